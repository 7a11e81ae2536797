//! A lease in PostgreSQL: one row per job key that keeps a periodic job on
//! one replica at a time (L1-L6).
//!
//! `holder` names the replica; `fence` names the mandate. Every claim, a
//! re-entrant one included, draws a new fence from `lease_fence_seq`, so a
//! heartbeat or a release of an older mandate of the same replica can never
//! reach the newer one (L2, L3), and fences keep growing after the start-up
//! purge empties a key (L4, L5).
//!
//! `Holder` holds one key for a periodic worker (the sweep's `sweep`, the
//! webhook worker's `webhooks`): it claims, heartbeats, stops trusting a
//! mandate whose trust window has passed, reports lease errors (L6) and
//! releases on shutdown; the worker does its own work under `fence()`.

use std::time::Duration;

use crate::db::Db;
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use tokio::time::{Instant, timeout};

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

/// The CTE `lease` of every write a worker makes on behalf of its lease
/// (`$1` the key, `$2` the holder, `$3` the fence): the lease, live, under
/// this holder and fence, taken FOR SHARE. A claim (which locks the row FOR
/// UPDATE) waits until the statement commits, so nothing written under it
/// can land after a newer fence was issued (L2, L3).
pub const LIVE_LEASE: &str = "
lease AS (
    SELECT fence FROM leases
     WHERE key = $1 AND holder = $2 AND fence = $3
       AND expires_at > clock_timestamp()
       FOR SHARE
)";

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

/// A worker's lease timings, all derived from the lease duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    pub lease_duration: Duration,
    /// About a third of the lease: two heartbeats may fail before it ends.
    pub heartbeat_period: Duration,
    /// Trust ends this long before (heartbeat sent + lease duration).
    pub trust_margin: Duration,
    /// Server-side statement_timeout of the worker's connections.
    pub statement_timeout: Duration,
    /// Client-side bound on every call (a hung network answers nothing).
    pub call_timeout: Duration,
}

impl Timings {
    /// The timings of a lease of `lease_duration`.
    pub fn for_lease(lease_duration: Duration) -> Timings {
        let statement_timeout =
            (lease_duration / 3).clamp(Duration::from_millis(500), Duration::from_secs(5));
        Timings {
            lease_duration,
            heartbeat_period: lease_duration / 3,
            trust_margin: (lease_duration / 10).min(Duration::from_secs(2)),
            statement_timeout,
            call_timeout: statement_timeout + Duration::from_secs(1),
        }
    }
}

/// What sets one worker's lease apart from another's.
#[derive(Debug, Clone)]
pub struct Terms {
    /// The lease key (`SWEEP_KEY`, `webhooks::WEBHOOKS_KEY`).
    pub key: &'static str,
    /// The holder: this replica's name.
    pub replica: String,
    pub timings: Timings,
    /// What the worker stops doing when the lease is lost, for the log
    /// ("sweeping": "this replica stops sweeping").
    pub work: &'static str,
}

struct Held {
    mandate: Mandate,
    /// Monotonic: (time the claim or heartbeat was SENT + duration - margin).
    trust_until: Instant,
    next_heartbeat: Instant,
}

/// One worker's hold on the lease `key` (L1-L6): at most one mandate at a
/// time, trusted until its trust window passes. Every call is bounded by
/// `call_timeout`; the counters `lease_acquired`, `lease_lost` and
/// `lease_errors` and the log lines (`"{key} lease acquired"`, ...) say
/// what happened.
pub struct Holder {
    db: Db,
    metrics: Metrics,
    terms: Terms,
    held: Option<Held>,
}

impl Holder {
    /// Holds nothing yet: `claim` takes the lease. Lease calls and error
    /// reports go through `db` (the worker's own pool).
    pub fn new(db: Db, metrics: Metrics, terms: Terms) -> Holder {
        Holder {
            db,
            metrics,
            terms,
            held: None,
        }
    }

    /// The fence of the mandate held, trusted or not: every write made on
    /// behalf of the lease names it (L2, L3).
    pub fn fence(&self) -> Option<i64> {
        self.held.as_ref().map(|h| h.mandate.fence)
    }

    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// A mandate is held and its trust window has not passed.
    pub fn trusted(&self) -> bool {
        self.held
            .as_ref()
            .is_some_and(|h| Instant::now() < h.trust_until)
    }

    /// When the worker must wake: at `next` (its own next step), or sooner
    /// for the next heartbeat or the end of trust.
    pub fn wake(&self, next: Instant) -> Instant {
        match &self.held {
            Some(h) => next.min(h.next_heartbeat).min(h.trust_until),
            None => next,
        }
    }

    /// Stops trusting a mandate whose trust window has passed, then
    /// heartbeats if one is due. True when the mandate ended here.
    pub async fn keep(&mut self) -> bool {
        if self.check_trust() {
            return true;
        }
        self.heartbeat_if_due().await
    }

    /// Stop trusting the lease once its trust window has passed without a
    /// successful heartbeat. True when the mandate ended here.
    fn check_trust(&mut self) -> bool {
        if self.held.is_some() && !self.trusted() {
            return self.lost("no successful heartbeat within the lease duration");
        }
        false
    }

