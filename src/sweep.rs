//! The sweep (R11): every period, the replica that holds the `sweep` lease
//! marks overdue held reservations expired. It only tidies: conversion and
//! the allocator enforce the deadline themselves.
//!
//! R12: the sweep has no switch. It runs whatever the datacenter-module
//! switches say, since a switch that disables a deadline is a leak.
//!
//! Every write made on behalf of the lease carries its fence and checks it
//! in the same statement, with the lease row taken FOR SHARE so that a
//! concurrent claim waits for the write to commit: a paused holder that
//! wakes up after losing the lease writes nothing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::db::Db;
use sqlx::PgExecutor;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};

use crate::lease::{self, Claim, LeaseError, Mandate, SWEEP_KEY};
use crate::metrics::Metrics;
use crate::settings::Settings;

/// Reservations expired per statement; each batch is its own short
/// transaction, so the sweep never holds many row locks for long.
pub const BATCH_SIZE: i64 = 500;

/// Batches run two at a time, on the worker's two connections: most of a
/// batch's cost is per row (the update, its index entries, the event), and a
/// second statement can use the database's second CPU. SKIP LOCKED keeps the
/// two on disjoint rows. What it saves varies: BENCHMARKS.md, item 4.
pub async fn expire_two_batches(
    pool: &Db,
    replica: &str,
    fence: i64,
    limit: i64,
    bound: Duration,
) -> Result<(u64, bool), SweepError> {
    let (a, b) = tokio::join!(
        bounded(bound, expire_batch(pool, replica, fence, limit)),
        bounded(bound, expire_batch(pool, replica, fence, limit)),
    );
    let (a, b) = (a?, b?);
    // Done when either came back short: nothing overdue was left to lock.
    Ok((a + b, (a as i64) < limit || (b as i64) < limit))
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The fence check in the statement failed: the lease is no longer ours.
    #[error("the sweep lease is no longer held under this fence")]
    Lost,
    #[error("sweep statement took longer than {0:?}")]
    TimedOut(Duration),
    #[error("sweep statement failed: {0}")]
    Database(#[from] sqlx::Error),
}

// The lease, live, under this holder and fence, taken FOR SHARE: a claim
// (which locks the row FOR UPDATE) waits until this statement commits, so
// nothing written here can land after a newer fence was issued.
const LIVE_LEASE: &str = "
lease AS (
    SELECT fence FROM leases
     WHERE key = $1 AND holder = $2 AND fence = $3
       AND expires_at > clock_timestamp()
       FOR SHARE
)";

/// Opens a run in `sweep_runs`; `Lost` (and nothing written) unless the
/// mandate (`replica`, `fence`) is live.
pub async fn start_run<'c>(
    db: impl PgExecutor<'c>,
    replica: &str,
    fence: i64,
) -> Result<i64, SweepError> {
    let sql = format!(
        "WITH {LIVE_LEASE}
         INSERT INTO sweep_runs (replica, lease_fence)
         SELECT $2, fence FROM lease
         RETURNING id"
    );
    let id: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(SWEEP_KEY)
        .bind(replica)
        .bind(fence)
        .fetch_optional(db)
        .await?;
    id.ok_or(SweepError::Lost)
}

