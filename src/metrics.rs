//! Prometheus metrics, served at `/metrics`.

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

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
    /// Refused reserves by reason, site and profile (issue 15); the site
    /// and profile labels are bounded by `refusal_labels`.
    pub reservations_refused: IntCounterVec,
    pub refusal_labels: std::sync::Arc<crate::demand::RefusalLabels>,
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
            registry,
        };
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
