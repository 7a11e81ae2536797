//! F5 with a physical backup: the restore drill of docs/operations.md,
//! "Backups and restore", with pgBackRest. A private cluster archives its
//! WAL with pgBackRest; a load runs through `poolkeeper serve`; a full
//! backup; more load (kept: before the restore point); a named restore
//! point; more load (lost: after it); then the cluster is stopped, restored
//! to the point with `pgbackrest restore --type=name`, and started: it
//! recovers and promotes to a new timeline. The server keeps running
//! through it all (its connections die with the cluster, and every new one
//! checks before it serves). Checked: every invariant, every pair the
//! clients hold from the lost part refused (`404`), every identifier after
//! the restore above every one before it, the lease fences included; the
//! restore time is printed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use poolkeeper::db::Db;
use poolkeeper::embedded_pg::{ClusterOptions, EmbeddedPostgres, cluster_user_command};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};

use crate::helpers::replicas::Replica;
use crate::helpers::{Generated, create_org, generated_machines};

const MACHINES: i64 = 120;
const STANZA: &str = "pk";

fn pgbackrest() -> PathBuf {
    let found = ["/usr/bin/pgbackrest", "/usr/local/bin/pgbackrest"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
    crate::helpers::required("pgBackRest", found, "apt-get install -y pgbackrest")
}

/// `pgbackrest --config=... --stanza=pk ARGS`, as the cluster's user.
async fn run_pgbackrest(bin: &Path, config: &Path, args: &[&str]) -> Duration {
    let mut cmd = cluster_user_command(bin).expect("the cluster's user");
    cmd.arg(format!("--config={}", config.display()))
        .arg(format!("--stanza={STANZA}"))
        .args(args)
        .stdin(Stdio::null());
    let started = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::from(cmd).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("pgbackrest {args:?} still running after 300 s"))
    .expect("run pgbackrest");
    assert!(
        out.status.success(),
        "pgbackrest {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    started.elapsed()
}

async fn start_cluster(opts: &ClusterOptions) -> EmbeddedPostgres {
    let o = opts.clone();
    tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&o))
        .await
        .expect("join")
        .expect("start the cluster")
}

async fn stop_cluster(pg: EmbeddedPostgres) {
    tokio::task::spawn_blocking(move || pg.stop())
        .await
        .expect("join");
}

/// One answer of the server, 503s (the cluster down, or connections that
/// died with it) retried within a bound.
async fn call(http: &reqwest::Client, url: &str, token: &str, body: Value) -> (StatusCode, Value) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let sent = http
            .post(url)
            .bearer_auth(token)
            .json(&body)
            .timeout(Duration::from_secs(20))
            .send()
            .await;
        if let Ok(r) = sent {
            let status = r.status();
            let answer: Value = r.json().await.unwrap_or(Value::Null);
            if status != StatusCode::SERVICE_UNAVAILABLE {
                return (status, answer);
            }
        }
        assert!(
            Instant::now() < deadline,
            "{url}: no answer but 503 in 120 s"
        );
        // The server is restarting its connections: nothing to wait on.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A reservation as the order service was told it.
#[derive(Debug, Clone)]
struct Held {
    id: i64,
    fence: i64,
    machine: String,
}

struct Load<'a> {
    http: reqwest::Client,
    base: String,
    token: &'a str,
}

