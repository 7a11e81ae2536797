//! A lease in PostgreSQL: one row per job key that keeps a periodic job on
//! one replica at a time (L1-L6).
//!
//! `holder` names the replica; `fence` names the mandate. Every claim, a
//! re-entrant one included, draws a new fence from `lease_fence_seq`, so a
//! heartbeat or a release of an older mandate of the same replica can never
//! reach the newer one (L2, L3), and fences keep growing after the start-up
//! purge empties a key (L4, L5).

use std::time::Duration;

use crate::db::Db;
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::metrics::Metrics;

/// The key of the every-minute sweep.
pub const SWEEP_KEY: &str = "sweep";

/// One mandate: the lease `key` held by `holder` under `fence`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Mandate {
    pub key: String,
    pub holder: String,
    pub fence: i64,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// What a claim that did not fail came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    Acquired(Mandate),
    /// Another holder has a live lease: normal, not an error (L6).
    HeldByOther,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// L3: the mandate named is no longer the live one (another holder, a
    /// newer mandate of this holder, or expiry). Never silence.
    #[error("lease lost: this mandate is no longer the live one")]
    Lost,
    #[error("lease call took longer than {0:?}")]
    TimedOut(Duration),
    #[error("lease call failed: {0}")]
    Database(#[from] sqlx::Error),
}

// L2: one statement. It succeeds when the key is free (INSERT), expired or
// already ours (DO UPDATE ... WHERE). acquired_at and expires_at come from
// the proposed row, computed before any wait on the row lock: with
// clock_timestamp() in the DO UPDATE, a claim that waited longer than the
// lease duration would violate leases_expiry_after_acquisition (23514).
// The fence is drawn by nextval() in the DO UPDATE, after the row lock is
// taken: EXCLUDED.fence was drawn before the wait and may be older than a
// fence issued meanwhile by the claim we waited for (L4).
const CLAIM: &str = "
INSERT INTO leases (key, holder, fence, acquired_at, expires_at)
VALUES ($1, $2, nextval('lease_fence_seq'), clock_timestamp(),
        clock_timestamp() + make_interval(secs => $3))
ON CONFLICT (key) DO UPDATE
   SET holder      = EXCLUDED.holder,
       acquired_at = EXCLUDED.acquired_at,
       expires_at  = EXCLUDED.expires_at,
       fence       = nextval('lease_fence_seq')
 WHERE leases.holder = EXCLUDED.holder OR leases.expires_at <= clock_timestamp()
RETURNING key, holder, fence, acquired_at, expires_at";

// L3: names key, holder and fence; only a live mandate is extended.
const HEARTBEAT: &str = "
UPDATE leases
   SET expires_at = clock_timestamp() + make_interval(secs => $4)
 WHERE key = $1 AND holder = $2 AND fence = $3
   AND expires_at > clock_timestamp()
RETURNING key, holder, fence, acquired_at, expires_at";

// L3: expire in place, never DELETE, so that the fence survives. No
// "- interval '1 second'": a lease released within a second of its claim
// would violate the CHECK.
const RELEASE: &str = "
UPDATE leases
   SET expires_at = clock_timestamp()
 WHERE key = $1 AND holder = $2 AND fence = $3
   AND expires_at > clock_timestamp()";

/// Claims `key` for `holder` for `duration` (L2).
pub async fn claim<'c>(
    db: impl PgExecutor<'c>,
    key: &str,
    holder: &str,
    duration: Duration,
) -> Result<Claim, sqlx::Error> {
    let row: Option<Mandate> = sqlx::query_as(CLAIM)
        .bind(key)
        .bind(holder)
        .bind(duration.as_secs_f64())
        .fetch_optional(db)
        .await?;
    Ok(match row {
        Some(m) => Claim::Acquired(m),
        None => Claim::HeldByOther,
    })
}

/// Extends a live mandate by `duration` from now; `Lost` if it is not live.
pub async fn heartbeat<'c>(
    db: impl PgExecutor<'c>,
    mandate: &Mandate,
    duration: Duration,
) -> Result<Mandate, LeaseError> {
    let row: Option<Mandate> = sqlx::query_as(HEARTBEAT)
        .bind(&mandate.key)
        .bind(&mandate.holder)
        .bind(mandate.fence)
        .bind(duration.as_secs_f64())
        .fetch_optional(db)
        .await?;
    row.ok_or(LeaseError::Lost)
}

/// Expires a live mandate now, so that another replica can claim at once;
/// `Lost` if it is not live (a second release of one mandate included).
pub async fn release<'c>(db: impl PgExecutor<'c>, mandate: &Mandate) -> Result<(), LeaseError> {
    let done = sqlx::query(RELEASE)
        .bind(&mandate.key)
        .bind(&mandate.holder)
        .bind(mandate.fence)
        .execute(db)
        .await?
        .rows_affected();
    if done == 0 {
        return Err(LeaseError::Lost);
    }
    Ok(())
}

/// L6: a lease call that failed because of an error (not because another
/// replica holds the lease) is loud: an error log, the `lease_errors`
/// metric, and a row in `lease_errors` when the database takes it.
pub async fn report_error(
    pool: &Db,
    metrics: &Metrics,
    key: &str,
    replica: &str,
    action: &str,
    error: &LeaseError,
    timeout: Duration,
) {
    metrics.lease_errors.inc();
    tracing::error!(key, replica, action, error = %error, "lease call failed");
    let message = format!("{action}: {error}");
    let insert =
        sqlx::query("INSERT INTO lease_errors (key, replica, message) VALUES ($1, $2, $3)")
            .bind(key)
            .bind(replica)
            .bind(&message)
            .execute(pool);
    match tokio::time::timeout(timeout, insert).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::error!(key, replica, error = %e, "could not record the lease error in lease_errors")
        }
        Err(_) => tracing::error!(
            key,
            replica,
            "could not record the lease error in lease_errors: timed out"
        ),
    }
}
