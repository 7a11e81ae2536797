//! Reservation events for the order service (issue 15, part 2): each
//! organization may register one webhook URL; every event of its
//! reservations is put in the outbox (`webhook_deliveries`) by a trigger in
//! the transaction that wrote the event (see `sql/webhook_outbox.sql` for
//! why a trigger and why no cursor), and
//! the delivery worker here POSTs it, signed, at least once.
//!
//! The worker runs on every replica; the lease of key `webhooks` keeps it on
//! one (held by `lease::Holder`, as the sweep's, L1-L6). Every write made on
//! behalf of the lease carries its holder and fence and checks them in the
//! same statement, with the lease row taken FOR SHARE: a paused holder that
//! wakes after losing the lease may POST (a duplicate, allowed) but records
//! nothing. A holder killed mid-batch recorded nothing for what it was
//! sending, so the next holder sends it again: duplicates, never losses.
//!
//! Order and isolation: a delivery is due only when no earlier event of the
//! same reservation is pending, so one reservation's events arrive in order.
//! Different reservations and organizations go concurrently (bounded), with
//! at most `PER_ORG` in flight per organization, so a slow or failing
//! endpoint holds only its own organization's slots; the sweep has its own
//! lease, pool and task and never waits on this worker.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::db::Db;
use base64::Engine;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use rand::{Rng, RngCore};
use serde::Serialize;
use sha2::Sha256;
use sqlx::PgConnection;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout};

use crate::lease::{Holder, LIVE_LEASE, Terms, Timings};
use crate::metrics::Metrics;
use crate::settings::{DbPooler, Settings};

/// The lease key of the delivery worker.
pub const WEBHOOKS_KEY: &str = "webhooks";

/// A request to the receiver gives up after this long (issue 15).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Deliveries in flight at once, all organizations together.
pub const CONCURRENCY: usize = 32;

/// Deliveries in flight at once for one organization: a slow endpoint holds
/// these slots and no more.
pub const PER_ORG: usize = 8;

/// The longest delay between two attempts.
pub const BACKOFF_CAP: Duration = Duration::from_secs(3600);

/// The longest URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// Header names of a delivery (README: "Webhooks").
pub const HEADER_EVENT_ID: &str = "Poolkeeper-Event-Id";
pub const HEADER_TIMESTAMP: &str = "Poolkeeper-Timestamp";
pub const HEADER_SIGNATURE: &str = "Poolkeeper-Signature";
pub const HEADER_ATTEMPT: &str = "Poolkeeper-Delivery-Attempt";

// ---------------------------------------------------------------------------
// URLs and addresses
// ---------------------------------------------------------------------------

/// Why a webhook URL or the address it resolves to is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("the URL is not valid: {0}")]
    Malformed(String),
    #[error("the URL must start with http:// or https://")]
    Scheme,
    #[error("the URL must be at most 2048 characters")]
    TooLong,
    #[error("the URL must not carry a user name or password")]
    Credentials,
    #[error("the URL's host {0} does not resolve")]
    Unresolved(String),
    #[error(
        "the URL's host resolves to {0}, a loopback, private, link-local or unspecified address; \
         this deployment does not call those (POOLKEEPER_WEBHOOK_ALLOW_PRIVATE)"
    )]
    Private(IpAddr),
}

/// Parses a webhook URL: http(s), a host, no credentials, no fragment, at
/// most 2048 characters. Says nothing yet about where the host points.
pub fn parse_url(raw: &str) -> Result<reqwest::Url, UrlError> {
    let raw = raw.trim();
    if raw.len() > MAX_URL_LEN {
        return Err(UrlError::TooLong);
    }
    let url = reqwest::Url::parse(raw).map_err(|e| UrlError::Malformed(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlError::Scheme);
    }
    if url.host().is_none() {
        return Err(UrlError::Malformed("no host".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlError::Credentials);
    }
    if url.fragment().is_some() {
        return Err(UrlError::Malformed("a fragment is never sent".into()));
    }
    Ok(url)
}

/// Loopback, private, link-local, unspecified (and their IPv6 and
/// IPv4-mapped forms), shared (CGNAT), multicast and broadcast addresses:
/// none of them is a customer's public endpoint, and each may be a service
/// of the provider's own network.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
        }
    }
}

