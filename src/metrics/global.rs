//! Process-wide series: counted where no `Metrics` is at hand (the error
//! boundaries, the webhook worker's deliveries), registered in every
//! registry.

use std::sync::LazyLock;

use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts};

use crate::db::Classified;

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
            "Database errors the API and the dashboard met, by SQLSTATE class (the code's first two characters; none: a code without one) and surface (api, dashboard)",
        ),
        &["class", "surface"],
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

impl Global {
    /// The series, for a registry.
    pub(super) fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.http_unavailable.clone()),
            Box::new(self.db_errors.clone()),
            Box::new(self.webhook_deliveries.clone()),
            Box::new(self.webhook_attempt.clone()),
        ]
    }

    /// Label sets present at 0 from the start, so that a rate over them is
    /// defined.
    pub(super) fn at_zero(&self) {
        for code in ["unavailable", "outcome_unknown"] {
            self.http_unavailable.with_label_values(&[code]);
        }
        for outcome in ["delivered", "failed"] {
            self.webhook_deliveries.with_label_values(&[outcome]);
        }
    }
}

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

/// The error boundary that met a database error: the `surface` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// The JSON API (`ApiError`).
    Api,
    /// The staff dashboard (`DashError`).
    Dashboard,
}

impl Surface {
    fn label(self) -> &'static str {
        match self {
            Surface::Api => "api",
            Surface::Dashboard => "dashboard",
        }
    }
}

/// Counts an error the database answered, by SQLSTATE class, as `db::classify`
/// read it; an error with no database error in its chain (a pool timeout,
/// a broken connection, a bug) is not one.
pub fn count_db_error(failure: &Classified<'_>, surface: Surface) {
    if failure.sqlstate.is_none() {
        return;
    }
    // A class is two characters of [0-9A-Z]; anything else is not a label
    // we let grow.
    let class = failure.sqlstate_class().unwrap_or("none");
    GLOBAL
        .db_errors
        .with_label_values(&[class, surface.label()])
        .inc();
}
