//! One delivery attempt: the signed POST and the delay before the next.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use tokio::time::Instant;

use super::outbox::{Attempt, Due};
use super::signatures::signature_header;
use super::urls::{REQUEST_TIMEOUT, check_ip, parse_url};

/// The longest delay between two attempts.
pub const BACKOFF_CAP: Duration = Duration::from_secs(3600);

/// Header names of a delivery (docs/webhooks.md).
pub const HEADER_EVENT_ID: &str = "Poolkeeper-Event-Id";
pub const HEADER_TIMESTAMP: &str = "Poolkeeper-Timestamp";
pub const HEADER_SIGNATURE: &str = "Poolkeeper-Signature";
pub const HEADER_ATTEMPT: &str = "Poolkeeper-Delivery-Attempt";

/// The delay before attempt `attempt + 1` after `attempt` failures:
/// base * 2^(attempt-1), capped, then "equal jitter" (a uniform draw in
/// [half, whole]) so that endpoints failing together do not retry together.
pub fn backoff(base: Duration, attempt: u32) -> Duration {
    let exp = attempt.saturating_sub(1).min(30);
    let whole = base.saturating_mul(1u32 << exp).min(BACKOFF_CAP);
    let half = whole / 2;
    let jitter = rand::rng().random_range(0.0..=1.0);
    half + half.mul_f64(jitter)
}

/// POSTs one delivery and says what came back. Never returns an error: a
/// failure is an attempt to record.
pub async fn post(client: &reqwest::Client, d: &Due, allow_private: bool) -> Attempt {
    let started = Instant::now();
    let fail = |error: String| Attempt {
        url: d.url.clone(),
        status: None,
        latency: started.elapsed(),
        error: Some(error),
    };
    let url = match parse_url(&d.url) {
        Ok(u) => u,
        Err(e) => return fail(e.to_string()),
    };
    // A literal address never reaches the resolver: check it here.
    let literal = match url.host() {
        Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
        _ => None,
    };
    if let Some(ip) = literal
        && let Err(e) = check_ip(ip, allow_private)
    {
        return fail(e.to_string());
    }
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|t| t.as_secs() as i64)
        .unwrap_or(0);
    let body = d.body.clone().into_bytes();
    let signature = signature_header(&d.secret, timestamp, &body);
    let sent = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(HEADER_EVENT_ID, d.event_id.to_string())
        .header(HEADER_TIMESTAMP, timestamp.to_string())
        .header(HEADER_SIGNATURE, signature)
        .header(HEADER_ATTEMPT, (d.attempts + 1).to_string())
        .body(body)
        .send()
        .await;
    match sent {
        Ok(resp) => {
            let status = resp.status();
            let error = if status.is_success() {
                None
            } else if status.is_redirection() {
                Some(format!(
                    "HTTP {}: redirects are not followed",
                    status.as_u16()
                ))
            } else {
                Some(format!("HTTP {}", status.as_u16()))
            };
            Attempt {
                url: d.url.clone(),
                status: Some(status.as_u16()),
                latency: started.elapsed(),
                error,
            }
        }
        Err(e) if e.is_timeout() => {
            fail(format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()))
        }
        Err(e) => fail(error_chain(&e)),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let base = Duration::from_secs(10);
        for attempt in 1..=5u32 {
            let whole = base * (1 << (attempt - 1));
            let d = backoff(base, attempt);
            assert!(d >= whole / 2 && d <= whole, "{attempt}: {d:?}");
        }
        assert!(backoff(base, 40) <= BACKOFF_CAP);
    }
}