/// Refuses an internal address unless the deployment allows them.
pub fn check_ip(ip: IpAddr, allow_private: bool) -> Result<(), UrlError> {
    if !allow_private && is_internal(ip) {
        return Err(UrlError::Private(ip));
    }
    Ok(())
}

/// Resolves the URL's host and checks every address it gives (registration
/// time). Delivery checks again, in the resolver of the connection itself,
/// so a name that later resolves elsewhere (DNS rebinding) is refused then.
pub async fn check_destination(url: &reqwest::Url, allow_private: bool) -> Result<(), UrlError> {
    let port = url.port_or_known_default().unwrap_or(443);
    match url.host() {
        Some(url::Host::Ipv4(ip)) => check_ip(IpAddr::V4(ip), allow_private),
        Some(url::Host::Ipv6(ip)) => check_ip(IpAddr::V6(ip), allow_private),
        Some(url::Host::Domain(name)) => {
            let addrs = resolve_checked(name, port, allow_private).await?;
            if addrs.is_empty() {
                return Err(UrlError::Unresolved(name.to_owned()));
            }
            Ok(())
        }
        None => Err(UrlError::Malformed("no host".into())),
    }
}

/// Every address of `name`, or the first refused one as an error.
async fn resolve_checked(
    name: &str,
    port: u16,
    allow_private: bool,
) -> Result<Vec<SocketAddr>, UrlError> {
    // Bounded like the request itself: a registration never hangs on DNS.
    let addrs: Vec<SocketAddr> = timeout(REQUEST_TIMEOUT, tokio::net::lookup_host((name, port)))
        .await
        .map_err(|_| UrlError::Unresolved(name.to_owned()))?
        .map_err(|_| UrlError::Unresolved(name.to_owned()))?
        .collect();
    for a in &addrs {
        check_ip(a.ip(), allow_private)?;
    }
    Ok(addrs)
}

/// The HTTP client's resolver: the addresses the connection will use are
/// the ones checked, so there is no window between check and connect.
struct GuardedResolver {
    allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let addrs = resolve_checked(name.as_str(), 0, allow_private).await?;
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// The delivery client: 5 s per request, no redirects (a 3xx is a failed
/// attempt: following it would let the receiver send us anywhere, internal
/// addresses included), no proxy from the environment, checked resolution.
pub fn http_client(allow_private: bool) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver { allow_private }))
        .user_agent(concat!("poolkeeper-webhooks/", env!("CARGO_PKG_VERSION")))
        .build()
}

// ---------------------------------------------------------------------------
// Secrets and signatures
// ---------------------------------------------------------------------------

/// A fresh signing secret: 32 random bytes, URL-safe base64, prefixed.
pub fn generate_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "whsec_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// HMAC-SHA256 over `"{timestamp}.{body}"` with the secret's bytes, in
/// lower-case hex. The timestamp is inside the MAC so that a captured
/// request cannot be replayed later under a fresh timestamp.
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    // new_from_slice accepts keys of any length for HMAC.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The `Poolkeeper-Signature` header: `t=TIMESTAMP,v1=HEX`.
pub fn signature_header(secret: &str, timestamp: i64, body: &[u8]) -> String {
    format!("t={timestamp},v1={}", sign(secret, timestamp, body))
}

// ---------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------

/// An organization's webhook, with its secret (admins and `orders` tokens of
/// the organization see it; README says why).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Webhook {
    pub url: String,
    pub secret: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub updated_by: String,
}

const WEBHOOK_COLUMNS: &str = "url, secret, created_at, updated_at, updated_by";

pub async fn get<'c>(
    db: impl sqlx::PgExecutor<'c>,
    org_id: i64,
) -> Result<Option<Webhook>, sqlx::Error> {
    let sql = format!("SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE org_id = $1");
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .fetch_optional(db)
        .await
}

/// What a registration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    Created,
    Updated,
}

