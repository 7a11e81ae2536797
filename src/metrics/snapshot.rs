//! What the database says (the pool's machines, holds, webhooks, the sweep,
//! the leases), read at scrape time by one replica for all of them and
//! shared through `metrics_snapshot`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use prometheus::{Gauge, GaugeVec, IntCounter, IntGauge, IntGaugeVec, Opts};

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
    /// What a replica of an older release reads for its per-site gauges:
    /// written empty, so that such a replica still parses the row during a
    /// rolling upgrade (and reports no pool gauges until it is replaced).
    #[serde(default)]
    machines: Vec<(String, String, String, i64)>,
    holds_soon: i64,
    holds_overdue: i64,
    pending: i64,
    oldest_pending_at: Option<f64>,
    sweep_finished_at: Option<f64>,
    leases: Vec<(String, i64)>,
    /// R17: each organization's pools as `capacity_pools` counts them, in
    /// one statement. Defaults: an older replica's snapshot reads empty.
    #[serde(default)]
    pools: Vec<PoolRow>,
    /// R18: machines kept per (organization, site, profile, segment).
    #[serde(default)]
    kept: Vec<(String, String, String, String, i64)>,
    /// R21: per (organization, site, profile) the days left (None: no
    /// run-out, no demand or no history) and the site's lead time.
    #[serde(default)]
    runout: Vec<(String, String, String, Option<f64>, i32)>,
}

/// One pool of one organization (by its slug), as R17 counts it.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, sqlx::FromRow)]
struct PoolRow {
    org: String,
    site: String,
    profile: String,
    sellable: i64,
    held: i64,
    sold: i64,
    not_ready: i64,
    available: i64,
}

/// At most this many pools (organization, site, profile) get their own
/// labels; the rest of each organization's are summed under site and
/// profile `other`, as refusal labels are bounded. Organizations are made
/// by the operator only, so the `org` label is bounded by them.
pub const MAX_POOL_PAIRS: usize = 200;

/// At most this many (pool, segment) headroom series; the rest are summed
/// under segment `other` of their pool.
pub const MAX_HEADROOM_SERIES: usize = 200;

/// The pool states of `poolkeeper_machines`, each shown for every pool (0
/// included), so that a pool that sold out still has its `sellable` series.
pub const POOL_STATES: [&str; 4] = ["sellable", "held", "sold", "not_ready"];

/// Holds expiring within this are "expiring soon".
pub const EXPIRING_SOON: Duration = Duration::from_secs(120);

