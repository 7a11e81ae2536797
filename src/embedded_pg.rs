//! The embedded default: a private PostgreSQL cluster started from the
//! system's binaries, listening on a Unix socket only (no TCP), trusted only
//! through that socket's file permissions (0700).
//!
//! PostgreSQL refuses to run as root, so when this process is root the
//! cluster is owned by and run as the `postgres` system user.
//!
//! The postmaster is a direct child of a dedicated thread that lives as long
//! as it does; it gets SIGINT (fast shutdown) when that thread, hence this
//! process, dies, even by `kill -9`, so no cluster is left behind.

use std::ffi::CString;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;

const PORT: u16 = 5432;
/// The cluster's superuser; clients connect as this user over the socket.
pub const SUPERUSER: &str = "postgres";

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(
        "no PostgreSQL server binaries found (looked for initdb and postgres on PATH and under /usr/lib/postgresql/*/bin): install them with `apt-get install postgresql`, or set DATABASE_URL"
    )]
    NoBinaries,
    #[error(
        "running as root, but there is no `postgres` system user to run PostgreSQL as: install the postgresql package, or set DATABASE_URL"
    )]
    NoPostgresUser,
    #[error(
        "the postgres user cannot reach {0}: run from a directory that other users may traverse, or set DATABASE_URL"
    )]
    Unreachable(PathBuf),
    #[error("{what} failed: {detail}")]
    Failed { what: String, detail: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

fn failed(what: impl Into<String>, detail: impl Into<String>) -> EmbeddedError {
    EmbeddedError::Failed {
        what: what.into(),
        detail: detail.into(),
    }
}

/// Where the server binaries live: on PATH, else the newest version under
/// /usr/lib/postgresql.
pub fn find_binaries() -> Result<PathBuf, EmbeddedError> {
    find_binaries_in(
        std::env::var_os("PATH").as_deref(),
        Path::new("/usr/lib/postgresql"),
    )
}

pub fn find_binaries_in(
    path: Option<&std::ffi::OsStr>,
    lib_root: &Path,
) -> Result<PathBuf, EmbeddedError> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    for dir in path
        .map(|p| std::env::split_paths(p).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        if has_both(&dir) {
            // /usr/local/bin may hold symlinks: follow them to the real
            // bin directory so that postgres finds its share files.
            let real = fs::canonicalize(dir.join("postgres")).ok();
            return Ok(real
                .and_then(|p| p.parent().map(Path::to_path_buf))
                .unwrap_or(dir));
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir(lib_root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_both(&bin).then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or(EmbeddedError::NoBinaries)
}

/// The user the cluster runs as: ourselves, or `postgres` when we are root.
#[derive(Debug, Clone, Copy)]
struct RunAs {
    uid: u32,
    gid: u32,
    switch: bool,
}

fn run_as() -> Result<RunAs, EmbeddedError> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        // SAFETY: as above.
        let egid = unsafe { libc::getegid() };
        return Ok(RunAs {
            uid: euid,
            gid: egid,
            switch: false,
        });
    }
    let name = CString::new("postgres").map_err(|e| failed("user lookup", e.to_string()))?;
    // SAFETY: getpwnam returns a pointer into static storage or NULL; we copy
    // the two integers out before any other call could overwrite it.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(EmbeddedError::NoPostgresUser);
    }
    // SAFETY: pw is non-null and points to a valid passwd record.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok(RunAs {
        uid,
        gid,
        switch: true,
    })
}

impl RunAs {
    fn command(&self, program: PathBuf) -> Command {
        let mut cmd = Command::new(program);
        if self.switch {
            cmd.uid(self.uid).gid(self.gid);
            // std drops root's supplementary groups when it switches uid.
            cmd.env("HOME", "/tmp");
        }
        cmd
    }

    fn chown(&self, path: &Path) -> Result<(), EmbeddedError> {
        if self.switch {
            std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))?;
        }
        Ok(())
    }

    /// Every ancestor of `path` must let the cluster's user through.
    fn check_reachable(&self, path: &Path) -> Result<(), EmbeddedError> {
        if !self.switch {
            return Ok(());
        }
        for dir in path.ancestors().skip(1) {
            let Ok(meta) = fs::metadata(dir) else {
                continue;
            };
            let mode = meta.permissions().mode();
            let ok = if meta.uid() == self.uid {
                mode & 0o100 != 0
            } else if meta.gid() == self.gid {
                mode & 0o010 != 0
            } else {
                mode & 0o001 != 0
            };
            if !ok {
                return Err(EmbeddedError::Unreachable(dir.to_path_buf()));
            }
        }
        Ok(())
    }
}

/// A running private cluster.
#[derive(Debug)]
pub struct EmbeddedPostgres {
    data_dir: PathBuf,
    socket_dir: PathBuf,
    port: u16,
    /// The postmaster's pid when this process started it (and so stops it).
    owned_pid: Option<i32>,
}

/// How to start a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The data directory; created and initialised when empty.
    pub data_dir: PathBuf,
    /// Where the server's stderr goes.
    pub log_file: PathBuf,
    /// Throwaway clusters (tests) trade durability for speed.
    pub throwaway: bool,
}

