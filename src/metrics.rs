//! Prometheus metrics, served at `/metrics`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, RwLock};
use std::time::{Duration, Instant};

use crate::db::Db;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Every metric this process exports. Cloning shares the same counters.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub reservations: IntCounterVec,
    pub sweeps_run: IntCounter,
    pub reservations_expired: IntCounterVec,
    pub lease_acquired: IntCounter,
    pub lease_lost: IntCounter,
    pub lease_errors: IntCounter,
    pub last_sweep_unixtime: IntGauge,
    /// Sweep statements that failed with an error (the lease's own errors
    /// are in `lease_errors`).
    pub sweep_errors: IntCounter,
    /// Refused reserves by reason, site and profile; the site
    /// and profile labels are bounded by `refusal_labels`.
    pub reservations_refused: IntCounterVec,
    pub refusal_labels: std::sync::Arc<RefusalLabels>,
    pub http: Http,
    pub db_state: DbState,
    process: Process,
    /// The configured sweep period, so that rules can say "3 periods".
    pub sweep_period: Gauge,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let reservations = IntCounterVec::new(
            Opts::new(
                "poolkeeper_reserve_outcomes_total",
                "Reserve requests by outcome",
            ),
            &["outcome"],
        )
        .expect("static metric definition");
        let reservations_expired = IntCounterVec::new(
            Opts::new(
                "poolkeeper_reservations_expired_total",
                "Reservations marked expired, by who marked them",
            ),
            &["by"],
        )
        .expect("static metric definition");
        let reservations_refused = IntCounterVec::new(
            Opts::new(
                "poolkeeper_reservations_refused_total",
                "Reserves refused as unavailable (buy hardware) or contended (retry), by site and profile of the inventory (other: not in it)",
            ),
            &["reason", "site", "profile"],
        )
        .expect("static metric definition");
        let counter =
            |name: &str, help: &str| IntCounter::new(name, help).expect("static metric definition");
        let m = Metrics {
            reservations,
            sweeps_run: counter("poolkeeper_sweeps_total", "Sweeps completed by this replica"),
            reservations_expired,
            lease_acquired: counter("poolkeeper_lease_acquired_total", "Sweep leases acquired by this replica"),
            lease_lost: counter("poolkeeper_lease_lost_total", "Sweep leases this replica lost or stopped trusting"),
            lease_errors: counter(
                "poolkeeper_lease_errors_total",
                "Lease claims, heartbeats or releases that failed with an error (not because another replica held it)",
            ),
            last_sweep_unixtime: IntGauge::new(
                "poolkeeper_last_sweep_timestamp_seconds",
                "Unix time of this replica's last successful sweep (0: never); seconds since = time() - this",
            )
            .expect("static metric definition"),
            sweep_errors: counter(
                "poolkeeper_sweep_errors_total",
                "Sweep runs that failed with a database error or timeout (retried next period)",
            ),
            reservations_refused,
            refusal_labels: Default::default(),
            http: Http::new(),
            db_state: DbState::new(),
            process: Process::new(),
            sweep_period: Gauge::new(
                "poolkeeper_sweep_period_seconds",
                "The sweep period this replica is configured with (POOLKEEPER_SWEEP_PERIOD)",
            )
            .expect("static metric definition"),
            registry,
        };
        let build_info = IntGaugeVec::new(
            Opts::new(
                "poolkeeper_build_info",
                "Always 1; the labels say which build runs",
            ),
            &["version", "git_commit"],
        )
        .expect("static metric definition");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), GIT_COMMIT])
            .set(1);
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(build_info),
            Box::new(m.http.duration.clone()),
            Box::new(m.http.in_flight.clone()),
            Box::new(m.db_state.machines.clone()),
            Box::new(m.db_state.headroom.clone()),
            Box::new(m.db_state.available.clone()),
            Box::new(m.db_state.holds_expiring_soon.clone()),
            Box::new(m.db_state.holds_overdue.clone()),
            Box::new(m.db_state.webhooks_pending.clone()),
            Box::new(m.db_state.webhooks_oldest_pending.clone()),
            Box::new(m.db_state.sweep_age.clone()),
            Box::new(m.db_state.lease_holders.clone()),
            Box::new(m.db_state.pool_connections.clone()),
            Box::new(m.db_state.scrape_errors.clone()),
            Box::new(m.db_state.reads.clone()),
            Box::new(m.sweep_period.clone()),
            Box::new(m.process.cpu.clone()),
            Box::new(m.process.resident.clone()),
            Box::new(m.process.virtual_memory.clone()),
            Box::new(m.process.open_fds.clone()),
            Box::new(m.process.start_time.clone()),
            Box::new(m.process.threads.clone()),
            Box::new(GLOBAL.http_unavailable.clone()),
            Box::new(GLOBAL.db_errors.clone()),
            Box::new(crate::db::READ_ONLY_SEEN_TOTAL.clone()),
            Box::new(crate::db::ACQUIRE_WAIT.clone()),
            Box::new(GLOBAL.webhook_deliveries.clone()),
            Box::new(GLOBAL.webhook_attempt.clone()),
        ];
        for c in collectors {
            m.registry.register(c).expect("metric registered once");
        }
        // Present at 0 from the start, so that a rate over them is defined.
        for code in ["unavailable", "outcome_unknown"] {
            GLOBAL.http_unavailable.with_label_values(&[code]);
        }
        for outcome in ["delivered", "failed"] {
            GLOBAL.webhook_deliveries.with_label_values(&[outcome]);
        }
        for c in [
            &m.sweeps_run,
            &m.lease_acquired,
            &m.lease_lost,
            &m.lease_errors,
            &m.sweep_errors,
        ] {
            m.registry
                .register(Box::new(c.clone()))
                .expect("metric registered once");
        }
        m.registry
            .register(Box::new(m.reservations.clone()))
            .expect("metric registered once");
        m.registry
            .register(Box::new(m.reservations_expired.clone()))
            .expect("metric registered once");
        m.registry
            .register(Box::new(m.last_sweep_unixtime.clone()))
            .expect("metric registered once");
        m.registry
            .register(Box::new(m.reservations_refused.clone()))
            .expect("metric registered once");
        m
    }

    /// Refreshes what is read at scrape time (the database's numbers, at
    /// most once per `DB_STATE_MAX_AGE`; the process's), then renders.
    pub async fn scrape(&self, pool: &Db, machines: &MachinesSql) -> String {
        self.db_state.refresh(pool, machines).await;
        self.process.refresh();
        self.render()
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

// ---------------------------------------------------------------------------
// The refusal metric's bounded labels
// ---------------------------------------------------------------------------

/// The label value of a site or profile not in the inventory.
pub const OTHER: &str = "other";

/// How old the known set may be before an unknown name triggers a refresh.
pub const LABELS_MAX_AGE: Duration = Duration::from_secs(30);

/// The sites and profiles of the inventory (every organization's), kept in
/// process so that labelling a refusal costs no query. A name outside the
/// set is `other`, so a caller sending random sites cannot grow the metric
/// without bound. The set is read at the first refusal, then again only
/// when a refusal names something unknown and the set is older than
/// `LABELS_MAX_AGE`: at most one query per 30 s per process, and none at
/// all while refusals name known sites and profiles. (A periodic refresh
/// would query even when nobody is refused; a query per refusal would put
/// a scan of `machines` on the 409 path.) One refresh at a time: a
/// concurrent refusal labels with the set it finds.
#[derive(Debug, Default)]
pub struct RefusalLabels {
    known: RwLock<Known>,
    refreshing: AtomicBool,
}

#[derive(Debug, Default)]
struct Known {
    sites: HashSet<String>,
    profiles: HashSet<String>,
    read_at: Option<Instant>,
}

impl Known {
    fn label(&self, site: &str, profile: &str) -> (String, String, bool) {
        let s = self.sites.contains(site);
        let p = self.profiles.contains(profile);
        (
            if s { site } else { OTHER }.to_owned(),
            if p { profile } else { OTHER }.to_owned(),
            s && p,
        )
    }

    fn stale(&self) -> bool {
        self.read_at.is_none_or(|at| at.elapsed() >= LABELS_MAX_AGE)
    }
}

impl RefusalLabels {
    /// The (site, profile) labels of a refusal for `spec`.
    pub async fn labels(&self, pool: &Db, site: &str, profile: &str) -> (String, String) {
        let (s, p, all_known, stale) = {
            let known = self.known.read().unwrap_or_else(|e| e.into_inner());
            let (s, p, all) = known.label(site, profile);
            (s, p, all, known.stale())
        };
        if all_known || !stale || self.refreshing.swap(true, Ordering::AcqRel) {
            return (s, p);
        }
        // Cleared on drop: a request dropped mid-refresh (its client went
        // away) must not leave the set frozen.
        let _refreshing = ClearOnDrop(&self.refreshing);
        if let Err(e) = self.refresh(pool).await {
            tracing::warn!(error = %e, "could not read the inventory's sites and profiles for metric labels");
            return (s, p);
        }
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        let (s, p, _) = known.label(site, profile);
        (s, p)
    }

    /// Reads the inventory's sites and profiles now.
    pub async fn refresh(&self, pool: &Db) -> Result<(), sqlx::Error> {
        let (sites, profiles): (Vec<String>, Vec<String>) = sqlx::query_as(
            "SELECT coalesce(array_agg(DISTINCT site), '{}'), coalesce(array_agg(DISTINCT profile), '{}')
               FROM machines",
        )
        .fetch_one(pool)
        .await?;
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        known.sites = sites.into_iter().collect();
        known.profiles = profiles.into_iter().collect();
        known.read_at = Some(Instant::now());
        Ok(())
    }
}

struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

// ---------------------------------------------------------------------------
// Process-wide series: counted where no `Metrics` is at hand (the error
// boundary, the pool's connect hook), registered in every registry.
// ---------------------------------------------------------------------------

/// The series counted from code that has no `Metrics` to hand.
pub struct Global {
    pub http_unavailable: IntCounterVec,
    pub db_errors: IntCounterVec,
    pub webhook_deliveries: IntCounterVec,
    pub webhook_attempt: Histogram,
}

pub static GLOBAL: LazyLock<Global> = LazyLock::new(|| {
    Global {
    http_unavailable: IntCounterVec::new(
        Opts::new(
            "poolkeeper_http_unavailable_total",
            "503 answers of the API by error code (unavailable: the database cannot answer; outcome_unknown: the connection was lost during a write, F3)",
        ),
        &["code"],
    )
    .expect("static metric definition"),
    db_errors: IntCounterVec::new(
        Opts::new(
            "poolkeeper_db_errors_total",
            "Statement errors the API met, by SQLSTATE class (the code's first two characters; none: not a server error)",
        ),
        &["class"],
    )
    .expect("static metric definition"),
    webhook_deliveries: IntCounterVec::new(
        Opts::new(
            "poolkeeper_webhook_deliveries_total",
            "Webhook deliveries this replica finished: delivered (a 2xx) or failed (retries ran out)",
        ),
        &["outcome"],
    )
    .expect("static metric definition"),
    webhook_attempt: Histogram::with_opts(
        HistogramOpts::new(
            "poolkeeper_webhook_attempt_duration_seconds",
            "Duration of one webhook POST, whatever its answer",
        )
        .buckets(vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
    )
    .expect("static metric definition"),
}
});

/// Counts a delivery that reached a final state.
pub fn count_webhook_delivery(state: &str) {
    if matches!(state, "delivered" | "failed") {
        GLOBAL.webhook_deliveries.with_label_values(&[state]).inc();
    }
}

/// Counts a 503 by its code.
pub fn count_unavailable(code: &str) {
    GLOBAL.http_unavailable.with_label_values(&[code]).inc();
}

/// Counts a statement error by SQLSTATE class, from anywhere in the chain.
pub fn count_db_error(err: &(dyn std::error::Error + 'static)) {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>() {
            let class: String = db
                .code()
                .map(|c| c.chars().take(2).collect())
                .unwrap_or_default();
            // A class is two characters of [0-9A-Z]; anything else is not
            // a label we let grow.
            let class = if class.len() == 2 && class.chars().all(|c| c.is_ascii_alphanumeric()) {
                class
            } else {
                "none".to_owned()
            };
            GLOBAL.db_errors.with_label_values(&[class.as_str()]).inc();
            return;
        }
        cur = e.source();
    }
}

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

/// Request series, observed by the middleware of `startup`.
#[derive(Clone)]
pub struct Http {
    pub duration: HistogramVec,
    pub in_flight: IntGauge,
}

impl Http {
    fn new() -> Http {
        Http {
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "poolkeeper_http_request_duration_seconds",
                    "HTTP requests by route template (unmatched: no route), method and status class; _count is the request count",
                )
                .buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ]),
                &["route", "method", "status"],
            )
            .expect("static metric definition"),
            in_flight: IntGauge::new(
                "poolkeeper_http_requests_in_flight",
                "HTTP requests being handled now",
            )
            .expect("static metric definition"),
        }
    }

    /// Records one request; `route` is the matched template, never the path.
    pub fn observe(&self, route: Option<&str>, method: &str, status: u16, seconds: f64) {
        let method = match method {
            "GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS" => method,
            _ => "other",
        };
        let class = match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.duration
            .with_label_values(&[route.unwrap_or("unmatched"), method, class])
            .observe(seconds);
    }
}