/// Series read from the database (any replica reports the same numbers).
#[derive(Clone)]
pub struct DbState {
    pub machines: IntGaugeVec,
    pub headroom: IntGaugeVec,
    pub available: IntGaugeVec,
    pub days_left: GaugeVec,
    pub lead_time: IntGaugeVec,
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
                    "Machines by organization, site, profile and pool state (sellable, held, sold, not_ready), as the overview and GET /api/v1/capacity count them (R17)",
                ),
                &["org", "site", "profile", "state"],
            )
            .expect("static metric definition"),
            headroom: IntGaugeVec::new(
                Opts::new(
                    "poolkeeper_pool_headroom",
                    "Machines of a pool kept for a segment (R18, headroom), by organization, site, profile and segment",
                ),
                &["org", "site", "profile", "segment"],
            )
            .expect("static metric definition"),
            available: IntGaugeVec::new(
                Opts::new(
                    "poolkeeper_pool_available",
                    "Machines of a pool an order without a segment could take now: sellable less the headroom kept for segments (R17), by organization, site and profile",
                ),
                &["org", "site", "profile"],
            )
            .expect("static metric definition"),
            days_left: GaugeVec::new(
                Opts::new(
                    "poolkeeper_pool_days_left",
                    "R21: days until a pool's available machines run out at its fitted demand, by organization, site and profile; +Inf without demand or history",
                ),
                &["org", "site", "profile"],
            )
            .expect("static metric definition"),
            lead_time: IntGaugeVec::new(
                Opts::new(
                    "poolkeeper_pool_lead_time_days",
                    "R21: the procurement lead time of a pool's site, in days, by organization, site and profile",
                ),
                &["org", "site", "profile"],
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
            Box::new(self.days_left.clone()),
            Box::new(self.lead_time.clone()),
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
    pub async fn refresh(&self, pool: &Db) {
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
        match tokio::time::timeout(Duration::from_secs(5), self.shared(pool)).await {
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

    async fn shared(&self, pool: &Db) -> Result<(), sqlx::Error> {
        const SNAPSHOT: &str = "SELECT body, extract(epoch FROM now() - read_at)::float8,
                                       extract(epoch FROM now())::float8
                                  FROM metrics_snapshot";
        let max_age = DB_STATE_MAX_AGE.as_secs_f64();
        let seen: Option<(sqlx::types::Json<Snapshot>, f64, f64)> =
            sqlx::query_as(SNAPSHOT).fetch_optional(pool).await?;
        if let Some((body, age, now)) = &seen
            && *age < max_age
        {
            self.apply(&body.0, *now);
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
                self.apply(&body.0, *now);
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
            self.apply(&body.0, *now);
            return Ok(());
        }
        let snapshot = Self::read(&mut tx).await?;
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
        self.apply(&snapshot, now);
        Ok(())
    }

    async fn read(conn: &mut sqlx::PgConnection) -> Result<Snapshot, sqlx::Error> {
        // R17: the one count, sql/capacity.sql's, so that the gauges say
        // what the overview, the API and a reserve decide (an overdue hold
        // is sellable there, as the allocator expires it at the point of
        // use). One statement: one snapshot for every organization.
        let pools: Vec<PoolRow> = sqlx::query_as(
            "SELECT o.slug AS org, c.site, c.profile, c.sellable, c.held, c.sold,
                    c.not_ready, c.available
               FROM organizations o
              CROSS JOIN LATERAL capacity_pools(o.id, NULL, NULL, NULL, NULL) c",
        )
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
        let kept: Vec<(String, String, String, String, i64)> = sqlx::query_as(
            "SELECT o.slug, h.site, h.profile, h.segment, h.machines::bigint
               FROM headroom h JOIN organizations o ON o.id = h.org_id",
        )
        .fetch_all(&mut *conn)
        .await?;
        let runout = Self::runout(conn).await?;
        Ok(Snapshot {
            machines: Vec::new(),
            pools,
            kept,
            runout,
            holds_soon,
            holds_overdue,
            pending,
            oldest_pending_at,
            sweep_finished_at,
            leases,
        })
    }

    /// R21: every organization's forecast, by the method the API answers
    /// with (`forecast::read`: the stock per organization, the fitted rates
    /// kept while the history stays as it was).
    async fn runout(
        conn: &mut sqlx::PgConnection,
    ) -> Result<Vec<(String, String, String, Option<f64>, i32)>, sqlx::Error> {
        let orgs: Vec<(i64, String)> = sqlx::query_as("SELECT id, slug FROM organizations")
            .fetch_all(&mut *conn)
            .await?;
        let mut out = Vec::new();
        for (id, slug) in orgs {
            let f = crate::forecast::read(&mut *conn, id, None, None).await?;
            out.extend(f.pools.into_iter().map(|p| {
                (
                    slug.clone(),
                    p.site,
                    p.profile,
                    p.days_left,
                    p.lead_time_days,
                )
            }));
        }
        Ok(out)
    }

    /// R21's gauges: pools without labels of their own (past
    /// `MAX_POOL_PAIRS`) have none, since days left cannot be summed.
    fn apply_runout(&self, snapshot: &Snapshot, labels: &PoolLabels) {
        self.days_left.reset();
        self.lead_time.reset();
        // A pool asked for but without machines (its demand all refused)
        // is in no capacity row: it keeps its labels, up to the bound.
        let stocked: HashSet<(&str, &str, &str)> = snapshot
            .pools
            .iter()
            .map(|p| (p.org.as_str(), p.site.as_str(), p.profile.as_str()))
            .collect();
        let mut unstocked = 0;
        for (org, site, profile, days, lead) in &snapshot.runout {
            let own = if stocked.contains(&(org.as_str(), site.as_str(), profile.as_str())) {
                labels.of(org, site, profile)
            } else {
                unstocked += 1;
                if unstocked > MAX_POOL_PAIRS {
                    continue;
                }
                [org.clone(), site.clone(), profile.clone()]
            };
            let [org, site, profile] = own;
            if site == OTHER && profile == OTHER {
                continue;
            }
            self.days_left
                .with_label_values(&[&org, &site, &profile])
                .set(days.unwrap_or(f64::INFINITY));
            self.lead_time
                .with_label_values(&[&org, &site, &profile])
                .set(i64::from(*lead));
        }
    }

    /// Sets the series from a snapshot; `now` is the database clock when
    /// the snapshot was read from or written to the table.
    fn apply(&self, snapshot: &Snapshot, now: f64) {
        let labels = PoolLabels::bounded(&snapshot.pools);
        let mut machines: HashMap<[String; 4], i64> = HashMap::new();
        let mut available: HashMap<[String; 3], i64> = HashMap::new();
        for p in &snapshot.pools {
            let [org, site, profile] = labels.of(&p.org, &p.site, &p.profile);
            let counts = [p.sellable, p.held, p.sold, p.not_ready];
            for (state, n) in POOL_STATES.iter().zip(counts) {
                *machines
                    .entry([
                        org.clone(),
                        site.clone(),
                        profile.clone(),
                        (*state).to_owned(),
                    ])
                    .or_default() += n;
            }
            *available.entry([org, site, profile]).or_default() += p.available;
        }
        // Pools gone from the inventory disappear rather than stay stale.
        self.machines.reset();
        for (k, n) in machines {
            self.machines
                .with_label_values(&[&k[0], &k[1], &k[2], &k[3]])
                .set(n);
        }
        self.available.reset();
        for (k, n) in available {
            self.available
                .with_label_values(&[&k[0], &k[1], &k[2]])
                .set(n);
        }
        // Headroom of a pool without labels of its own goes to its
        // organization's `other`; past the bound, a segment goes to its
        // pool's `other`, largest first.
        let mut kept: HashMap<[String; 4], i64> = HashMap::new();
        for (org, site, profile, segment, n) in &snapshot.kept {
            let [org, site, profile] = labels.of(org, site, profile);
            *kept
                .entry([org, site, profile, segment.clone()])
                .or_default() += n;
        }
        let mut kept: Vec<_> = kept.into_iter().collect();
        kept.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut bounded: HashMap<[String; 4], i64> = HashMap::new();
        for (i, (mut k, n)) in kept.into_iter().enumerate() {
            if i >= MAX_HEADROOM_SERIES {
                k[3] = OTHER.to_owned();
            }
            *bounded.entry(k).or_default() += n;
        }
        self.headroom.reset();
        for (k, n) in bounded {
            self.headroom
                .with_label_values(&[&k[0], &k[1], &k[2], &k[3]])
                .set(n);
        }
        self.apply_runout(snapshot, &labels);
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

/// Which pools keep labels of their own: the `MAX_POOL_PAIRS` largest by
/// machines; the others are their organization's `other`.
struct PoolLabels {
    kept: HashSet<(String, String, String)>,
}

impl PoolLabels {
    fn bounded(pools: &[PoolRow]) -> PoolLabels {
        let mut by_size: Vec<&PoolRow> = pools.iter().collect();
        by_size.sort_by(|a, b| {
            let size = |p: &PoolRow| p.sellable + p.held + p.sold + p.not_ready;
            size(b)
                .cmp(&size(a))
                .then_with(|| (&a.org, &a.site, &a.profile).cmp(&(&b.org, &b.site, &b.profile)))
        });
        PoolLabels {
            kept: by_size
                .into_iter()
                .take(MAX_POOL_PAIRS)
                .map(|p| (p.org.clone(), p.site.clone(), p.profile.clone()))
                .collect(),
        }
    }

    fn of(&self, org: &str, site: &str, profile: &str) -> [String; 3] {
        if self
            .kept
            .contains(&(org.to_owned(), site.to_owned(), profile.to_owned()))
        {
            [org.to_owned(), site.to_owned(), profile.to_owned()]
        } else {
            [org.to_owned(), OTHER.to_owned(), OTHER.to_owned()]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(org: &str, site: &str, sellable: i64) -> PoolRow {
        PoolRow {
            org: org.to_owned(),
            site: site.to_owned(),
            profile: "p".to_owned(),
            sellable,
            ..PoolRow::default()
        }
    }

    #[test]
    fn pools_past_the_bound_are_summed_under_their_organizations_other() {
        let mut pools: Vec<PoolRow> = (0..MAX_POOL_PAIRS)
            .map(|i| pool("big", &format!("s{i}"), 10))
            .collect();
        pools.push(pool("small", "par1", 1));
        pools.push(pool("small", "ams1", 2));
        let state = DbState::new();
        state.apply(
            &Snapshot {
                pools,
                ..Snapshot::default()
            },
            0.0,
        );
        let other = state
            .machines
            .with_label_values(&["small", OTHER, OTHER, "sellable"])
            .get();
        assert_eq!(other, 3);
        assert_eq!(
            state
                .machines
                .with_label_values(&["big", "s0", "p", "sellable"])
                .get(),
            10
        );
    }
}
