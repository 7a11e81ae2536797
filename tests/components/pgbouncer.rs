//! PgBouncer 1.18 (Debian 12) in front of the test cluster, as a real child
//! process.
//!
//! What sqlx 0.9 does (sqlx-postgres 0.9.0, connection/executor.rs): a
//! query with arguments is prepared in one round trip (Parse, Describe,
//! Sync) and executed in the next (Bind, Execute, Sync). `persistent`
//! queries (the default) get a *named* statement `sqlx_s_N`, numbered per
//! client connection, even with `statement_cache_capacity(0)`, which only
//! stops caching and closing them. PgBouncer 1.18 in transaction mode hands
//! the server session back after each Sync outside a transaction, so the
//! two round trips may land on different server sessions. Measured here
//! (4 clients, 2 server sessions, 300 rounds): named statements fail with
//! "prepared statement sqlx_s_1 already exists" or bind to another
//! client's statement, with or without the cache, in or out of an explicit
//! transaction; unnamed statements (`persistent(false)`) outside a
//! transaction silently return *another client's* answer.
//!
//! What works, and what poolkeeper does with `POOLKEEPER_DB_STATEMENT_CACHE
//! =off` (`db::Db`, pinned): every statement inside an explicit transaction
//! (the pooler keeps one server session for it), begun by `BEGIN;
//! DEALLOCATE ALL` (no other client's statement is left to collide with
//! sqlx's names), and no cache (nothing prepared in one transaction is used
//! in the next). Tested here in transaction mode with two replicas, as the
//! session mode is, with the same assertions. With the cache on, start-up
//! refuses a transaction-mode pooler that passes statements through.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

use serde_json::{Value, json};

use crate::helpers::replicas::free_port;
use crate::helpers::replicas::{Replica, wait_lease};
use crate::helpers::{FakeHold, FakeMachine};
use crate::helpers::{TestDb, create_org};

