//! The sweep (R11, R12) as a function, as an in-process worker, and as
//! three real `poolkeeper serve` processes sharing one database.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use chrono::{DateTime, Utc};
use poolkeeper::db::Db;
use poolkeeper::lease::{self, Claim, Mandate, SWEEP_KEY};
use poolkeeper::metrics::Metrics;
use poolkeeper::sweep::{self, SweepError};
use sqlx::Connection;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::helpers::replicas::free_port;
use crate::helpers::{FakeHold, binary, migrated_db, seed_org_with_machines, test_settings};

const LONG: Duration = Duration::from_secs(60);

async fn take_sweep_lease(pool: &Db, holder: &str) -> Mandate {
    match lease::claim(pool, SWEEP_KEY, holder, LONG)
        .await
        .expect("claim")
    {
        Claim::Acquired(m) => m,
        Claim::HeldByOther => panic!("{holder} could not take the sweep lease"),
    }
}

async fn scalar<T>(pool: &Db, sql: &'static str) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}

/// A held reservation of `machine` as the sweep finds one: created 20
/// minutes ago, with its deadline `deadline` from now by the database clock
/// (negative: overdue).
fn aged_hold(machine: i64, deadline: &str) -> FakeHold {
    FakeHold::on(machine)
        .bare()
        .spec(serde_json::json!({"site": "par1"}))
        .snapshot(serde_json::json!({"asset_tag": "m"}))
        .reason("first ready machine of the spec")
        .created_ago("20 minutes")
        .deadline(deadline)
}

/// (state, ended_by, end_reason) of a reservation.
async fn state(pool: &Db, id: i64) -> (String, Option<String>, Option<String>) {
    sqlx::query_as("SELECT state, ended_by, end_reason FROM reservations WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("reservation")
}

/// Expired events of a reservation: (actor, replica, lease_fence).
async fn expired_events(pool: &Db, id: i64) -> Vec<(String, Option<String>, Option<i64>)> {
    sqlx::query_as(
        "SELECT actor, replica, lease_fence FROM reservation_events
          WHERE reservation_id = $1 AND kind = 'expired' AND from_state = 'held' AND to_state = 'expired'",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .expect("events")
}

/// Waits for a condition checked in the database; only for workers and
/// processes that run on their own.
async fn wait_until(pool: &Db, what: &str, within: Duration, sql: &'static str) {
    let deadline = Instant::now() + within;
    loop {
        let done: bool = sqlx::query_scalar(sql)
            .fetch_one(pool)
            .await
            .unwrap_or(false);
        if done {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn overdue_held_reservations_are_expired_once_by_the_sweep() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let (org, machines) = seed_org_with_machines(&pool, "acme", true, 6).await;
    let mut overdue = Vec::new();
    for &m in &machines[..3] {
        overdue.push(aged_hold(m, "-5 minutes").create(&pool, org).await);
    }
    let live = aged_hold(machines[3], "10 minutes")
        .create(&pool, org)
        .await;
    // A reservation somebody cancelled past its deadline stays cancelled (R2).
    let cancelled = aged_hold(machines[4], "-1 minute").create(&pool, org).await;
    sqlx::query(
        "UPDATE reservations SET state = 'cancelled', ended_at = clock_timestamp(),
                ended_by = 'support@acme.example', end_reason = 'customer asked' WHERE id = $1",
    )
    .bind(cancelled)
    .execute(&pool)
    .await
    .expect("cancel");
    let m = take_sweep_lease(&pool, "replica-a").await;

    // Batches of 2: three overdue reservations take two statements.
    let report = sweep::sweep(&pool, "replica-a", m.fence, 2)
        .await
        .expect("sweep");
    assert_eq!(report.expired, 3);
    let again = sweep::sweep(&pool, "replica-a", m.fence, 2)
        .await
        .expect("second sweep");
    assert_eq!(again.expired, 0);

    for &id in &overdue {
        let (st, by, reason) = state(&pool, id).await;
        assert_eq!((st.as_str(), by.as_deref()), ("expired", Some("sweep")));
        let reason = reason.expect("end_reason");
        assert!(
            // One format for people, as everywhere else: no `T`, no milliseconds.
            reason.starts_with("hold deadline 20")
                && reason.ends_with(" UTC passed")
                && reason.len() == "hold deadline 2026-12-07 11:07:28 UTC passed".len(),
            "{reason}"
        );
        assert_eq!(
            expired_events(&pool, id).await,
            vec![(
                "sweep".to_owned(),
                Some("replica-a".to_owned()),
                Some(m.fence)
            )],
            "exactly one expired event with replica and fence"
        );
    }
    assert_eq!(state(&pool, live).await.0, "held");
    assert!(expired_events(&pool, live).await.is_empty());
    let (st, by, _) = state(&pool, cancelled).await;
    assert_eq!(
        (st.as_str(), by.as_deref()),
        ("cancelled", Some("support@acme.example"))
    );
    let runs: Vec<(String, i64, i32, bool)> = sqlx::query_as(
        "SELECT replica, lease_fence, expired, finished_at >= started_at FROM sweep_runs ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .expect("runs");
    assert_eq!(
        runs,
        vec![
            ("replica-a".to_owned(), m.fence, 3, true),
            ("replica-a".to_owned(), m.fence, 0, true)
        ]
    );
    // The machines are back in stock: a new hold on one of them is allowed
    // by the arbiter index (R1).
    aged_hold(machines[0], "10 minutes")
        .create(&pool, org)
        .await;
}

/// Two sweeps racing under the same mandate (a run that overlaps the next
/// tick) still expire each reservation exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_sweeps_expire_each_reservation_once() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let (org, machines) = seed_org_with_machines(&pool, "acme", true, 60).await;
    for &m in &machines {
        aged_hold(m, "-5 minutes").create(&pool, org).await;
    }
    let m = take_sweep_lease(&pool, "replica-a").await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(4));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (db, barrier) = (db.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let pool = db.pool().await;
            barrier.wait().await;
            sweep::sweep(&pool, "replica-a", m.fence, 7).await
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task").expect("sweep").expired;
    }
    assert_eq!(total, 60);
    let not_once: i64 = scalar(
        &pool,
        "SELECT count(*) FROM reservations r
          WHERE r.state <> 'expired'
             OR (SELECT count(*) FROM reservation_events e WHERE e.reservation_id = r.id) <> 1",
    )
    .await;
    assert_eq!(not_once, 0);
    assert_eq!(
        scalar::<i64>(&pool, "SELECT sum(expired) FROM sweep_runs").await,
        60
    );
}

/// A paused holder that wakes after its lease was reclaimed writes nothing:
/// the fence is checked in the same statement as the write.
#[tokio::test]
async fn a_sweep_under_a_stale_fence_changes_nothing() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let (org, machines) = seed_org_with_machines(&pool, "acme", true, 2).await;
    let overdue = aged_hold(machines[0], "-5 minutes")
        .create(&pool, org)
        .await;

    // Reclaimed by another holder after expiry.
    let stale = take_sweep_lease(&pool, "replica-a").await;
    sqlx::query(
        "UPDATE leases SET acquired_at = clock_timestamp() - interval '2 minutes',
                           expires_at = clock_timestamp() - interval '1 minute' WHERE key = 'sweep'",
    )
    .execute(&pool)
    .await
    .expect("age the lease");
    let newer = take_sweep_lease(&pool, "replica-b").await;
    assert!(matches!(
        sweep::sweep(&pool, "replica-a", stale.fence, 500).await,
        Err(SweepError::Lost)
    ));
    // A run opened under the old fence cannot be fed either.
    let old_run: i64 = sqlx::query_scalar(
        "INSERT INTO sweep_runs (replica, lease_fence) VALUES ('replica-a', $1) RETURNING id",
    )
    .bind(stale.fence)
    .fetch_one(&pool)
    .await
    .expect("run");
    assert!(matches!(
        sweep::expire_batch(&pool, "replica-a", stale.fence, 500).await,
        Err(SweepError::Lost)
    ));
    assert!(matches!(
        sweep::finish_run(&pool, "replica-a", stale.fence, old_run, 0).await,
        Err(SweepError::Lost)
    ));
    // The same holder's older mandate (re-entrant claim) is stale too.
    let stale_b = newer.clone();
    let newest = take_sweep_lease(&pool, "replica-b").await;
    assert!(matches!(
        sweep::sweep(&pool, "replica-b", stale_b.fence, 500).await,
        Err(SweepError::Lost)
    ));
    // A lease that simply expired is not trusted either.
    let expired_holder_fence = newest.fence;
    sqlx::query("UPDATE leases SET expires_at = clock_timestamp() WHERE key = 'sweep'")
        .execute(&pool)
        .await
        .expect("expire");
    assert!(matches!(
        sweep::sweep(&pool, "replica-b", expired_holder_fence, 500).await,
        Err(SweepError::Lost)
    ));

    assert_eq!(state(&pool, overdue).await.0, "held");
    assert_eq!(
        scalar::<i64>(&pool, "SELECT count(*) FROM reservation_events").await,
        0
    );
    assert_eq!(
        scalar::<i64>(
            &pool,
            "SELECT count(*) FROM sweep_runs WHERE expired > 0 OR finished_at IS NOT NULL"
        )
        .await,
        0
    );
    assert_eq!(
        scalar::<i64>(&pool, "SELECT count(*) FROM sweep_runs").await,
        1,
        "only the run made by hand"
    );
}

/// The worker's connections carry a statement timeout shorter than the
/// pool's 15 s, so no call can hang the sweep for long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_fails_with_an_error_is_loud_and_the_worker_recovers() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let (org, machines) = seed_org_with_machines(&pool, "acme", false, 1).await;
    let overdue = aged_hold(machines[0], "-5 minutes")
        .create(&pool, org)
        .await;
    // An expired lease row of a departed replica, locked by a transaction
    // that outlasts the worker's statement timeout: the claim fails with
    // an error (57014), which is not "someone else holds it".
    lease::claim(&pool, SWEEP_KEY, "departed", Duration::from_secs(1))
        .await
        .expect("claim");
    sqlx::query("UPDATE leases SET expires_at = clock_timestamp() WHERE key = 'sweep'")
        .execute(&pool)
        .await
        .expect("expire");
    let mut locker = db.connection().await;
    sqlx::query("BEGIN")
        .execute(&mut locker)
        .await
        .expect("begin");
    sqlx::query("SELECT 1 FROM leases WHERE key = 'sweep' FOR UPDATE")
        .execute(&mut locker)
        .await
        .expect("lock");

    let mut settings = test_settings();
    settings.datacenter_module = false;
    settings.sweep_period = Duration::from_secs(1);
    settings.lease_duration = Duration::from_secs(3);
    let metrics = Metrics::new();
    let (stop, stopped) = watch::channel(false);
    let worker = {
        let (pool, settings, metrics) = (pool.clone(), settings.clone(), metrics.clone());
        tokio::spawn(async move { sweep::run(&pool, &settings, metrics, stopped).await })
    };
    wait_until(
        &pool,
        "a lease_errors row",
        Duration::from_secs(15),
        "SELECT EXISTS (SELECT 1 FROM lease_errors WHERE key = 'sweep' AND message LIKE 'claim: %')",
    )
    .await;
    assert!(metrics.lease_errors.get() >= 1);
    assert_eq!(metrics.lease_acquired.get(), 0);
    // The worker's own statement_timeout, shorter than the pool's 15 s and
    // than the 5 s lock_timeout, cancelled the claim.
    let message: String = scalar(
        &pool,
        "SELECT message FROM lease_errors ORDER BY id LIMIT 1",
    )
    .await;
    assert!(message.contains("statement timeout"), "{message}");
    assert_eq!(state(&pool, overdue).await.0, "held");

    sqlx::query("ROLLBACK")
        .execute(&mut locker)
        .await
        .expect("rollback");
    wait_until(
        &pool,
        "the worker sweeps once the lock is gone",
        Duration::from_secs(15),
        "SELECT state = 'expired' FROM reservations",
    )
    .await;
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(15), worker)
        .await
        .expect("worker stops")
        .expect("worker task");
    assert_eq!(metrics.lease_acquired.get(), 1);
    assert_eq!(
        metrics
            .reservations_expired
            .with_label_values(&["sweep"])
            .get(),
        1
    );
    assert!(metrics.sweeps_run.get() >= 1);
    assert!(metrics.last_sweep_unixtime.get() > 0);
    // Graceful stop released the lease in place.
    let (holder, live): (String, bool) = sqlx::query_as(
        "SELECT holder, expires_at > clock_timestamp() FROM leases WHERE key = 'sweep'",
    )
    .fetch_one(&pool)
    .await
    .expect("lease");
    assert_eq!((holder.as_str(), live), (settings.replica.as_str(), false));
}

/// R12: the sweep has no switch. With the deployment switch off and the
/// organization's setting off, overdue reservations still expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_runs_with_the_datacenter_module_switched_off() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let (org, machines) = seed_org_with_machines(&pool, "acme", false, 2).await;
    let overdue = aged_hold(machines[0], "-5 minutes")
        .create(&pool, org)
        .await;
    let live = aged_hold(machines[1], "1 hour").create(&pool, org).await;
    let mut settings = test_settings();
    settings.datacenter_module = false;
    settings.sweep_period = Duration::from_secs(1);
    settings.lease_duration = Duration::from_secs(3);
    let metrics = Metrics::new();
    let (stop, stopped) = watch::channel(false);
    let worker = {
        let (pool, settings, metrics) = (pool.clone(), settings.clone(), metrics.clone());
        tokio::spawn(async move { sweep::run(&pool, &settings, metrics, stopped).await })
    };
    wait_until(
        &pool,
        "the sweep with both switches off",
        Duration::from_secs(15),
        "SELECT count(*) = 1 FROM reservations WHERE state = 'expired' AND ended_by = 'sweep'",
    )
    .await;
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(15), worker)
        .await
        .expect("worker stops")
        .expect("worker task");
    assert_eq!(state(&pool, overdue).await.0, "expired");
    assert_eq!(state(&pool, live).await.0, "held");
    let events = expired_events(&pool, overdue).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].1.as_deref(), Some(settings.replica.as_str()));
}