impl Load<'_> {
    async fn reserve(&self, order: &str) -> Held {
        let (status, body) = call(
            &self.http,
            &format!("{}/api/v1/reservations", self.base),
            self.token,
            json!({"order_ref": order, "site": "par1", "profile": "r650"}),
        )
        .await;
        assert!(
            status == StatusCode::CREATED || status == StatusCode::OK,
            "reserve {order}: {status} {body}"
        );
        Held {
            id: body["id"].as_i64().expect("id"),
            fence: body["fence"].as_i64().expect("fence"),
            machine: body["machine"]["asset_tag"]
                .as_str()
                .expect("machine")
                .to_owned(),
        }
    }

    async fn act(&self, h: &Held, action: &str) -> (StatusCode, Value) {
        let body = match action {
            "convert" => json!({"fence": h.fence, "service_ref": format!("SRV-{}", h.id)}),
            _ => json!({"fence": h.fence, "reason": "drill"}),
        };
        call(
            &self.http,
            &format!("{}/api/v1/reservations/{}/{action}", self.base, h.id),
            self.token,
            body,
        )
        .await
    }

    /// `n` new orders named `prefix-i`; every third cancelled, every fifth
    /// converted, the rest held.
    async fn round(&self, prefix: &str, n: usize) -> Vec<Held> {
        let mut told = Vec::new();
        for i in 0..n {
            let h = self.reserve(&format!("{prefix}-{i}")).await;
            if i % 3 == 0 {
                let (s, b) = self.act(&h, "cancel").await;
                assert_eq!(s, StatusCode::OK, "{b}");
            } else if i % 5 == 0 {
                let (s, b) = self.act(&h, "convert").await;
                assert_eq!(s, StatusCode::OK, "{b}");
            }
            told.push(h);
        }
        told
    }
}

async fn scalar(pool: &Db, sql: &'static str) -> i64 {
    sqlx::query_scalar::<_, Option<i64>>(sql)
        .fetch_one(pool)
        .await
        .expect(sql)
        .unwrap_or(0)
}

/// The highest value each identifier has reached: reservation ids and
/// fences, event ids, lease fences (the sequences, so values handed out in
/// a transaction that rolled back count too).
async fn highest(pool: &Db) -> [i64; 4] {
    [
        scalar(pool, "SELECT max(id) FROM reservations").await,
        scalar(pool, "SELECT last_value FROM reservation_fence_seq").await,
        scalar(pool, "SELECT max(id) FROM reservation_events").await,
        scalar(pool, "SELECT last_value FROM lease_fence_seq").await,
    ]
}

/// Every invariant of the restored and then used database, in SQL.
async fn check_invariants(pool: &Db) -> Vec<String> {
    let checks: [(&str, &str); 5] = [
        (
            "a machine held twice",
            "SELECT count(*) FROM (SELECT machine_id FROM reservations WHERE state = 'held'
                                    GROUP BY 1 HAVING count(*) > 1) t",
        ),
        (
            "a machine held while in another reservation's live service",
            "SELECT count(*) FROM reservations r JOIN service_links l
                 ON l.machine_id = r.machine_id AND l.ended_at IS NULL AND l.reservation_id <> r.id
              WHERE r.state = 'held'",
        ),
        (
            "a reservation without exactly one created event",
            "SELECT count(*) FROM reservations r
              WHERE (SELECT count(*) FROM reservation_events e
                      WHERE e.reservation_id = r.id AND e.kind = 'created') <> 1",
        ),
        (
            "an ended reservation without exactly one terminal event of its state",
            "SELECT count(*) FROM reservations r
              WHERE r.state <> 'held'
                AND (SELECT count(*) FROM reservation_events e
                      WHERE e.reservation_id = r.id AND e.to_state = r.state
                        AND e.from_state = 'held') <> 1",
        ),
        (
            "converted without a service link, or a link without a conversion",
            "SELECT count(*) FROM reservations r
              WHERE (r.state = 'converted')
                    <> EXISTS (SELECT 1 FROM service_links l WHERE l.reservation_id = r.id)",
        ),
    ];
    let mut violations = Vec::new();
    for (what, sql) in checks {
        let n = scalar(pool, sql).await;
        if n != 0 {
            violations.push(format!("{what}: {n}"));
        }
    }
    violations
}

/// A private cluster whose WAL pgBackRest archives (stanza created), with
/// an empty database `poolkeeper`, in `dir`.
struct Archived {
    bin: PathBuf,
    dir: PathBuf,
    config: PathBuf,
    opts: ClusterOptions,
}

