//! The SQL definitions: functions, trigger functions (with the triggers that
//! attach them) and views, one file per rule family under `sql/`, embedded in
//! the binary (docs/architecture.md).
//!
//! Unlike a migration, a definition file is the code that runs: it is
//! re-applied whenever its content changes. The table `sql_definitions`
//! records, per file, the checksum installed and the version of the
//! definition set that installed (or confirmed) it. `sql/VERSIONS` gives the
//! set a monotonic version, so that during a rolling deploy an older binary
//! never puts its older definitions back:
//!
//! - installed version above ours: nothing is applied, with a warning
//!   naming both versions (an older replica restarting mid-rollout);
//! - the same version with other checksums: refused (a file changed without
//!   a new line in `sql/VERSIONS`);
//! - below ours: the files whose checksum differs are applied, in the order
//!   of `FILES`, in one transaction.
//!
//! Applying is the owner's work, on the migration session under the
//! migrations' advisory lock (`db::migrate`); the application role only
//! reads the table (`status`).

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use sqlx::{Connection, PgConnection};

/// The definition files, in the order they are applied: a file may call
/// functions of the files before it (a SQL-language function's body is
/// checked when it is created; PL/pgSQL bodies only when they run).
pub const FILES: &[(&str, &str)] = &[
    ("api_callers.sql", include_str!("../../sql/api_callers.sql")),
    ("locks.sql", include_str!("../../sql/locks.sql")),
    ("services.sql", include_str!("../../sql/services.sql")),
    (
        "pool_figures.sql",
        include_str!("../../sql/pool_figures.sql"),
    ),
    ("capacity.sql", include_str!("../../sql/capacity.sql")),
    ("substitutes.sql", include_str!("../../sql/substitutes.sql")),
    ("allocator.sql", include_str!("../../sql/allocator.sql")),
    ("transitions.sql", include_str!("../../sql/transitions.sql")),
    (
        "webhook_outbox.sql",
        include_str!("../../sql/webhook_outbox.sql"),
    ),
    ("healing.sql", include_str!("../../sql/healing.sql")),
    ("incarnation.sql", include_str!("../../sql/incarnation.sql")),
    ("planning.sql", include_str!("../../sql/planning.sql")),
];

/// One line per version of the set: `<version> <sha256 of the set>`,
/// appended whenever a file changes (checked by this module's tests).
pub const VERSIONS: &str = include_str!("../../sql/VERSIONS");

/// A set of definition files and its version.
#[derive(Debug, Clone)]
pub struct DefinitionSet {
    pub version: i64,
    pub files: Vec<(String, String)>,
}

impl DefinitionSet {
    /// The set embedded in this binary: `FILES` at the last version of
    /// `sql/VERSIONS`.
    pub fn embedded() -> anyhow::Result<DefinitionSet> {
        let (version, _) = last_version(VERSIONS)?;
        Ok(DefinitionSet {
            version,
            files: FILES
                .iter()
                .map(|(name, sql)| ((*name).to_owned(), (*sql).to_owned()))
                .collect(),
        })
    }

    /// SHA-256 of the whole set: each file's name and content, in order.
    pub fn checksum(&self) -> String {
        let mut digest = Sha256::new();
        for (name, sql) in &self.files {
            digest.update(name.as_bytes());
            digest.update([0]);
            digest.update(sql.as_bytes());
            digest.update([0]);
        }
        hex(&digest.finalize())
    }
}

/// SHA-256 of one file, as stored in `sql_definitions.checksum`.
pub fn file_checksum(sql: &str) -> Vec<u8> {
    Sha256::digest(sql.as_bytes()).to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The last `<version> <checksum>` line of `sql/VERSIONS`.
fn last_version(text: &str) -> anyhow::Result<(i64, String)> {
    let lines = version_lines(text)?;
    lines
        .last()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("sql/VERSIONS has no version line"))
}

fn version_lines(text: &str) -> anyhow::Result<Vec<(i64, String)>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(version), Some(checksum), None) = (parts.next(), parts.next(), parts.next())
        else {
            anyhow::bail!("sql/VERSIONS: expected `<version> <sha256>`, found {line:?}");
        };
        let version: i64 = version
            .parse()
            .map_err(|_| anyhow::anyhow!("sql/VERSIONS: {version:?} is not a version number"))?;
        out.push((version, checksum.to_owned()));
    }
    Ok(out)
}