/// A worker whose mandate was superseded notices at its next heartbeat,
/// says so, and stops sweeping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_loses_its_lease_stops_sweeping() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let (org, machines) = seed_org_with_machines(&pool, "acme", false, 2).await;
    aged_hold(machines[0], "-5 minutes")
        .create(&pool, org)
        .await;
    let mut settings = test_settings();
    settings.sweep_period = Duration::from_secs(1);
    settings.lease_duration = Duration::from_secs(3);
    let metrics = Metrics::new();
    let (stop, stopped) = watch::channel(false);
    let worker = {
        let (pool, settings, metrics) = (pool.clone(), settings.clone(), metrics.clone());
        tokio::spawn(async move { sweep::run(&pool, &settings, metrics, stopped).await })
    };
    wait_until(
        &pool,
        "first sweep",
        Duration::from_secs(15),
        "SELECT count(*) = 1 FROM reservations WHERE state = 'expired'",
    )
    .await;
    // Another replica takes the lease over (as if ours had expired).
    let intruder_fence: i64 = sqlx::query_scalar(
        "UPDATE leases SET holder = 'intruder', fence = nextval('lease_fence_seq'),
                acquired_at = clock_timestamp(), expires_at = clock_timestamp() + interval '1 hour'
          WHERE key = 'sweep' RETURNING fence",
    )
    .fetch_one(&pool)
    .await
    .expect("take over");
    let deadline = Instant::now() + Duration::from_secs(10);
    while metrics.lease_lost.get() == 0 {
        assert!(
            Instant::now() < deadline,
            "the worker never noticed it lost the lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let overdue = aged_hold(machines[1], "-5 minutes")
        .create(&pool, org)
        .await;
    let runs_before: i64 = scalar(&pool, "SELECT count(*) FROM sweep_runs").await;
    // Every claim draws a value from the sequence, refused or not: two
    // draws past the intruder's fence mean at least one refused claim was
    // fully handled (the worker is sequential) and the worker had its
    // chance to sweep.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let last: i64 = scalar(&pool, "SELECT last_value FROM lease_fence_seq").await;
        if last >= intruder_fence + 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker stopped retrying the claim"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(15), worker)
        .await
        .expect("worker stops")
        .expect("worker task");
    assert_eq!(state(&pool, overdue).await.0, "held");
    assert_eq!(
        scalar::<i64>(&pool, "SELECT count(*) FROM sweep_runs").await,
        runs_before
    );
    assert_eq!(metrics.lease_acquired.get(), 1);
    assert_eq!(metrics.lease_lost.get(), 1);
    let holder: String = scalar(&pool, "SELECT holder FROM leases WHERE key = 'sweep'").await;
    assert_eq!(
        holder, "intruder",
        "the worker's release must not touch the new mandate"
    );
}

/// The worker survives its connections being killed (as in a database
/// restart) and goes on sweeping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_survives_lost_connections() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let (org, machines) = seed_org_with_machines(&pool, "acme", false, 2).await;
    aged_hold(machines[0], "-5 minutes")
        .create(&pool, org)
        .await;
    let mut settings = test_settings();
    settings.datacenter_module = false;
    settings.sweep_period = Duration::from_secs(1);
    settings.lease_duration = Duration::from_secs(3);
    let metrics = Metrics::new();
    let (stop, stopped) = watch::channel(false);
    let worker = {
        let (pool, settings, metrics) = (pool.clone(), settings.clone(), metrics.clone());
        tokio::spawn(async move { sweep::run(&pool, &settings, metrics, stopped).await })
    };
    wait_until(
        &pool,
        "first sweep",
        Duration::from_secs(15),
        "SELECT count(*) = 1 FROM reservations WHERE state = 'expired'",
    )
    .await;

    // Refuse new connections and kill the worker's: every call fails for a while.
    let mut admin = sqlx::PgConnection::connect_with(&db.options.clone().database("postgres"))
        .await
        .expect("admin connection");
    let block = format!("ALTER DATABASE {} ALLOW_CONNECTIONS false", db.name);
    sqlx::query(sqlx::AssertSqlSafe(block))
        .execute(&mut admin)
        .await
        .expect("block");
    let errors_before = metrics.lease_errors.get() + metrics.sweep_errors.get();
    let killed: i64 = scalar(
        &pool,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'poolkeeper-sweep'",
    )
    .await;
    assert!(killed >= 1, "no worker connection to kill");
    let deadline = Instant::now() + Duration::from_secs(15);
    while metrics.lease_errors.get() + metrics.sweep_errors.get() == errors_before {
        assert!(
            Instant::now() < deadline,
            "the worker never noticed the database was gone"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let allow = format!("ALTER DATABASE {} ALLOW_CONNECTIONS true", db.name);
    sqlx::query(sqlx::AssertSqlSafe(allow))
        .execute(&mut admin)
        .await
        .expect("unblock");

    aged_hold(machines[1], "-5 minutes")
        .create(&pool, org)
        .await;
    wait_until(
        &pool,
        "a sweep after the outage",
        Duration::from_secs(15),
        "SELECT count(*) = 2 FROM reservations WHERE state = 'expired'",
    )
    .await;
    assert!(!worker.is_finished(), "the worker exited on an error");
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(15), worker)
        .await
        .expect("worker stops")
        .expect("worker task");
}

// ---- Three real replicas ---------------------------------------------------

struct Replica {
    name: String,
    /// `/metrics` on a listener of its own (no token needed there).
    metrics_port: u16,
    child: tokio::process::Child,
    log: PathBuf,
}

impl Replica {
    fn spawn(url: &str, name: &str, dir: &std::path::Path) -> Replica {
        let (port, metrics_port) = (free_port(), free_port());
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = tokio::process::Command::new(binary())
            .arg("serve")
            .env("DATABASE_URL", url)
            .env("POOLKEEPER_BIND", format!("127.0.0.1:{port}"))
            .env(
                "POOLKEEPER_METRICS_BIND",
                format!("127.0.0.1:{metrics_port}"),
            )
            .env("POOLKEEPER_SWEEP_SECONDS", "1")
            .env("POOLKEEPER_LEASE_SECONDS", "3")
            .env("POOLKEEPER_REPLICA", name)
            // R12: both switches off; the sweep runs anyway.
            .env("POOLKEEPER_DATACENTER_MODULE", "off")
            .env("RUST_LOG", "info,sqlx=warn,actix_server=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn poolkeeper serve");
        Replica {
            name: name.to_owned(),
            metrics_port,
            child,
            log,
        }
    }

    fn signal(&self, signal: i32) {
        let pid = self.child.id().expect("child still running");
        // SAFETY: plain signal delivery to our own child.
        let rc = unsafe { libc::kill(pid as i32, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn metric(&self, http: &reqwest::Client, name: &str) -> Option<f64> {
        let body = http
            .get(format!("http://127.0.0.1:{}/metrics", self.metrics_port))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }
}

async fn holder(pool: &Db) -> Option<(String, i64)> {
    sqlx::query_as(
        "SELECT holder, fence FROM leases WHERE key = 'sweep' AND expires_at > clock_timestamp()",
    )
    .fetch_optional(pool)
    .await
    .expect("lease")
}

async fn db_now(pool: &Db) -> DateTime<Utc> {
    scalar(pool, "SELECT clock_timestamp()").await
}

async fn seed_overdue(pool: &Db, org: i64, machines: &[i64]) -> Vec<i64> {
    let mut ids = Vec::new();
    for &m in machines {
        ids.push(aged_hold(m, "-1 minute").create(pool, org).await);
    }
    ids
}

/// Waits until every reservation of `ids` is expired.
async fn wait_expired(pool: &Db, ids: &[i64], within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM reservations WHERE id = ANY($1) AND state = 'held'",
        )
        .bind(ids)
        .fetch_one(pool)
        .await
        .expect("count");
        if left == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for the first sweep run of a replica other than `gone` started
/// after `after`; returns its start.
async fn first_run_after(
    pool: &Db,
    gone: &str,
    after: DateTime<Utc>,
    within: Duration,
) -> DateTime<Utc> {
    let deadline = Instant::now() + within;
    loop {
        let started: Option<DateTime<Utc>> = sqlx::query_scalar(
            "SELECT min(started_at) FROM sweep_runs WHERE replica <> $1 AND started_at > $2",
        )
        .bind(gone)
        .bind(after)
        .fetch_one(pool)
        .await
        .expect("runs");
        if let Some(t) = started {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "no other replica swept within {within:?} after {gone} left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn seconds(a: DateTime<Utc>, b: DateTime<Utc>) -> f64 {
    (b - a).num_milliseconds() as f64 / 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_the_sweep_through_the_lease() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let url = db.url();
    // R12: the organization's setting is off too.
    let (org, machines) = seed_org_with_machines(&pool, "acme", false, 40).await;
    let first = seed_overdue(&pool, org, &machines[..10]).await;
    let live = aged_hold(machines[39], "1 hour").create(&pool, org).await;
    let dir = std::env::temp_dir().join(format!(
        "poolkeeper-test-replicas-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("log dir");
    let mut replicas: Vec<Replica> = (1..=3)
        .map(|i| Replica::spawn(&url, &format!("replica-{i}"), &dir))
        .collect();
    let http = reqwest::Client::new();
    let logs = |replicas: &[Replica]| {
        replicas
            .iter()
            .map(|r| format!("--- {} ---\n{}", r.name, r.log()))
            .collect::<Vec<_>>()
            .join("\n")
    };

    // 1. Every overdue reservation is expired, by the one holder.
    wait_expired(&pool, &first, Duration::from_secs(30), "first sweep").await;

    // 2. kill -9 the holder: another replica sweeps within lease + period.
    let (dead, _) = holder(&pool).await.expect("a live holder");
    let idx = replicas
        .iter()
        .position(|r| r.name == dead)
        .expect("holder is ours");
    let mut killed = replicas.remove(idx);
    let killed_at = db_now(&pool).await;
    killed.child.start_kill().expect("SIGKILL");
    let _ = killed.child.wait().await;
    let batch = seed_overdue(&pool, org, &machines[10..15]).await;
    let started = first_run_after(&pool, &dead, killed_at, Duration::from_secs(15)).await;
    wait_expired(
        &pool,
        &batch,
        Duration::from_secs(15),
        "takeover after kill -9",
    )
    .await;
    let took = seconds(killed_at, started);
    eprintln!("takeover after kill -9 of {dead}: {took} s");
    assert!(
        took <= 3.0 + 1.0 + 1.5,
        "takeover after kill -9 took {took} s\n{}",
        logs(&replicas)
    );
    // An orchestrator would start a replacement.
    replicas.push(Replica::spawn(&url, "replica-4", &dir));

    // 3. SIGTERM the holder: it releases, another takes over within a period.
    let (leaving, _) = holder(&pool).await.expect("a live holder");
    let idx = replicas
        .iter()
        .position(|r| r.name == leaving)
        .expect("holder is ours");
    let mut stopped = replicas.remove(idx);
    let term_at = db_now(&pool).await;
    stopped.signal(libc::SIGTERM);
    let status = tokio::time::timeout(Duration::from_secs(20), stopped.child.wait())
        .await
        .expect("serve exits after SIGTERM")
        .expect("wait");
    assert!(
        status.success(),
        "serve exited with {status:?}\n{}",
        stopped.log()
    );
    assert!(
        stopped.log().contains("sweep lease released"),
        "{}",
        stopped.log()
    );
    let batch = seed_overdue(&pool, org, &machines[15..20]).await;
    let started = first_run_after(&pool, &leaving, term_at, Duration::from_secs(15)).await;
    wait_expired(
        &pool,
        &batch,
        Duration::from_secs(15),
        "takeover after SIGTERM",
    )
    .await;
    let took = seconds(term_at, started);
    eprintln!("takeover after SIGTERM of {leaving}: {took} s");
    assert!(
        took <= 1.0 + 1.5,
        "takeover after SIGTERM took {took} s\n{}",
        logs(&replicas)
    );

    // 4. SIGSTOP the holder past its lease, SIGCONT it: its stale mandate
    // writes nothing.
    let (paused_name, old_fence) = holder(&pool).await.expect("a live holder");
    let paused = replicas
        .iter()
        .find(|r| r.name == paused_name)
        .expect("holder is ours");
    let lost_before = paused
        .metric(&http, "poolkeeper_lease_lost_total")
        .await
        .expect("metrics of the holder");
    paused.signal(libc::SIGSTOP);
    let deadline = Instant::now() + Duration::from_secs(15);
    let new_fence = loop {
        if let Some((h, f)) = holder(&pool).await
            && h != paused_name
        {
            break f;
        }
        assert!(
            Instant::now() < deadline,
            "nobody took over from the paused holder"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(new_fence > old_fence);
    eprintln!("{paused_name} paused under fence {old_fence}; fence {new_fence} took over");
    // Work that exists only after the paused mandate was superseded.
    let batch = seed_overdue(&pool, org, &machines[20..30]).await;
    paused.signal(libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(15);
    while paused
        .metric(&http, "poolkeeper_lease_lost_total")
        .await
        .unwrap_or(0.0)
        <= lost_before
    {
        assert!(
            Instant::now() < deadline,
            "the woken replica never noticed\n{}",
            paused.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_expired(
        &pool,
        &batch,
        Duration::from_secs(15),
        "sweep after the pause",
    )
    .await;
    let stale: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservation_events WHERE reservation_id = ANY($1) AND lease_fence < $2",
    )
    .bind(&batch)
    .bind(new_fence)
    .fetch_one(&pool)
    .await
    .expect("stale events");
    assert_eq!(stale, 0, "the woken holder wrote under its old fence");
    let stale_runs: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sweep_runs WHERE lease_fence = $1
            AND (finished_at > (SELECT min(started_at) FROM sweep_runs WHERE lease_fence = $2)
                 OR started_at > (SELECT min(started_at) FROM sweep_runs WHERE lease_fence = $2))",
    )
    .bind(old_fence)
    .bind(new_fence)
    .fetch_one(&pool)
    .await
    .expect("stale runs");
    assert_eq!(
        stale_runs, 0,
        "the woken holder opened or closed a run after the new holder swept"
    );

    for r in &mut replicas {
        r.signal(libc::SIGTERM);
    }
    for r in &mut replicas {
        let status = tokio::time::timeout(Duration::from_secs(20), r.child.wait())
            .await
            .expect("serve exits")
            .expect("wait");
        assert!(
            status.success(),
            "{} exited with {status:?}\n{}",
            r.name,
            r.log()
        );
    }

    // Invariants over the whole run.
    let not_once: i64 = scalar(
        &pool,
        "SELECT count(*) FROM reservations r
          WHERE r.state <> 'held'
            AND (r.state <> 'expired' OR r.ended_by <> 'sweep'
                 OR (SELECT count(*) FROM reservation_events e
                      WHERE e.reservation_id = r.id AND e.kind = 'expired') <> 1)",
    )
    .await;
    assert_eq!(
        not_once, 0,
        "a reservation was not expired exactly once by the sweep"
    );
    assert_eq!(
        scalar::<i64>(
            &pool,
            "SELECT count(*) FROM reservations WHERE state = 'expired'"
        )
        .await,
        30
    );
    assert_eq!(
        state(&pool, live).await.0,
        "held",
        "a live hold was expired"
    );
    let unsigned: i64 = scalar(
        &pool,
        "SELECT count(*) FROM reservation_events e
          WHERE e.kind = 'expired' AND (e.actor <> 'sweep' OR e.replica IS NULL OR e.lease_fence IS NULL
                OR NOT EXISTS (SELECT 1 FROM sweep_runs r WHERE r.replica = e.replica AND r.lease_fence = e.lease_fence))",
    )
    .await;
    assert_eq!(
        unsigned, 0,
        "an expired event without its replica, fence and run"
    );
    // One holder at a time: runs of different replicas never overlap, and
    // fences only grow with time.
    let overlapping: i64 = scalar(
        &pool,
        "SELECT count(*) FROM sweep_runs a JOIN sweep_runs b
             ON a.replica <> b.replica AND a.started_at <= b.started_at AND a.id <> b.id
          WHERE b.started_at < coalesce(a.finished_at, a.started_at)",
    )
    .await;
    assert_eq!(
        overlapping,
        0,
        "sweep runs of two replicas overlapped\n{}",
        logs(&replicas)
    );
    let backwards: i64 = scalar(
        &pool,
        "SELECT count(*) FROM sweep_runs a JOIN sweep_runs b
             ON a.started_at < b.started_at AND a.lease_fence > b.lease_fence",
    )
    .await;
    assert_eq!(backwards, 0, "a later run carried an older fence");
    let holders: i64 = scalar(&pool, "SELECT count(DISTINCT replica) FROM sweep_runs").await;
    assert!(holders >= 3, "the sweep moved between replicas");
    let _ = std::fs::remove_dir_all(&dir);
}