/// Sets the organization's webhook URL (already checked by the caller with
/// `parse_url` and `check_destination`). A new webhook gets a fresh secret;
/// a changed URL keeps its secret unless `rotate` is set, so the receiver
/// need not change its key to move. Pending deliveries go to the new URL.
pub async fn set_on(
    conn: &mut PgConnection,
    org_id: i64,
    url: &str,
    rotate: bool,
    actor: &str,
) -> Result<(Webhook, Saved), sqlx::Error> {
    let sql = format!(
        "INSERT INTO webhooks (org_id, url, secret, updated_by) VALUES ($1, $2, $3, $4)
         ON CONFLICT (org_id) DO UPDATE
            SET url = EXCLUDED.url,
                secret = CASE WHEN $5 THEN EXCLUDED.secret ELSE webhooks.secret END,
                updated_at = clock_timestamp(),
                updated_by = EXCLUDED.updated_by
         RETURNING {WEBHOOK_COLUMNS}, (xmax = 0) AS inserted"
    );
    let row: (String, String, DateTime<Utc>, DateTime<Utc>, String, bool) =
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(org_id)
            .bind(url)
            .bind(generate_secret())
            .bind(actor)
            .bind(rotate)
            .fetch_one(conn)
            .await?;
    let (url, secret, created_at, updated_at, updated_by, inserted) = row;
    Ok((
        Webhook {
            url,
            secret,
            created_at,
            updated_at,
            updated_by,
        },
        if inserted {
            Saved::Created
        } else {
            Saved::Updated
        },
    ))
}

/// Gives the organization's webhook a new secret; false when it has none.
pub async fn rotate_secret_on(
    conn: &mut PgConnection,
    org_id: i64,
    actor: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE webhooks SET secret = $2, updated_at = clock_timestamp(), updated_by = $3
          WHERE org_id = $1",
    )
    .bind(org_id)
    .bind(generate_secret())
    .bind(actor)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(done == 1)
}

/// Removes the organization's webhook; its pending deliveries are dropped
/// (nobody to send them to). Returns how many were dropped, or None when
/// there was no webhook.
pub async fn remove_on(conn: &mut PgConnection, org_id: i64) -> Result<Option<i64>, sqlx::Error> {
    let removed = sqlx::query("DELETE FROM webhooks WHERE org_id = $1")
        .bind(org_id)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if removed == 0 {
        return Ok(None);
    }
    let dropped = sqlx::query(
        "UPDATE webhook_deliveries
            SET state = 'dropped', finished_at = clock_timestamp(), last_error = 'webhook removed'
          WHERE org_id = $1 AND state = 'pending'",
    )
    .bind(org_id)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(Some(dropped as i64))
}

/// Counts for the settings page and `/jobs`.
#[derive(Debug, Clone, Default, sqlx::FromRow)]
pub struct Backlog {
    pub pending: i64,
    pub due: i64,
    pub oldest_pending: Option<DateTime<Utc>>,
    pub delivered_24h: i64,
    pub failed_24h: i64,
}

/// The backlog of one organization, or of all when `org_id` is None.
pub async fn backlog(pool: &Db, org_id: Option<i64>) -> Result<Backlog, sqlx::Error> {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'pending') AS pending,
                count(*) FILTER (WHERE state = 'pending' AND next_attempt_at <= clock_timestamp()) AS due,
                min(created_at) FILTER (WHERE state = 'pending') AS oldest_pending,
                count(*) FILTER (WHERE state = 'delivered'
                                   AND finished_at > clock_timestamp() - interval '24 hours') AS delivered_24h,
                count(*) FILTER (WHERE state = 'failed'
                                   AND finished_at > clock_timestamp() - interval '24 hours') AS failed_24h
           FROM webhook_deliveries
          WHERE (state = 'pending' OR finished_at > clock_timestamp() - interval '24 hours')
            AND ($1::bigint IS NULL OR org_id = $1)",
    )
    .bind(org_id)
    .fetch_one(pool)
    .await
}

/// One failed attempt, for the settings page and `/jobs`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Failure {
    pub at: DateTime<Utc>,
    pub org_slug: String,
    pub event_id: i64,
    pub url: String,
    pub status: Option<i32>,
    pub latency_ms: i32,
    pub error: String,
    pub replica: String,
}

