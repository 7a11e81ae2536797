//! What a run asked of the database's disk, per completed cycle: WAL records,
//! bytes and full-page images, WAL syncs (pg_stat_wal), commits
//! (pg_stat_database), and lock waits (the `log_lock_waits` lines the run
//! added to the server's log). Unlike the rates, these barely depend on
//! what else the machine is doing, so they are what changes are judged by.

use std::path::PathBuf;
use std::time::Duration;

use crate::setup::Db;

/// Cumulative counters of the cluster (WAL) and of the run's database (commits).
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    pub records: f64,
    pub fpi: f64,
    pub bytes: f64,
    pub syncs: f64,
    pub commits: f64,
}

/// Per completed cycle over one run (lock waits: the run's total).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct PerCycle {
    pub records: f64,
    pub fpi: f64,
    pub bytes: f64,
    pub syncs: f64,
    pub commits: f64,
    /// Every lock wait logged (longer than deadlock_timeout).
    pub lock_waits: u64,
    /// Of which waits for the lock that extends a table or index by a page
    /// (PostgreSQL's storage, not a row another order holds).
    pub extension_waits: u64,
    /// What the first few waits were for (the log's message and context).
    pub lock_wait_examples: Vec<String>,
}

impl PerCycle {
    /// The median of each counter over runs; lock waits are summed and
    /// their examples kept.
    pub fn median_of(runs: &[PerCycle]) -> PerCycle {
        let f = |get: fn(&PerCycle) -> f64| {
            crate::stats::median(&runs.iter().map(get).collect::<Vec<_>>())
        };
        let mut examples: Vec<String> = Vec::new();
        for r in runs {
            for e in &r.lock_wait_examples {
                if examples.len() < 3 && !examples.contains(e) {
                    examples.push(e.clone());
                }
            }
        }
        PerCycle {
            records: f(|c| c.records),
            fpi: f(|c| c.fpi),
            bytes: f(|c| c.bytes),
            syncs: f(|c| c.syncs),
            commits: f(|c| c.commits),
            lock_waits: runs.iter().map(|r| r.lock_waits).sum(),
            extension_waits: runs.iter().map(|r| r.extension_waits).sum(),
            lock_wait_examples: examples,
        }
    }
}

/// Reads the counters of `db`'s cluster and the lock waits of its log.
#[derive(Debug, Clone)]
pub struct Probe {
    log: Option<PathBuf>,
    settle: Duration,
}

/// The counters and the log's length at the start of a run.
pub struct Mark {
    counters: Counters,
    log_len: u64,
}

impl Probe {
    pub fn new(log: Option<PathBuf>, settle_seconds: f64) -> Probe {
        Probe {
            log,
            settle: Duration::from_secs_f64(settle_seconds.max(0.0)),
        }
    }

    async fn counters(db: &Db) -> anyhow::Result<Counters> {
        let (records, fpi, bytes, syncs, commits): (f64, f64, f64, f64, f64) = sqlx::query_as(
            "SELECT w.wal_records::float8, w.wal_fpi::float8, w.wal_bytes::float8, w.wal_sync::float8,
                    d.xact_commit::float8
               FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()",
        )
        .fetch_one(&db.setup)
        .await?;
        Ok(Counters {
            records,
            fpi,
            bytes,
            syncs,
            commits,
        })
    }

    fn log_len(&self) -> u64 {
        self.log
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map_or(0, |m| m.len())
    }

    /// Before a run (the previous run's `end` has let the statistics settle).
    pub async fn start(&self, db: &Db) -> anyhow::Result<Mark> {
        Ok(Mark {
            counters: Self::counters(db).await?,
            log_len: self.log_len(),
        })
    }