/// The pgbouncer binary, or None (with the reason printed) when it is not
/// installed: `scripts/test` installs it.
pub fn pgbouncer_binary() -> Option<PathBuf> {
    ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// A running pgbouncer; killed when dropped (and when the test's thread
/// ends, by its parent-death signal).
pub struct Bouncer {
    pub port: u16,
    pub dir: PathBuf,
    child: Child,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (uid, gid) of the `postgres` user when we are root: pgbouncer, like
/// PostgreSQL, refuses to run as root.
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("postgres").expect("static");
    // SAFETY: getpwnam returns NULL or a pointer to a static record, read at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(!pw.is_null(), "running as root without a postgres user");
    // SAFETY: pw is non-null.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

impl Bouncer {
    /// Starts pgbouncer in pool mode `mode` in front of `db`'s cluster
    /// (through its Unix socket), with `pool_size` server connections per
    /// user and database, trusting the users listed.
    pub async fn start(db: &TestDb, users: &[&str], pool_size: u32, mode: &str) -> Bouncer {
        let bin = pgbouncer_binary().expect("pgbouncer is installed (scripts/test installs it)");
        let socket = db
            .options
            .get_socket()
            .cloned()
            .expect("the test cluster listens on a Unix socket");
        let dir = std::env::temp_dir().join(format!(
            "poolkeeper-bouncer-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        poolkeeper::embedded_pg::prepare_private_dir(&dir).expect("bouncer dir");
        let port = free_port();
        let auth: String = users.iter().map(|u| format!("\"{u}\" \"\"\n")).collect();
        std::fs::write(dir.join("users.txt"), auth).expect("auth file");
        // The settings docs/production.md documents for poolkeeper behind PgBouncer.
        let ini = format!(
            "[databases]\n* = host={socket} port=5432\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {dir}/users.txt\n\
             pool_mode = {mode}\n\
             ignore_startup_parameters = extra_float_digits\n\
             max_client_conn = 500\ndefault_pool_size = {pool_size}\n\
             server_reset_query_always = 0\n\
             logfile = {dir}/pgbouncer.log\npidfile =\n",
            socket = socket.display(),
            dir = dir.display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).expect("ini");
        let mut cmd = Command::new(bin);
        cmd.arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some((uid, gid)) = run_as() {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe; it runs between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().expect("spawn pgbouncer");
        let mut bouncer = Bouncer { port, dir, child };
        bouncer.wait_ready(&db.name).await;
        bouncer
    }

    async fn wait_ready(&mut self, dbname: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("pgbouncer exited: {status}\n{}", self.log());
            }
            let opts = self.options("postgres", dbname);
            if let Ok(Ok(mut c)) =
                tokio::time::timeout(Duration::from_secs(2), PgConnection::connect_with(&opts))
                    .await
                // The simple protocol: nothing prepared, nothing left on the server.
                && sqlx::raw_sql("SELECT 1").execute(&mut c).await.is_ok()
            {
                let _ = c.close().await;
                return;
            }
            assert!(
                Instant::now() < deadline,
                "pgbouncer not ready in 30 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    /// Plain options through the pooler (no session limits, default cache).
    pub fn options(&self, user: &str, dbname: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username(user)
            .database(dbname)
    }

    pub fn url(&self, user: &str, dbname: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{dbname}", self.port)
    }
}

/// Sets the session limits of RELIABILITY.md on `role` in `db` (what the
/// docs/production.md's `ALTER ROLE ... SET` does, scoped to the test's database).
pub async fn set_role_limits(db: &TestDb, role: &str, statement_timeout: &str) {
    let mut conn = db.connection().await;
    for (name, value) in [
        ("statement_timeout", statement_timeout),
        ("lock_timeout", "5s"),
        ("idle_in_transaction_session_timeout", "30s"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER ROLE {role} IN DATABASE {} SET {name} = '{value}'",
            db.name
        )))
        .execute(&mut conn)
        .await
        .expect("alter role");
    }
}

/// Without PgBouncer the test fails, naming its install (`helpers::needs`).
fn require_pgbouncer() {
    crate::helpers::needs(
        "pgbouncer",
        pgbouncer_binary().is_some(),
        "apt-get install -y --no-install-recommends pgbouncer",
    )
}

/// The failure made deterministic: one server session shared by two client
/// connections. The second client's first query collides with the
/// statement the first left on the server, with the cache on or off. Pinned,
/// the same sequence passes. The start-up probe accepts pinned and refuses
/// the cache on, naming the setting.
#[tokio::test]
async fn named_statements_collide_through_pgbouncer_1_18_in_transaction_mode() {
    require_pgbouncer();
    let db = crate::helpers::migrated_db().await;
    let bouncer = Bouncer::start(&db, &["postgres"], 1, "transaction").await;
    let opts = poolkeeper::db::for_pooler(bouncer.options("postgres", &db.name));
    for cache in [100, 0] {
        let opts = opts.clone().statement_cache_capacity(cache);
        let mut first = PgConnection::connect_with(&opts).await.expect("connect");
        let mut second = PgConnection::connect_with(&opts).await.expect("connect");
        let one: i32 = sqlx::query_scalar("SELECT $1::int4")
            .bind(1)
            .fetch_one(&mut first)
            .await
            .expect("the first client's statement");
        assert_eq!(one, 1);
        let err = sqlx::query_scalar::<_, i32>("SELECT $1::int4")
            .bind(2)
            .fetch_one(&mut second)
            .await
            .expect_err("the second client's statement has the same name on the same server");
        assert_eq!(
            poolkeeper::db::sqlstate(&err).as_deref(),
            Some("42P05"),
            "cache {cache}: {err}"
        );
        // Leave no statement behind for the next round.
        sqlx::raw_sql("DEALLOCATE ALL")
            .execute(&mut first)
            .await
            .expect("deallocate");
        let _ = first.close().await;
        let _ = second.close().await;
    }
    let through = |pinned: bool| {
        poolkeeper::db::connect_app(opts.clone(), 2, Duration::from_secs(2), true, pinned)
    };
    // The same sequence, pinned: the second client's transaction starts by
    // dropping what the first left on the shared server session.
    let pinned = through(true).await.expect("pool");
    let mut first = pinned.acquire().await.expect("first");
    let one: i32 = sqlx::query_scalar("SELECT $1::int4")
        .bind(1)
        .fetch_one(&mut *first)
        .await
        .expect("the first client's statement");
    first.finish().await.expect("commit");
    let second = through(true).await.expect("pool");
    let two: i32 = sqlx::query_scalar("SELECT $1::int4")
        .bind(2)
        .fetch_one(&second)
        .await
        .expect("pinned: no collision");
    assert_eq!((one, two), (1, 2));
    poolkeeper::db::check_statement_support(&pinned)
        .await
        .expect("pinned suits a pooler that passes statements through");

    let cached = through(false).await.expect("pool");
    let err = poolkeeper::db::check_statement_support(&cached)
        .await
        .expect_err("PgBouncer 1.18 passes statements through");
    assert!(
        err.to_string()
            .contains("POOLKEEPER_DB_STATEMENT_CACHE=off"),
        "{err}"
    );
    assert!(err.to_string().contains("max_prepared_statements"), "{err}");
    for pool in [pinned, second, cached] {
        pool.close().await;
    }
}

/// Many clients on two server sessions, all released together: pinned,
/// every client gets its own answers, from statements that sqlx prepares
/// and executes in two round trips, and its writes are committed when the
/// call returns (read back by the next statement, on whatever server
/// session it gets). The unpinned failure is the test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pinned_statements_through_a_shared_server_session_get_their_own_answers() {
    require_pgbouncer();
    let db = crate::helpers::migrated_db().await;
    let bouncer = Bouncer::start(&db, &["postgres"], 2, "transaction").await;
    let opts = poolkeeper::db::for_pooler(bouncer.options("postgres", &db.name));
    let pinned = poolkeeper::db::connect_app(opts, 16, Duration::from_secs(30), true, true)
        .await
        .expect("pool");
    sqlx::raw_sql("CREATE TABLE pinned_probe (client int, n int, PRIMARY KEY (client, n))")
        .execute(&pinned)
        .await
        .expect("table");
    let clients = 16;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(clients));
    let mut tasks = Vec::new();
    for client in 0..clients as i32 {
        let (pinned, barrier) = (pinned.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut wrong = Vec::new();
            for n in 0..25 {
                // A different statement text per client and round, and the
                // same text as every other client's: both kinds of mix-up.
                let echoed: i32 = sqlx::query_scalar("SELECT $1::int4 * 1000 + $2::int4")
                    .bind(client)
                    .bind(n)
                    .fetch_one(&pinned)
                    .await
                    .expect("echo");
                if echoed != client * 1000 + n {
                    wrong.push((client, n, echoed));
                }
                sqlx::query("INSERT INTO pinned_probe (client, n) VALUES ($1, $2)")
                    .bind(client)
                    .bind(n)
                    .execute(&pinned)
                    .await
                    .expect("insert");
                let written: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM pinned_probe WHERE client = $1")
                        .bind(client)
                        .fetch_one(&pinned)
                        .await
                        .expect("count");
                if written != i64::from(n) + 1 {
                    wrong.push((client, n, written as i32));
                }
            }
            wrong
        }));
    }
    let mut wrong = Vec::new();
    for t in tasks {
        wrong.extend(t.await.expect("task"));
    }
    assert!(wrong.is_empty(), "answers for another client: {wrong:?}");
    let mut direct = db.connection().await;
    let (rows, clients_seen): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT client) FROM pinned_probe")
            .fetch_one(&mut direct)
            .await
            .expect("rows");
    assert_eq!((rows, clients_seen), (16 * 25, 16));
    let leaked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(&mut direct)
    .await
    .expect("activity");
    assert_eq!(leaked, 0, "no transaction left open on a server session");
    pinned.close().await;
}