/// The last failed attempts, of one organization or of all.
pub async fn recent_failures(
    pool: &Db,
    org_id: Option<i64>,
    limit: i64,
) -> Result<Vec<Failure>, sqlx::Error> {
    sqlx::query_as(
        "SELECT a.at, o.slug AS org_slug, d.event_id, a.url, a.status, a.latency_ms,
                a.error, a.replica
           FROM webhook_attempts a
           JOIN webhook_deliveries d ON d.id = a.delivery_id
           JOIN organizations o ON o.id = a.org_id
          WHERE a.error IS NOT NULL AND ($1::bigint IS NULL OR a.org_id = $1)
          ORDER BY a.at DESC LIMIT $2",
    )
    .bind(org_id)
    .bind(limit)
    .fetch_all(pool)
    .await
}

// ---------------------------------------------------------------------------
// Fenced writes of the delivery worker
// ---------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    /// The fence check in the statement failed: the lease is no longer ours.
    #[error("the webhooks lease is no longer held under this fence")]
    Lost,
    #[error("webhook statement took longer than {0:?}")]
    TimedOut(Duration),
    #[error("webhook statement failed: {0}")]
    Database(#[from] sqlx::Error),
}

/// A due delivery, with where to send it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Due {
    pub id: i64,
    pub org_id: i64,
    pub reservation_id: i64,
    pub event_id: i64,
    pub attempts: i32,
    pub body: String,
    pub url: String,
    pub secret: String,
}

/// Pending deliveries whose time has come and whose reservation has no
/// earlier pending event, at most `per_org` per organization, oldest first,
/// leaving out `in_flight`. A read: nothing is written or locked, so a
/// replica killed after it leaves nothing to clean up.
pub async fn due<'c>(
    db: impl sqlx::PgExecutor<'c>,
    in_flight: &[i64],
    per_org: i64,
    limit: i64,
) -> Result<Vec<Due>, sqlx::Error> {
    sqlx::query_as(
        "WITH ready AS (
             SELECT d.id, d.org_id, d.next_attempt_at, d.event_id,
                    row_number() OVER (PARTITION BY d.org_id
                                       ORDER BY d.next_attempt_at, d.event_id) AS n
               FROM webhook_deliveries d
              WHERE d.state = 'pending' AND d.next_attempt_at <= clock_timestamp()
                AND d.id <> ALL ($1)
                AND NOT EXISTS (
                    SELECT 1 FROM webhook_deliveries p
                     WHERE p.reservation_id = d.reservation_id AND p.state = 'pending'
                       AND p.event_id < d.event_id)
         )
         SELECT d.id, d.org_id, d.reservation_id, d.event_id, d.attempts,
                d.payload::text AS body, w.url, w.secret
           FROM ready
           JOIN webhook_deliveries d ON d.id = ready.id
           JOIN webhooks w ON w.org_id = d.org_id
          WHERE ready.n <= $2
          ORDER BY ready.next_attempt_at, ready.event_id
          LIMIT $3",
    )
    .bind(in_flight)
    .bind(per_org)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// What one attempt came to.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub url: String,
    pub status: Option<u16>,
    pub latency: Duration,
    /// None on success (a 2xx).
    pub error: Option<String>,
}

impl Attempt {
    pub fn succeeded(&self) -> bool {
        self.error.is_none()
    }
}

