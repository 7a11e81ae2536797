//! Item 8: the hot path through PgBouncer, beside the same path direct.
//! One `pgbouncer` (Debian's, run as the cluster's user) in front of the
//! bench cluster serves the same database twice: in session mode, and in
//! transaction mode, where poolkeeper runs pinned
//! (`POOLKEEPER_DB_STATEMENT_CACHE=off`: every statement inside its own
//! transaction begun by `BEGIN; DEALLOCATE ALL`, nothing prepared for
//! later). The calls are the API handlers' own (`reserve_for_token`, then
//! `transition_for_token` to cancel), from 8 clients sharing one pool of 8
//! connections per path; the paths take turns, run after run, so that a
//! noisy moment hits all three. The statements PostgreSQL ran per cycle are
//! counted by pg_stat_statements (one client, 100 cycles per path).
//!
//! The database is set up as item 1's. On a small one analyzed empty (800
//! machines, no history) every path, direct included, slowed down run after
//! run (1278/s to 613/s in five 1-second runs), and came back at once after
//! an ANALYZE: the functions' generic plans, cached while the table was
//! empty, looked reservations up through an index led by org_id instead of
//! their key's. Migration 20261203000007 fixed it (2464/s to 2347/s in the
//! same five runs).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use poolkeeper::allocator::{HoldSeconds, OrderSpec, ReserveOutcome, ReserveRequest};
use poolkeeper::db::Db as AppDb;
use poolkeeper::domain::{OrderRef, Profile, Site};
use poolkeeper::reservations::Transition;
use sqlx::postgres::PgConnectOptions;
use tokio::sync::Barrier;

use crate::setup::{self, Config, Db, PROFILE};
use crate::stats::{Latency, median};

pub const CLIENTS: usize = 8;
const COUNTED_CYCLES: usize = 100;

/// One path's medians over the runs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Path {
    pub path: String,
    pub cycles_per_s: f64,
    pub reserve: Latency,
    pub cancel: Latency,
    /// Statements PostgreSQL ran per reserve+cancel cycle (pg_stat_statements,
    /// utility statements included), when it could count.
    pub statements_per_cycle: Option<f64>,
    pub runs: Vec<f64>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Result {
    pub clients: usize,
    pub pgbouncer: String,
    pub paths: Vec<Path>,
}

fn binary() -> Option<PathBuf> {
    ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Why item 8 cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    binary()
        .is_none()
        .then(|| "8: pgbouncer is not installed (apt-get install pgbouncer)".to_owned())
}

struct Bouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
    user: String,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Bouncer {
    /// `session_db` and `transaction_db` in front of `db`, in those modes.
    async fn start(db: &Db, cluster_dir: &std::path::Path) -> anyhow::Result<Bouncer> {
        let bin = binary().context("pgbouncer is not installed")?;
        let dir = cluster_dir.join("pgbouncer");
        poolkeeper::embedded_pg::prepare_private_dir(&dir)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let target = match db.options.get_socket() {
            Some(socket) => format!("host={} port={}", socket.display(), db.options.get_port()),
            None => format!(
                "host={} port={}",
                db.options.get_host(),
                db.options.get_port()
            ),
        };
        let user = db.options.get_username();
        std::fs::write(dir.join("users.txt"), format!("\"{user}\" \"\"\n"))?;
        let ini = format!(
            "[databases]\n\
             session_db = {target} dbname={name} pool_mode=session\n\
             transaction_db = {target} dbname={name} pool_mode=transaction\n\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {dir}/users.txt\n\
             ignore_startup_parameters = extra_float_digits\n\
             max_client_conn = 200\ndefault_pool_size = {CLIENTS}\n\
             logfile = {dir}/pgbouncer.log\npidfile =\n",
            name = db.name,
            dir = dir.display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini)?;
        let mut cmd = Command::new(bin);
        cmd.arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // pgbouncer, like PostgreSQL, refuses to run as root.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            use std::os::unix::process::CommandExt;
            let name = std::ffi::CString::new("postgres")?;
            // SAFETY: getpwnam returns NULL or a pointer to a static record, read at once.
            let pw = unsafe { libc::getpwnam(name.as_ptr()) };
            if pw.is_null() {
                bail!("running as root without a postgres user");
            }
            // SAFETY: pw is non-null.
            let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
            cmd.uid(uid).gid(gid);
        }
        let child = cmd.spawn().context("starting pgbouncer")?;
        let bouncer = Bouncer {
            child,
            port,
            dir,
            user: user.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            use sqlx::Connection;
            if let Ok(mut c) =
                sqlx::PgConnection::connect_with(&bouncer.options("session_db")).await
                && sqlx::raw_sql("SELECT 1").execute(&mut c).await.is_ok()
            {
                let _ = c.close().await;
                return Ok(bouncer);
            }
            if Instant::now() > deadline {
                bail!(
                    "pgbouncer not ready in 30 s: {}",
                    std::fs::read_to_string(bouncer.dir.join("pgbouncer.log")).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn options(&self, dbname: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username(&self.user)
            .database(dbname)
    }
}

fn version() -> String {
    binary()
        .and_then(|b| Command::new(b).arg("--version").output().ok())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        })
        .unwrap_or_default()
}

pub async fn run(
    cfg: &Config,
    db: &Db,
    cluster_dir: &std::path::Path,
    org: &setup::Org,
) -> anyhow::Result<Result> {
    let bouncer = Bouncer::start(db, cluster_dir).await?;
    let wait = Duration::from_secs(10);
    // (name, where to connect, behind a pooler, pinned)
    let paths = [
        (
            "direct (Unix socket), statement cache on",
            db.options.clone(),
            false,
            false,
        ),
        (
            "PgBouncer session mode, statement cache on",
            bouncer.options("session_db"),
            true,
            false,
        ),
        (
            "PgBouncer transaction mode, pinned (statement cache off)",
            bouncer.options("transaction_db"),
            true,
            true,
        ),
    ];
    let mut pools: Vec<(&str, AppDb)> = Vec::new();
    for (name, options, pooler, pinned) in paths {
        let pool =
            poolkeeper::db::connect_app(options, CLIENTS as u32, wait, pooler, pinned).await?;
        pools.push((name, pool));
    }
    let hash = Arc::new(poolkeeper::tokens::digest(&org.token));
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); pools.len()];
    let mut reserves: Vec<Vec<Latency>> = vec![Vec::new(); pools.len()];
    let mut cancels: Vec<Vec<Latency>> = vec![Vec::new(); pools.len()];
    // One warm-up run per path (connections opened, plans cached).
    for (i, (_, pool)) in pools.iter().enumerate() {
        timed(pool, &hash, &format!("w{i}"), 0.5).await?;
    }
    for run in 0..cfg.runs {
        for (i, (name, pool)) in pools.iter().enumerate() {
            let r = timed(pool, &hash, &format!("r{run}p{i}"), cfg.run_seconds).await?;
            eprintln!(
                "  {name}: {:.0}/s, reserve p50 {:.2} ms p99 {:.2} ms",
                r.0, r.1.p50_ms, r.1.p99_ms
            );
            rates[i].push(r.0);
            reserves[i].push(r.1);
            cancels[i].push(r.2);
        }
    }
    let counting = crate::roundtrips::available(db).await;
    let mut paths = Vec::new();
    for (i, (name, pool)) in pools.iter().enumerate() {
        let statements_per_cycle = if counting {
            crate::roundtrips::reset(db).await?;
            for n in 0..COUNTED_CYCLES {
                cycle(pool, &hash, &format!("count{i}-{n}"), 0).await?;
            }
            Some(crate::roundtrips::statements(db).await? as f64 / COUNTED_CYCLES as f64)
        } else {
            None
        };
        paths.push(Path {
            path: (*name).to_owned(),
            cycles_per_s: median(&rates[i]),
            reserve: Latency::median_of(&reserves[i]),
            cancel: Latency::median_of(&cancels[i]),
            statements_per_cycle,
            runs: rates[i].clone(),
        });
    }
    for (_, pool) in pools {
        pool.close().await;
    }
    drop(bouncer);
    Ok(Result {
        clients: CLIENTS,
        pgbouncer: version(),
        paths,
    })
}