// ---------------------------------------------------------------------------
// What the database says, read at scrape time and cached
// ---------------------------------------------------------------------------

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
    fn new() -> DbState {
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

// ---------------------------------------------------------------------------
// Build and process
// ---------------------------------------------------------------------------

/// The commit the binary was built from (build.rs; `unknown` outside git).
pub const GIT_COMMIT: &str = match option_env!("POOLKEEPER_GIT_COMMIT") {
    Some(c) => c,
    None => "unknown",
};

/// Process series read from /proc at scrape time (Linux; absent elsewhere).
#[derive(Clone)]
pub struct Process {
    cpu: prometheus::Counter,
    resident: IntGauge,
    virtual_memory: IntGauge,
    open_fds: IntGauge,
    start_time: Gauge,
    threads: IntGauge,
}

impl Process {
    fn new() -> Process {
        let g =
            |name: &str, help: &str| IntGauge::new(name, help).expect("static metric definition");
        let p = Process {
            cpu: prometheus::Counter::new(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds",
            )
            .expect("static metric definition"),
            resident: g(
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
            ),
            virtual_memory: g(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
            ),
            open_fds: g("process_open_fds", "Number of open file descriptors"),
            start_time: Gauge::new(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
            )
            .expect("static metric definition"),
            threads: g("process_threads", "Number of OS threads in the process"),
        };
        if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            p.start_time
                .set(now.as_secs_f64() - PROCESS_START.elapsed().as_secs_f64());
        }
        p
    }

    fn refresh(&self) {
        // /proc/self/stat: fields after the command's closing parenthesis;
        // utime and stime are the 12th and 13th of them, in clock ticks
        // (100 per second on Linux), num_threads the 18th, vsize the 21st
        // and rss (pages) the 22nd.
        let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
            return;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            return;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let cpu = (num(11) + num(12)) as f64 / 100.0;
        let delta = cpu - self.cpu.get();
        if delta > 0.0 {
            self.cpu.inc_by(delta);
        }
        self.threads.set(num(17) as i64);
        self.virtual_memory.set(num(20) as i64);
        self.resident.set(num(21) as i64 * 4096);
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(dir.count() as i64);
        }
    }
}

static PROCESS_START: LazyLock<Instant> = LazyLock::new(Instant::now);