/// Records an attempt and moves the delivery on (delivered; failed once
/// `give_up` has passed since the event; else pending until `retry_in`
/// from now), in one statement; `Lost` (and nothing written) unless the
/// mandate is live. Returns the delivery's new state, or None when it was
/// no longer pending (another holder recorded it first).
#[allow(clippy::too_many_arguments)]
pub async fn record_attempt<'c>(
    db: impl sqlx::PgExecutor<'c>,
    replica: &str,
    fence: i64,
    delivery_id: i64,
    attempt: &Attempt,
    retry_in: Duration,
    give_up: Duration,
) -> Result<Option<String>, DeliveryError> {
    let sql = format!(
        "WITH {LIVE_LEASE},
         upd AS (
             UPDATE webhook_deliveries d
                SET attempts = d.attempts + 1,
                    last_status = $5,
                    last_error = $6,
                    state = CASE WHEN $6 IS NULL THEN 'delivered'
                                 WHEN d.created_at + make_interval(secs => $8) <= clock_timestamp()
                                      THEN 'failed'
                                 ELSE 'pending' END,
                    finished_at = CASE WHEN $6 IS NULL THEN clock_timestamp()
                                       WHEN d.created_at + make_interval(secs => $8) <= clock_timestamp()
                                            THEN clock_timestamp() END,
                    next_attempt_at = CASE WHEN $6 IS NULL THEN d.next_attempt_at
                                           ELSE clock_timestamp() + make_interval(secs => $7) END
              WHERE d.id = $4 AND d.state = 'pending' AND EXISTS (SELECT 1 FROM lease)
             RETURNING d.id, d.org_id, d.state
         ),
         att AS (
             INSERT INTO webhook_attempts
                    (delivery_id, org_id, url, status, latency_ms, error, replica, lease_fence)
             SELECT upd.id, upd.org_id, $9, $5, $10, $6, $2, l.fence
               FROM upd CROSS JOIN lease l
         )
         SELECT (SELECT count(*) FROM lease) AS live, (SELECT state FROM upd) AS state"
    );
    let (live, state): (i64, Option<String>) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(WEBHOOKS_KEY)
        .bind(replica)
        .bind(fence)
        .bind(delivery_id)
        .bind(attempt.status.map(i32::from))
        .bind(attempt.error.as_deref())
        .bind(retry_in.as_secs_f64())
        .bind(give_up.as_secs_f64())
        .bind(&attempt.url)
        .bind(i32::try_from(attempt.latency.as_millis()).unwrap_or(i32::MAX))
        .fetch_one(db)
        .await?;
    if live == 0 {
        return Err(DeliveryError::Lost);
    }
    Ok(state)
}

/// Drops pending deliveries of organizations that have no webhook any more
/// (an event that committed just after its organization removed the
/// webhook); fenced like every write of the worker.
pub async fn drop_orphans<'c>(
    db: impl sqlx::PgExecutor<'c>,
    replica: &str,
    fence: i64,
) -> Result<u64, DeliveryError> {
    let sql = format!(
        "WITH {LIVE_LEASE},
         dropped AS (
             UPDATE webhook_deliveries d
                SET state = 'dropped', finished_at = clock_timestamp(), last_error = 'webhook removed'
              WHERE d.state = 'pending' AND EXISTS (SELECT 1 FROM lease)
                AND NOT EXISTS (SELECT 1 FROM webhooks w WHERE w.org_id = d.org_id)
             RETURNING d.id
         )
         SELECT (SELECT count(*) FROM lease) AS live, (SELECT count(*) FROM dropped) AS dropped"
    );
    let (live, dropped): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(WEBHOOKS_KEY)
        .bind(replica)
        .bind(fence)
        .fetch_one(db)
        .await?;
    if live == 0 {
        return Err(DeliveryError::Lost);
    }
    Ok(dropped as u64)
}

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

// ---------------------------------------------------------------------------
// The worker
// ---------------------------------------------------------------------------

/// Timings of the worker, derived from `Settings`.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub replica: String,
    pub poll: Duration,
    /// The lease's timings (`POOLKEEPER_WEBHOOK_LEASE_SECONDS`), the
    /// worker's call bounds among them.
    pub lease: Timings,
    pub backoff_base: Duration,
    pub give_up: Duration,
    pub allow_private: bool,
}

impl WorkerConfig {
    pub fn from_settings(settings: &Settings) -> WorkerConfig {
        WorkerConfig {
            replica: settings.replica.clone(),
            poll: settings.webhook_poll,
            lease: Timings::for_lease(settings.webhook_lease_duration),
            backoff_base: settings.webhook_backoff_base,
            give_up: settings.webhook_give_up,
            allow_private: settings.webhook_allow_private,
        }
    }
}

/// The delivery worker, run on every replica by `serve` until `shutdown`
/// turns true. Errors are logged and it tries again next poll; on shutdown
/// it lets in-flight deliveries finish (each is bounded by the request
/// timeout), then releases the lease.
pub async fn run(
    pool: &Db,
    settings: &Settings,
    metrics: Metrics,
    shutdown: watch::Receiver<bool>,
) {
    let config = WorkerConfig::from_settings(settings);
    let http = match http_client(config.allow_private) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the webhook HTTP client; no webhook is delivered by this replica");
            return;
        }
    };
    // Its own small pool, like the sweep's: HTTP load cannot starve it, and
    // a slow receiver holds no connection (the POST runs outside any
    // statement).
    let worker_pool = pool.worker_pool(
        "poolkeeper-webhooks",
        4,
        &config.lease,
        settings.db_pooler == DbPooler::Transaction,
    );
    let terms = Terms {
        key: WEBHOOKS_KEY,
        replica: config.replica.clone(),
        timings: config.lease,
        work: "delivering",
    };
    let lease = Holder::new(worker_pool.clone(), metrics, terms);
    let mut worker = Worker {
        pool: worker_pool.clone(),
        http,
        config,
        shutdown,
        stopping: false,
        lease,
        tasks: JoinSet::new(),
        in_flight: HashMap::new(),
    };
    worker.run().await;
    worker_pool.close().await;
}

