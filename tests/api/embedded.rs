//! The embedded default, run the way a newcomer runs it: `poolkeeper serve`
//! with no DATABASE_URL, in a fresh directory.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::helpers::binary;
use crate::helpers::replicas::free_port;

#[tokio::test]
async fn serve_without_database_url_starts_a_private_postgres_and_is_ready() {
    let dir = std::env::temp_dir().join(format!(
        "poolkeeper-test-serve-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("work dir");
    let port = free_port();
    let mut child = tokio::process::Command::new(binary())
        .arg("serve")
        .current_dir(&dir)
        .env_remove("DATABASE_URL")
        .env("POOLKEEPER_BIND", format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn poolkeeper serve");

    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    let ready = loop {
        let answer = http
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await;
        if answer.is_ok_and(|r| r.status() == 200) {
            break true;
        }
        if Instant::now() > deadline || child.try_wait().expect("poll child").is_some() {
            break false;
        }
        // The server has no way to tell us it is listening but to answer.
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let pidfile = dir.join(".poolkeeper/pg/postmaster.pid");
    let postmaster_ran = pidfile.exists();

    // SIGTERM: the server stops, and stops its PostgreSQL cleanly.
    if let Some(pid) = child.id() {
        // SAFETY: plain signal delivery to our child.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("serve exits")
        .expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(ready, "/readyz never answered 200; stderr:\n{stderr}");
    assert!(postmaster_ran, "no private cluster under ./.poolkeeper/pg");
    assert!(
        out.status.success(),
        "serve exited with {:?}; stderr:\n{stderr}",
        out.status
    );
    assert!(
        !pidfile.exists(),
        "PostgreSQL still running after serve exited"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