    /// Drops the mandate held, if any, counting and logging the loss (L3).
    /// True when there was one: the worker stops its work.
    pub fn lost(&mut self, why: &str) -> bool {
        let Some(h) = self.held.take() else {
            return false;
        };
        self.metrics.lease_lost.inc();
        tracing::warn!(
            replica = %self.terms.replica,
            fence = h.mandate.fence,
            reason = why,
            "{} lease lost; this replica stops {}",
            self.terms.key,
            self.terms.work
        );
        true
    }

    /// L6: a lease call that failed because of an error is loud.
    async fn report(&self, action: &str, error: &LeaseError) {
        report_error(
            &self.db,
            &self.metrics,
            self.terms.key,
            &self.terms.replica,
            action,
            error,
            self.terms.timings.call_timeout,
        )
        .await;
    }

    /// A lease call, bounded by `call_timeout` (a hung network answers
    /// nothing).
    async fn bounded<T, E: Into<LeaseError>>(
        &self,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, LeaseError> {
        let limit = self.terms.timings.call_timeout;
        match timeout(limit, call).await {
            Ok(r) => r.map_err(Into::into),
            Err(_) => Err(LeaseError::TimedOut(limit)),
        }
    }

    /// Claims the lease (L2); trust runs from the time the claim was sent.
    pub async fn claim(&mut self) {
        let sent = Instant::now();
        let call = claim(
            &self.db,
            self.terms.key,
            &self.terms.replica,
            self.terms.timings.lease_duration,
        );
        let outcome = self.bounded(call).await;
        match outcome {
            Ok(Claim::Acquired(mandate)) => {
                self.metrics.lease_acquired.inc();
                tracing::info!(
                    replica = %self.terms.replica,
                    fence = mandate.fence,
                    expires_at = %mandate.expires_at,
                    "{} lease acquired",
                    self.terms.key
                );
                self.held = Some(Held {
                    mandate,
                    trust_until: self.trust_from(sent),
                    next_heartbeat: sent + self.terms.timings.heartbeat_period,
                });
            }
            // L6: someone else holding the lease (sweeping, delivering) is
            // the normal case on most replicas.
            Ok(Claim::HeldByOther) => {
                tracing::debug!(replica = %self.terms.replica, "{} lease held by another replica", self.terms.key)
            }
            Err(e) => self.report("claim", &e).await,
        }
    }

    fn trust_from(&self, sent: Instant) -> Instant {
        let t = &self.terms.timings;
        sent + t.lease_duration.saturating_sub(t.trust_margin)
    }

    /// Heartbeats if a mandate is held and its heartbeat is due. True when
    /// the mandate ended here.
    pub async fn heartbeat_if_due(&mut self) -> bool {
        if self
            .held
            .as_ref()
            .is_some_and(|h| Instant::now() >= h.next_heartbeat)
        {
            return self.heartbeat().await;
        }
        false
    }

    /// Extends the mandate held (L3); trust runs from the time the
    /// heartbeat was sent. True when the mandate ended here.
    async fn heartbeat(&mut self) -> bool {
        let Some(h) = &self.held else { return false };
        let mandate = h.mandate.clone();
        let sent = Instant::now();
        let call = heartbeat(&self.db, &mandate, self.terms.timings.lease_duration);
        let outcome = self.bounded(call).await;
        match outcome {
            Ok(renewed) => {
                let trust_until = self.trust_from(sent);
                if let Some(h) = &mut self.held {
                    h.mandate = renewed;
                    h.trust_until = trust_until;
                    h.next_heartbeat = sent + self.terms.timings.heartbeat_period;
                }
                false
            }
            Err(LeaseError::Lost) => {
                self.lost("heartbeat found a newer mandate or an expired lease")
            }
            Err(e) => {
                self.report("heartbeat", &e).await;
                // Try again soon; trust_until is unchanged and ends the
                // mandate if no heartbeat gets through in time.
                let retry = Instant::now() + (self.terms.timings.heartbeat_period / 2);
                if let Some(h) = &mut self.held {
                    h.next_heartbeat = retry;
                }
                false
            }
        }
    }

    /// Graceful shutdown, once the worker's work has stopped: expire the
    /// lease in place (L3) so that another replica claims it at its next
    /// tick.
    pub async fn release(&mut self) {
        let Some(h) = self.held.take() else { return };
        let outcome = self.bounded(release(&self.db, &h.mandate)).await;
        match outcome {
            Ok(()) => {
                tracing::info!(replica = %self.terms.replica, fence = h.mandate.fence, "{} lease released", self.terms.key)
            }
            Err(LeaseError::Lost) => {
                self.metrics.lease_lost.inc();
                tracing::warn!(
                    replica = %self.terms.replica,
                    fence = h.mandate.fence,
                    "{} lease was already lost when releasing it",
                    self.terms.key
                );
            }
            Err(e) => self.report("release", &e).await,
        }
    }
}
