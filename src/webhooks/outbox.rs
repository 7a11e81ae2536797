//! The outbox (`webhook_deliveries`): its reads for the pages and the
//! worker, and the worker's fenced writes.

use std::time::Duration;

use crate::db::Db;
use chrono::{DateTime, Utc};

use crate::lease::LIVE_LEASE;

/// The lease key of the delivery worker.
pub const WEBHOOKS_KEY: &str = "webhooks";

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
        "SELECT a.at, o.slug AS org_slug,
                coalesce(d.event_id, (d.payload->>'event_id')::bigint) AS event_id, a.url, a.status, a.latency_ms,
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

/// The worker's poll (`due`): $1 the deliveries in flight, $2 how many per
/// organization, $3 how many in all.
///
/// Read per organization with a webhook (few rows), each on one page of
/// `webhook_deliveries_due_by_org_idx` in due order, so a poll costs its
/// page however long the backlog is. `statement_timestamp()`, not
/// `clock_timestamp()`: a stable bound is an index condition, so deliveries
/// waiting out a backoff are never read; a volatile one is a filter on
/// every pending row. An organization without a webhook has nothing to
/// send (its deliveries are dropped: `drop_orphans`).
pub const DUE_SQL: &str = "SELECT d.id, d.org_id,
        -- F5: a `database.restored` event has neither; its own negative
        -- key keeps it apart from every reservation.
        coalesce(d.reservation_id, -d.id) AS reservation_id,
        coalesce(d.event_id, (d.payload->>'event_id')::bigint) AS event_id, d.attempts,
        d.payload::text AS body, w.url, w.secret
   FROM webhooks w
  CROSS JOIN LATERAL (
      SELECT d.id, d.org_id, d.reservation_id, d.event_id, d.attempts, d.payload, d.next_attempt_at
        FROM webhook_deliveries d
       WHERE d.org_id = w.org_id AND d.state = 'pending'
         AND d.next_attempt_at <= statement_timestamp()
         AND d.id <> ALL ($1)
         -- In order per reservation: not while an earlier event of it is
         -- pending.
         AND NOT EXISTS (
             SELECT 1 FROM webhook_deliveries p
              WHERE p.reservation_id = d.reservation_id AND p.state = 'pending'
                AND p.event_id < d.event_id)
       ORDER BY d.next_attempt_at, d.event_id
       LIMIT $2
  ) d
  ORDER BY d.next_attempt_at, d.event_id
  LIMIT $3";

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
    sqlx::query_as(DUE_SQL)
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