/// Expires up to `limit` overdue held reservations in one statement, with
/// their events; `Lost` (and nothing written) unless the mandate is live.
/// Returns how many were expired. The run's count is not updated here: a
/// shared counter row would serialize concurrent batches on its row lock
/// (measured: two batches at a time saved nothing with it, a third of the
/// time without it); the worker adds the counts and `finish_run` writes them.
pub async fn expire_batch<'c>(
    db: impl PgExecutor<'c>,
    replica: &str,
    fence: i64,
    limit: i64,
) -> Result<u64, SweepError> {
    // The overdue rows are chosen and locked in a CTE with LIMIT (a LIMIT
    // inside IN (...) may lock more rows than it returns). SKIP LOCKED: a
    // reservation being converted or cancelled right now is left to its
    // owner; if it is still held and overdue, the next sweep takes it.
    let sql = format!(
        "WITH {LIVE_LEASE},
         due AS (
             SELECT r.id FROM reservations r
              WHERE r.state = 'held' AND r.expires_at <= clock_timestamp()
                AND EXISTS (SELECT 1 FROM lease)
              ORDER BY r.expires_at
              LIMIT $4
                FOR UPDATE OF r SKIP LOCKED
         ),
         expired AS (
             UPDATE reservations r
                SET state = 'expired', ended_at = clock_timestamp(), ended_by = 'sweep',
                    end_reason = 'hold deadline ' || to_char(r.expires_at AT TIME ZONE 'UTC',
                                 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') || ' passed'
               FROM due
              WHERE r.id = due.id AND r.state = 'held'
             RETURNING r.id, r.end_reason
         ),
         events AS (
             INSERT INTO reservation_events
                    (reservation_id, kind, from_state, to_state, actor, detail, replica, lease_fence)
             SELECT e.id, 'expired', 'held', 'expired', 'sweep', e.end_reason, $2, l.fence
               FROM expired e CROSS JOIN lease l
         )
         SELECT (SELECT count(*) FROM lease) AS live, (SELECT count(*) FROM expired) AS expired"
    );
    let (live, expired): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(SWEEP_KEY)
        .bind(replica)
        .bind(fence)
        .bind(limit)
        .fetch_one(db)
        .await?;
    if live == 0 {
        return Err(SweepError::Lost);
    }
    Ok(expired as u64)
}

/// Closes a run with its count; `Lost` (and the run left open) unless the
/// mandate is live. A run left open (lease lost, error) keeps a count of 0:
/// its expiries are in `reservation_events`, each with replica and fence.
pub async fn finish_run<'c>(
    db: impl PgExecutor<'c>,
    replica: &str,
    fence: i64,
    run_id: i64,
    expired: u64,
) -> Result<(), SweepError> {
    let sql = format!(
        "WITH {LIVE_LEASE}
         UPDATE sweep_runs SET finished_at = clock_timestamp(), expired = $5
          WHERE id = $4 AND replica = $2 AND lease_fence = $3 AND EXISTS (SELECT 1 FROM lease)
         RETURNING id"
    );
    let id: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(SWEEP_KEY)
        .bind(replica)
        .bind(fence)
        .bind(run_id)
        .bind(i32::try_from(expired).unwrap_or(i32::MAX))
        .fetch_optional(db)
        .await?;
    id.map(|_| ()).ok_or(SweepError::Lost)
}

/// Refusal rows (issue 15) deleted per retention statement.
pub const PURGE_BATCH_SIZE: i64 = 1000;

/// Deletes up to `limit` refusal rows older than `retention_days` (by the
/// database's clock), oldest first, in one statement that checks the
/// mandate like `expire_batch`; `Lost` (and nothing deleted) unless it is
/// live. Returns how many were deleted: fewer than `limit` means done.
pub async fn purge_refusals_batch<'c>(
    db: impl PgExecutor<'c>,
    replica: &str,
    fence: i64,
    retention_days: u32,
    limit: i64,
) -> Result<u64, SweepError> {
    // The rows are chosen in a CTE with LIMIT, as in expire_batch: a walk
    // of reservation_refusals_by_at_idx bounded by the cut-off, computed
    // once (a volatile clock_timestamp() in the WHERE clause could not
    // bound the index scan, and with nothing to purge the walk would read
    // the whole index every period).
    let sql = format!(
        "WITH {LIVE_LEASE},
         old AS (
             SELECT f.id FROM reservation_refusals f
              WHERE f.at < (SELECT clock_timestamp() - make_interval(days => $4))
                AND EXISTS (SELECT 1 FROM lease)
              ORDER BY f.at
              LIMIT $5
                FOR UPDATE OF f SKIP LOCKED
         ),
         purged AS (
             DELETE FROM reservation_refusals f USING old WHERE f.id = old.id RETURNING f.id
         )
         SELECT (SELECT count(*) FROM lease) AS live, (SELECT count(*) FROM purged) AS purged"
    );
    let (live, purged): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(SWEEP_KEY)
        .bind(replica)
        .bind(fence)
        .bind(i32::try_from(retention_days).unwrap_or(i32::MAX))
        .bind(limit)
        .fetch_one(db)
        .await?;
    if live == 0 {
        return Err(SweepError::Lost);
    }
    Ok(purged as u64)
}

/// What one complete sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepReport {
    pub run_id: i64,
    pub expired: u64,
}

