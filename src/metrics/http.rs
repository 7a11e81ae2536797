//! The request series: duration by route template, method and status
//! class, and the requests in flight.

use prometheus::{HistogramOpts, HistogramVec, IntGauge};

/// Request series, observed by the middleware of `startup`.
#[derive(Clone)]
pub struct Http {
    pub duration: HistogramVec,
    pub in_flight: IntGauge,
}

impl Http {
    pub(super) fn new() -> Http {
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

    /// The series, for a registry.
    pub(super) fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.duration.clone()),
            Box::new(self.in_flight.clone()),
        ]
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
