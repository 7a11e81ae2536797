//! What the database says (the pool's machines, holds, webhooks, the sweep,
//! the leases), read at scrape time by one replica for all of them and
//! shared through `metrics_snapshot`.

use std::collections::HashSet;
use std::time::Duration;

use prometheus::{Gauge, IntCounter, IntGauge, IntGaugeVec, Opts};

use super::refusals::OTHER;
use crate::db::Db;

/// How long the database's numbers are reused, by every replica: a scrape
/// more often than this (several Prometheus servers, ten replicas, a person
/// with curl) reads the shared snapshot, one row by its key.
pub const DB_STATE_MAX_AGE: Duration = Duration::from_secs(10);

/// The advisory lock under which one replica reads the numbers for all
/// ('pk' 'metr'); the others reuse the snapshot it writes.
pub const SNAPSHOT_LOCK_KEY: i64 = 0x706b_6d65_7472;

/// What one replica read, shared through `metrics_snapshot`. Instants are
/// epoch seconds by the database clock, so that every replica computes the
/// same ages from them whenever it reads the row.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Snapshot {
    machines: Vec<(String, String, String, i64)>,
    holds_soon: i64,
    holds_overdue: i64,
    pending: i64,
    oldest_pending_at: Option<f64>,
    sweep_finished_at: Option<f64>,
    leases: Vec<(String, i64)>,
    /// R18: machines kept per (site, profile, segment), every organization's.
    /// Defaults: a snapshot written by a replica without them reads empty.
    #[serde(default)]
    headroom: Vec<(String, String, String, i64)>,
    /// R17: per (site, profile), what an order without a segment could take.
    #[serde(default)]
    available: Vec<(String, String, i64)>,
}

/// At most this many (site, profile) pairs get their own labels; the rest
/// are summed under `other`, as refusal labels are bounded.
pub const MAX_POOL_PAIRS: usize = 200;

/// Holds expiring within this are "expiring soon".
pub const EXPIRING_SOON: Duration = Duration::from_secs(120);

/// The statement counting machines by (site, profile, pool state), and
/// every pool state (each pair shows all of them, 0 included). Given by
/// the caller: the pool states are the inventory's rule, above this module.
pub struct MachinesSql {
    pub sql: String,
    pub states: Vec<&'static str>,
}

