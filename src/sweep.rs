//! The sweep (R11): every period, the replica that holds the `sweep` lease
//! marks overdue held reservations expired. It only tidies: conversion and
//! the allocator enforce the deadline themselves. Between two sweeps the
//! holder also writes the R16 warnings as they fall due (`next_warning_in`),
//! and each period the chart's count, the fold of the pool figures and
//! R21's daily history of the pools (src/planning.rs).
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

use crate::lease::{Holder, LIVE_LEASE, SWEEP_KEY, Terms, Timings};
use crate::metrics::Metrics;
use crate::settings::{DbPooler, Settings};

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
    // The overdue orders are chosen and locked by their first slot in a CTE
    // with LIMIT (a LIMIT inside IN (...) may lock more rows than it
    // returns). SKIP LOCKED: an order being converted or cancelled right
    // now is left to its owner; if it is still held and overdue, the next
    // sweep takes it. R13: an order ends whole, in this one statement: its
    // other slots are then locked and waited for (whoever locks slots
    // takes the first one first, or never waits: no deadlock). An order of
    // one is its first slot, already locked: only orders of several look
    // up their other slots.
    let sql = format!(
        "WITH {LIVE_LEASE},
         due AS (
             SELECT r.id, r.org_id, r.order_ref, r.quantity FROM reservations r
              WHERE r.state = 'held' AND r.expires_at <= clock_timestamp() AND r.slot = 1
                AND EXISTS (SELECT 1 FROM lease)
              ORDER BY r.expires_at
              LIMIT $4
                FOR UPDATE OF r SKIP LOCKED
         ),
         others AS (
             SELECT s.id FROM reservations s JOIN due d ON s.org_id = d.org_id AND s.order_ref = d.order_ref
              WHERE d.quantity > 1 AND s.slot > 1 AND s.state = 'held'
                FOR UPDATE OF s
         ),
         slots AS (SELECT id FROM due UNION ALL SELECT id FROM others),
         expired AS (
             UPDATE reservations r
                SET state = 'expired', ended_at = clock_timestamp(), ended_by = 'sweep',
                    end_reason = 'hold deadline ' || to_char(r.expires_at AT TIME ZONE 'UTC',
                                 'YYYY-MM-DD HH24:MI:SS') || ' UTC passed'
               FROM slots
              WHERE r.id = slots.id AND r.state = 'held'
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
    fenced(db, sql, replica, fence, limit).await
}

/// Runs one of the worker's fenced statements: `$1` the sweep's key, `$2`
/// the replica, `$3` its fence, `$4` the batch's limit; it answers whether
/// the mandate was live in the statement and how many rows it did. `Lost`
/// when it was not (and then it did nothing).
async fn fenced<'c>(
    db: impl PgExecutor<'c>,
    sql: String,
    replica: &str,
    fence: i64,
    limit: i64,
) -> Result<u64, SweepError> {
    let (live, done): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(SWEEP_KEY)
        .bind(replica)
        .bind(fence)
        .bind(limit)
        .fetch_one(db)
        .await?;
    if live == 0 {
        return Err(SweepError::Lost);
    }
    Ok(done as u64)
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

/// Refusal rows deleted per retention statement.
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

/// R16: warns about up to `limit` holds whose deadline is within their
/// organization's warning time (`organizations.expiry_warning_seconds`),
/// once per deadline: the event `expiring` (webhook `reservation.expiring`)
/// and `warned_deadline` are written in one statement under the sweep's
/// mandate, so a replica killed mid-way warns about nothing and the next
/// holder warns once; an extension moves the deadline and re-arms it.
/// Returns how many were warned about.
pub async fn warn_batch<'c>(
    db: impl PgExecutor<'c>,
    replica: &str,
    fence: i64,
    limit: i64,
) -> Result<u64, SweepError> {
    let sql = format!(
        "WITH {LIVE_LEASE},
         due AS MATERIALIZED (
             SELECT r.id FROM reservations r
               JOIN organizations o ON o.id = r.org_id
              WHERE r.state = 'held' AND r.expires_at > clock_timestamp()
                -- The longest warning (the column's check) bounds the scan
                -- of the held-by-deadline index; each organization's own
                -- warning time filters within it.
                AND r.expires_at <= clock_timestamp() + interval '3600 seconds'
                AND r.expires_at <= clock_timestamp() + make_interval(secs => o.expiry_warning_seconds)
                AND r.warned_deadline IS DISTINCT FROM r.expires_at
                AND EXISTS (SELECT 1 FROM lease)
              ORDER BY r.expires_at
              LIMIT $4
                FOR UPDATE OF r SKIP LOCKED
         ),
         warned AS (
             UPDATE reservations r SET warned_deadline = r.expires_at
               FROM due
              WHERE r.id = due.id AND r.state = 'held'
             RETURNING r.id, r.expires_at
         ),
         events AS (
             INSERT INTO reservation_events
                    (reservation_id, kind, from_state, to_state, actor, detail, replica, lease_fence)
             SELECT w.id, 'expiring', 'held', 'held', 'sweep',
                    'hold deadline ' || to_char(w.expires_at AT TIME ZONE 'UTC',
                                 'YYYY-MM-DD HH24:MI:SS') || ' UTC'
                    || ' in ' || ceil(extract(epoch FROM w.expires_at - clock_timestamp()))::bigint || ' s',
                    $2, l.fence
               FROM warned w CROSS JOIN lease l
         )
         SELECT (SELECT count(*) FROM lease) AS live, (SELECT count(*) FROM warned) AS warned"
    );
    fenced(db, sql, replica, fence, limit).await
}

/// How often, at the longest, the lease holder looks for a warning falling
/// due between two sweeps: a hold created or extended on any replica, whose
/// warning time is already within reach, is seen within this.
pub const WARNING_RECHECK: Duration = Duration::from_secs(1);

/// The shortest wait between two looks at the warnings.
const WARNING_PAUSE: Duration = Duration::from_millis(50);

/// R16 between sweeps: seconds (by the database's clock) until the earliest
/// warning not yet written falls due, among the holds whose warning falls
/// within `WARNING_RECHECK`; negative when one is already due, `None` when
/// none is. Read-only and unfenced: it only says when to run `warn_batch`,
/// which checks the mandate. The scan of the held-by-deadline index is
/// bounded by the longest warning any organization asks for.
pub async fn next_warning_in<'c>(db: impl PgExecutor<'c>) -> Result<Option<f64>, sqlx::Error> {
    sqlx::query_scalar(
        "WITH now AS MATERIALIZED (
             SELECT clock_timestamp() AS t,
                    (SELECT coalesce(max(expiry_warning_seconds), 0) FROM organizations) AS longest
         )
         SELECT extract(epoch FROM min(r.expires_at - make_interval(secs => o.expiry_warning_seconds))
                                  - (SELECT t FROM now))::float8
           FROM reservations r
           JOIN organizations o ON o.id = r.org_id
          WHERE r.state = 'held'
            AND r.expires_at > (SELECT t FROM now)
            AND r.expires_at <= (SELECT t + make_interval(secs => longest + $1) FROM now)
            AND o.expiry_warning_seconds > 0
            AND r.expires_at <= (SELECT t FROM now)
                                + make_interval(secs => o.expiry_warning_seconds + $1)
            AND r.warned_deadline IS DISTINCT FROM r.expires_at",
    )
    .bind(WARNING_RECHECK.as_secs_f64())
    .fetch_one(db)
    .await
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
    while warn_batch(pool, replica, fence, batch).await? as i64 == batch {}
    finish_run(pool, replica, fence, run_id, expired).await?;
    Ok(SweepReport { run_id, expired })
}