/// One complete sweep on behalf of the mandate (`replica`, `fence`): a run,
/// batches, two at a time, until one comes back short, and the run closed.
pub async fn sweep(
    pool: &Db,
    replica: &str,
    fence: i64,
    batch: i64,
) -> Result<SweepReport, SweepError> {
    let run_id = start_run(pool, replica, fence).await?;
    let mut expired = 0;
    loop {
        let (n, done) = expire_two_batches(pool, replica, fence, batch, Duration::MAX).await?;
        expired += n;
        if done {
            break;
        }
    }
    finish_run(pool, replica, fence, run_id, expired).await?;
    Ok(SweepReport { run_id, expired })
}

/// Timings of the worker, derived from `Settings`.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub replica: String,
    pub period: Duration,
    pub lease_duration: Duration,
    /// About a third of the lease: two heartbeats may fail before it ends.
    pub heartbeat_period: Duration,
    /// Trust ends this long before (heartbeat sent + lease duration).
    pub trust_margin: Duration,
    /// Server-side statement_timeout of the worker's connections.
    pub statement_timeout: Duration,
    /// Client-side bound on every call (a hung network answers nothing).
    pub call_timeout: Duration,
    pub batch_size: i64,
    /// `POOLKEEPER_REFUSAL_RETENTION_DAYS`.
    pub refusal_retention_days: u32,
}

impl WorkerConfig {
    pub fn from_settings(settings: &Settings) -> WorkerConfig {
        let lease = settings.lease_duration;
        let statement_timeout =
            (lease / 3).clamp(Duration::from_millis(500), Duration::from_secs(5));
        WorkerConfig {
            replica: settings.replica.clone(),
            period: settings.sweep_period,
            lease_duration: lease,
            heartbeat_period: lease / 3,
            trust_margin: (lease / 10).min(Duration::from_secs(2)),
            statement_timeout,
            call_timeout: statement_timeout + Duration::from_secs(1),
            batch_size: BATCH_SIZE,
            refusal_retention_days: settings.refusal_retention_days,
        }
    }
}

/// The sweep worker, run on every replica by `serve` until `shutdown` turns
/// true (or its sender is dropped). It never returns on a database error:
/// errors are logged and counted, and it tries again next period. On
/// shutdown it stops sweeping, then releases the lease so that another
/// replica takes over at once.
pub async fn run(
    pool: &Db,
    settings: &Settings,
    metrics: Metrics,
    shutdown: watch::Receiver<bool>,
) {
    let config = WorkerConfig::from_settings(settings);
    let worker_pool = worker_pool(
        pool,
        &config,
        settings.db_pooler == crate::settings::DbPooler::Transaction,
    );
    let mut worker = Worker {
        pool: worker_pool.clone(),
        config,
        metrics,
        shutdown,
        stopping: false,
        held: None,
    };
    worker.run().await;
    worker_pool.close().await;
}

/// The worker's own small pool (`Db::worker_pool`): the HTTP load cannot
/// starve it, and its statement_timeout is shorter than the pool's 15 s.
fn worker_pool(pool: &Db, config: &WorkerConfig, transaction_pooler: bool) -> Db {
    pool.worker_pool(
        "poolkeeper-sweep",
        2,
        config.call_timeout,
        config.statement_timeout,
        transaction_pooler,
    )
}

struct Held {
    mandate: Mandate,
    /// Monotonic: (time the claim or heartbeat was SENT + duration - margin).
    trust_until: Instant,
    next_heartbeat: Instant,
}

struct Worker {
    pool: Db,
    config: WorkerConfig,
    metrics: Metrics,
    shutdown: watch::Receiver<bool>,
    stopping: bool,
    held: Option<Held>,
}