async fn archived_cluster() -> (Archived, EmbeddedPostgres) {
    let bin = pgbackrest();
    let dir = std::env::temp_dir().join(format!("pk-bk-{:08x}", rand::random::<u32>()));
    poolkeeper::embedded_pg::prepare_private_dir(&dir).expect("drill dir");
    for sub in ["repo", "log", "lock", "spool"] {
        poolkeeper::embedded_pg::prepare_private_dir(&dir.join(sub)).expect("drill dir");
    }
    let data = dir.join("pg");
    let config = dir.join("pgbackrest.conf");
    // The socket is in the data directory (a short path): pg1-socket-path.
    std::fs::write(
        &config,
        format!(
            "[global]\nrepo1-path={d}/repo\nlog-path={d}/log\nlock-path={d}/lock\n\
             spool-path={d}/spool\nlog-level-console=warn\nlog-level-file=detail\n\
             start-fast=y\n\n[{STANZA}]\npg1-path={data}\npg1-socket-path={data}\n\
             pg1-port=5432\npg1-user=postgres\n",
            d = dir.display(),
            data = data.display()
        ),
    )
    .expect("pgbackrest.conf");
    let opts = ClusterOptions {
        data_dir: data.clone(),
        log_file: dir.join("postgres.log"),
        throwaway: false,
    };

    // WAL archiving needs a restart of the cluster.
    let pg = start_cluster(&opts).await;
    let admin = pg.connect_options("postgres");
    let mut conn = PgConnection::connect_with(&admin).await.expect("admin");
    for sql in [
        "ALTER SYSTEM SET archive_mode = 'on'".to_owned(),
        format!(
            "ALTER SYSTEM SET archive_command = '{} --config={} --stanza={STANZA} archive-push %p'",
            bin.display(),
            config.display()
        ),
        "CREATE DATABASE poolkeeper".to_owned(),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect("set up archiving");
    }
    let _ = conn.close().await;
    stop_cluster(pg).await;
    let pg = start_cluster(&opts).await;
    run_pgbackrest(&bin, &config, &["stanza-create"]).await;
    (
        Archived {
            bin,
            dir,
            config,
            opts,
        },
        pg,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_point_in_time_recovery_with_pgbackrest_keeps_every_invariant() {
    let (archived, pg) = archived_cluster().await;
    let Archived {
        bin,
        dir,
        config,
        opts,
    } = &archived;
    let (bin, dir, config, opts) = (bin.as_path(), dir.as_path(), config.as_path(), opts);
    let db_opts = pg.connect_options("poolkeeper");
    poolkeeper::db::migrate(&db_opts).await.expect("migrate");
    let setup = poolkeeper::db::connect(db_opts.clone(), 4)
        .await
        .expect("pool");
    let org = create_org(&setup, "drill", true).await;
    generated_machines(
        &setup,
        org.id,
        MACHINES,
        Generated {
            tag: "'DR-' || lpad(g::text, 3, '0')",
            site: "'par1'",
            vendor: "'dell'",
            profile: "'r650'",
            status: "'ready'",
        },
    )
    .await;
    setup.close().await;

    let mut replica = Replica::start(
        &format!("drill-{:08x}", rand::random::<u32>()),
        &[("DATABASE_URL", pg.url("poolkeeper"))],
    )
    .await;
    let load = Load {
        http: reqwest::Client::new(),
        base: format!("http://127.0.0.1:{}", replica.port),
        token: &org.token,
    };

    // Load; the full backup; load kept by the restore; the restore point;
    // load lost with it.
    let first = load.round("FIRST", 15).await;
    let backup = run_pgbackrest(&bin, &config, &["--type=full", "backup"]).await;
    let kept = load.round("KEPT", 15).await;
    let pool = poolkeeper::db::connect(db_opts.clone(), 4)
        .await
        .expect("pool");
    sqlx::query("SELECT pg_create_restore_point('pk-drill')")
        .execute(&pool)
        .await
        .expect("restore point");
    // More than 32: a sequence WAL-logs 32 values ahead, so a recovery
    // alone skips up to 32; the lost part must be past that.
    let lost = load.round("LOST", 40).await;
    // What became of kept orders after the point is lost too.
    let kept_held: Vec<&Held> = kept
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0 && i % 5 != 0)
        .map(|(_, h)| h)
        .collect();
    let (s, b) = load.act(kept_held[0], "cancel").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let mut lease_fence: i64 = 0;
    if let poolkeeper::lease::Claim::Acquired(m) =
        poolkeeper::lease::claim(&pool, "drill", "drill", Duration::from_secs(60))
            .await
            .expect("claim")
    {
        lease_fence = m.fence;
    }
    assert!(lease_fence > 0, "a fresh key is free");
    let before = highest(&pool).await;
    // Every WAL segment up to here is archived (check switches and waits).
    run_pgbackrest(&bin, &config, &["check"]).await;
    pool.close().await;

    // The restore, with the server still running.
    let down = Instant::now();
    stop_cluster(pg).await;
    let restore = run_pgbackrest(
        &bin,
        &config,
        &[
            "--delta",
            "--type=name",
            "--target=pk-drill",
            "--target-action=promote",
            "restore",
        ],
    )
    .await;
    let pg = start_cluster(&opts).await;
    let recovered = down.elapsed();
    let after = load.reserve("AFTER-0").await;
    let serving = down.elapsed();

    let pool = poolkeeper::db::connect(db_opts.clone(), 4)
        .await
        .expect("pool");
    let mut violations = Vec::new();
    // Every identifier after the restore above every one before it.
    let more = load.round("AFTER", 9).await;
    let new_events = scalar(
        &pool,
        "SELECT min(e.id) FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id
          WHERE r.order_ref LIKE 'AFTER-%'",
    )
    .await;
    for h in std::iter::once(&after).chain(more.iter()) {
        if h.id <= before[0] || h.fence <= before[1] {
            violations.push(format!("{h:?} not above {before:?}"));
        }
    }
    if new_events <= before[2] {
        violations.push(format!("event {new_events} <= {}", before[2]));
    }
    match poolkeeper::lease::claim(&pool, "drill-after", "drill", Duration::from_secs(60))
        .await
        .expect("claim")
    {
        poolkeeper::lease::Claim::Acquired(m) if m.fence > before[3] => {}
        other => violations.push(format!("lease claim {other:?} not above {}", before[3])),
    }
    // The lost orders are not in the restored database, and what the
    // clients hold of them is refused.
    for h in &lost {
        let (s, b) = load.act(h, "cancel").await;
        if s != StatusCode::NOT_FOUND {
            violations.push(format!("cancel of lost {h:?}: {s} {b}"));
        }
    }
    // The kept orders are there as they were at the point; the one
    // cancelled after it is held again, and acts with its fence.
    for h in first.iter().chain(kept.iter()) {
        let row: Option<(i64, String)> = sqlx::query_as(
            "SELECT r.fence, m.asset_tag FROM reservations r JOIN machines m ON m.id = r.machine_id
              WHERE r.id = $1",
        )
        .bind(h.id)
        .fetch_optional(&pool)
        .await
        .expect("kept");
        if row != Some((h.fence, h.machine.clone())) {
            violations.push(format!("kept {h:?} is {row:?}"));
        }
    }
    let (s, b) = load.act(kept_held[0], "cancel").await;
    if s != StatusCode::OK {
        violations.push(format!("cancel of kept {:?}: {s} {b}", kept_held[0]));
    }
    let reason: Option<String> =
        sqlx::query_scalar("SELECT reason FROM incarnation_changes ORDER BY id DESC LIMIT 1")
            .fetch_optional(&pool)
            .await
            .expect("the log of changes");
    if !reason.as_deref().is_some_and(|r| r.contains("timeline")) {
        violations.push(format!("no new timeline logged: {reason:?}"));
    }
    violations.extend(check_invariants(&pool).await);
    let reservations = scalar(&pool, "SELECT count(*) FROM reservations").await;
    pool.close().await;

    println!(
        "restore drill: full backup {:.1}s; pgbackrest restore {:.1}s; cluster down to recovered \
         and promoted {:.1}s; to the first 201 through the running server {:.1}s \
         ({} machines, {} reservations; debug build, shared machine)",
        backup.as_secs_f64(),
        restore.as_secs_f64(),
        recovered.as_secs_f64(),
        serving.as_secs_f64(),
        MACHINES,
        reservations,
    );
    replica.signal(libc::SIGTERM);
    let _ = replica.exit(Duration::from_secs(30)).await;
    stop_cluster(pg).await;
    assert!(violations.is_empty(), "{violations:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

fn env_or(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// On a connection of its own: no session limits (the pool's
/// statement_timeout would stop the load).
async fn timed(conn: &mut PgConnection, sql: &str) -> Duration {
    let started = Instant::now();
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    started.elapsed()
}

/// The runbook's figures at scale, by hand (minutes, gigabytes):
/// `BACKUP_MACHINES` machines (400,000) and `BACKUP_RESERVATIONS`
/// reservations (1,000,000: one held on every tenth machine, the rest
/// cancelled, each with its events), then the times of a full backup, a
/// restore into an empty data directory (a lost disk) and its recovery to
/// a point, the first `201` after it, and of `pg_dump -Fc` and
/// `pg_restore --single-transaction` of the same database.
///
/// `cargo test --test components backups::restore_time_at_scale -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes and gigabytes: by hand, for docs/operations.md"]
async fn restore_time_at_scale() {
    let machines = env_or("BACKUP_MACHINES", 400_000);
    let reservations = env_or("BACKUP_RESERVATIONS", 1_000_000);
    let held = machines / 10;
    let (archived, pg) = archived_cluster().await;
    let db_opts = pg.connect_options("poolkeeper");
    poolkeeper::db::migrate(&db_opts).await.expect("migrate");
    let pool =
        poolkeeper::db::connect_with_acquire_timeout(db_opts.clone(), 2, Duration::from_secs(60))
            .await
            .expect("pool");
    let org = create_org(&pool, "scale", true).await;
    let mut conn = PgConnection::connect_with(&db_opts).await.expect("connect");
    let loading = Instant::now();
    timed(
        &mut conn,
        &format!(
            "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
             SELECT {o}, 'SC-' || lpad(g::text, 7, '0'), 'par1', 'dell', 'r650', 'ready'
               FROM generate_series(1, {machines}) g",
            o = org.id
        ),
    )
    .await;
    // In batches: one transaction of millions of rows would need the
    // memory of all of them for its triggers' transition tables.
    let batch = 200_000;
    let mut from = 1;
    while from <= reservations {
        let to = (from + batch - 1).min(reservations);
        timed(
            &mut conn,
            &format!(
                "WITH m AS (SELECT min(id) AS first FROM machines),
                 ins AS (
                    INSERT INTO reservations (org_id, order_ref, machine_id, state, spec,
                                              machine_snapshot, reason, hold_seconds, created_at,
                                              expires_at, ended_at, ended_by, end_reason)
                    SELECT {o}, 'SC-' || g, m.first + (g - 1) % {machines},
                           CASE WHEN g > {reservations} - {held} THEN 'held' ELSE 'cancelled' END,
                           jsonb_build_object('site', 'par1', 'profile', 'r650', 'vendor', NULL,
                                              'hold_seconds', 900),
                           jsonb_build_object('asset_tag', 'SC-' || lpad(((g - 1) % {machines} + 1)::text, 7, '0'),
                                              'site', 'par1', 'vendor', 'dell', 'profile', 'r650',
                                              'status', 'ready'),
                           'SC matched site par1, profile r650, any vendor: candidate 1 of 25 in pass one; held for 900 s',
                           900, clock_timestamp(), clock_timestamp() + interval '1 day',
                           CASE WHEN g > {reservations} - {held} THEN NULL ELSE clock_timestamp() END,
                           CASE WHEN g > {reservations} - {held} THEN NULL ELSE 'checkout' END,
                           CASE WHEN g > {reservations} - {held} THEN NULL ELSE 'scale' END
                      FROM generate_series({from}, {to}) g, m
                    RETURNING id, state, created_at),
                 created AS (
                    INSERT INTO reservation_events (reservation_id, at, kind, from_state, to_state, actor)
                    SELECT id, created_at, 'created', NULL, 'held', 'checkout' FROM ins RETURNING 1)
                 INSERT INTO reservation_events (reservation_id, at, kind, from_state, to_state, actor)
                 SELECT id, created_at, 'cancelled', 'held', 'cancelled', 'checkout' FROM ins
                  WHERE state = 'cancelled'",
                o = org.id
            ),
        )
        .await;
        from = to + 1;
    }
    timed(&mut conn, "VACUUM ANALYZE").await;
    let loaded = loading.elapsed();
    let size: String = sqlx::query_scalar("SELECT pg_size_pretty(pg_database_size('poolkeeper'))")
        .fetch_one(&pool)
        .await
        .expect("size");

    let backup = run_pgbackrest(&archived.bin, &archived.config, &["--type=full", "backup"]).await;
    // The point: after the backup, before a reservation the restore loses.
    sqlx::query("SELECT pg_create_restore_point('pk-scale')")
        .execute(&pool)
        .await
        .expect("restore point");
    let lost: i64 = sqlx::query_scalar("SELECT nextval('reservation_fence_seq')")
        .fetch_one(&pool)
        .await
        .expect("nextval");
    run_pgbackrest(&archived.bin, &archived.config, &["check"]).await;

    // The logical path, into another database of the same cluster.
    let dump_file = archived.dir.join("scale.dump");
    let started = Instant::now();
    let out = tokio::process::Command::new("pg_dump")
        .args(["-Fc", "-f"])
        .arg(&dump_file)
        .arg("-d")
        .arg(pg.url("poolkeeper"))
        .output()
        .await
        .expect("pg_dump");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dumped = started.elapsed();
    let dump_size = std::fs::metadata(&dump_file).map(|m| m.len()).unwrap_or(0);
    timed(&mut conn, "CREATE DATABASE restored").await;
    let started = Instant::now();
    let out = tokio::process::Command::new("pg_restore")
        .args(["--single-transaction", "--exit-on-error", "-d"])
        .arg(pg.url("restored"))
        .arg(&dump_file)
        .output()
        .await
        .expect("pg_restore");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let logical = started.elapsed();
    pool.close().await;
    let _ = conn.close().await;

    // The physical path: the data directory lost, restored from the
    // repository into an empty one, recovered to the point.
    let down = Instant::now();
    stop_cluster(pg).await;
    std::fs::remove_dir_all(&archived.opts.data_dir).expect("lose the data directory");
    poolkeeper::embedded_pg::prepare_private_dir(&archived.opts.data_dir).expect("empty data dir");
    let restore = run_pgbackrest(
        &archived.bin,
        &archived.config,
        &[
            "--type=name",
            "--target=pk-scale",
            "--target-action=promote",
            "restore",
        ],
    )
    .await;
    let pg = start_cluster(&archived.opts).await;
    let recovered = down.elapsed();
    let replica = Replica::start(
        &format!("scale-{:08x}", rand::random::<u32>()),
        &[("DATABASE_URL", pg.url("poolkeeper"))],
    )
    .await;
    let sql = poolkeeper::db::connect(db_opts.clone(), 1)
        .await
        .expect("pool");
    let free: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM machines m WHERE NOT EXISTS
            (SELECT 1 FROM reservations r WHERE r.machine_id = m.id AND r.state = 'held')",
    )
    .fetch_one(&sql)
    .await
    .expect("free");
    assert!(
        free > 0,
        "a free machine for the first order after the restore"
    );
    let load = Load {
        http: reqwest::Client::new(),
        base: format!("http://127.0.0.1:{}", replica.port),
        token: &org.token,
    };
    let first = load.reserve("SCALE-AFTER").await;
    let serving = down.elapsed();
    assert!(first.fence > lost, "{first:?} after fence {lost}");
    let counted: i64 = sqlx::query_scalar("SELECT count(*) FROM reservations")
        .fetch_one(&sql)
        .await
        .expect("count");
    assert_eq!(counted, reservations + 1);
    println!(
        "restore at scale ({machines} machines, {reservations} reservations, database {size}; \
         debug build of poolkeeper, 2-core machine shared with other builds): load {:.0}s; \
         pgbackrest full backup {:.0}s; restore into an empty data directory {:.0}s; \
         stopped to recovered and promoted {:.0}s; to the first 201 {:.0}s | \
         pg_dump -Fc {:.0}s ({} MB); pg_restore --single-transaction {:.0}s",
        loaded.as_secs_f64(),
        backup.as_secs_f64(),
        restore.as_secs_f64(),
        recovered.as_secs_f64(),
        serving.as_secs_f64(),
        dumped.as_secs_f64(),
        dump_size / 1_000_000,
        logical.as_secs_f64(),
    );
    drop(replica);
    stop_cluster(pg).await;
    let _ = std::fs::remove_dir_all(&archived.dir);
}