/// What the database holds compared with a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Installed at this version with these checksums.
    Current,
    /// Installed at a lower version (or never): these files must be applied.
    Pending { installed: i64, files: Vec<String> },
    /// A newer set is installed: this (older) binary must apply nothing.
    Newer { installed: i64, ours: i64 },
}

/// What `apply` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to do.
    Current,
    /// These files were applied, moving the set from `from` to `to`.
    Applied {
        from: i64,
        to: i64,
        files: Vec<String>,
    },
    /// A newer set is installed; nothing was applied.
    Newer { installed: i64, ours: i64 },
}

/// Compares the installed definitions with `set`. Fails when the same
/// version is installed with other content: someone changed a file without
/// a new version, and which one is right cannot be told.
pub async fn status(db: impl sqlx::PgExecutor<'_>, set: &DefinitionSet) -> anyhow::Result<Status> {
    let rows: Vec<(String, Vec<u8>, i64)> =
        match sqlx::query_as("SELECT file, checksum, version FROM sql_definitions")
            .fetch_all(db)
            .await
        {
            Ok(rows) => rows,
            // Not migrated that far yet: nothing is installed. (`db` calls
            // this module, so only its `errors` file is named here.)
            Err(e) if super::errors::sqlstate(&e).as_deref() == Some("42P01") => Vec::new(),
            Err(e) => return Err(e.into()),
        };
    decide(&rows, set)
}

