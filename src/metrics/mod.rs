//! Prometheus metrics, served at `/metrics` (`ops`), by concern: this file
//! the registry and the `Metrics` handle with the series it owns;
//! `global` the process-wide series counted where no `Metrics` is at hand
//! (the error boundaries' 503s and database errors, webhook deliveries);
//! `refusals` the refusal metric's bounded labels; `http` the request
//! series; `snapshot` what the database says, read by one replica for all
//! at scrape time; `process` the build and the process's own numbers.
//! Callers use `crate::metrics::...`.

mod global;
mod http;
mod process;
mod refusals;
mod snapshot;

pub use global::*;
pub use http::*;
pub use process::*;
pub use refusals::*;
pub use snapshot::*;

use crate::db::Db;
use prometheus::{
    Encoder, Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
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
    /// R20: new orders by the pool asked and the pool that served them
    /// (`substituted` "true" when a declared substitute did); labels
    /// bounded as the refusals'.
    pub orders_served: IntCounterVec,
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
                "Reserves refused (unavailable: buy hardware; contended: retry; reserved: kept for a segment; customer_limit), by organization and by site and profile of its inventory (other: not in it)",
            ),
            &["reason", "org", "site", "profile"],
        )
        .expect("static metric definition");
        let orders_served = IntCounterVec::new(
            Opts::new(
                "poolkeeper_orders_served_total",
                "New orders held, by organization, site, the profile asked and the profile that served (substituted: true when a declared substitute served, R20)",
            ),
            &["org", "site", "profile_asked", "profile_served", "substituted"],
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
            orders_served,
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
        m.register_all();
        m
    }

    /// Every series in the registry, once; the global ones at zero.
    fn register_all(&self) {
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
        let mut collectors: Vec<Box<dyn prometheus::core::Collector>> =
            vec![Box::new(build_info), Box::new(self.sweep_period.clone())];
        collectors.extend(self.http.collectors());
        collectors.extend(self.db_state.collectors());
        collectors.extend(self.process.collectors());
        collectors.extend(GLOBAL.collectors());
        // The database handle's own series.
        collectors.push(Box::new(crate::db::READ_ONLY_SEEN_TOTAL.clone()));
        collectors.push(Box::new(crate::db::ACQUIRE_WAIT.clone()));
        for c in collectors {
            self.registry.register(c).expect("metric registered once");
        }
        GLOBAL.at_zero();
        for c in [
            &self.sweeps_run,
            &self.lease_acquired,
            &self.lease_lost,
            &self.lease_errors,
            &self.sweep_errors,
        ] {
            self.registry
                .register(Box::new(c.clone()))
                .expect("metric registered once");
        }
        self.registry
            .register(Box::new(self.reservations.clone()))
            .expect("metric registered once");
        self.registry
            .register(Box::new(self.reservations_expired.clone()))
            .expect("metric registered once");
        self.registry
            .register(Box::new(self.last_sweep_unixtime.clone()))
            .expect("metric registered once");
        self.registry
            .register(Box::new(self.reservations_refused.clone()))
            .expect("metric registered once");
        self.registry
            .register(Box::new(self.orders_served.clone()))
            .expect("metric registered once");
    }

    /// Refreshes what is read at scrape time (the database's numbers, at
    /// most once per `DB_STATE_MAX_AGE`; the process's), then renders.
    pub async fn scrape(&self, pool: &Db) -> String {
        self.db_state.refresh(pool).await;
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