/// `serve` with the statement cache on refuses transaction mode on
/// PgBouncer 1.18, at once and saying what to set instead, rather than
/// answering with other clients' rows.
#[tokio::test]
async fn serve_refuses_transaction_mode_when_the_pooler_passes_statements_through() {
    require_pgbouncer();
    let db = crate::helpers::migrated_db().await;
    set_role_limits(&db, "postgres", "15s").await;
    let bouncer = Bouncer::start(&db, &["postgres"], 4, "transaction").await;
    let mut r = Replica::spawn(
        "refuse-tx",
        crate::helpers::replicas::free_port(),
        &[
            ("DATABASE_URL", bouncer.url("postgres", &db.name)),
            ("POOLKEEPER_DB_POOLER", "transaction".into()),
            ("POOLKEEPER_MIGRATION_DATABASE_URL", db.url()),
        ],
    );
    let (status, log) = r.exit(Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(log.contains("POOLKEEPER_DB_STATEMENT_CACHE=off"), "{log}");
    assert!(log.contains("max_prepared_statements"), "{log}");
    assert!(log.contains("pool_mode = session"), "{log}");
}

/// A pooler-only `serve` (transaction mode, no migration session) refuses
/// to start while SQL definitions are pending, as it does for migrations,
/// naming what to set; it changes nothing.
#[tokio::test]
async fn serve_through_the_pooler_alone_refuses_pending_definitions() {
    require_pgbouncer();
    let db = crate::helpers::migrated_db().await;
    set_role_limits(&db, "postgres", "15s").await;
    let admin = db.pool().await;
    sqlx::query("DELETE FROM sql_definitions")
        .execute(&admin)
        .await
        .expect("forget the installed set");
    let bouncer = Bouncer::start(&db, &["postgres"], 4, "transaction").await;
    let mut r = Replica::spawn(
        "refuse-definitions",
        crate::helpers::replicas::free_port(),
        &[
            ("DATABASE_URL", bouncer.url("postgres", &db.name)),
            ("POOLKEEPER_DB_POOLER", "transaction".into()),
            ("POOLKEEPER_DB_STATEMENT_CACHE", "off".into()),
        ],
    );
    let (status, log) = r.exit(Duration::from_secs(30)).await;
    assert!(!status.success(), "{log}");
    assert!(log.contains("SQL definitions are pending"), "{log}");
    assert!(log.contains("POOLKEEPER_MIGRATION_DATABASE_URL"), "{log}");
    let files: i64 = sqlx::query_scalar("SELECT count(*) FROM sql_definitions")
        .fetch_one(&admin)
        .await
        .expect("sql_definitions");
    assert_eq!(files, 0, "nothing applied through the pooler");
    admin.close().await;
}

/// Behind a pooler the limits cannot travel as startup options: without
/// them on the role, `serve` refuses to start and names the SQL to run.
#[tokio::test]
async fn serve_behind_a_pooler_refuses_a_role_without_the_session_limits() {
    require_pgbouncer();
    let db = crate::helpers::migrated_db().await;
    let bouncer = Bouncer::start(&db, &["postgres"], 4, "session").await;
    let mut r = Replica::spawn(
        "refuse-limits",
        crate::helpers::replicas::free_port(),
        &[
            ("DATABASE_URL", bouncer.url("postgres", &db.name)),
            ("POOLKEEPER_DB_POOLER", "session".into()),
        ],
    );
    let (status, log) = r.exit(Duration::from_secs(30)).await;
    assert!(!status.success());
    for sql in [
        "ALTER ROLE postgres SET statement_timeout = '15s';",
        "ALTER ROLE postgres SET lock_timeout = '5s';",
        "ALTER ROLE postgres SET idle_in_transaction_session_timeout = '30s';",
    ] {
        assert!(log.contains(sql), "{sql} not in:\n{log}");
    }
}

/// Two replicas behind PgBouncer 1.18 in session mode, the limits on the
/// role: the 8-orders-on-3-machines race (the allocator's own assertions,
/// through the pooler), orders through both replicas, a sweep-lease
/// takeover, and a statement past statement_timeout answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_behind_pgbouncer_order_sweep_and_time_out() {
    require_pgbouncer();
    two_replicas_through("session").await;
}