fn decide(rows: &[(String, Vec<u8>, i64)], set: &DefinitionSet) -> anyhow::Result<Status> {
    let installed = rows.iter().map(|(_, _, v)| *v).max().unwrap_or(0);
    if installed > set.version {
        return Ok(Status::Newer {
            installed,
            ours: set.version,
        });
    }
    let by_file: BTreeMap<&str, &[u8]> = rows
        .iter()
        .map(|(f, c, _)| (f.as_str(), c.as_slice()))
        .collect();
    let differ: Vec<String> = set
        .files
        .iter()
        .filter(|(name, sql)| by_file.get(name.as_str()) != Some(&file_checksum(sql).as_slice()))
        .map(|(name, _)| name.clone())
        .collect();
    if installed == set.version {
        let unknown: Vec<&str> = by_file
            .keys()
            .filter(|f| !set.files.iter().any(|(name, _)| name == *f))
            .copied()
            .collect();
        if !differ.is_empty() || !unknown.is_empty() {
            anyhow::bail!(
                "the SQL definitions installed as version {installed} differ from this binary's \
                 version {installed} ({}): a file in sql/ changed without a new line in \
                 sql/VERSIONS. Refusing to guess which is right",
                differ
                    .iter()
                    .map(String::as_str)
                    .chain(unknown)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        return Ok(Status::Current);
    }
    Ok(Status::Pending {
        installed,
        files: differ,
    })
}

/// Logs that a newer definition set is installed than this binary's.
pub fn warn_newer(installed: i64, ours: i64) {
    tracing::warn!(
        installed,
        ours,
        "the SQL definitions installed (version {installed}) are newer than this binary's \
         (version {ours}); applying none of ours (an older release during a rolling deploy)"
    );
}

/// Brings the installed definitions to `set`, on the owner's session `conn`,
/// which the caller holds under the migrations' advisory lock. The files
/// that changed are applied in order, and the table updated, in one
/// transaction: a failure leaves the previous definitions in place.
pub async fn apply(conn: &mut PgConnection, set: &DefinitionSet) -> anyhow::Result<Outcome> {
    let mut tx = conn.begin().await?;
    let (installed, files) = match status(&mut *tx, set).await? {
        Status::Current => return Ok(Outcome::Current),
        Status::Newer { installed, ours } => {
            warn_newer(installed, ours);
            return Ok(Outcome::Newer { installed, ours });
        }
        Status::Pending { installed, files } => (installed, files),
    };
    for (name, sql) in &set.files {
        if files.contains(name) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                .execute(&mut *tx)
                .await
                .map_err(|e| anyhow::Error::new(e).context(format!("applying sql/{name}")))?;
        }
        sqlx::query(
            "INSERT INTO sql_definitions (file, checksum, version) VALUES ($1, $2, $3)
             ON CONFLICT (file) DO UPDATE
                SET version = EXCLUDED.version,
                    checksum = EXCLUDED.checksum,
                    applied_at = CASE WHEN sql_definitions.checksum = EXCLUDED.checksum
                                      THEN sql_definitions.applied_at
                                      ELSE clock_timestamp() END",
        )
        .bind(name)
        .bind(file_checksum(sql))
        .bind(set.version)
        .execute(&mut *tx)
        .await?;
    }
    // A file no longer in the set: its row would claim it is installed.
    sqlx::query("DELETE FROM sql_definitions WHERE NOT (file = ANY ($1))")
        .bind(
            set.files
                .iter()
                .map(|(name, _)| name.clone())
                .collect::<Vec<_>>(),
        )
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Outcome::Applied {
        from: installed,
        to: set.version,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(version: i64, files: &[(&str, &str)]) -> DefinitionSet {
        DefinitionSet {
            version,
            files: files
                .iter()
                .map(|(n, s)| ((*n).to_owned(), (*s).to_owned()))
                .collect(),
        }
    }

    /// A file of sql/ changed without a new line in sql/VERSIONS fails here,
    /// naming the line to append.
    #[test]
    fn the_last_version_line_is_the_checksum_of_the_embedded_files() {
        let embedded = DefinitionSet::embedded().expect("sql/VERSIONS parses");
        let (version, recorded) = last_version(VERSIONS).expect("a version line");
        let actual = embedded.checksum();
        assert_eq!(
            recorded,
            actual,
            "the files in sql/ changed: append the line `{} {actual}` to sql/VERSIONS",
            version + 1
        );
    }

    #[test]
    fn versions_only_go_up_and_each_names_a_different_set() {
        let lines = version_lines(VERSIONS).expect("sql/VERSIONS parses");
        assert!(!lines.is_empty());
        for pair in lines.windows(2) {
            assert!(pair[1].0 > pair[0].0, "versions go up: {pair:?}");
        }
        let mut checksums: Vec<&str> = lines.iter().map(|(_, c)| c.as_str()).collect();
        checksums.sort_unstable();
        checksums.dedup();
        assert_eq!(checksums.len(), lines.len(), "a checksum appears twice");
    }

    #[test]
    fn every_file_of_sql_is_embedded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/sql");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .expect("sql/")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = FILES.iter().map(|(n, _)| (*n).to_owned()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
    }

    #[test]
    fn decisions_by_version() {
        let ours = set(2, &[("a.sql", "A2"), ("b.sql", "B")]);
        let row = |f: &str, sql: &str, v: i64| (f.to_owned(), file_checksum(sql), v);
        // Nothing installed: everything pending.
        assert_eq!(
            decide(&[], &ours).expect("decide"),
            Status::Pending {
                installed: 0,
                files: vec!["a.sql".into(), "b.sql".into()]
            }
        );
        // Lower: only the changed file.
        assert_eq!(
            decide(&[row("a.sql", "A1", 1), row("b.sql", "B", 1)], &ours).expect("decide"),
            Status::Pending {
                installed: 1,
                files: vec!["a.sql".into()]
            }
        );
        // Higher: nothing, whatever the content.
        assert_eq!(
            decide(&[row("a.sql", "A3", 3), row("b.sql", "B", 3)], &ours).expect("decide"),
            Status::Newer {
                installed: 3,
                ours: 2
            }
        );
        // Equal and identical: current.
        assert_eq!(
            decide(&[row("a.sql", "A2", 2), row("b.sql", "B", 2)], &ours).expect("decide"),
            Status::Current
        );
        // Equal but different: refused, naming the file.
        let err = decide(&[row("a.sql", "A9", 2), row("b.sql", "B", 2)], &ours)
            .expect_err("same version, other content");
        assert!(err.to_string().contains("a.sql"), "{err}");
        assert!(err.to_string().contains("sql/VERSIONS"), "{err}");
    }
}