/// Series read from the database (any replica reports the same numbers).
#[derive(Clone)]
pub struct DbState {
    pub machines: IntGaugeVec,
    pub headroom: IntGaugeVec,
    pub available: IntGaugeVec,
    pub holds_expiring_soon: IntGauge,
    pub holds_overdue: IntGauge,
    pub webhooks_pending: IntGauge,
    pub webhooks_oldest_pending: Gauge,
    pub sweep_age: Gauge,
    pub lease_holders: IntGaugeVec,
    pub pool_connections: IntGaugeVec,
    pub scrape_errors: IntCounter,
    /// Times this replica read the numbers for every replica.
    pub reads: IntCounter,
    /// One refresh at a time in this process; a concurrent scrape serves
    /// what is there.
    refreshing: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl DbState {
    pub(super) fn new() -> DbState {
        let g =
            |name: &str, help: &str| IntGauge::new(name, help).expect("static metric definition");
        DbState {
            machines: IntGaugeVec::new(
                Opts::new(
                    "poolkeeper_machines",
                    "Machines by site, profile and pool state (sellable, held, sold, not_ready), as the overview counts them; every organization's",
                ),
                &["site", "profile", "state"],
            )
            .expect("static metric definition"),
            headroom: IntGaugeVec::new(
                Opts::new(
                    "poolkeeper_pool_headroom",
                    "Machines of a pool kept for a segment (R18, headroom), by site, profile and segment; every organization's",
                ),
                &["site", "profile", "segment"],
            )
            .expect("static metric definition"),
            available: IntGaugeVec::new(
                Opts::new(
                    "poolkeeper_pool_available",
                    "Machines of a pool an order without a segment could take now: sellable less the headroom kept for segments (R17); every organization's",
                ),
                &["site", "profile"],
            )
            .expect("static metric definition"),
            holds_expiring_soon: g(
                "poolkeeper_holds_expiring_soon",
                "Held reservations whose hold ends within 2 minutes (database clock)",
            ),
            holds_overdue: g(
                "poolkeeper_holds_overdue",
                "Held reservations past their expiry that no sweep has marked expired yet",
            ),
            webhooks_pending: g(
                "poolkeeper_webhook_deliveries_pending",
                "Webhook deliveries waiting to be sent or retried",
            ),
            webhooks_oldest_pending: Gauge::new(
                "poolkeeper_webhook_oldest_pending_age_seconds",
                "Age of the oldest pending webhook delivery (0: none pending)",
            )
            .expect("static metric definition"),
            sweep_age: Gauge::new(
                "poolkeeper_sweep_last_success_age_seconds",
                "Seconds since any replica last finished a sweep, by the database clock (+Inf: never)",
            )
            .expect("static metric definition"),
            lease_holders: IntGaugeVec::new(
                Opts::new(
                    "poolkeeper_lease_holders",
                    "Unexpired leases by key, by the database clock (0: nobody holds it)",
                ),
                &["key"],
            )
            .expect("static metric definition"),
            pool_connections: IntGaugeVec::new(
                Opts::new(
                    "poolkeeper_db_pool_connections",
                    "The API's database connections: in_use, idle, and max (the pool's size limit)",
                ),
                &["state"],
            )
            .expect("static metric definition"),
            scrape_errors: IntCounter::new(
                "poolkeeper_metrics_db_errors_total",
                "Scrapes whose database numbers could not be read (the previous numbers are served)",
            )
            .expect("static metric definition"),
            reads: IntCounter::new(
                "poolkeeper_metrics_db_reads_total",
                "Times this replica read the database's numbers for /metrics on behalf of every replica (the others reuse that snapshot)",
            )
            .expect("static metric definition"),
            refreshing: Default::default(),
        }
    }

    /// The series, for a registry.
    pub(super) fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.machines.clone()),
            Box::new(self.headroom.clone()),
            Box::new(self.available.clone()),
            Box::new(self.holds_expiring_soon.clone()),
            Box::new(self.holds_overdue.clone()),
            Box::new(self.webhooks_pending.clone()),
            Box::new(self.webhooks_oldest_pending.clone()),
            Box::new(self.sweep_age.clone()),
            Box::new(self.lease_holders.clone()),
            Box::new(self.pool_connections.clone()),
            Box::new(self.scrape_errors.clone()),
            Box::new(self.reads.clone()),
        ]
    }

    /// The database's numbers: the shared snapshot when it is younger than
    /// `DB_STATE_MAX_AGE`, or else read by this replica under
    /// `SNAPSHOT_LOCK_KEY` and shared; a replica that finds the lock taken
    /// serves the snapshot there is. One refresh at a time per process.
    pub async fn refresh(&self, pool: &Db, machines: &MachinesSql) {
        let (size, idle, max) = pool.pool_sizes();
        self.pool_connections
            .with_label_values(&["in_use"])
            .set(i64::from(size.saturating_sub(idle)));
        self.pool_connections
            .with_label_values(&["idle"])
            .set(i64::from(idle));
        self.pool_connections
            .with_label_values(&["max"])
            .set(i64::from(max));
        let Ok(_refreshing) = self.refreshing.try_lock() else {
            return;
        };
        match tokio::time::timeout(Duration::from_secs(5), self.shared(pool, machines)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                self.scrape_errors.inc();
                tracing::warn!(error = %e, "could not read the database's numbers for /metrics");
            }
            Err(_) => {
                self.scrape_errors.inc();
                tracing::warn!("reading the database's numbers for /metrics timed out");
            }
        }
    }

    async fn shared(&self, pool: &Db, machines: &MachinesSql) -> Result<(), sqlx::Error> {
        const SNAPSHOT: &str = "SELECT body, extract(epoch FROM now() - read_at)::float8,
                                       extract(epoch FROM now())::float8
                                  FROM metrics_snapshot";
        let max_age = DB_STATE_MAX_AGE.as_secs_f64();
        let seen: Option<(sqlx::types::Json<Snapshot>, f64, f64)> =
            sqlx::query_as(SNAPSHOT).fetch_optional(pool).await?;
        if let Some((body, age, now)) = &seen
            && *age < max_age
        {
            self.apply(&body.0, *now, machines);
            return Ok(());
        }
        let mut tx = pool.begin().await?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
            .bind(SNAPSHOT_LOCK_KEY)
            .fetch_one(&mut *tx)
            .await?;
        if !locked {
            // Another replica is reading: serve the last snapshot.
            drop(tx);
            if let Some((body, _, now)) = &seen {
                self.apply(&body.0, *now, machines);
            }
            return Ok(());
        }
        // Under the lock: another replica may have just written it.
        let again: Option<(sqlx::types::Json<Snapshot>, f64, f64)> =
            sqlx::query_as(SNAPSHOT).fetch_optional(&mut *tx).await?;
        if let Some((body, age, now)) = &again
            && *age < max_age
        {
            tx.commit().await?;
            self.apply(&body.0, *now, machines);
            return Ok(());
        }
        let snapshot = Self::read(&mut tx, machines).await?;
        let now: f64 = sqlx::query_scalar(
            "INSERT INTO metrics_snapshot (id, read_at, body) VALUES (true, now(), $1)
             ON CONFLICT (id) DO UPDATE SET read_at = EXCLUDED.read_at, body = EXCLUDED.body
             RETURNING extract(epoch FROM read_at)::float8",
        )
        .bind(sqlx::types::Json(&snapshot))
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        self.reads.inc();
        self.apply(&snapshot, now, machines);
        Ok(())
    }

    async fn read(
        conn: &mut sqlx::PgConnection,
        machines: &MachinesSql,
    ) -> Result<Snapshot, sqlx::Error> {
        let rows: Vec<(String, String, String, i64)> =
            sqlx::query_as(sqlx::AssertSqlSafe(machines.sql.clone()))
                .fetch_all(&mut *conn)
                .await?;
        let (holds_soon, holds_overdue, pending, oldest_pending_at, sweep_finished_at): (
            i64,
            i64,
            i64,
            Option<f64>,
            Option<f64>,
        ) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM reservations WHERE state = 'held'
                       AND expires_at >= now() AND expires_at < now() + make_interval(secs => $1)),
                    (SELECT count(*) FROM reservations WHERE state = 'held' AND expires_at < now()),
                    (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'),
                    (SELECT extract(epoch FROM min(created_at))::float8
                       FROM webhook_deliveries WHERE state = 'pending'),
                    (SELECT extract(epoch FROM max(finished_at))::float8 FROM sweep_runs)",
        )
        .bind(EXPIRING_SOON.as_secs_f64())
        .fetch_one(&mut *conn)
        .await?;
        let leases: Vec<(String, i64)> = sqlx::query_as(
            "SELECT k.key, count(l.key)
               FROM (VALUES ('sweep'), ('webhooks')) k (key)
               LEFT JOIN leases l ON l.key = k.key AND l.expires_at > now()
              GROUP BY k.key",
        )
        .fetch_all(&mut *conn)
        .await?;
        // sql/capacity.sql's counts, so that the gauges say what the API
        // and a reserve decide.
        let headroom: Vec<(String, String, String, i64)> = sqlx::query_as(
            "SELECT site, profile, segment, sum(machines)::bigint
               FROM headroom GROUP BY site, profile, segment",
        )
        .fetch_all(&mut *conn)
        .await?;
        let available: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT c.site, c.profile, sum(c.available)::bigint
               FROM organizations o
              CROSS JOIN LATERAL capacity_pools(o.id, NULL, NULL, NULL, NULL) c
              GROUP BY c.site, c.profile",
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(Snapshot {
            headroom,
            available,
            machines: rows,
            holds_soon,
            holds_overdue,
            pending,
            oldest_pending_at,
            sweep_finished_at,
            leases,
        })
    }

    /// Sets the series from a snapshot; `now` is the database clock when
    /// the snapshot was read from or written to the table.
    fn apply(&self, snapshot: &Snapshot, now: f64, machines: &MachinesSql) {
        let rows = snapshot.machines.clone();
        // Bounded: the largest pairs by machines keep their labels.
        let mut totals: std::collections::HashMap<(String, String), i64> = Default::default();
        for (site, profile, _, n) in &rows {
            *totals.entry((site.clone(), profile.clone())).or_default() += n;
        }
        let mut pairs: Vec<_> = totals.into_iter().collect();
        pairs.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let kept: HashSet<(String, String)> = pairs
            .into_iter()
            .take(MAX_POOL_PAIRS)
            .map(|(k, _)| k)
            .collect();
        let mut counts: std::collections::HashMap<(String, String, String), i64> =
            Default::default();
        for (site, profile, _, _) in &rows {
            let key = if kept.contains(&(site.clone(), profile.clone())) {
                (site.clone(), profile.clone())
            } else {
                (OTHER.to_owned(), OTHER.to_owned())
            };
            for st in &machines.states {
                counts
                    .entry((key.0.clone(), key.1.clone(), (*st).to_owned()))
                    .or_default();
            }
        }
        for (site, profile, state, n) in rows {
            let key = if kept.contains(&(site.clone(), profile.clone())) {
                (site, profile)
            } else {
                (OTHER.to_owned(), OTHER.to_owned())
            };
            *counts.entry((key.0, key.1, state)).or_default() += n;
        }
        // Pairs gone from the inventory disappear rather than stay stale.
        self.machines.reset();
        for ((site, profile, state), n) in counts {
            self.machines
                .with_label_values(&[&site, &profile, &state])
                .set(n);
        }
        // The same bound: a pool without its own labels is summed under
        // `other`.
        let pair = |site: &str, profile: &str| {
            if kept.contains(&(site.to_owned(), profile.to_owned())) {
                (site.to_owned(), profile.to_owned())
            } else {
                (OTHER.to_owned(), OTHER.to_owned())
            }
        };
        let mut headroom: std::collections::HashMap<(String, String, String), i64> =
            Default::default();
        for (site, profile, segment, n) in &snapshot.headroom {
            let (site, profile) = pair(site, profile);
            *headroom
                .entry((site, profile, segment.clone()))
                .or_default() += n;
        }
        self.headroom.reset();
        for ((site, profile, segment), n) in headroom {
            self.headroom
                .with_label_values(&[&site, &profile, &segment])
                .set(n);
        }
        let mut available: std::collections::HashMap<(String, String), i64> = Default::default();
        for (site, profile, n) in &snapshot.available {
            *available.entry(pair(site, profile)).or_default() += n;
        }
        self.available.reset();
        for ((site, profile), n) in available {
            self.available.with_label_values(&[&site, &profile]).set(n);
        }
        self.holds_expiring_soon.set(snapshot.holds_soon);
        self.holds_overdue.set(snapshot.holds_overdue);
        self.webhooks_pending.set(snapshot.pending);
        self.webhooks_oldest_pending.set(
            snapshot
                .oldest_pending_at
                .map_or(0.0, |at| (now - at).max(0.0)),
        );
        self.sweep_age.set(
            snapshot
                .sweep_finished_at
                .map_or(f64::INFINITY, |at| (now - at).max(0.0)),
        );
        for (key, n) in &snapshot.leases {
            self.lease_holders.with_label_values(&[key]).set(*n);
        }
    }
}