/// What a delivery task reports back.
struct Done {
    id: i64,
    org_id: i64,
    outcome: Result<Option<String>, DeliveryError>,
}

struct Worker {
    pool: Db,
    http: reqwest::Client,
    config: WorkerConfig,
    shutdown: watch::Receiver<bool>,
    stopping: bool,
    lease: Holder,
    tasks: JoinSet<Done>,
    /// Delivery id -> organization, for everything in `tasks`.
    in_flight: HashMap<i64, i64>,
}

impl Worker {
    async fn run(&mut self) {
        tracing::info!(
            replica = %self.config.replica,
            poll_ms = self.config.poll.as_millis() as u64,
            lease_s = self.config.lease.lease_duration.as_secs_f64(),
            "webhook delivery worker started"
        );
        let mut next_poll = Instant::now();
        while !self.stop_requested() {
            let wake = self.lease.wake(next_poll);
            tokio::select! {
                _ = sleep_until(wake) => {}
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    self.finished(done);
                    // A slot is free: look again now rather than a poll later.
                    next_poll = next_poll.min(Instant::now());
                    continue;
                }
                changed = self.shutdown.changed() => {
                    if changed.is_err() {
                        self.stopping = true;
                    }
                    continue;
                }
            }
            if self.lease.keep().await {
                self.abandon_deliveries();
            }
            if Instant::now() >= next_poll {
                next_poll = Instant::now() + self.config.poll;
                if !self.lease.is_held() {
                    self.lease.claim().await;
                }
                if self.lease.trusted() {
                    self.poll().await;
                }
            }
        }
        // Let what is in flight finish and be recorded (bounded by the
        // request timeout and the statement bound), then release.
        let drain = self.config.lease.call_timeout + REQUEST_TIMEOUT;
        let deadline = Instant::now() + drain;
        while !self.tasks.is_empty() {
            match tokio::time::timeout_at(deadline, self.tasks.join_next()).await {
                Ok(Some(done)) => self.finished(done),
                Ok(None) => break,
                Err(_) => {
                    self.tasks.abort_all();
                    break;
                }
            }
        }
        self.lease.release().await;
        tracing::info!(replica = %self.config.replica, "webhook delivery worker stopped");
    }

    fn stop_requested(&mut self) -> bool {
        self.stopping = self.stopping || *self.shutdown.borrow();
        self.stopping
    }

    fn lost(&mut self, why: &str) {
        if self.lease.lost(why) {
            self.abandon_deliveries();
        }
    }

    /// Stops delivering: in-flight POSTs are abandoned (their writes would
    /// fail the fence check anyway); the next holder sends them again.
    fn abandon_deliveries(&mut self) {
        self.tasks.abort_all();
        self.in_flight.clear();
    }

    fn finished(&mut self, done: Result<Done, tokio::task::JoinError>) {
        let Ok(done) = done else {
            // Aborted (lease lost) or panicked: nothing was recorded, so the
            // delivery stays pending and is sent again.
            return;
        };
        self.in_flight.remove(&done.id);
        match done.outcome {
            Ok(Some(state)) if state == "failed" => tracing::warn!(
                delivery = done.id,
                org = done.org_id,
                "webhook delivery gave up after the retry window"
            ),
            Ok(_) => {}
            Err(DeliveryError::Lost) => self.lost("a fenced delivery write found the lease gone"),
            Err(e) => tracing::error!(
                delivery = done.id,
                error = %e,
                "could not record a webhook attempt; it will be sent again"
            ),
        }
    }

    /// Looks for due deliveries and starts as many as there are free slots.
    async fn poll(&mut self) {
        let Some(fence) = self.lease.fence() else {
            return;
        };
        let free = CONCURRENCY.saturating_sub(self.tasks.len());
        if free == 0 {
            return;
        }
        let limit = self.config.lease.call_timeout;
        match timeout(limit, drop_orphans(&self.pool, &self.config.replica, fence)).await {
            Ok(Ok(_)) => {}
            Ok(Err(DeliveryError::Lost)) => {
                return self.lost("a fenced delivery write found the lease gone");
            }
            Ok(Err(e)) => tracing::error!(error = %e, "could not drop orphaned webhook deliveries"),
            Err(_) => tracing::error!("dropping orphaned webhook deliveries timed out"),
        }
        let in_flight: Vec<i64> = self.in_flight.keys().copied().collect();
        let rows = match timeout(
            limit,
            due(&self.pool, &in_flight, PER_ORG as i64, free as i64 + 64),
        )
        .await
        {
            Ok(Ok(rows)) => rows,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "could not read due webhook deliveries");
                return;
            }
            Err(_) => {
                tracing::error!("reading due webhook deliveries timed out");
                return;
            }
        };
        let mut per_org: HashMap<i64, usize> = HashMap::new();
        for org in self.in_flight.values() {
            *per_org.entry(*org).or_default() += 1;
        }
        let mut started_reservations: HashSet<i64> = HashSet::new();
        for d in rows {
            if self.tasks.len() >= CONCURRENCY {
                break;
            }
            let n = per_org.entry(d.org_id).or_default();
            // One organization's slots, and one event per reservation at a
            // time (the query already hides later events of a reservation).
            if *n >= PER_ORG || !started_reservations.insert(d.reservation_id) {
                continue;
            }
            *n += 1;
            self.in_flight.insert(d.id, d.org_id);
            self.start(d, fence);
        }
    }

    fn start(&mut self, d: Due, fence: i64) {
        let pool = self.pool.clone();
        let http = self.http.clone();
        let replica = self.config.replica.clone();
        let config = self.config.clone();
        self.tasks.spawn(async move {
            let attempt = post(&http, &d, config.allow_private).await;
            let retry_in = backoff(config.backoff_base, d.attempts.max(0) as u32 + 1);
            if let Some(error) = &attempt.error {
                tracing::info!(delivery = d.id, event = d.event_id, error = %error, "webhook attempt failed");
            }
            let outcome = match timeout(
                config.lease.call_timeout,
                record_attempt(
                    &pool,
                    &replica,
                    fence,
                    d.id,
                    &attempt,
                    retry_in,
                    config.give_up,
                ),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(DeliveryError::TimedOut(config.lease.call_timeout)),
            };
            Done {
                id: d.id,
                org_id: d.org_id,
                outcome,
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_sha256_of_timestamp_dot_body() {
        // The value of `printf '%s' '1700000000.{}' | openssl dgst -sha256
        // -hmac whsec_test`: the README's verification recipe.
        assert_eq!(
            sign("whsec_test", 1_700_000_000, b"{}"),
            "35495024f4ef3f94e5a93e22221544c4b75e9a42300cd965ab81cb85cd994e91"
        );
        assert_eq!(
            signature_header("whsec_test", 1_700_000_000, b"{}"),
            "t=1700000000,v1=35495024f4ef3f94e5a93e22221544c4b75e9a42300cd965ab81cb85cd994e91"
        );
    }

    #[test]
    fn internal_addresses_are_recognised() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = ip.parse().expect("address");
            assert!(is_internal(ip), "{ip} is internal");
        }
        for ip in ["93.184.216.34", "2606:2800:220:1::1", "8.8.8.8"] {
            let ip: IpAddr = ip.parse().expect("address");
            assert!(!is_internal(ip), "{ip} is public");
        }
    }

    #[test]
    fn urls_must_be_http_without_credentials() {
        assert_eq!(parse_url("ftp://x.example/").err(), Some(UrlError::Scheme));
        assert_eq!(
            parse_url("https://u:p@x.example/").err(),
            Some(UrlError::Credentials)
        );
        assert!(matches!(
            parse_url("not a url"),
            Err(UrlError::Malformed(_))
        ));
        assert!(parse_url("https://hooks.example/pk?x=1").is_ok());
        let long = format!("https://x.example/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(parse_url(&long).err(), Some(UrlError::TooLong));
    }

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
