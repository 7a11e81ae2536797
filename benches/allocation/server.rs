//! poolkeeper as a separate process (`poolkeeper serve`, the release binary
//! cargo built for this bench), as it runs in production: its own runtime,
//! its own pool of 20 connections, the sweep worker running beside it.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

pub struct Server {
    child: Child,
    pub base: String,
}

fn free_port() -> anyhow::Result<u16> {
    // Bound then released: the server binds it a moment later.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

impl Server {
    pub async fn start(database_url: &str, dir: &Path, log: &str) -> anyhow::Result<Server> {
        Self::start_with(database_url, dir, log, &[]).await
    }

    /// `start` with more environment (item 12: the OTLP variables).
    pub async fn start_with(
        database_url: &str,
        dir: &Path,
        log: &str,
        env: &[(&str, String)],
    ) -> anyhow::Result<Server> {
        let port = free_port()?;
        let log_file = std::fs::File::create(dir.join(format!("server-{port}.log")))?;
        let child = Command::new(env!("CARGO_BIN_EXE_poolkeeper"))
            .arg("serve")
            // No .env of the developer's: the environment below is the whole configuration.
            .current_dir(dir)
            .env("DATABASE_URL", database_url)
            .env("POOLKEEPER_BIND", format!("127.0.0.1:{port}"))
            .env("POOLKEEPER_DATACENTER_MODULE", "on")
            .env("POOLKEEPER_REPLICA", "bench")
            .env("RUST_LOG", log)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .kill_on_drop(true)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .spawn()
            .context("starting poolkeeper serve")?;
        let mut server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        server.wait_ready().await?;
        Ok(server)
    }

    /// Polls /readyz: waiting on an external process, with a deadline.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("poolkeeper serve exited during start-up: {status}");
            }
            if let Ok(r) = http.get(format!("{}/readyz", self.base)).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("poolkeeper serve not ready after 60 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGTERM (the orderly shutdown), then wait.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: plain signal delivery to our own child.
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}
