//! A highly available PostgreSQL for the failover test and its bench item
//! from Debian 12's packages: Patroni 3.0.2 managing three
//! PostgreSQL 15 nodes in strict synchronous mode, one etcd 3.4 member as
//! its DCS (the v2 API: see `patroni_yml`), and HAProxy 2.6 in front routing to the node whose Patroni
//! answers `GET /primary` with 200. Every part listens on 127.0.0.1 on its
//! own free port and keeps its files under one temporary directory; the
//! PostgreSQL nodes and Patroni run as `postgres` when we are root.
//!
//! Shared by `tests/components/failover.rs` and `benches/allocation/ha.rs`
//! (`#[path]` modules): nothing here depends on either.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tokio::process::{Child, Command};

/// Patroni's leader key lives this long without a renewal: a leader frozen
/// past it loses the key and a synchronous standby is promoted. Short, so
/// that the test's faults heal in seconds; `loop_wait + 2 * retry_timeout
/// <= ttl`, as Patroni's documentation asks.
pub const TTL_SECONDS: u64 = 10;
pub const LOOP_WAIT_SECONDS: u64 = 1;
pub const RETRY_TIMEOUT_SECONDS: u64 = 4;

/// What `apt-get` installs when a part is missing (`scripts/test` does it).
pub const APT_PACKAGES: &str = "patroni python3-etcd etcd-server haproxy postgresql";

/// The programs the cluster needs.
pub struct Binaries {
    pub patroni: PathBuf,
    pub patronictl: PathBuf,
    pub etcd: PathBuf,
    pub haproxy: PathBuf,
    pub pg_bin: PathBuf,
}

/// The programs, or the one line that says how to install what is missing
/// (a test never passes by skipping a component it claims).
pub fn binaries() -> Result<Binaries, String> {
    let find = |names: &[&str]| {
        names
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or_else(|| names[0].to_owned())
    };
    let mut missing = Vec::new();
    let mut get = |names: &[&str]| match find(names) {
        Ok(p) => p,
        Err(name) => {
            missing.push(name);
            PathBuf::new()
        }
    };
    let b = Binaries {
        patroni: get(&["/usr/bin/patroni"]),
        patronictl: get(&["/usr/bin/patronictl"]),
        etcd: get(&["/usr/bin/etcd"]),
        haproxy: get(&["/usr/sbin/haproxy", "/usr/bin/haproxy"]),
        pg_bin: poolkeeper::embedded_pg::find_binaries().unwrap_or_else(|_| {
            missing.push("postgres".to_owned());
            PathBuf::new()
        }),
    };
    if missing.is_empty() {
        Ok(b)
    } else {
        Err(format!(
            "missing {}: run `apt-get update && apt-get install -y --no-install-recommends {APT_PACKAGES}` \
             (scripts/test does it)",
            missing.join(", ")
        ))
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One PostgreSQL node and the Patroni that manages it.
pub struct Node {
    pub name: String,
    pub pg_port: u16,
    pub rest_port: u16,
    pub dir: PathBuf,
    pub config: PathBuf,
    patroni: Option<Child>,
}

impl Node {
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The postmaster's PID, from its pid file (absent while it is down).
    pub fn postmaster_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.data_dir().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    pub fn patroni_pid(&self) -> Option<i32> {
        self.patroni.as_ref()?.id().map(|p| p as i32)
    }

    pub fn rest(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.rest_port)
    }
}

/// A member as Patroni's `GET /cluster` lists it.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    /// `leader`, `sync_standby` or `replica`.
    pub role: String,
    /// `running` when PostgreSQL is up and following (or leading).
    pub state: String,
}

/// The cluster: etcd, the nodes, HAProxy. Everything is stopped and its
/// directory removed when dropped (kept when the test panicked).
pub struct HaCluster {
    pub dir: PathBuf,
    pub scope: String,
    pub nodes: Vec<Node>,
    /// HAProxy's port: the one endpoint that follows the leader.
    pub port: u16,
    pub etcd_port: u16,
    etcd: Child,
    haproxy: Child,
    bin: Binaries,
}

