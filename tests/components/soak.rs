//! Reliability: per-connection timeouts, a pool that answers 503
//! instead of hanging, and the soak: three `poolkeeper serve` replicas on a
//! private PostgreSQL, 32 clients, and faults (backends terminated, a
//! PostgreSQL restart, the sweep's lease holder killed, a replica paused past
//! its lease). Afterwards the invariants are checked in SQL and against what
//! the clients were told.
//!
//! `soak_short` runs in `scripts/test` (about 45 s); `soak_long` runs for
//! `SOAK_SECONDS` (default 600):
//! `SOAK_SECONDS=600 cargo test --test components soak_long -- --ignored --nocapture`.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use poolkeeper::db::Db;
use poolkeeper::embedded_pg::{ClusterOptions, EmbeddedPostgres};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tokio::process::{Child, Command};

use crate::helpers::replicas::free_port_to_bind_again;
use crate::helpers::{FakeHold, FakeMachine};
use crate::helpers::{binary, create_org, migrated_db, test_settings};

// ---------------------------------------------------------------------------
// Timeouts and pool exhaustion
// ---------------------------------------------------------------------------

/// Every connection of the application's pool carries the session limits.
#[tokio::test]
async fn every_pooled_connection_has_the_session_limits() {
    let db = migrated_db().await;
    let pool = poolkeeper::db::connect(db.options.clone(), 2)
        .await
        .expect("pool");
    for (name, expected) in [
        ("statement_timeout", "15s"),
        ("lock_timeout", "5s"),
        ("idle_in_transaction_session_timeout", "30s"),
    ] {
        let value: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {name}")))
            .fetch_one(&pool)
            .await
            .expect("show");
        assert_eq!(value, expected, "{name}");
    }
    let app_name: String = sqlx::query_scalar("SHOW application_name")
        .fetch_one(&pool)
        .await
        .expect("show");
    assert_eq!(app_name, "poolkeeper");
    // The sweep's own pool is built from these options (sweep::worker_pool
    // clones pool.connect_options() and renames the application): the
    // limits survive that clone.
    let sweep_like = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            (*pool.connect_options())
                .clone()
                .application_name("poolkeeper-sweep"),
        )
        .await
        .expect("sweep-like pool");
    let (lock, idle, name): (String, String, String) = sqlx::query_as(
        "SELECT current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout'),
                current_setting('application_name')",
    )
    .fetch_one(&sweep_like)
    .await
    .expect("settings");
    assert_eq!(
        (lock.as_str(), idle.as_str(), name.as_str()),
        ("5s", "30s", "poolkeeper-sweep")
    );
}

/// lock_timeout bounds a transaction that waits on a row lock: a cancel
/// blocked behind a foreign lock on its machine gets 503 + Retry-After after
/// the 5 s lock_timeout, not a hung request, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_blocked_on_a_lock_gets_503_after_lock_timeout() {
    let app = crate::helpers::spawn_app().await;
    let machine = FakeMachine::new()
        .tag("LT-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (id, fence) = FakeHold::on("LT-1")
        .order("ORD-LT")
        .hold_seconds(600)
        .create_with_fence(&app.pool, app.org.id)
        .await;
    // A foreign transaction holds the machine's row lock (as a stuck client would).
    let mut blocker = app.db.connection().await;
    sqlx::query("BEGIN")
        .execute(&mut blocker)
        .await
        .expect("begin");
    sqlx::query("SELECT id FROM machines WHERE id = $1 FOR UPDATE")
        .bind(machine)
        .execute(&mut blocker)
        .await
        .expect("lock");
    let started = Instant::now();
    let resp = app
        .http
        .post(app.url(&format!("/api/v1/reservations/{id}/cancel")))
        .bearer_auth(&app.org.token)
        .json(&json!({"fence": fence, "reason": "stuck"}))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("an answer, not a hang");
    let waited = started.elapsed();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"], "unavailable");
    assert!(
        waited >= Duration::from_secs(4),
        "lock_timeout is 5 s, waited {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(14),
        "bounded by lock_timeout, waited {waited:?}"
    );
    sqlx::query("ROLLBACK")
        .execute(&mut blocker)
        .await
        .expect("rollback");
    assert_eq!(app.state_of(id).await, "held", "nothing written on refusal");
}

/// An exhausted pool answers 503 with Retry-After within the acquire
/// timeout instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_answers_503_with_retry_after() {
    let db = migrated_db().await;
    let setup = db.pool().await;
    let org = create_org(&setup, "acme", true).await;
    let pool =
        poolkeeper::db::connect_with_acquire_timeout(db.options.clone(), 1, Duration::from_secs(1))
            .await
            .expect("pool of one");
    let mut settings = test_settings();
    settings.db_acquire_timeout = Duration::from_secs(1);
    let app = poolkeeper::startup::Application::build(poolkeeper::startup::AppState::new(
        settings,
        pool.clone(),
        poolkeeper::metrics::Metrics::new(),
    ))
    .expect("build");
    let base = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped());
    let http = reqwest::Client::new();
    let get = || {
        http.get(format!("{base}/api/v1/reservations?order_ref=ORD-1"))
            .bearer_auth(&org.token)
            .timeout(Duration::from_secs(20))
            .send()
    };
    // The pool works while it has a connection to give.
    assert_eq!(get().await.expect("answer").status().as_u16(), 404);

    let held = pool.acquire().await.expect("the only connection");
    let started = Instant::now();
    let resp = get().await.expect("an answer, not a hang");
    let waited = started.elapsed();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"], "unavailable");
    assert!(
        waited < Duration::from_secs(10),
        "bounded by the acquire timeout: {waited:?}"
    );

    drop(held);
    assert_eq!(
        get().await.expect("answer").status().as_u16(),
        404,
        "recovers"
    );
}