impl Worker {
    async fn run(&mut self) {
        tracing::info!(
            replica = %self.config.replica,
            period_s = self.config.period.as_secs_f64(),
            lease_s = self.config.lease_duration.as_secs_f64(),
            "sweep worker started"
        );
        let mut next_tick = Instant::now();
        while !self.stop_requested() {
            let wake = match &self.held {
                Some(h) => next_tick.min(h.next_heartbeat).min(h.trust_until),
                None => next_tick,
            };
            tokio::select! {
                _ = sleep_until(wake) => {}
                changed = self.shutdown.changed() => {
                    if changed.is_err() {
                        self.stopping = true;
                    }
                    continue;
                }
            }
            self.check_trust();
            if self
                .held
                .as_ref()
                .is_some_and(|h| Instant::now() >= h.next_heartbeat)
            {
                self.heartbeat().await;
            }
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + self.config.period;
                if self.held.is_none() {
                    self.claim().await;
                }
                if self.held.is_some() {
                    self.sweep().await;
                    self.purge_refusals().await;
                }
            }
        }
        self.release().await;
        tracing::info!(replica = %self.config.replica, "sweep worker stopped");
    }

    fn stop_requested(&mut self) -> bool {
        self.stopping = self.stopping || *self.shutdown.borrow();
        self.stopping
    }

    fn trusted(&self) -> bool {
        self.held
            .as_ref()
            .is_some_and(|h| Instant::now() < h.trust_until)
    }

    /// Stop trusting the lease once its trust window has passed without a
    /// successful heartbeat.
    fn check_trust(&mut self) {
        if self.held.is_some() && !self.trusted() {
            self.lost("no successful heartbeat within the lease duration");
        }
    }

    fn lost(&mut self, why: &str) {
        if let Some(h) = self.held.take() {
            self.metrics.lease_lost.inc();
            tracing::warn!(
                replica = %self.config.replica,
                fence = h.mandate.fence,
                reason = why,
                "sweep lease lost; this replica stops sweeping"
            );
        }
    }

    async fn report(&self, action: &str, error: &LeaseError) {
        lease::report_error(
            &self.pool,
            &self.metrics,
            SWEEP_KEY,
            &self.config.replica,
            action,
            error,
            self.config.call_timeout,
        )
        .await;
    }

    async fn claim(&mut self) {
        let sent = Instant::now();
        let call = lease::claim(
            &self.pool,
            SWEEP_KEY,
            &self.config.replica,
            self.config.lease_duration,
        );
        let outcome = match timeout(self.config.call_timeout, call).await {
            Ok(Ok(claim)) => Ok(claim),
            Ok(Err(e)) => Err(LeaseError::Database(e)),
            Err(_) => Err(LeaseError::TimedOut(self.config.call_timeout)),
        };
        match outcome {
            Ok(Claim::Acquired(mandate)) => {
                self.metrics.lease_acquired.inc();
                tracing::info!(
                    replica = %self.config.replica,
                    fence = mandate.fence,
                    expires_at = %mandate.expires_at,
                    "sweep lease acquired"
                );
                self.held = Some(Held {
                    mandate,
                    trust_until: self.trust_from(sent),
                    next_heartbeat: sent + self.config.heartbeat_period,
                });
            }
            // L6: someone else sweeping is the normal case on most replicas.
            Ok(Claim::HeldByOther) => {
                tracing::debug!(replica = %self.config.replica, "sweep lease held by another replica")
            }
            Err(e) => self.report("claim", &e).await,
        }
    }

    fn trust_from(&self, sent: Instant) -> Instant {
        sent + self
            .config
            .lease_duration
            .saturating_sub(self.config.trust_margin)
    }

    async fn heartbeat(&mut self) {
        let Some(h) = &self.held else { return };
        let mandate = h.mandate.clone();
        let sent = Instant::now();
        let call = lease::heartbeat(&self.pool, &mandate, self.config.lease_duration);
        let outcome = match timeout(self.config.call_timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(LeaseError::TimedOut(self.config.call_timeout)),
        };
        match outcome {
            Ok(renewed) => {
                let trust_until = self.trust_from(sent);
                if let Some(h) = &mut self.held {
                    h.mandate = renewed;
                    h.trust_until = trust_until;
                    h.next_heartbeat = sent + self.config.heartbeat_period;
                }
            }
            Err(LeaseError::Lost) => {
                self.lost("heartbeat found a newer mandate or an expired lease")
            }
            Err(e) => {
                self.report("heartbeat", &e).await;
                // Try again soon; trust_until is unchanged and ends the
                // mandate if no heartbeat gets through in time.
                let retry = Instant::now() + (self.config.heartbeat_period / 2);
                if let Some(h) = &mut self.held {
                    h.next_heartbeat = retry;
                }
            }
        }
    }

    /// One sweep on behalf of the held mandate, batch by batch, heartbeating
    /// between batches when one is due.
    async fn sweep(&mut self) {
        let Some(fence) = self.held.as_ref().map(|h| h.mandate.fence) else {
            return;
        };
        if !self.trusted() {
            return;
        }
        let replica = self.config.replica.clone();
        let limit = self.config.call_timeout;
        let run_id = match bounded(limit, start_run(&self.pool, &replica, fence)).await {
            Ok(id) => id,
            Err(e) => return self.sweep_failed("start", fence, e),
        };
        let mut total = 0u64;
        loop {
            if self.stop_requested() || !self.trusted() {
                break;
            }
            let batch =
                expire_two_batches(&self.pool, &replica, fence, self.config.batch_size, limit)
                    .await;
            match batch {
                Ok((n, done)) => {
                    total += n;
                    self.metrics
                        .reservations_expired
                        .with_label_values(&["sweep"])
                        .inc_by(n);
                    if done {
                        break;
                    }
                }
                Err(e) => return self.sweep_failed("expire", fence, e),
            }
            if self
                .held
                .as_ref()
                .is_some_and(|h| Instant::now() >= h.next_heartbeat)
            {
                self.heartbeat().await;
            }
        }
        if !self.trusted() {
            return;
        }
        if let Err(e) = bounded(
            limit,
            finish_run(&self.pool, &replica, fence, run_id, total),
        )
        .await
        {
            return self.sweep_failed("finish", fence, e);
        }
        self.metrics.sweeps_run.inc();
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.metrics.last_sweep_unixtime.set(unix as i64);
        if total > 0 {
            tracing::info!(replica = %replica, fence, expired = total, "sweep expired overdue reservations");
        } else {
            tracing::debug!(replica = %replica, fence, "sweep found nothing overdue");
        }
    }

    /// Issue 15: refusal rows past their retention, batch by batch, under
    /// the same mandate as the sweep (each batch checks it), heartbeating
    /// between batches when one is due.
    async fn purge_refusals(&mut self) {
        let Some(fence) = self.held.as_ref().map(|h| h.mandate.fence) else {
            return;
        };
        let replica = self.config.replica.clone();
        let mut purged = 0u64;
        loop {
            if self.stop_requested() || !self.trusted() {
                break;
            }
            let batch = bounded(
                self.config.call_timeout,
                purge_refusals_batch(
                    &self.pool,
                    &replica,
                    fence,
                    self.config.refusal_retention_days,
                    PURGE_BATCH_SIZE,
                ),
            )
            .await;
            match batch {
                Ok(n) => {
                    purged += n;
                    if (n as i64) < PURGE_BATCH_SIZE {
                        break;
                    }
                }
                Err(e) => return self.sweep_failed("purge refusals", fence, e),
            }
            if self
                .held
                .as_ref()
                .is_some_and(|h| Instant::now() >= h.next_heartbeat)
            {
                self.heartbeat().await;
            }
        }
        if purged > 0 {
            tracing::info!(replica = %replica, fence, purged, retention_days = self.config.refusal_retention_days, "sweep purged old refusal rows");
        }
    }

    fn sweep_failed(&mut self, step: &str, fence: i64, error: SweepError) {
        match error {
            SweepError::Lost => self.lost("a fenced sweep statement found the lease gone"),
            e => {
                self.metrics.sweep_errors.inc();
                tracing::error!(replica = %self.config.replica, fence, step, error = %e, "sweep failed; retrying next period");
            }
        }
    }

    /// Graceful shutdown: the sweep has stopped; expire the lease in place so
    /// that another replica claims it at its next tick.
    async fn release(&mut self) {
        let Some(h) = self.held.take() else { return };
        let call = lease::release(&self.pool, &h.mandate);
        let outcome = match timeout(self.config.call_timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(LeaseError::TimedOut(self.config.call_timeout)),
        };
        match outcome {
            Ok(()) => {
                tracing::info!(replica = %self.config.replica, fence = h.mandate.fence, "sweep lease released")
            }
            Err(LeaseError::Lost) => {
                self.metrics.lease_lost.inc();
                tracing::warn!(
                    replica = %self.config.replica,
                    fence = h.mandate.fence,
                    "sweep lease was already lost when releasing it"
                );
            }
            Err(e) => self.report("release", &e).await,
        }
    }
}

async fn bounded<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, SweepError>>,
) -> Result<T, SweepError> {
    timeout(limit, call)
        .await
        .unwrap_or(Err(SweepError::TimedOut(limit)))
}