/// A child that dies with us (SIGKILL when the test process dies before
/// its destructors run).
fn spawn(mut cmd: Command, log: &Path) -> Child {
    let file = std::fs::File::create(log).expect("a log file");
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().expect("log"))
        .stderr(file)
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe; it runs between fork and exec,
    // after the uid switch (so the exec keeps it).
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", log.display()))
}

/// SIGKILL, SIGSTOP, SIGCONT... to a process of ours (0 when gone).
pub fn signal(pid: i32, sig: i32) -> bool {
    // SAFETY: plain signal delivery to a process this test started.
    unsafe { libc::kill(pid, sig) == 0 }
}

impl HaCluster {
    /// Starts etcd, `nodes` Patroni nodes and HAProxy, and waits until the
    /// cluster has a leader and a synchronous standby. Panics with the
    /// `apt-get` line when a program is missing.
    pub async fn start(nodes: usize) -> HaCluster {
        let bin = binaries().unwrap_or_else(|e| panic!("{e}"));
        let dir = std::env::temp_dir().join(format!(
            "poolkeeper-ha-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        poolkeeper::embedded_pg::prepare_private_dir(&dir).expect("cluster dir");
        let scope = format!("pk{:08x}", rand::random::<u32>());

        let etcd_port = free_port();
        let peer_port = free_port();
        let mut etcd = Command::new(&bin.etcd);
        etcd.arg("--name=e0")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{etcd_port}"
            ))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"
            ))
            .arg(format!("--initial-cluster=e0=http://127.0.0.1:{peer_port}"))
            // Patroni's `etcd:` DCS speaks the v2 API, off by default in 3.4.
            .arg("--enable-v2=true");
        let etcd = spawn(etcd, &dir.join("etcd.log"));

        let mut node_list = Vec::new();
        for i in 1..=nodes {
            let name = format!("node{i}");
            let node_dir = dir.join(&name);
            poolkeeper::embedded_pg::prepare_private_dir(&node_dir).expect("node dir");
            let node = Node {
                pg_port: free_port(),
                rest_port: free_port(),
                config: node_dir.join("patroni.yml"),
                dir: node_dir,
                name,
                patroni: None,
            };
            std::fs::write(
                &node.config,
                patroni_yml(&scope, &node, etcd_port, &bin.pg_bin),
            )
            .expect("patroni.yml");
            node_list.push(node);
        }
        let port = free_port();
        std::fs::write(dir.join("haproxy.cfg"), haproxy_cfg(port, &node_list))
            .expect("haproxy.cfg");
        let mut haproxy = Command::new(&bin.haproxy);
        haproxy.arg("-db").arg("-f").arg(dir.join("haproxy.cfg"));
        let haproxy = spawn(haproxy, &dir.join("haproxy.log"));

        let mut cluster = HaCluster {
            dir,
            scope,
            nodes: node_list,
            port,
            etcd_port,
            etcd,
            haproxy,
            bin,
        };
        cluster.wait_etcd().await;
        for i in 0..cluster.nodes.len() {
            cluster.start_patroni(i);
        }
        cluster.wait_healthy(Duration::from_secs(120)).await;
        cluster
    }

    async fn wait_etcd(&mut self) {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.etcd.try_wait() {
                panic!("etcd exited: {status}\n{}", self.log("etcd.log"));
            }
            let ok = http
                .get(format!("http://127.0.0.1:{}/health", self.etcd_port))
                .timeout(Duration::from_secs(1))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "etcd not healthy in 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn start_patroni(&mut self, i: usize) {
        let node = &self.nodes[i];
        let cmd = poolkeeper::embedded_pg::cluster_user_command(&self.bin.patroni)
            .expect("the cluster's user");
        let mut cmd = Command::from(cmd);
        cmd.arg(&node.config)
            // Patroni would pass these to pg_basebackup and libpq, over
            // its own pgpass (the trial's failed base backup).
            .env_remove("PGPASSWORD")
            .env_remove("PGUSER")
            .env_remove("PGHOST")
            .env_remove("PGPORT")
            .env_remove("PGDATABASE")
            .env_remove("DATABASE_URL")
            .current_dir(&node.dir);
        let log = self.dir.join(format!("{}.log", node.name));
        let child = spawn(cmd, &log);
        self.nodes[i].patroni = Some(child);
    }

    /// A file of the cluster's directory (logs on failure).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// Every log, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["etcd.log", "haproxy.log"]
            .into_iter()
            .map(str::to_owned)
            .chain(self.nodes.iter().map(|n| format!("{}.log", n.name)))
        {
            let text = self.log(&name);
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            let _ = writeln!(out, "--- {name} (last lines)");
            for line in tail.into_iter().rev() {
                let _ = writeln!(out, "{line}");
            }
        }
        out
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// The members, from the first node whose REST API answers.
    pub async fn members(&self) -> Option<Vec<Member>> {
        let http = reqwest::Client::new();
        for node in &self.nodes {
            let Ok(resp) = http
                .get(node.rest("/cluster"))
                .timeout(Duration::from_millis(800))
                .send()
                .await
            else {
                continue;
            };
            let Ok(body) = resp.json::<serde_json::Value>().await else {
                continue;
            };
            let members = body["members"]
                .as_array()?
                .iter()
                .map(|m| Member {
                    name: m["name"].as_str().unwrap_or_default().to_owned(),
                    role: m["role"].as_str().unwrap_or_default().to_owned(),
                    state: m["state"].as_str().unwrap_or_default().to_owned(),
                })
                .collect();
            return Some(members);
        }
        None
    }

    /// Waits until every node runs, one leads and one is the synchronous
    /// standby (Patroni's `/cluster` JSON, not `patronictl list`'s text),
    /// and a connection through HAProxy can write; returns the leader.
    pub async fn wait_healthy(&self, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(members) = self.members().await {
                let running = |role: &str| {
                    members
                        .iter()
                        .filter(|m| m.role == role && m.state == "running")
                        .count()
                };
                let all_running = members.len() == self.nodes.len()
                    && members.iter().all(|m| m.state == "running");
                if all_running && running("leader") == 1 && running("sync_standby") == 1 {
                    let leader = members
                        .iter()
                        .find(|m| m.role == "leader")
                        .map(|m| m.name.clone())
                        .unwrap_or_default();
                    if self.writable().await {
                        return leader;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "the cluster is not healthy after {within:?}: {:?}\n{}",
                self.members().await,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The leader and the synchronous standby, as `/cluster` says now.
    pub async fn roles(&self) -> (Option<String>, Option<String>) {
        let members = self.members().await.unwrap_or_default();
        let of = |role: &str| {
            members
                .iter()
                .find(|m| m.role == role)
                .map(|m| m.name.clone())
        };
        (of("leader"), of("sync_standby"))
    }

    /// Connects through HAProxy and checks the server takes writes.
    pub async fn writable(&self) -> bool {
        let attempt = async {
            let mut conn = PgConnection::connect_with(&self.options("postgres"))
                .await
                .ok()?;
            let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut conn)
                .await
                .ok()?;
            let _ = conn.close().await;
            Some(!in_recovery)
        };
        tokio::time::timeout(Duration::from_secs(2), attempt)
            .await
            .ok()
            .flatten()
            .unwrap_or(false)
    }

    /// `DATABASE_URL` through HAProxy.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    pub fn options(&self, db: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database(db)
    }

    /// `patronictl switchover` from `leader` to `candidate` (in strict
    /// synchronous mode Patroni accepts only the synchronous standby).
    pub async fn switchover(&self, leader: &str, candidate: &str) -> Result<(), String> {
        let out = Command::new(&self.bin.patronictl)
            .arg("-c")
            .arg(&self.nodes[0].config)
            .args([
                "switchover",
                "--leader",
                leader,
                "--candidate",
                candidate,
                "--force",
            ])
            .arg(&self.scope)
            .env_remove("PGPASSWORD")
            .env_remove("PGUSER")
            .output()
            .await
            .map_err(|e| format!("patronictl: {e}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() && !text.contains("failed") {
            Ok(())
        } else {
            Err(format!("patronictl switchover: {}: {text}", out.status))
        }
    }
}

impl Drop for HaCluster {
    /// SIGKILL Patroni (so that it restarts nothing), SIGQUIT the
    /// postmasters (immediate shutdown: a fraction of a second), then etcd
    /// and HAProxy. The directory is kept when the test failed.
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(pid) = node.patroni_pid() {
                signal(pid, libc::SIGCONT);
            }
            if let Some(child) = node.patroni.as_mut() {
                let _ = child.start_kill();
            }
        }
        for node in &self.nodes {
            if let Some(pid) = node.postmaster_pid() {
                signal(pid, libc::SIGCONT);
                signal(pid, libc::SIGQUIT);
            }
        }
        let _ = self.etcd.start_kill();
        let _ = self.haproxy.start_kill();
        if !std::thread::panicking() {
            // Give the postmasters a moment to go before their files do.
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.nodes.iter().any(|n| {
                n.postmaster_pid()
                    .is_some_and(|pid| signal(pid, 0) && Instant::now() < deadline)
            }) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("HA cluster files kept in {}", self.dir.display());
        }
    }
}