// ---------------------------------------------------------------------------
// The soak
// ---------------------------------------------------------------------------

const CLIENTS: usize = 32;
const REPLICAS: usize = 3;
const MACHINES: i64 = 32;
const LEASE_SECONDS: u64 = 3;
const PROFILES: [&str; 2] = ["soak-small", "soak-large"];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_short() {
    let report = run_soak(Duration::from_secs(40)).await;
    eprintln!("{report}");
    report.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "long soak: SOAK_SECONDS=600 cargo test --test components soak_long -- --ignored --nocapture"]
async fn soak_long() {
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let report = run_soak(Duration::from_secs(seconds)).await;
    eprintln!("{report}");
    if let Ok(path) = std::env::var("SOAK_REPORT") {
        std::fs::write(&path, report.to_string()).expect("write the report");
    }
    report.assert_clean();
}

/// Everything the run counted.
#[derive(Default)]
pub(crate) struct SoakReport {
    load: Duration,
    requests: u64,
    by_op: BTreeMap<&'static str, u64>,
    by_status: BTreeMap<u16, u64>,
    no_answer: u64,
    created_201: u64,
    terminated_backends: u64,
    terminate_rounds: u64,
    pg_restarts: u64,
    holder_kills: u64,
    replica_stops: u64,
    replica_restarts: u64,
    pub(crate) ended: BTreeMap<String, i64>,
    /// Answered requests' latencies, in milliseconds.
    latencies_ms: Vec<u32>,
    by_code: BTreeMap<String, u64>,
    /// (distinct lease fences that swept, distinct replicas that swept, sweep runs)
    sweep: (i64, i64, i64),
    pub(crate) violations: Vec<String>,
}

impl std::fmt::Display for SoakReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "soak: {} clients, {} replicas, {} machines, load for {:?}",
            CLIENTS, REPLICAS, MACHINES, self.load
        )?;
        writeln!(
            f,
            "requests: {} ({} without an answer: replica killed or paused, or its request head timed out, 408)",
            self.requests, self.no_answer
        )?;
        writeln!(f, "by operation: {:?}", self.by_op)?;
        writeln!(f, "by status: {:?}", self.by_status)?;
        writeln!(f, "refusals by code: {:?}", self.by_code)?;
        writeln!(f, "201 received: {}", self.created_201)?;
        writeln!(
            f,
            "reservations ended (state/ended_by: count): {:?}",
            self.ended
        )?;
        writeln!(
            f,
            "faults: {} backends terminated in {} rounds, {} PostgreSQL restarts, {} lease holders killed (-9), {} replicas paused past their lease, {} replicas restarted",
            self.terminated_backends,
            self.terminate_rounds,
            self.pg_restarts,
            self.holder_kills,
            self.replica_stops,
            self.replica_restarts
        )?;
        let mut l = self.latencies_ms.clone();
        l.sort_unstable();
        let pct = |p: f64| {
            l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0)
        };
        writeln!(
            f,
            "latency of answered requests (ms): p50 {}, p99 {}, max {}",
            pct(0.5),
            pct(0.99),
            l.last().copied().unwrap_or(0)
        )?;
        writeln!(
            f,
            "sweep: {} runs under {} lease fences by {} replicas",
            self.sweep.2, self.sweep.0, self.sweep.1
        )?;
        writeln!(f, "invariant violations: {}", self.violations.len())?;
        for v in self.violations.iter().take(50) {
            writeln!(f, "  - {v}")?;
        }
        Ok(())
    }
}

impl SoakReport {
    fn assert_clean(&self) {
        assert!(self.violations.is_empty(), "violations:\n{self}");
        // The run must have exercised what it claims to.
        assert!(self.created_201 > 50, "too little load:\n{self}");
        assert!(
            self.terminated_backends > 0,
            "no backend terminated:\n{self}"
        );
        assert!(
            self.pg_restarts >= 1 && self.holder_kills >= 1 && self.replica_stops >= 1,
            "{self}"
        );
        assert!(
            self.ended.get("expired/sweep").copied().unwrap_or(0) > 0,
            "the sweep expired nothing:\n{self}"
        );
        assert!(
            self.ended.get("converted").copied().unwrap_or(0) > 0,
            "nothing converted:\n{self}"
        );
        assert!(
            self.ended.get("cancelled").copied().unwrap_or(0) > 0,
            "nothing cancelled:\n{self}"
        );
    }
}

/// The private cluster; stopped and started again mid-run.
struct Cluster {
    opts: ClusterOptions,
    pg: std::sync::Mutex<Option<EmbeddedPostgres>>,
}

impl Cluster {
    async fn start(opts: ClusterOptions) -> Arc<Cluster> {
        let o = opts.clone();
        let pg = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&o))
            .await
            .expect("join")
            .expect("start the soak cluster");
        Arc::new(Cluster {
            opts,
            pg: std::sync::Mutex::new(Some(pg)),
        })
    }

    /// Fast shutdown (every connection dies), a pause, and a start on the
    /// same data directory (same socket, same URL).
    async fn restart(self: &Arc<Self>, down_for: Duration) {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            if let Some(pg) = me.pg.lock().expect("lock").take() {
                pg.stop();
            }
        })
        .await
        .expect("join");
        tokio::time::sleep(down_for).await;
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let pg = EmbeddedPostgres::start(&me.opts).expect("restart the soak cluster");
            *me.pg.lock().expect("lock") = Some(pg);
        })
        .await
        .expect("join");
    }

    async fn stop(self: &Arc<Self>) {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            if let Some(pg) = me.pg.lock().expect("lock").take() {
                pg.stop();
            }
        })
        .await
        .expect("join");
    }
}