    /// Waits until the run's backends, now idle, have reported their last
    /// counters, then reads them. `cycles` completed cycles.
    pub async fn end(&self, db: &Db, mark: &Mark, cycles: u64) -> anyhow::Result<PerCycle> {
        let log_end = self.log_len();
        tokio::time::sleep(self.settle).await;
        let now = Self::counters(db).await?;
        let per = |a: f64, b: f64| {
            if cycles == 0 {
                0.0
            } else {
                (a - b) / cycles as f64
            }
        };
        let before = &mark.counters;
        let waits = self.lock_waits(mark.log_len, log_end);
        let mut lock_wait_examples = Vec::new();
        for (what, relation) in waits.examples {
            // The relation's name, from the oid the message gives.
            let name: Option<String> = match relation {
                Some(oid) => {
                    sqlx::query_scalar("SELECT relname::text FROM pg_class WHERE oid::bigint = $1")
                        .bind(oid)
                        .fetch_optional(&db.setup)
                        .await?
                }
                None => None,
            };
            lock_wait_examples.push(match name {
                Some(n) => format!("{what} ({n})"),
                None => what,
            });
        }
        lock_wait_examples.dedup();
        Ok(PerCycle {
            records: per(now.records, before.records),
            fpi: per(now.fpi, before.fpi),
            bytes: per(now.bytes, before.bytes),
            syncs: per(now.syncs, before.syncs),
            // The reading statement of `start` is a commit of this database.
            commits: per(now.commits - 1.0, before.commits),
            lock_waits: waits.count,
            extension_waits: waits.extension,
            lock_wait_examples,
        })
    }

    /// `log_lock_waits` lines ("process N still waiting for ShareLock on
    /// transaction M after 1.0 ms") written between two log lengths, and
    /// what the first ones waited for: the lock, and the CONTEXT line that
    /// names the tuple and relation, or the relation being extended (its oid).
    fn lock_waits(&self, from: u64, to: u64) -> Waits {
        let mut waits = Waits::default();
        let Some(path) = &self.log else {
            return waits;
        };
        let Ok(bytes) = std::fs::read(path) else {
            return waits;
        };
        let end = (to as usize).min(bytes.len());
        let start = (from as usize).min(end);
        let text = String::from_utf8_lossy(&bytes[start..end]);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(at) = line.find("still waiting for ") else {
                continue;
            };
            waits.count += 1;
            let what = &line[at + "still waiting for ".len()..];
            let what = what.split(" after ").next().unwrap_or(what);
            let extension = what
                .split_once("on extension of relation ")
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .and_then(|oid| oid.parse::<i64>().ok());
            let example = if let Some(oid) = extension {
                waits.extension += 1;
                (
                    "ExclusiveLock on the extension of a relation".to_owned(),
                    Some(oid),
                )
            } else {
                // "while locking tuple (3,4) in relation \"machines\"", or
                // "while inserting index tuple ... in relation ...".
                let context = lines[i + 1..lines.len().min(i + 5)]
                    .iter()
                    .find_map(|l| l.split_once("CONTEXT:").map(|(_, c)| c.trim()))
                    .filter(|c| c.starts_with("while "))
                    .map(strip_numbers)
                    .unwrap_or_default();
                let what = strip_numbers(what);
                (
                    if context.is_empty() {
                        what
                    } else {
                        format!("{what} {context}")
                    },
                    None,
                )
            };
            if waits.examples.len() < 3 && !waits.examples.contains(&example) {
                waits.examples.push(example);
            }
        }
        waits
    }
}

#[derive(Default)]
struct Waits {
    count: u64,
    extension: u64,
    /// The lock waited for, and the oid of the relation being extended.
    examples: Vec<(String, Option<i64>)>,
}

/// "ShareLock on transaction 1234" -> "ShareLock on transaction N", so that
/// waits of one kind read as one example.
fn strip_numbers(s: &str) -> String {
    let mut out = String::new();
    let mut in_number = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

/// The settings printed in the machine table, as `name value` pairs.
pub async fn settings(db: &Db) -> anyhow::Result<Vec<(String, String)>> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY($1)
          ORDER BY array_position($1, name)",
    )
    .bind(
        crate::setup::PRINTED_SETTINGS
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
    )
    .fetch_all(&db.setup)
    .await?;
    Ok(rows)
}