/// `CLIENTS` clients released together, reserve then cancel for `seconds`:
/// (cycles per second, reserve latency, cancel latency). Item 9 runs it too.
pub async fn timed(
    pool: &AppDb,
    hash: &Arc<Vec<u8>>,
    tag: &str,
    seconds: f64,
) -> anyhow::Result<(f64, Latency, Latency)> {
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let (pool, hash, barrier) = (pool.clone(), hash.clone(), barrier.clone());
        let tag = format!("{tag}c{client}");
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let end = Instant::now() + Duration::from_secs_f64(seconds);
            let (mut reserve, mut cancel) = (Vec::new(), Vec::new());
            let mut n = 0;
            while Instant::now() < end {
                let (r, c) = cycle(&pool, &hash, &format!("{tag}-{n}"), client).await?;
                reserve.push(r);
                cancel.push(c);
                n += 1;
            }
            anyhow::Ok((reserve, cancel))
        }));
    }
    barrier.wait().await;
    let started = Instant::now();
    let (mut reserve, mut cancel) = (Vec::new(), Vec::new());
    for t in tasks {
        let (r, c) = t.await??;
        reserve.extend(r);
        cancel.extend(c);
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok((
        reserve.len() as f64 / elapsed,
        Latency::of(&mut reserve),
        Latency::of(&mut cancel),
    ))
}

/// One reserve+cancel cycle on the client's own site, through the API
/// handlers' calls: (reserve time, cancel time).
async fn cycle(
    pool: &AppDb,
    hash: &[u8],
    order_ref: &str,
    client: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let req = ReserveRequest {
        order_ref: OrderRef::parse(order_ref)?,
        spec: OrderSpec {
            site: Site::parse(&setup::site(client as i64))?,
            profile: Profile::parse(PROFILE)?,
            vendor: None,
        },
        hold: HoldSeconds::new(900)?,
        quantity: poolkeeper::allocator::Quantity::ONE,
        actor: "bench".to_owned(),
        segment: None,
        customer_ref: None,
        substitutes: Default::default(),
    };
    let t = Instant::now();
    let outcome = poolkeeper::allocator::reserve_for_token(pool, hash, true, &req)
        .await?
        .map_err(|r| anyhow::anyhow!("caller refused: {r:?}"))?;
    let reserved = t.elapsed();
    let ReserveOutcome::Created { reservation, .. } = outcome else {
        bail!("reserve for {order_ref}: {outcome:?}");
    };
    let t = Instant::now();
    poolkeeper::reservations::transition_for_token(
        pool,
        hash,
        true,
        reservation.id,
        reservation.fence,
        Transition::Cancel("bench"),
    )
    .await?
    .map_err(|r| anyhow::anyhow!("caller refused: {r:?}"))?
    .map_err(|e| anyhow::anyhow!("cancel: {e}"))?;
    Ok((reserved, t.elapsed()))
}