/// One `poolkeeper serve` process.
struct Replica {
    name: String,
    port: u16,
    child: Child,
}

struct Fleet {
    db_url: String,
    dir: PathBuf,
    replicas: Vec<Replica>,
    generation: u32,
}

impl Fleet {
    async fn spawn(&mut self, slot: usize, port: u16) -> Replica {
        self.generation += 1;
        let name = format!("soak-r{slot}-g{}", self.generation);
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).expect("replica log");
        let mut child = Command::new(binary())
            .arg("serve")
            .env("DATABASE_URL", &self.db_url)
            .env("POOLKEEPER_BIND", format!("127.0.0.1:{port}"))
            .env("POOLKEEPER_DATACENTER_MODULE", "on")
            .env("POOLKEEPER_SWEEP_SECONDS", "1")
            .env("POOLKEEPER_LEASE_SECONDS", LEASE_SECONDS.to_string())
            .env("POOLKEEPER_REPLICA", &name)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn poolkeeper serve");
        wait_healthy(&mut child, port, &name).await;
        Replica { name, port, child }
    }
}

/// Polls /healthz of a starting process (an external process: nothing to
/// wait on but its answer).
async fn wait_healthy(child: &mut Child, port: u16, name: &str) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("replica {name} exited at start-up: {status}");
        }
        let ok = http
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replica {name} not healthy in 90 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn signal(child: &Child, sig: i32) {
    if let Some(pid) = child.id() {
        // SAFETY: plain signal delivery to our own child process.
        unsafe {
            libc::kill(pid as i32, sig);
        }
    }
}

async fn admin_connection(opts: &PgConnectOptions) -> Option<PgConnection> {
    tokio::time::timeout(Duration::from_secs(3), PgConnection::connect_with(opts))
        .await
        .ok()?
        .ok()
}

/// The replica named in the sweep's live lease, if any.
async fn lease_holder(opts: &PgConnectOptions) -> Option<String> {
    let mut conn = admin_connection(opts).await?;
    sqlx::query_scalar(
        "SELECT holder FROM leases WHERE key = 'sweep' AND expires_at > clock_timestamp()",
    )
    .fetch_optional(&mut conn)
    .await
    .ok()
    .flatten()
}

#[derive(Default)]
struct Faults {
    terminated: AtomicU64,
    rounds: AtomicU64,
    restarts: AtomicU64,
    kills: AtomicU64,
    stops: AtomicU64,
    replica_restarts: AtomicU64,
}