/// The same, with the same assertions, in transaction mode with the
/// statement cache off (pinned): 10 server sessions shared by the test's
/// pool and both replicas' pools and workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_behind_pgbouncer_in_transaction_mode_order_sweep_and_time_out() {
    require_pgbouncer();
    two_replicas_through("transaction").await;
}

async fn two_replicas_through(mode: &str) {
    let pinned = mode == "transaction";
    let db = crate::helpers::migrated_db().await;
    // A short statement_timeout (no looser than the 15 s the start-up check
    // demands), so that the test provokes it quickly; lock_timeout (5 s) is
    // longer, so a lock wait ends by statement_timeout.
    set_role_limits(&db, "postgres", "2s").await;
    // Session mode needs a server session per client connection; in
    // transaction mode 10 serve them all (the race below pins 8 at once).
    let server_sessions = if pinned { 10 } else { 80 };
    let bouncer = Bouncer::start(&db, &["postgres"], server_sessions, mode).await;
    let through = poolkeeper::db::connect_app(
        bouncer.options("postgres", &db.name),
        20,
        Duration::from_secs(5),
        true,
        pinned,
    )
    .await
    .expect("a pool through pgbouncer");
    let limit: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&through)
        .await
        .expect("show");
    assert_eq!(limit, "2s", "the role's limit holds through the pooler");
    poolkeeper::db::check_role_limits(&through)
        .await
        .expect("limits in force");

    // R3 through the pooler: 8 orders, 3 eligible machines, 5 rounds.
    for round in 0..5 {
        let org = create_org(&through, &format!("bouncer-{round}"), true).await;
        crate::helpers::decoys(&through, org.id).await;
        for i in 0..3 {
            FakeMachine::new()
                .tag(&format!("OK-{i}"))
                .site(crate::helpers::SITE)
                .create(&through, org.id)
                .await;
        }
        let reqs = (0..8)
            .map(|i| crate::helpers::request(&format!("ORD-{i}"), Some("dell")))
            .collect();
        let outcomes = crate::helpers::race(&through, org.id, reqs).await;
        crate::helpers::check_round(&through, org.id, &outcomes, 3, round).await;
    }

    let direct = db.pool().await;
    let org = create_org(&direct, "acme", true).await;
    let env = |name: &str| {
        vec![
            ("DATABASE_URL", bouncer.url("postgres", &db.name)),
            ("POOLKEEPER_DB_POOLER", mode.to_owned()),
            (
                "POOLKEEPER_DB_STATEMENT_CACHE",
                if pinned { "off" } else { "on" }.to_owned(),
            ),
            ("POOLKEEPER_REPLICA", name.to_owned()),
        ]
    };
    let a = Replica::start("bouncer-a", &env("bouncer-a")).await;
    let b = Replica::start("bouncer-b", &env("bouncer-b")).await;
    let http = reqwest::Client::new();
    for r in [&a, &b] {
        let ready = http.get(r.url("/readyz")).send().await.expect("readyz");
        assert_eq!(ready.status().as_u16(), 200, "{}", r.log());
    }

    // 8 orders on 3 machines over HTTP, alternating replicas, released
    // together: 3 reservations on 3 machines, 5 refusals.
    for i in 0..3 {
        FakeMachine::new()
            .tag(&format!("H-{i}"))
            .site(crate::helpers::SITE)
            .create(&direct, org.id)
            .await;
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let url = if i % 2 == 0 { a.url("") } else { b.url("") };
        let (http, token, barrier) = (http.clone(), org.token.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let r = http
                .post(format!("{url}/api/v1/reservations"))
                .bearer_auth(&token)
                .json(&json!({"order_ref": format!("HTTP-{i}"), "site": crate::helpers::SITE,
                               "profile": crate::helpers::PROFILE, "vendor": "dell", "hold_seconds": 600}))
                .send()
                .await
                .expect("answer");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.expect("json"))
        }));
    }
    let mut created = 0;
    for t in tasks {
        let (status, body) = t.await.expect("task");
        match status {
            201 => created += 1,
            409 => assert!(
                ["unavailable", "contended"].contains(&body["error"].as_str().unwrap_or("")),
                "{body}"
            ),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    let (held, machines): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT machine_id) FROM reservations
          WHERE org_id = $1 AND state = 'held' AND order_ref LIKE 'HTTP-%'",
    )
    .bind(org.id)
    .fetch_one(&direct)
    .await
    .expect("held");
    assert_eq!(held, created, "every 201 is a held reservation");
    assert_eq!(created, 3, "3 machines, 8 orders: 3 reservations");
    assert_eq!(machines, held, "one holder per machine");

    // The sweep lease moves when its holder stops; the new holder sweeps.
    let (holder, fence) = wait_lease(
        &direct,
        &["bouncer-a", "bouncer-b"],
        None,
        Duration::from_secs(30),
    )
    .await;
    let (victim, survivor) = if holder == "bouncer-a" {
        (a, b)
    } else {
        (b, a)
    };
    let mut victim = victim;
    victim.signal(libc::SIGTERM);
    let (status, log) = victim.exit(Duration::from_secs(30)).await;
    assert!(status.success(), "graceful exit: {log}");
    let (new_holder, new_fence) = wait_lease(
        &direct,
        &[survivor.name.as_str()],
        Some(&holder),
        Duration::from_secs(30),
    )
    .await;
    assert!(new_fence > fence, "{new_holder}: {new_fence} after {fence}");
    let late = FakeMachine::new()
        .tag("LATE-1")
        .site("ams1")
        .create(&direct, org.id)
        .await;
    let overdue = FakeHold::on(late)
        .order("LATE-ORDER")
        .bare()
        .create(&direct, org.id)
        .await;
    sqlx::query(
        "UPDATE reservations SET created_at = clock_timestamp() - interval '1 hour',
                expires_at = clock_timestamp() - interval '1 minute' WHERE id = $1",
    )
    .bind(overdue)
    .execute(&direct)
    .await
    .expect("overdue");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (replica, lease_fence) = loop {
        let row: Option<(Option<String>, Option<i64>)> = sqlx::query_as(
            "SELECT replica, lease_fence FROM reservation_events
              WHERE reservation_id = $1 AND kind = 'expired'",
        )
        .bind(overdue)
        .fetch_optional(&direct)
        .await
        .expect("events");
        if let Some(r) = row {
            break r;
        }
        assert!(Instant::now() < deadline, "the survivor never swept");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(replica.as_deref(), Some(survivor.name.as_str()));
    assert!(lease_fence.is_some_and(|f| f >= new_fence));

    // statement_timeout through the pooler: a cancel stuck behind a foreign
    // row lock ends with the honest 503 of RELIABILITY.md, writes nothing.
    let m = FakeMachine::new()
        .tag("STUCK-1")
        .site("fra1")
        .create(&direct, org.id)
        .await;
    let stuck = FakeHold::on(m)
        .order("STUCK-ORDER")
        .bare()
        .create(&direct, org.id)
        .await;
    let fence: i64 = sqlx::query_scalar("SELECT fence FROM reservations WHERE id = $1")
        .bind(stuck)
        .fetch_one(&direct)
        .await
        .expect("fence");
    let mut blocker = db.connection().await;
    sqlx::query("BEGIN")
        .execute(&mut blocker)
        .await
        .expect("begin");
    sqlx::query("SELECT id FROM machines WHERE id = $1 FOR UPDATE")
        .bind(m)
        .execute(&mut blocker)
        .await
        .expect("lock");
    let started = Instant::now();
    let resp = http
        .post(survivor.url(&format!("/api/v1/reservations/{stuck}/cancel")))
        .bearer_auth(&org.token)
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
        waited < Duration::from_secs(5),
        "ended by the role's 2 s statement_timeout, before lock_timeout: {waited:?}"
    );
    sqlx::query("ROLLBACK")
        .execute(&mut blocker)
        .await
        .expect("rollback");
    let state: String = sqlx::query_scalar("SELECT state FROM reservations WHERE id = $1")
        .bind(stuck)
        .fetch_one(&direct)
        .await
        .expect("state");
    assert_eq!(state, "held", "nothing written on refusal");
    through.close().await;
}
