//! The delivery worker under the `webhooks` lease.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::db::Db;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout};

use super::delivery::{backoff, post};
use super::outbox::{DeliveryError, Due, WEBHOOKS_KEY, drop_orphans, due, record_attempt};
use super::urls::{REQUEST_TIMEOUT, http_client};
use crate::lease::{Holder, Terms, Timings};
use crate::metrics::Metrics;
use crate::settings::{DbPooler, Settings};

/// Deliveries in flight at once, all organizations together.
pub const CONCURRENCY: usize = 32;

/// Deliveries in flight at once for one organization: a slow endpoint holds
/// these slots and no more.
pub const PER_ORG: usize = 8;

/// How often the worker drops the deliveries of organizations whose webhook
/// is gone. Removing a webhook drops its pending deliveries itself; this
/// only catches an event that committed just after, and it reads every
/// pending delivery, so not at every poll (the worker polls whenever
/// deliveries finish).
pub const ORPHANS_EVERY: Duration = Duration::from_secs(30);

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
    let Some(mut worker) = Worker::new(pool, settings, metrics, shutdown) else {
        return;
    };
    worker.run().await;
    worker.pool.close().await;
}

/// What one step of the worker did: the deliveries it attempted, by the
/// state each attempt left its delivery in.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Step {
    /// Whether this replica held the lease: without it nothing is attempted.
    pub leased: bool,
    /// Answered 2xx.
    pub delivered: usize,
    /// Failed, pending again until its backoff has passed.
    pub retrying: usize,
    /// Failed past the retry window: given up.
    pub failed: usize,
    /// Sent, but not recorded by this worker (the lease lost, a database
    /// error, or recorded first by another holder): sent again if pending.
    pub unrecorded: usize,
}

impl Step {
    /// Deliveries attempted.
    pub fn attempted(&self) -> usize {
        self.delivered + self.retrying + self.failed + self.unrecorded
    }
}

/// One step of the worker, as `settings.replica`: claims the lease, starts
/// what is due now as the loop's poll does (at most `CONCURRENCY`,
/// `PER_ORG` per organization, one event of a reservation at a time),
/// waits for every attempt to be recorded as the loop does on shutdown,
/// and releases the lease. What is due after a backoff is left for a later
/// step. For tests, which step the worker instead of waiting for its loop.
pub async fn run_once(pool: &Db, settings: &Settings, metrics: Metrics) -> Step {
    let (_keep_running, running) = watch::channel(false);
    let Some(mut worker) = Worker::new(pool, settings, metrics, running) else {
        return Step::default();
    };
    worker.start_due().await;
    worker.report.leased = worker.lease.is_held();
    worker.drain().await;
    worker.lease.release().await;
    worker.pool.close().await;
    worker.report
}

impl Worker {
    /// The worker of `settings`, holding no lease yet; `None` (logged) when
    /// its HTTP client cannot be built.
    fn new(
        pool: &Db,
        settings: &Settings,
        metrics: Metrics,
        shutdown: watch::Receiver<bool>,
    ) -> Option<Worker> {
        let config = WorkerConfig::from_settings(settings);
        let http = match http_client(config.allow_private) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot build the webhook HTTP client; no webhook is delivered by this replica");
                return None;
            }
        };
        // Its own small pool, like the sweep's: HTTP load cannot starve it, and
        // a slow receiver holds no connection (the POST runs outside any
        // statement).
        let worker_pool = pool.worker_pool(
            "poolkeeper-webhooks",
            4,
            config.lease.call_timeout,
            config.lease.statement_timeout,
            settings.db_pooler == DbPooler::Transaction,
        );
        let terms = Terms {
            key: WEBHOOKS_KEY,
            replica: config.replica.clone(),
            timings: config.lease,
            work: "delivering",
        };
        let lease = Holder::new(worker_pool.clone(), metrics, terms);
        Some(Worker {
            pool: worker_pool,
            http,
            config,
            shutdown,
            stopping: false,
            lease,
            tasks: JoinSet::new(),
            in_flight: HashMap::new(),
            orphans_dropped_at: None,
            report: Step::default(),
        })
    }
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
    /// When `drop_orphans` last ran (`ORPHANS_EVERY`).
    orphans_dropped_at: Option<Instant>,
    /// What the attempts finished so far came to.
    report: Step,
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
                    // Every delivery finished meanwhile too: one poll then
                    // fills all the free slots, not one slot per poll.
                    while let Some(done) = self.tasks.try_join_next() {
                        self.finished(done);
                    }
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
                self.start_due().await;
            }
        }
        self.drain().await;
        self.lease.release().await;
        tracing::info!(replica = %self.config.replica, "webhook delivery worker stopped");
    }

    /// Claims the lease unless it is held; trusted, starts what is due.
    async fn start_due(&mut self) {
        if !self.lease.is_held() {
            self.lease.claim().await;
        }
        if self.lease.trusted() {
            self.poll().await;
        }
    }

    /// Lets what is in flight finish and be recorded, bounded by the request
    /// timeout and the statement bound; what is left then is abandoned.
    async fn drain(&mut self) {
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
        if let Ok(Some(state)) = &done.outcome {
            crate::metrics::count_webhook_delivery(state);
        }
        let r = &mut self.report;
        match done.outcome.as_ref().map(|s| s.as_deref()) {
            Ok(Some("delivered")) => r.delivered += 1,
            Ok(Some("failed")) => r.failed += 1,
            Ok(Some(_)) => r.retrying += 1,
            Ok(None) | Err(_) => r.unrecorded += 1,
        }
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
        if self
            .orphans_dropped_at
            .is_none_or(|at| at.elapsed() >= ORPHANS_EVERY)
        {
            self.orphans_dropped_at = Some(Instant::now());
            match timeout(limit, drop_orphans(&self.pool, &self.config.replica, fence)).await {
                Ok(Ok(_)) => {}
                Ok(Err(DeliveryError::Lost)) => {
                    return self.lost("a fenced delivery write found the lease gone");
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "could not drop orphaned webhook deliveries")
                }
                Err(_) => tracing::error!("dropping orphaned webhook deliveries timed out"),
            }
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
            let timer = crate::metrics::GLOBAL.webhook_attempt.start_timer();
            let attempt = post(&http, &d, config.allow_private).await;
            timer.observe_duration();
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