async fn run_soak(load: Duration) -> SoakReport {
    let dir = std::env::temp_dir().join(format!(
        "poolkeeper-soak-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    poolkeeper::embedded_pg::prepare_private_dir(&dir).expect("soak dir");
    let cluster = Cluster::start(ClusterOptions {
        data_dir: dir.join("pg"),
        log_file: dir.join("postgres.log"),
        throwaway: true,
    })
    .await;
    let (admin, db_url) = {
        let guard = cluster.pg.lock().expect("lock");
        let pg = guard.as_ref().expect("running");
        (pg.connect_options("soak"), pg.url("soak"))
    };
    {
        let mut conn = PgConnection::connect_with(&admin.clone().database("postgres"))
            .await
            .expect("connect to the soak cluster");
        sqlx::query("CREATE DATABASE soak")
            .execute(&mut conn)
            .await
            .expect("create db");
        conn.close().await.expect("close");
    }
    poolkeeper::db::migrate(&admin).await.expect("migrate");
    let setup = poolkeeper::db::connect(admin.clone(), 2)
        .await
        .expect("pool");
    let org = create_org(&setup, "soak", true).await;
    crate::helpers::generated_machines(
        &setup,
        org.id,
        MACHINES,
        crate::helpers::Generated {
            tag: "'SOAK-' || lpad(g::text, 3, '0')",
            site: "'par1'",
            vendor: "'dell'",
            profile: "CASE WHEN g % 2 = 0 THEN 'soak-small' ELSE 'soak-large' END",
            status: "'ready'",
        },
    )
    .await;
    setup.close().await;

    let mut fleet = Fleet {
        db_url,
        dir: dir.clone(),
        replicas: Vec::new(),
        generation: 0,
    };
    let ports: Vec<u16> = (0..REPLICAS).map(|_| free_port_to_bind_again()).collect();
    for (slot, port) in ports.iter().enumerate() {
        let r = fleet.spawn(slot, *port).await;
        fleet.replicas.push(r);
    }
    let urls: Arc<Vec<String>> = Arc::new(
        ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}/api/v1"))
            .collect(),
    );

    let started = Instant::now();
    let deadline = started + load;
    let faults = Arc::new(Faults::default());

    // Clients.
    let mut clients = Vec::new();
    for n in 0..CLIENTS {
        let urls = urls.clone();
        let token = org.token.clone();
        clients.push(tokio::spawn(async move {
            client(n, urls, token, deadline).await
        }));
    }

    // Fault: terminate random application backends every few seconds.
    let terminator = {
        let (admin, faults) = (admin.clone(), faults.clone());
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(rand::random());
            while Instant::now() + Duration::from_secs(2) < deadline {
                tokio::time::sleep(Duration::from_millis(rng.random_range(1500..3500))).await;
                let Some(mut conn) = admin_connection(&admin).await else {
                    continue;
                };
                let killed: Result<Vec<bool>, _> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                      WHERE datname = 'soak' AND application_name IN ('poolkeeper', 'poolkeeper-sweep')
                        AND pid <> pg_backend_pid()
                      ORDER BY random() LIMIT 3",
                )
                .fetch_all(&mut conn)
                .await;
                if let Ok(killed) = killed {
                    faults.rounds.fetch_add(1, Ordering::Relaxed);
                    faults.terminated.fetch_add(
                        killed.into_iter().filter(|k| *k).count() as u64,
                        Ordering::Relaxed,
                    );
                }
            }
        })
    };

    // Faults on a schedule, repeated every cycle of the run.
    let cycle = load.min(Duration::from_secs(90));
    let mut cycle_start = started;
    while cycle_start + cycle <= deadline + Duration::from_millis(10) {
        // Kill -9 the sweep's lease holder; start a new replica in its place.
        tokio::time::sleep_until((cycle_start + cycle.mul_f64(0.2)).into()).await;
        let holder = lease_holder(&admin).await;
        let slot = fleet
            .replicas
            .iter()
            .position(|r| Some(&r.name) == holder.as_ref())
            .unwrap_or(0);
        let mut victim = fleet.replicas.remove(slot);
        let _ = victim.child.start_kill();
        let _ = victim.child.wait().await;
        faults.kills.fetch_add(1, Ordering::Relaxed);
        let replacement = fleet.spawn(slot, victim.port).await;
        fleet.replicas.insert(slot, replacement);
        faults.replica_restarts.fetch_add(1, Ordering::Relaxed);

        // Restart PostgreSQL.
        tokio::time::sleep_until((cycle_start + cycle.mul_f64(0.45)).into()).await;
        cluster.restart(Duration::from_secs(1)).await;
        faults.restarts.fetch_add(1, Ordering::Relaxed);

        // Pause the lease holder (or any replica) past its lease, then resume it.
        tokio::time::sleep_until((cycle_start + cycle.mul_f64(0.7)).into()).await;
        let holder = lease_holder(&admin).await;
        let slot = fleet
            .replicas
            .iter()
            .position(|r| Some(&r.name) == holder.as_ref())
            .unwrap_or(1);
        signal(&fleet.replicas[slot].child, libc::SIGSTOP);
        tokio::time::sleep(Duration::from_secs(LEASE_SECONDS + 2)).await;
        signal(&fleet.replicas[slot].child, libc::SIGCONT);
        faults.stops.fetch_add(1, Ordering::Relaxed);
        cycle_start += cycle;
    }

    let mut report = SoakReport {
        load,
        ..SoakReport::default()
    };
    let mut created = Vec::new();
    let mut told = Vec::new();
    for c in clients {
        let r = c.await.expect("client task");
        report.requests += r.requests;
        report.no_answer += r.no_answer;
        for (k, v) in r.by_op {
            *report.by_op.entry(k).or_default() += v;
        }
        for (k, v) in r.by_status {
            *report.by_status.entry(k).or_default() += v;
        }
        report.violations.extend(r.violations);
        report.latencies_ms.extend(r.latencies_ms);
        created.extend(r.created);
        told.extend(r.told);
        for (k, v) in r.by_code {
            *report.by_code.entry(k).or_default() += v;
        }
    }
    report.load = started.elapsed();
    terminator.await.expect("terminator");
    report.created_201 = created.len() as u64;
    report.terminated_backends = faults.terminated.load(Ordering::Relaxed);
    report.terminate_rounds = faults.rounds.load(Ordering::Relaxed);
    report.pg_restarts = faults.restarts.load(Ordering::Relaxed);
    report.holder_kills = faults.kills.load(Ordering::Relaxed);
    report.replica_stops = faults.stops.load(Ordering::Relaxed);
    report.replica_restarts = faults.replica_restarts.load(Ordering::Relaxed);

    // Every replica must still be running: none may die of a fault.
    for r in &mut fleet.replicas {
        if let Ok(Some(status)) = r.child.try_wait() {
            report
                .violations
                .push(format!("replica {} exited on its own: {status}", r.name));
        }
        let _ = r.child.start_kill();
        let _ = r.child.wait().await;
    }

    let pool = poolkeeper::db::connect(admin.clone(), 2)
        .await
        .expect("pool");
    check_invariants(&pool, &created, &mut report).await;
    check_told(&pool, &told, &mut report).await;
    pool.close().await;
    cluster.stop().await;
    if report.violations.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("soak: logs kept in {}", dir.display());
    }
    report
}

/// A 201 a client received.
pub(crate) struct Created {
    pub(crate) id: i64,
    pub(crate) order_ref: String,
    pub(crate) asset_tag: String,
    pub(crate) fence: i64,
}