/// Timings of the worker, derived from `Settings`.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub replica: String,
    pub period: Duration,
    /// The lease's timings (`POOLKEEPER_LEASE_SECONDS`), the worker's call
    /// bounds among them.
    pub lease: Timings,
    pub batch_size: i64,
    /// `POOLKEEPER_REFUSAL_RETENTION_DAYS`.
    pub refusal_retention_days: u32,
}

impl WorkerConfig {
    pub fn from_settings(settings: &Settings) -> WorkerConfig {
        WorkerConfig {
            replica: settings.replica.clone(),
            period: settings.sweep_period,
            lease: Timings::for_lease(settings.lease_duration),
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
    // Its own small pool: the HTTP load cannot starve it, and its
    // statement_timeout is shorter than the pool's 15 s.
    let worker_pool = pool.worker_pool(
        "poolkeeper-sweep",
        2,
        config.lease.call_timeout,
        config.lease.statement_timeout,
        settings.db_pooler == DbPooler::Transaction,
    );
    let terms = Terms {
        key: SWEEP_KEY,
        replica: config.replica.clone(),
        timings: config.lease,
        work: "sweeping",
    };
    let lease = Holder::new(worker_pool.clone(), metrics.clone(), terms);
    let mut worker = Worker {
        pool: worker_pool.clone(),
        config,
        metrics,
        shutdown,
        stopping: false,
        lease,
    };
    worker.run().await;
    worker_pool.close().await;
}

struct Worker {
    pool: Db,
    config: WorkerConfig,
    metrics: Metrics,
    shutdown: watch::Receiver<bool>,
    stopping: bool,
    lease: Holder,
}

impl Worker {
    async fn run(&mut self) {
        tracing::info!(
            replica = %self.config.replica,
            period_s = self.config.period.as_secs_f64(),
            lease_s = self.config.lease.lease_duration.as_secs_f64(),
            "sweep worker started"
        );
        let mut next_tick = Instant::now();
        // R16: when the holder next looks at the warnings, between sweeps.
        let mut next_warning: Option<Instant> = None;
        while !self.stop_requested() {
            let next = match next_warning {
                Some(at) if self.lease.is_held() => next_tick.min(at),
                _ => next_tick,
            };
            let wake = self.lease.wake(next);
            tokio::select! {
                _ = sleep_until(wake) => {}
                changed = self.shutdown.changed() => {
                    if changed.is_err() {
                        self.stopping = true;
                    }
                    continue;
                }
            }
            self.lease.keep().await;
            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + self.config.period;
                if !self.lease.is_held() {
                    self.lease.claim().await;
                }
                if self.lease.is_held() {
                    self.sweep().await;
                    self.purge_refusals().await;
                    self.count_activity().await;
                    self.fold_figures().await;
                    self.write_history().await;
                }
                next_warning = self.plan_warnings().await;
            } else if next_warning.is_some_and(|at| now >= at) {
                self.warn().await;
                next_warning = self.plan_warnings().await;
            }
        }
        // Graceful shutdown: the sweep has stopped; the lease is expired in
        // place so that another replica claims it at its next tick.
        self.lease.release().await;
        tracing::info!(replica = %self.config.replica, "sweep worker stopped");
    }

    fn stop_requested(&mut self) -> bool {
        self.stopping = self.stopping || *self.shutdown.borrow();
        self.stopping
    }

    /// One sweep on behalf of the held mandate, batch by batch, heartbeating
    /// between batches when one is due.
    async fn sweep(&mut self) {
        let Some(fence) = self.lease.fence() else {
            return;
        };
        if !self.lease.trusted() {
            return;
        }
        let replica = self.config.replica.clone();
        let limit = self.config.lease.call_timeout;
        let run_id = match bounded(limit, start_run(&self.pool, &replica, fence)).await {
            Ok(id) => id,
            Err(e) => return self.sweep_failed("start", fence, e),
        };
        let mut total = 0u64;
        loop {
            if self.stop_requested() || !self.lease.trusted() {
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
            self.lease.heartbeat_if_due().await;
        }
        // R16: the warnings before the deadlines, under the same mandate.
        if let Err(e) = self.warn_due(fence).await {
            return self.sweep_failed("warn", fence, e);
        }
        if !self.lease.trusted() {
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

    /// R16: every warning due now, batch by batch, under the mandate `fence`
    /// (each batch checks it), heartbeating between batches when one is due.
    async fn warn_due(&mut self, fence: i64) -> Result<(), SweepError> {
        let replica = self.config.replica.clone();
        let limit = self.config.lease.call_timeout;
        let batch_size = self.config.batch_size;
        loop {
            if self.stop_requested() || !self.lease.trusted() {
                return Ok(());
            }
            let n = bounded(limit, warn_batch(&self.pool, &replica, fence, batch_size)).await?;
            if (n as i64) < batch_size {
                return Ok(());
            }
            self.lease.heartbeat_if_due().await;
        }
    }

    /// R16 between sweeps: the warnings that fell due since the last look.
    async fn warn(&mut self) {
        let Some(fence) = self.lease.fence() else {
            return;
        };
        if let Err(e) = self.warn_due(fence).await {
            self.sweep_failed("warn", fence, e);
        }
    }

    /// R16: when the holder must next look at the warnings: when the
    /// earliest one falls due, and at least every `WARNING_RECHECK`, so that
    /// a warning is written within about a second of its time whatever the
    /// sweep period and the warning time. The look is a read of the
    /// database, so holds created or extended on any replica are seen; a
    /// notification (LISTEN/NOTIFY) would not pass a pooler in transaction
    /// mode, and an in-process one would miss the other replicas. `None`
    /// when this replica holds no trusted mandate: only the holder warns.
    async fn plan_warnings(&mut self) -> Option<Instant> {
        if !self.lease.trusted() || self.stop_requested() {
            return None;
        }
        let now = Instant::now();
        let limit = self.config.lease.call_timeout;
        let due_in = match timeout(limit, next_warning_in(&self.pool)).await {
            Ok(Ok(due_in)) => due_in,
            // The sweep itself reports a database that fails, each period.
            Ok(Err(e)) => {
                tracing::debug!(replica = %self.config.replica, error = %e, "looking for due warnings failed; looking again shortly");
                None
            }
            Err(_) => None,
        };
        // A warning already due (a hold being converted right now is skipped
        // by warn_batch) is looked at again after a short pause, not in a
        // tight loop.
        let wait = due_in
            .filter(|s| s.is_finite())
            .map_or(WARNING_RECHECK.as_secs_f64(), |s| {
                s.clamp(WARNING_PAUSE.as_secs_f64(), WARNING_RECHECK.as_secs_f64())
            });
        Some(now + Duration::from_secs_f64(wait))
    }

    /// The overview's chart: what happened since the last count, under the
    /// same mandate (the statement checks it).
    async fn count_activity(&mut self) {
        let Some(fence) = self.lease.fence() else {
            return;
        };
        if self.stop_requested() || !self.lease.trusted() {
            return;
        }
        let replica = self.config.replica.clone();
        let counted = bounded(self.config.lease.call_timeout, async {
            crate::activity::count(&self.pool, &replica, fence)
                .await?
                .ok_or(SweepError::Lost)
        })
        .await;
        if let Err(e) = counted {
            self.sweep_failed("count activity", fence, e);
        }
    }

    /// R21: the days that closed since the last period into each pool's
    /// history, one statement per day under the same mandate (each checks
    /// it), at most `DAYS_PER_PERIOD` a period, heartbeating between days
    /// when one is due: a rebuild of the past is spread over periods.
    async fn write_history(&mut self) {
        let Some(fence) = self.lease.fence() else {
            return;
        };
        let replica = self.config.replica.clone();
        let limit = self.config.lease.call_timeout;
        for _ in 0..crate::planning::DAYS_PER_PERIOD {
            if self.stop_requested() || !self.lease.trusted() {
                return;
            }
            let written = bounded(limit, async {
                crate::planning::write_next_day(&self.pool, &replica, fence)
                    .await?
                    .ok_or(SweepError::Lost)
            })
            .await;
            match written {
                Ok(crate::planning::Written::UpToDate) => return,
                Ok(crate::planning::Written::Day(day, pools)) => {
                    tracing::info!(replica = %replica, fence, %day, pools, "sweep wrote a day of pool history");
                }
                Err(e) => return self.sweep_failed("write pool history", fence, e),
            }
            self.lease.heartbeat_if_due().await;
        }
    }

    /// R17: the changes of machines since the last period into the figures
    /// per pool, so that their reads stay a few rows per pool. The fold is
    /// exact whoever runs it, so it needs no fence; only the holder runs it
    /// to keep it to one replica.
    async fn fold_figures(&mut self) {
        if self.stop_requested() || !self.lease.trusted() {
            return;
        }
        let limit = self.config.lease.call_timeout;
        let folded = bounded(limit, async {
            Ok(crate::capacity::fold_figures(&self.pool).await?)
        })
        .await;
        match folded {
            Ok(n) => {
                tracing::debug!(replica = %self.config.replica, folded = n, "sweep folded the pool figures")
            }
            Err(e) => {
                let fence = self.lease.fence().unwrap_or(0);
                self.sweep_failed("fold pool figures", fence, e);
            }
        }
    }

    /// Refusal rows past their retention, batch by batch, under
    /// the same mandate as the sweep (each batch checks it), heartbeating
    /// between batches when one is due.
    async fn purge_refusals(&mut self) {
        let Some(fence) = self.lease.fence() else {
            return;
        };
        let replica = self.config.replica.clone();
        let mut purged = 0u64;
        loop {
            if self.stop_requested() || !self.lease.trusted() {
                break;
            }
            let batch = bounded(
                self.config.lease.call_timeout,
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
            self.lease.heartbeat_if_due().await;
        }
        if purged > 0 {
            tracing::info!(replica = %replica, fence, purged, retention_days = self.config.refusal_retention_days, "sweep purged old refusal rows");
        }
    }

    fn sweep_failed(&mut self, step: &str, fence: i64, error: SweepError) {
        match error {
            SweepError::Lost => {
                self.lease
                    .lost("a fenced sweep statement found the lease gone");
            }
            e => {
                self.metrics.sweep_errors.inc();
                tracing::error!(replica = %self.config.replica, fence, step, error = %e, "sweep failed; retrying next period");
            }
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
