//! Percentiles and medians. Latencies are kept whole (every sample), so the
//! percentiles are exact for the run, not estimates.

use std::time::Duration;

/// The `q`-quantile (0..=1) of `samples` by nearest rank; 0 when empty.
pub fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let rank = (q * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

/// The median of `values` (the middle one; the lower middle of an even count
/// would bias down, so the mean of the two middles).
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Latency summary of one run.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub samples: usize,
}

impl Latency {
    pub fn of(samples: &mut [Duration]) -> Latency {
        Latency {
            p50_ms: ms(percentile(samples, 0.50)),
            p99_ms: ms(percentile(samples, 0.99)),
            max_ms: ms(percentile(samples, 1.0)),
            samples: samples.len(),
        }
    }

    /// The median, field by field, of several runs' summaries.
    pub fn median_of(runs: &[Latency]) -> Latency {
        let f = |get: fn(&Latency) -> f64| median(&runs.iter().map(get).collect::<Vec<_>>());
        Latency {
            p50_ms: f(|l| l.p50_ms),
            p99_ms: f(|l| l.p99_ms),
            max_ms: f(|l| l.max_ms),
            samples: runs.iter().map(|l| l.samples).sum(),
        }
    }
}