#[derive(Default)]
struct ClientReport {
    requests: u64,
    no_answer: u64,
    by_op: BTreeMap<&'static str, u64>,
    by_status: BTreeMap<u16, u64>,
    violations: Vec<String>,
    created: Vec<Created>,
    latencies_ms: Vec<u32>,
    /// Reservations a 200 said were converted or cancelled.
    told: Vec<(i64, &'static str)>,
    /// Answers other than 2xx, by status and error code.
    by_code: BTreeMap<String, u64>,
}

struct Order {
    order_ref: String,
    body: Value,
    id: Option<i64>,
    fence: i64,
    open: bool,
    /// The service_ref of a convert sent before: a retry after no answer
    /// (or `outcome_unknown`) sends the same, as an order service does, so
    /// a convert that did commit answers as a replay; another service_ref
    /// would be `422 idempotency_mismatch`, truthfully.
    service_ref: Option<String>,
}

struct Service {
    id: i64,
    machine: Value,
    /// An earlier end got no answer: it may have ended already.
    maybe_ended: bool,
}

enum Answer {
    Status(u16, Value, bool),
    NoAnswer,
}

impl ClientReport {
    /// Sends, classifies and checks the status against the documented ones.
    async fn call(
        &mut self,
        op: &'static str,
        req: reqwest::RequestBuilder,
        allowed: &[u16],
    ) -> Answer {
        self.requests += 1;
        *self.by_op.entry(op).or_default() += 1;
        let sent = Instant::now();
        let resp = match req.timeout(Duration::from_secs(20)).send().await {
            Ok(r) => r,
            Err(_) => {
                self.no_answer += 1;
                return Answer::NoAnswer;
            }
        };
        let status = resp.status().as_u16();
        // actix-web's own 408 (no body): the request head did not reach the
        // server within its client request timeout (5 s), because the
        // replica was paused or starved of CPU by the tests beside this
        // one. No handler ran, so nothing was written: as good as no
        // answer, which is how a client must take it.
        if status == 408 && resp.headers().get("content-type").is_none() {
            self.no_answer += 1;
            return Answer::NoAnswer;
        }
        let retry_after = resp.headers().contains_key("retry-after");
        let body: Value = match resp.bytes().await {
            Ok(b) => serde_json::from_slice(&b).unwrap_or(Value::Null),
            Err(_) => {
                self.no_answer += 1;
                return Answer::NoAnswer;
            }
        };
        *self.by_status.entry(status).or_default() += 1;
        if status >= 300 {
            let code = body["error"].as_str().unwrap_or("-");
            *self.by_code.entry(format!("{status} {code}")).or_default() += 1;
        }
        self.latencies_ms
            .push(sent.elapsed().as_millis().min(u32::MAX as u128) as u32);
        if !allowed.contains(&status) {
            self.violations
                .push(format!("{op}: undocumented status {status}: {body}"));
        }
        // F3: a write whose connection was lost is `outcome_unknown`.
        let writes = matches!(
            op,
            "reserve" | "replay" | "convert" | "cancel" | "end_service" | "put_machine"
        );
        let code_ok =
            body["error"] == "unavailable" || (writes && body["error"] == "outcome_unknown");
        if status == 503 && (!retry_after || !code_ok) {
            self.violations
                .push(format!("{op}: 503 without Retry-After or code: {body}"));
        }
        Answer::Status(status, body, retry_after)
    }
}

async fn client(
    n: usize,
    urls: Arc<Vec<String>>,
    token: String,
    deadline: Instant,
) -> ClientReport {
    let mut rng = StdRng::seed_from_u64(rand::random());
    let http = reqwest::Client::new();
    let mut me = ClientReport::default();
    let mut orders: Vec<Order> = Vec::new();
    let mut services: Vec<Service> = Vec::new();
    let mut known_services: HashSet<i64> = HashSet::new();
    let mut seq = 0u64;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..60))).await;
        let base = &urls[rng.random_range(0..urls.len())];
        let dice = rng.random_range(0..100);
        let open: Vec<usize> = (0..orders.len())
            .filter(|&i| orders[i].open && orders[i].id.is_some())
            .collect();
        if dice < 30 || orders.is_empty() {
            // A new order.
            seq += 1;
            let order_ref = format!("SOAK-{n}-{seq}");
            let body = json!({
                "order_ref": order_ref,
                "site": "par1",
                "profile": PROFILES[rng.random_range(0..PROFILES.len())],
                "hold_seconds": rng.random_range(2..=5),
            });
            let req = http
                .post(format!("{base}/reservations"))
                .bearer_auth(&token)
                .json(&body);
            let mut order = Order {
                order_ref,
                body,
                id: None,
                fence: 0,
                open: true,
                service_ref: None,
            };
            match me.call("reserve", req, &[201, 409, 503]).await {
                Answer::Status(201, b, _) => {
                    learn_created(&mut me, &mut order, &b);
                    // A third of the customers walk away: only the sweep or a
                    // later order ends their hold.
                    order.open = rng.random_bool(0.67);
                }
                Answer::Status(409, b, retry) => {
                    order.open = false;
                    check_409_reserve(&mut me, &b, retry);
                    // Nothing was created: the order is dropped.
                    continue;
                }
                Answer::Status(..) => {}
                Answer::NoAnswer => {}
            }
            orders.push(order);
        } else if dice < 40 {
            // Replay a reserve: the same order_ref gives the same reservation.
            let i = rng.random_range(0..orders.len());
            let req = http
                .post(format!("{base}/reservations"))
                .bearer_auth(&token)
                .json(&orders[i].body);
            let answer = me.call("replay", req, &[200, 201, 409, 503]).await;
            let order = &mut orders[i];
            match answer {
                Answer::Status(200, b, _) => {
                    let id = b["id"].as_i64();
                    match order.id {
                        Some(known) if Some(known) != id => me.violations.push(format!(
                            "replay of {} gave id {id:?}, first answer {known}",
                            order.order_ref
                        )),
                        Some(_) => {}
                        None => {
                            order.id = id;
                            order.fence = b["fence"].as_i64().unwrap_or(0);
                        }
                    }
                    if b["state"] != "held" {
                        order.open = false;
                    }
                    if b["order_ref"] != order.order_ref.as_str() {
                        me.violations
                            .push(format!("replay of {} answered {b}", order.order_ref));
                    }
                }
                Answer::Status(201, b, _) => {
                    if order.id.is_some() {
                        me.violations.push(format!(
                            "replay of {} created a second reservation: {b}",
                            order.order_ref
                        ));
                    } else {
                        learn_created(&mut me, order, &b);
                    }
                }
                Answer::Status(409, b, retry) => {
                    if order.id.is_some() {
                        me.violations.push(format!(
                            "replay of existing {} answered 409: {b}",
                            order.order_ref
                        ));
                    }
                    check_409_reserve(&mut me, &b, retry);
                }
                _ => {}
            }
        } else if dice < 55 && !open.is_empty() {
            // Convert.
            let i = open[rng.random_range(0..open.len())];
            let (id, fence) = (orders[i].id.unwrap_or(0), orders[i].fence);
            seq += 1;
            let service_ref = orders[i]
                .service_ref
                .get_or_insert_with(|| format!("SRV-{n}-{seq}"))
                .clone();
            let req = http
                .post(format!("{base}/reservations/{id}/convert"))
                .bearer_auth(&token)
                .json(&json!({"fence": fence, "service_ref": service_ref}));
            match me.call("convert", req, &[200, 409, 503]).await {
                Answer::Status(200, b, _) => {
                    orders[i].open = false;
                    if b["state"] != "converted" || b["id"].as_i64() != Some(id) {
                        me.violations.push(format!("convert {id} answered {b}"));
                    }
                    me.told.push((id, "converted"));
                    learn_service(&mut services, &mut known_services, &b);
                }
                Answer::Status(409, b, _) => {
                    orders[i].open = false;
                    check_409_transition(&mut me, "convert", &b);
                }
                _ => {}
            }
        } else if dice < 65 && !open.is_empty() {
            // Cancel.
            let i = open[rng.random_range(0..open.len())];
            let (id, fence) = (orders[i].id.unwrap_or(0), orders[i].fence);
            let req = http
                .post(format!("{base}/reservations/{id}/cancel"))
                .bearer_auth(&token)
                .json(&json!({"fence": fence, "reason": "soak: customer gave up"}));
            match me.call("cancel", req, &[200, 409, 503]).await {
                Answer::Status(200, b, _) => {
                    orders[i].open = false;
                    if b["state"] != "cancelled" || b["id"].as_i64() != Some(id) {
                        me.violations.push(format!("cancel {id} answered {b}"));
                    }
                    me.told.push((id, "cancelled"));
                }
                Answer::Status(409, b, _) => {
                    orders[i].open = false;
                    check_409_transition(&mut me, "cancel", &b);
                }
                _ => {}
            }
        } else if dice < 85 {
            // Read, by id or by order_ref.
            let i = rng.random_range(0..orders.len());
            let (req, allowed): (_, &[u16]) = match orders[i].id {
                Some(id) if rng.random_bool(0.5) => (
                    http.get(format!("{base}/reservations/{id}"))
                        .bearer_auth(&token),
                    &[200, 503],
                ),
                Some(_) => (
                    http.get(format!("{base}/reservations"))
                        .query(&[("order_ref", orders[i].order_ref.as_str())])
                        .bearer_auth(&token),
                    &[200, 503],
                ),
                // Never answered: it may or may not exist.
                None => (
                    http.get(format!("{base}/reservations"))
                        .query(&[("order_ref", orders[i].order_ref.as_str())])
                        .bearer_auth(&token),
                    &[200, 404, 503],
                ),
            };
            if let Answer::Status(200, b, _) = me.call("read", req, allowed).await {
                let order = &mut orders[i];
                if b["order_ref"] != order.order_ref.as_str()
                    || (order.id.is_some() && b["id"].as_i64() != order.id)
                {
                    me.violations
                        .push(format!("read of {} answered {b}", order.order_ref));
                }
                if order.id.is_none() {
                    order.id = b["id"].as_i64();
                    order.fence = b["fence"].as_i64().unwrap_or(0);
                }
                if b["state"] != "held" {
                    order.open = false;
                }
                // A conversion whose answer was lost still left a service.
                learn_service(&mut services, &mut known_services, &b);
            }
        } else if !services.is_empty() {
            // End a service, then the datacenter team puts the machine back.
            let i = rng.random_range(0..services.len());
            let id = services[i].id;
            let req = http
                .post(format!("{base}/services/{id}/end"))
                .bearer_auth(&token);
            match me.call("end_service", req, &[200, 409, 503]).await {
                Answer::Status(status @ (200 | 409), b, _) => {
                    let s = services.swap_remove(i);
                    if status == 409 && !(s.maybe_ended && b["error"] == "not_live") {
                        me.violations
                            .push(format!("end of service {id} answered 409: {b}"));
                    }
                    let m = &s.machine;
                    let tag = m["asset_tag"].as_str().unwrap_or_default();
                    let req = http
                        .put(format!("{base}/machines/{tag}"))
                        .bearer_auth(&token)
                        .json(&json!({"site": m["site"], "vendor": m["vendor"], "profile": m["profile"], "status": "ready"}));
                    // Lost answers leave the machine in provisioning: less capacity, no harm.
                    me.call("put_machine", req, &[200, 503]).await;
                }
                // F3: an end whose outcome is unknown may have ended it.
                Answer::NoAnswer => services[i].maybe_ended = true,
                Answer::Status(503, b, _) if b["error"] == "outcome_unknown" => {
                    services[i].maybe_ended = true
                }
                _ => {}
            }
        }
        // Forget finished orders now and then, keeping a few for replays.
        if orders.len() > 64 {
            orders.drain(..16);
        }
    }
    me
}

