//! Prometheus metrics, served at `/metrics`.

use std::collections::HashSet;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::db::Db;
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
    pub refusal_labels: std::sync::Arc<RefusalLabels>,
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

// ---------------------------------------------------------------------------
// The refusal metric's bounded labels (issue 15)
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