/// What a cluster may add to the default Unix-socket-only server: a TCP
/// listener on 127.0.0.1 and TLS (for tests of a remote, TLS-only
/// PostgreSQL). Separate from `ClusterOptions`, whose callers need neither.
#[derive(Debug, Clone, Default)]
pub struct ServerExtras {
    /// Listen on 127.0.0.1 at this port (also the socket's port number).
    pub tcp_port: Option<u16>,
    /// `ssl = on` with this certificate and key (PEM files). The key is
    /// copied into the data directory, owned by the cluster's user with
    /// mode 0600, as PostgreSQL demands.
    pub tls: Option<TlsFiles>,
}

#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl EmbeddedPostgres {
    /// Starts the cluster in `opts.data_dir` (initialising it on first use),
    /// or attaches to the one already running there.
    pub fn start(opts: &ClusterOptions) -> Result<EmbeddedPostgres, EmbeddedError> {
        Self::start_with(opts, &ServerExtras::default())
    }

    /// `start`, with a TCP listener and TLS when `extras` asks for them.
    pub fn start_with(
        opts: &ClusterOptions,
        extras: &ServerExtras,
    ) -> Result<EmbeddedPostgres, EmbeddedError> {
        let bin = find_binaries()?;
        let who = run_as()?;
        let data_dir = absolute(&opts.data_dir)?;
        who.check_reachable(&data_dir)?;
        if let Some(parent) = data_dir.parent() {
            fs::create_dir_all(parent)?;
        }
        if !data_dir.exists() {
            fs::create_dir(&data_dir)?;
            fs::set_permissions(&data_dir, fs::Permissions::from_mode(0o700))?;
            who.chown(&data_dir)?;
        }

        if let Some(running) = Self::attach(&data_dir) {
            return Ok(running);
        }

        if !data_dir.join("PG_VERSION").exists() {
            initdb(&bin, &who, &data_dir, opts.throwaway)?;
        }
        let socket_dir = socket_dir(&who, &data_dir)?;
        let port = extras.tcp_port.unwrap_or(PORT);
        let server = server_command(&bin, &who, opts, extras, &data_dir, &socket_dir, port)?;
        let pid = spawn_on_keeper_thread(server)?;

        let cluster = EmbeddedPostgres {
            data_dir,
            socket_dir,
            port,
            owned_pid: Some(pid),
        };
        cluster.wait_ready(pid, &opts.log_file)?;
        Ok(cluster)
    }

    /// A postmaster already serving this data directory (another replica in
    /// the same directory, or a previous run still up).
    fn attach(data_dir: &Path) -> Option<EmbeddedPostgres> {
        let pidfile = fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
        let lines: Vec<&str> = pidfile.lines().collect();
        let pid: i32 = lines.first()?.trim().parse().ok()?;
        // SAFETY: kill with signal 0 only checks that the process exists.
        if unsafe { libc::kill(pid, 0) } != 0 {
            return None;
        }
        let port: u16 = lines.get(3)?.trim().parse().ok()?;
        let socket_dir = PathBuf::from(lines.get(4)?.trim());
        let status = lines.get(7).map(|s| s.trim()).unwrap_or("");
        if status != "ready" {
            return None;
        }
        Some(EmbeddedPostgres {
            data_dir: data_dir.to_path_buf(),
            socket_dir,
            port,
            owned_pid: None,
        })
    }

    /// Waits until the postmaster says it is ready in its pid file, or fails
    /// with the end of its log.
    fn wait_ready(&self, pid: i32, log_file: &Path) -> Result<(), EmbeddedError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if Self::attach(&self.data_dir).is_some() {
                return Ok(());
            }
            // SAFETY: signal 0 only checks existence.
            let alive = unsafe { libc::kill(pid, 0) } == 0;
            if !alive || Instant::now() > deadline {
                let mut log = String::new();
                if let Ok(mut f) = fs::File::open(log_file) {
                    let _ = f.read_to_string(&mut log);
                }
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Err(failed("starting postgres", tail.join(" | ")));
            }
            // Polling a pid file the server writes; there is no event to wait on.
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Connection options for database `db` on this cluster.
    pub fn connect_options(&self, db: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.socket_dir)
            .port(self.port)
            .username(SUPERUSER)
            .database(db)
    }

    /// A `DATABASE_URL` for database `db`, for child processes.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://{SUPERUSER}@localhost:{}/{db}?host={}",
            self.port,
            self.socket_dir.display()
        )
    }

    /// The port: of the socket, and of the TCP listener when there is one.
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Did this process start the server (and so must stop it)?
    pub fn owned(&self) -> bool {
        self.owned_pid.is_some()
    }

    /// Fast shutdown of a server this process started; waits until it is gone.
    pub fn stop(&self) {
        let Some(pid) = self.owned_pid else { return };
        // SAFETY: plain signal delivery to our own child.
        unsafe {
            libc::kill(pid, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        // SAFETY: signal 0 only checks existence.
        while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A new cluster in `data_dir`, owned by `who`.
fn initdb(bin: &Path, who: &RunAs, data_dir: &Path, throwaway: bool) -> Result<(), EmbeddedError> {
    let mut initdb = who.command(bin.join("initdb"));
    initdb
        .arg("-D")
        .arg(data_dir)
        .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--locale=C"])
        .stdin(Stdio::null());
    if throwaway {
        initdb.arg("--no-sync");
    }
    let out = initdb.output()?;
    if !out.status.success() {
        return Err(failed(
            "initdb",
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ));
    }
    Ok(())
}

/// The socket lives in the data directory when the path is short enough
/// for sun_path (107 bytes), else in a private directory in /tmp.
fn socket_dir(who: &RunAs, data_dir: &Path) -> Result<PathBuf, EmbeddedError> {
    if data_dir.as_os_str().len() + 20 < 100 {
        return Ok(data_dir.to_path_buf());
    }
    let dir = std::env::temp_dir().join(format!("poolkeeper-sock-{:016x}", path_hash(data_dir)));
    if !dir.exists() {
        fs::create_dir(&dir)?;
    }
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
    who.chown(&dir)?;
    Ok(dir)
}

/// The postmaster's command: its directories, port and listener, TLS when
/// asked, no durability for a throwaway cluster, and death with its parent.
fn server_command(
    bin: &Path,
    who: &RunAs,
    opts: &ClusterOptions,
    extras: &ServerExtras,
    data_dir: &Path,
    socket_dir: &Path,
    port: u16,
) -> Result<Command, EmbeddedError> {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&opts.log_file)?;
    let listen = if extras.tcp_port.is_some() {
        "listen_addresses=127.0.0.1"
    } else {
        "listen_addresses="
    };
    let mut server = who.command(bin.join("postgres"));
    server
        .arg("-D")
        .arg(data_dir)
        .arg("-k")
        .arg(socket_dir)
        .args(["-p", &port.to_string()])
        .args(["-c", listen])
        .args(["-c", "unix_socket_permissions=0700"])
        .args(["-c", "max_connections=300"])
        .args(["-c", "shared_buffers=128MB"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Some(tls) = &extras.tls {
        let cert = data_dir.join("server.crt");
        let key = data_dir.join("server.key");
        fs::copy(&tls.cert_file, &cert)?;
        fs::copy(&tls.key_file, &key)?;
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600))?;
        who.chown(&cert)?;
        who.chown(&key)?;
        server
            .args(["-c", "ssl=on"])
            .arg("-c")
            .arg(format!("ssl_cert_file={}", cert.display()))
            .arg("-c")
            .arg(format!("ssl_key_file={}", key.display()));
    }
    if opts.throwaway {
        server.args([
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ]);
    }
    // SAFETY: prctl is async-signal-safe; it runs between fork and exec.
    unsafe {
        server.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(server)
}

/// Spawns `cmd` from a thread that stays alive while the child runs: the
/// parent-death signal fires when the spawning *thread* exits, so it must not
/// be a worker thread that finishes its task.
fn spawn_on_keeper_thread(mut cmd: Command) -> Result<i32, EmbeddedError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("embedded-postgres".into())
        .spawn(move || match cmd.spawn() {
            Ok(mut child) => {
                let _ = tx.send(Ok(child.id() as i32));
                let _ = child.wait();
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        })?;
    rx.recv()
        .map_err(|_| failed("starting postgres", "the keeper thread died"))?
        .map_err(EmbeddedError::Io)
}

fn absolute(path: &Path) -> Result<PathBuf, EmbeddedError> {
    Ok(if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    })
}

fn path_hash(path: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    h.finish()
}

/// Makes `dir` usable as a cluster's parent when the cluster runs as another
/// user (root running tests in a fresh temporary directory).
/// A command that runs as the cluster's user (`postgres` when we are root,
/// as `initdb` and `postgres` are run here): for the tools that manage a
/// cluster and refuse root too (Patroni, in the failover test).
pub fn cluster_user_command(program: impl Into<PathBuf>) -> Result<Command, EmbeddedError> {
    Ok(run_as()?.command(program.into()))
}

pub fn prepare_private_dir(dir: &Path) -> Result<(), EmbeddedError> {
    let who = run_as()?;
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    who.chown(dir)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_newest_version_or_says_what_to_install() {
        let root = std::env::temp_dir().join(format!("pk-bin-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).expect("tmp");
        let err =
            find_binaries_in(Some(std::ffi::OsStr::new("")), &root).expect_err("nothing there");
        assert!(
            err.to_string().contains("apt-get install postgresql"),
            "{err}"
        );
        assert_eq!(err.to_string().lines().count(), 1, "one line");
        for v in ["13", "16", "9"] {
            let bin = root.join(v).join("bin");
            fs::create_dir_all(&bin).expect("mkdir");
            fs::write(bin.join("initdb"), "").expect("touch");
            fs::write(bin.join("postgres"), "").expect("touch");
        }
        assert_eq!(
            find_binaries_in(None, &root).expect("found"),
            root.join("16").join("bin")
        );
        let _ = fs::remove_dir_all(&root);
    }
}