fn learn_created(me: &mut ClientReport, order: &mut Order, b: &Value) {
    let (Some(id), Some(fence), Some(tag)) = (
        b["id"].as_i64(),
        b["fence"].as_i64(),
        b["machine"]["asset_tag"].as_str(),
    ) else {
        me.violations
            .push(format!("201 without id, fence or machine: {b}"));
        return;
    };
    if b["state"] != "held" || b["order_ref"] != order.order_ref.as_str() {
        me.violations
            .push(format!("201 for {} answered {b}", order.order_ref));
    }
    order.id = Some(id);
    order.fence = fence;
    me.created.push(Created {
        id,
        order_ref: order.order_ref.clone(),
        asset_tag: tag.to_owned(),
        fence,
    });
}

fn learn_service(services: &mut Vec<Service>, known: &mut HashSet<i64>, b: &Value) {
    if let Some(sid) = b["service"]["id"].as_i64()
        && b["service"]["ended_at"].is_null()
        && known.insert(sid)
    {
        services.push(Service {
            id: sid,
            machine: b["machine"].clone(),
            maybe_ended: false,
        });
    }
}

fn check_409_reserve(me: &mut ClientReport, b: &Value, retry_after: bool) {
    match b["error"].as_str() {
        Some("contended") if retry_after => {}
        Some("unavailable") if !retry_after => {}
        _ => me
            .violations
            .push(format!("reserve: 409 {b} (Retry-After: {retry_after})")),
    }
}