/// A node's Patroni configuration: the settings docs/high-availability.md
/// shows, with this test's ports and directories.
pub fn patroni_yml(scope: &str, node: &Node, etcd_port: u16, pg_bin: &Path) -> String {
    format!(
        r#"scope: {scope}
namespace: /poolkeeper-test/
name: {name}
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
# F1: the v2 DCS, not etcd3: Patroni 3.0.2's etcd3 `_update_leader`
# rewrites the leader key with a plain put when its lease changed, so a
# leader woken from a freeze takes the key back from its successor (which
# is then rewound, acknowledged writes and all). The v2 one renews the key
# by compare-and-swap on its own name (RELIABILITY.md).
etcd:
  host: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    ttl: {ttl}
    loop_wait: {loop_wait}
    retry_timeout: {retry}
    maximum_lag_on_failover: 1048576
    # F1: a commit returns only once a synchronous standby has it, and
    # Patroni never turns replication asynchronous when none is left.
    synchronous_mode: true
    synchronous_mode_strict: true
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        synchronous_commit: "on"
        # Strict mode blocks commits until a standby reconnects: retry WAL
        # sources every 500 ms, not every 5 s.
        wal_retrieve_retry_interval: 500ms
        wal_keep_size: 128MB
        max_connections: 100
        shared_buffers: 16MB
        # Process faults only (kill -9, SIGSTOP): nothing here cuts power.
        fsync: "off"
        full_page_writes: "on"
  initdb:
  - encoding: UTF8
  - locale: C
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
  parameters:
    unix_socket_directories: {dir}
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
"#,
        name = node.name,
        rest = node.rest_port,
        pg = node.pg_port,
        ttl = TTL_SECONDS,
        loop_wait = LOOP_WAIT_SECONDS,
        retry = RETRY_TIMEOUT_SECONDS,
        data = node.data_dir().display(),
        bin = pg_bin.display(),
        dir = node.dir.display(),
    )
}

/// HAProxy in front of the nodes: it sends connections to the one whose
/// Patroni answers `GET /primary` with 200, checks every 500 ms, and cuts
/// the sessions of a node marked down (a demoted leader keeps none).
pub fn haproxy_cfg(port: u16, nodes: &[Node]) -> String {
    let mut servers = String::new();
    for n in nodes {
        let _ = writeln!(
            servers,
            "    server {} 127.0.0.1:{} check port {}",
            n.name, n.pg_port, n.rest_port
        );
    }
    format!(
        "global
    maxconn 1000

defaults
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s

listen primary
    bind 127.0.0.1:{port}
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
{servers}"
    )
}
