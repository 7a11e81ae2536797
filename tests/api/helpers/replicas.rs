//! `poolkeeper serve` as real processes, for the deployment tests (of both
//! test binaries: each uses some of it).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::helpers::binary;

/// A port free now, from the kernel (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A free port below the kernel's ephemeral range, for a process that is
/// killed and comes back on the same port (the clients keep its address): a
/// port of the ephemeral range can meanwhile become the local end of some
/// outgoing connection, and the new bind then fails with "Address already
/// in use" (seen once). Below the range, only a listener could take it.
pub fn free_port_to_bind_again() -> u16 {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| {
            r.split_whitespace()
                .next()
                .and_then(|l| l.parse::<u16>().ok())
        })
        .unwrap_or(32768);
    let mut rng = StdRng::seed_from_u64(rand::random());
    for _ in 0..1000 {
        let port = rng.random_range(10_000..low.max(10_001));
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between 10000 and {low}");
}

/// One `poolkeeper serve` process; killed when dropped.
pub struct Replica {
    pub name: String,
    pub port: u16,
    pub child: Child,
    pub log: PathBuf,
}

impl Drop for Replica {
    /// Logs are kept only when the test fails (in
    /// `$TMPDIR/poolkeeper-deploy-logs`).
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

impl Replica {
    /// Starts `poolkeeper serve` with `env` on a free port; waits until
    /// `/healthz` answers.
    pub async fn start(name: &str, env: &[(&str, String)]) -> Replica {
        let port = free_port();
        let mut replica = Self::spawn(name, port, env);
        replica.wait_healthy().await;
        replica
    }

    /// Spawns without waiting (for start-up failures).
    pub fn spawn(name: &str, port: u16, env: &[(&str, String)]) -> Replica {
        let dir = std::env::temp_dir().join("poolkeeper-deploy-logs");
        std::fs::create_dir_all(&dir).expect("log dir");
        let log = dir.join(format!("{name}-{:08x}.log", rand::random::<u32>()));
        let file = std::fs::File::create(&log).expect("replica log");
        let mut cmd = Command::new(binary());
        cmd.arg("serve")
            .env_remove("DATABASE_URL")
            .env("POOLKEEPER_BIND", format!("127.0.0.1:{port}"))
            .env("POOLKEEPER_DATACENTER_MODULE", "on")
            .env("POOLKEEPER_SWEEP_SECONDS", "1")
            .env("POOLKEEPER_LEASE_SECONDS", "3")
            .env("POOLKEEPER_SHUTDOWN_DRAIN_SECONDS", "1")
            .env("POOLKEEPER_REPLICA", name)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn poolkeeper serve");
        Replica {
            name: name.to_owned(),
            port,
            child,
            log,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls /healthz (an external process: nothing to wait on but its answer).
    pub async fn wait_healthy(&mut self) {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "replica {} exited at start-up: {status}\n{}",
                    self.name,
                    self.log()
                );
            }
            let ok = http
                .get(self.url("/healthz"))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "replica {} not healthy in 60 s",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the process to exit (bounded); its status and log.
    pub async fn exit(&mut self, within: Duration) -> (std::process::ExitStatus, String) {
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} still running after {within:?}", self.name))
            .expect("wait");
        (status, self.log())
    }

    pub fn signal(&self, sig: i32) {
        if let Some(pid) = self.child.id() {
            // SAFETY: plain signal delivery to our own child process.
            unsafe {
                libc::kill(pid as i32, sig);
            }
        }
    }
}

/// The holder of the sweep's live lease, read on `pool`.
pub async fn lease_holder(pool: &poolkeeper::db::Db) -> Option<(String, i64)> {
    sqlx::query_as(
        "SELECT holder, fence FROM leases WHERE key = 'sweep' AND expires_at > clock_timestamp()",
    )
    .fetch_optional(pool)
    .await
    .expect("lease row")
}

/// Polls until the live sweep lease is held by one of `among` (and not by
/// `not`); returns (holder, fence).
pub async fn wait_lease(
    pool: &poolkeeper::db::Db,
    among: &[&str],
    not: Option<&str>,
    within: Duration,
) -> (String, i64) {
    let deadline = Instant::now() + within;
    loop {
        if let Some((h, f)) = lease_holder(pool).await
            && among.contains(&h.as_str())
            && Some(h.as_str()) != not
        {
            return (h, f);
        }
        assert!(
            Instant::now() < deadline,
            "no lease among {among:?} (not {not:?}) within {within:?}: {:?}",
            lease_holder(pool).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