fn check_409_transition(me: &mut ClientReport, op: &str, b: &Value) {
    // stale_fence would mean the fence of a 201 was not the reservation's.
    if !matches!(b["error"].as_str(), Some("expired" | "not_held")) {
        me.violations.push(format!("{op}: 409 {b}"));
    }
}

/// Every convert or cancel a client was told succeeded is in the database.
pub(crate) async fn check_told(pool: &Db, told: &[(i64, &'static str)], report: &mut SoakReport) {
    let ids: Vec<i64> = told.iter().map(|(id, _)| *id).collect();
    let rows: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, state FROM reservations WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(pool)
            .await
            .expect("told rows");
    let states: std::collections::HashMap<i64, String> = rows.into_iter().collect();
    for (id, state) in told {
        if states.get(id).map(String::as_str) != Some(*state) {
            report.violations.push(format!(
                "reservation {id} was answered {state} but is {:?}",
                states.get(id)
            ));
        }
    }
}

/// The invariants, in SQL and against the clients' 201s.
pub(crate) async fn check_invariants(pool: &Db, created: &[Created], report: &mut SoakReport) {
    let checks: [(&str, &str); 12] = [
        (
            "one lease fence used by two replicas",
            "SELECT count(*) FROM (SELECT lease_fence FROM sweep_runs GROUP BY lease_fence
                                    HAVING count(DISTINCT replica) > 1) f",
        ),
        (
            "a sweep expiry written under another replica's fence",
            "SELECT count(*) FROM reservation_events e JOIN sweep_runs s ON s.lease_fence = e.lease_fence
              WHERE e.actor = 'sweep' AND s.replica <> e.replica",
        ),
        (
            "two holds on one machine at once",
            // A hold runs from its `created` event (written after the insert
            // passed the unique index, so after any earlier holder committed
            // its end) to its ended_at.
            "WITH iv AS (
                SELECT r.id, r.machine_id, c.at AS from_at, coalesce(r.ended_at, 'infinity') AS to_at
                  FROM reservations r JOIN reservation_events c ON c.reservation_id = r.id AND c.kind = 'created')
             SELECT count(*) FROM iv a JOIN iv b ON a.machine_id = b.machine_id AND a.id < b.id
              WHERE a.from_at < b.to_at AND b.from_at < a.to_at",
        ),
        (
            "a machine held while in live service",
            // A conversion writes its link while its own reservation is still
            // held (R10), so a link is compared with the other reservations.
            "WITH iv AS (
                SELECT r.id, r.machine_id, c.at AS from_at, coalesce(r.ended_at, 'infinity') AS to_at
                  FROM reservations r JOIN reservation_events c ON c.reservation_id = r.id AND c.kind = 'created')
             SELECT count(*) FROM service_links s JOIN iv ON iv.machine_id = s.machine_id AND iv.id <> s.reservation_id
              WHERE s.created_at < iv.to_at AND iv.from_at < coalesce(s.ended_at, 'infinity')",
        ),
        (
            "two live services on one machine at once",
            "SELECT count(*) FROM service_links a JOIN service_links b ON a.machine_id = b.machine_id AND a.id < b.id
              WHERE a.created_at < coalesce(b.ended_at, 'infinity') AND b.created_at < coalesce(a.ended_at, 'infinity')",
        ),
        (
            "a conversion after its deadline",
            "SELECT count(*) FROM service_links s JOIN reservations r ON r.id = s.reservation_id
              WHERE s.created_at > r.expires_at",
        ),
        (
            "a converted reservation without exactly one service link, or a link of an unconverted one",
            "SELECT count(*) FROM reservations r
              WHERE (r.state = 'converted') <> EXISTS (SELECT 1 FROM service_links s WHERE s.reservation_id = r.id)",
        ),
        (
            "an ended reservation without exactly one terminal event of its state, or without an actor",
            "SELECT count(*) FROM reservations r
              WHERE r.state <> 'held'
                AND (r.ended_by IS NULL OR r.ended_at IS NULL
                     OR (SELECT count(*) FROM reservation_events e
                          WHERE e.reservation_id = r.id AND e.kind NOT IN ('created', 'extended', 'expiring')) <> 1
                     OR NOT EXISTS (SELECT 1 FROM reservation_events e
                                     WHERE e.reservation_id = r.id AND e.kind = r.state
                                       AND e.actor = r.ended_by AND e.at >= r.ended_at))",
        ),
        (
            "a held reservation with a terminal event",
            "SELECT count(*) FROM reservations r
              WHERE r.state = 'held'
                AND EXISTS (SELECT 1 FROM reservation_events e
                             WHERE e.reservation_id = r.id AND e.kind NOT IN ('created', 'extended', 'expiring'))",
        ),
        (
            "a reservation without exactly one created event",
            "SELECT count(*) FROM reservations r
              WHERE (SELECT count(*) FROM reservation_events e
                      WHERE e.reservation_id = r.id AND e.kind = 'created') <> 1",
        ),
        (
            "an expiry before the deadline",
            "SELECT count(*) FROM reservations r WHERE r.state = 'expired' AND r.ended_at < r.expires_at",
        ),
        (
            "a sweep expiry without the replica and fence of a lease",
            "SELECT count(*) FROM reservation_events e
              WHERE e.kind = 'expired' AND e.actor = 'sweep' AND (e.replica IS NULL OR e.lease_fence IS NULL)",
        ),
    ];
    for (what, sql) in checks {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("invariant query ({what}): {e}"));
        if n != 0 {
            report.violations.push(format!("{what}: {n}"));
        }
    }

    // Every 201 a client received exists, with its id, machine and fence.
    let ids: Vec<i64> = created.iter().map(|c| c.id).collect();
    let rows: Vec<(i64, String, String, i64)> = sqlx::query_as(
        "SELECT r.id, r.order_ref, m.asset_tag, r.fence FROM reservations r JOIN machines m ON m.id = r.machine_id
          WHERE r.id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await
    .expect("created rows");
    let found: std::collections::HashMap<i64, (String, String, i64)> = rows
        .into_iter()
        .map(|(id, o, t, f)| (id, (o, t, f)))
        .collect();
    let mut seen = HashSet::new();
    for c in created {
        if !seen.insert(c.id) {
            report
                .violations
                .push(format!("two 201 answers for reservation {}", c.id));
        }
        match found.get(&c.id) {
            Some((o, t, f)) if *o == c.order_ref && *t == c.asset_tag && *f == c.fence => {}
            other => report.violations.push(format!(
                "201 for {} (id {}, {}, fence {}) does not match the database: {other:?}",
                c.order_ref, c.id, c.asset_tag, c.fence
            )),
        }
    }

    report.sweep = sqlx::query_as(
        "SELECT count(DISTINCT lease_fence), count(DISTINCT replica), count(*) FROM sweep_runs",
    )
    .fetch_one(pool)
    .await
    .expect("sweep runs");
    let ended: Vec<(String, Option<String>, i64)> = sqlx::query_as(
        "SELECT state, ended_by, count(*) FROM reservations GROUP BY state, ended_by ORDER BY state, ended_by",
    )
    .fetch_all(pool)
    .await
    .expect("states");
    for (state, by, n) in ended {
        let key = match state.as_str() {
            "expired" => format!("expired/{}", by.unwrap_or_default()),
            _ => state,
        };
        *report.ended.entry(key).or_default() += n;
    }
}

/// The checker is not blind: each kind of damage it claims to find is found.
#[tokio::test]
async fn the_invariant_checks_find_what_they_claim() {
    let app = crate::helpers::spawn_app().await;
    for tag in ["INV-1", "INV-2", "INV-3"] {
        FakeMachine::new()
            .tag(tag)
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    // Two holds on INV-1: the first "ended" an hour from now.
    let first = FakeHold::on("INV-1")
        .order("ORD-I1")
        .hold_seconds(600)
        .create(&app.pool, app.org.id)
        .await;
    sqlx::query(
        "WITH r AS (UPDATE reservations SET state = 'cancelled', ended_at = clock_timestamp() + interval '1 hour',
                           ended_by = 'x' WHERE id = $1 RETURNING id)
         INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, at)
         SELECT id, 'cancelled', 'held', 'cancelled', 'x', clock_timestamp() + interval '1 hour' FROM r",
    )
    .bind(first)
    .execute(&app.pool)
    .await
    .expect("end in the future");
    let (_, fence) = FakeHold::on("INV-1")
        .order("ORD-I2")
        .hold_seconds(600)
        .create_with_fence(&app.pool, app.org.id)
        .await;
    // A link dated after the deadline, on a reservation still held, naming
    // the machine INV-1 that another order holds.
    let late = FakeHold::on("INV-2")
        .order("ORD-I3")
        .hold_seconds(600)
        .create(&app.pool, app.org.id)
        .await;
    sqlx::query(
        "INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at)
         SELECT org_id, (SELECT id FROM machines WHERE asset_tag = 'INV-1'), id, 'SRV-LATE',
                expires_at + interval '1 second'
           FROM reservations WHERE id = $1",
    )
    .bind(late)
    .execute(&app.pool)
    .await
    .expect("late link");
    // An ending without its event.
    let silent = FakeHold::on("INV-3")
        .order("ORD-I4")
        .hold_seconds(600)
        .create(&app.pool, app.org.id)
        .await;
    sqlx::query(
        "UPDATE reservations SET state = 'expired', ended_at = expires_at, ended_by = 'sweep' WHERE id = $1",
    )
    .bind(silent)
    .execute(&app.pool)
    .await
    .expect("silent end");
    // A 201 whose fence the database does not know.
    let created = [Created {
        id: first + 1,
        order_ref: "ORD-I2".into(),
        asset_tag: "INV-1".into(),
        fence: fence + 1000,
    }];
    let mut report = SoakReport::default();
    check_invariants(&app.pool, &created, &mut report).await;
    let all = report.violations.join("\n");
    for expected in [
        "two holds on one machine at once: 1",
        "a machine held while in live service",
        "a conversion after its deadline: 1",
        "a converted reservation without exactly one service link",
        "an ended reservation without exactly one terminal event",
        "does not match the database",
    ] {
        assert!(all.contains(expected), "{expected} not found in:\n{all}");
    }
}
