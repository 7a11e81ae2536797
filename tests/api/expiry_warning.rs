//! R16: the order service hears before a deadline passes. One `expiring`
//! event (webhook `reservation.expiring`) per deadline, the organization's
//! warning time before it, written by the sweep's worker under its lease;
//! an extension re-arms it; a holder killed -9 leaves it to the next holder,
//! which warns once.

use std::process::Stdio;
use std::time::Duration;

use poolkeeper::db::Db;
use poolkeeper::lease::{self, Claim, SWEEP_KEY};
use poolkeeper::sweep;
use serde_json::json;
use tokio::time::Instant;

use crate::helpers::{FakeHold, FakeMachine};
use crate::helpers::{TestApp, binary, spawn_app_with};

async fn expiring_events(pool: &Db, id: i64) -> Vec<(String, Option<String>, Option<i64>)> {
    sqlx::query_as(
        "SELECT detail, replica, lease_fence FROM reservation_events
          WHERE reservation_id = $1 AND kind = 'expiring' ORDER BY id",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .expect("events")
}

async fn app() -> TestApp {
    let app = spawn_app_with(|s| s.webhook_allow_private = true).await;
    for tag in ["EW-1", "EW-2", "EW-3"] {
        FakeMachine::new()
            .tag(tag)
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    app
}

#[tokio::test]
async fn a_hold_is_warned_once_per_deadline_and_an_extension_rearms_it() {
    let app = app().await;
    // The webhook, so that the outbox shows what the order service gets.
    let r = app
        .http
        .put(app.url("/api/v1/webhook"))
        .bearer_auth(&app.org.token)
        .json(&json!({"url": "http://127.0.0.1:9/hooks"}))
        .send()
        .await
        .expect("webhook");
    assert_eq!(r.status().as_u16(), 201);
    // Within the default 2 minutes of its deadline, and far from it.
    let (soon, soon_fence) = FakeHold::on("EW-1")
        .order("EW-SOON")
        .hold_seconds(60)
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let later = FakeHold::on("EW-2")
        .order("EW-LATER")
        .create(&app.pool, app.org.id)
        .await;
    let mandate = match lease::claim(&app.pool, SWEEP_KEY, "warner", Duration::from_secs(60))
        .await
        .expect("claim")
    {
        Claim::Acquired(m) => m,
        Claim::HeldByOther => panic!("the sweep lease is free in a new database"),
    };
    let warn = || sweep::warn_batch(&app.pool, "warner", mandate.fence, 500);
    assert_eq!(warn().await.expect("warn"), 1);
    let events = expiring_events(&app.pool, soon).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].1.as_deref(), Some("warner"));
    assert_eq!(events[0].2, Some(mandate.fence));
    assert!(expiring_events(&app.pool, later).await.is_empty());
    // Never twice for one deadline.
    assert_eq!(warn().await.expect("warn again"), 0);
    assert_eq!(expiring_events(&app.pool, soon).await.len(), 1);
    // The order service hears it as `reservation.expiring`.
    let sent: Vec<String> = sqlx::query_scalar(
        "SELECT payload->>'type' FROM webhook_deliveries WHERE reservation_id = $1 ORDER BY event_id",
    )
    .bind(soon)
    .fetch_all(&app.pool)
    .await
    .expect("outbox");
    assert_eq!(
        sent.last().map(String::as_str),
        Some("reservation.expiring")
    );

    // An extension (still within the warning time) is a new deadline: it
    // is warned about once more.
    let deadline: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT expires_at FROM reservations WHERE id = $1")
            .bind(soon)
            .fetch_one(&app.pool)
            .await
            .expect("deadline");
    let until = (deadline + chrono::Duration::seconds(30)).to_rfc3339();
    let r = app
        .http
        .post(app.url(&format!("/api/v1/reservations/{soon}/extend")))
        .bearer_auth(&app.org.token)
        .json(&json!({"fence": soon_fence, "until": until}))
        .send()
        .await
        .expect("extend");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(warn().await.expect("warn after the extension"), 1);
    assert_eq!(warn().await.expect("and not again"), 0);
    assert_eq!(expiring_events(&app.pool, soon).await.len(), 2);

    // An organization that asks for no warning gets none.
    sqlx::query("UPDATE organizations SET expiry_warning_seconds = 0 WHERE id = $1")
        .bind(app.org.id)
        .execute(&app.pool)
        .await
        .expect("no warning");
    let quiet = FakeHold::on("EW-3")
        .order("EW-QUIET")
        .hold_seconds(30)
        .create(&app.pool, app.org.id)
        .await;
    assert_eq!(warn().await.expect("warn"), 0);
    assert!(expiring_events(&app.pool, quiet).await.is_empty());

    // A mandate that is no longer live writes nothing.
    sqlx::query("UPDATE organizations SET expiry_warning_seconds = 120 WHERE id = $1")
        .bind(app.org.id)
        .execute(&app.pool)
        .await
        .expect("warnings back");
    lease::release(&app.pool, &mandate).await.expect("release");
    assert!(matches!(warn().await, Err(sweep::SweepError::Lost)));
    assert!(expiring_events(&app.pool, quiet).await.is_empty());
}

/// Two `serve` replicas; the sweep's holder is killed -9 before a hold
/// comes within its warning time: the other takes the lease when it expires
/// and the warning still arrives, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warning_arrives_once_when_the_sweep_holder_is_killed() {
    let app = app().await;
    let url = app.db.url();
    let spawn = |name: &str| {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        tokio::process::Command::new(binary())
            .arg("serve")
            .env("DATABASE_URL", &url)
            .env("POOLKEEPER_BIND", format!("127.0.0.1:{port}"))
            .env("POOLKEEPER_REPLICA", name)
            .env("POOLKEEPER_SWEEP_SECONDS", "1")
            .env("POOLKEEPER_LEASE_SECONDS", "2")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn poolkeeper serve")
    };
    let mut replicas = vec![("ew-a", spawn("ew-a")), ("ew-b", spawn("ew-b"))];
    let holder_now = async || -> Option<(String, i64)> {
        sqlx::query_as(
            "SELECT holder, fence FROM leases WHERE key = 'sweep' AND expires_at > clock_timestamp()",
        )
        .fetch_optional(&app.pool)
        .await
        .expect("leases")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let (holder, killed_fence) = loop {
        if let Some(h) = holder_now().await {
            break h;
        }
        assert!(Instant::now() < deadline, "no replica took the sweep lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let i = replicas
        .iter()
        .position(|(name, _)| *name == holder)
        .expect("the holder is one of ours");
    let (killed_name, mut killed) = replicas.remove(i);
    let pid = killed.id().expect("pid");
    // SAFETY: a plain signal to our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let _ = killed.wait().await;
    let id = FakeHold::on("EW-1")
        .order("EW-KILL")
        .hold_seconds(90)
        .create(&app.pool, app.org.id)
        .await;
    let survivor = replicas[0].0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while expiring_events(&app.pool, id).await.is_empty() {
        assert!(Instant::now() < deadline, "the warning never came");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Two more sweeps by the survivor: still one warning for this deadline.
    let runs = async || -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM sweep_runs WHERE replica = $1 AND finished_at IS NOT NULL",
        )
        .bind(survivor)
        .fetch_one(&app.pool)
        .await
        .expect("runs")
    };
    let after = runs().await + 2;
    let deadline = Instant::now() + Duration::from_secs(60);
    while runs().await < after {
        assert!(Instant::now() < deadline, "the survivor stopped sweeping");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = expiring_events(&app.pool, id).await;
    assert_eq!(events.len(), 1, "{events:?}");
    // Written by the survivor under a newer fence (L4); or by the killed
    // holder under the mandate it held: a statement it had sent before
    // SIGKILL still runs in its backend, and its lease was live then.
    match (events[0].1.as_deref(), events[0].2) {
        (Some(r), Some(fence)) if r == survivor => assert!(fence > killed_fence, "{events:?}"),
        (Some(r), Some(fence)) if r == killed_name => assert_eq!(fence, killed_fence),
        _ => panic!("a warning by neither replica's mandate: {events:?}"),
    }
    for (_, mut child) in replicas {
        let _ = child.kill().await;
    }
}

/// R16's warning time is the organization's, set by an admin on /settings
/// with an audit row when it changes; a bad value is a 400 that writes
/// nothing.
#[tokio::test]
async fn an_admin_sets_the_warning_time_on_the_settings_page() {
    let app = app().await;
    let admin = app.staff("ada@acme.example", "admin").await;
    let (status, body) = admin.page("/settings").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("name=\"expiry_warning_seconds\"") && body.contains("value=\"120\""),
        "{body}"
    );
    let csrf = admin.csrf().await;
    let warning = async || -> i32 {
        sqlx::query_scalar("SELECT expiry_warning_seconds FROM organizations WHERE id = $1")
            .bind(app.org.id)
            .fetch_one(&app.pool)
            .await
            .expect("warning")
    };
    let audits = async || -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'org.expiry_warning'")
            .fetch_one(&app.pool)
            .await
            .expect("audit")
    };
    for bad in ["90 s", "-1", "3601", "1e3"] {
        let r = admin
            .post_form(
                "/settings",
                &[
                    ("csrf", &csrf),
                    ("datacenter", "on"),
                    ("expiry_warning_seconds", bad),
                ],
            )
            .await;
        assert_eq!(r.status().as_u16(), 400, "{bad}");
        assert_eq!(warning().await, 120, "{bad} wrote nothing");
    }
    let save = async |seconds: &str| {
        admin
            .post_form(
                "/settings",
                &[
                    ("csrf", &csrf),
                    ("datacenter", "on"),
                    ("expiry_warning_seconds", seconds),
                ],
            )
            .await
            .status()
            .as_u16()
    };
    assert_eq!(save("300").await, 303);
    assert_eq!(warning().await, 300);
    assert_eq!(audits().await, 1);
    // The same value again changes nothing and writes no audit row.
    assert_eq!(save("300").await, 303);
    assert_eq!(audits().await, 1);
}

/// R16 whatever the sweep period: with a 60 s sweep and a 5 s warning, a
/// hold made (through the API) after the worker's first sweep is warned
/// within 2 s of its deadline less 5 s by the database's clock, and so is
/// its new deadline after an extension; once each. The order service gets
/// each as `reservation.expiring` with the deadline it is about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warning_comes_on_time_between_two_sweeps() {
    let app = app().await;
    let r = app
        .http
        .put(app.url("/api/v1/webhook"))
        .bearer_auth(&app.org.token)
        .json(&json!({"url": "http://127.0.0.1:9/hooks"}))
        .send()
        .await
        .expect("webhook");
    assert_eq!(r.status().as_u16(), 201);
    sqlx::query("UPDATE organizations SET expiry_warning_seconds = 5 WHERE id = $1")
        .bind(app.org.id)
        .execute(&app.pool)
        .await
        .expect("a 5 s warning");
    let mut settings = app.settings.clone();
    settings.sweep_period = Duration::from_secs(60);
    settings.replica = "warner-60".into();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let worker = {
        let (pool, metrics) = (app.pool.clone(), app.metrics.clone());
        tokio::spawn(async move { sweep::run(&pool, &settings, metrics, stopped).await })
    };
    // The worker's first sweep is done before the hold exists: the next one
    // is a minute away.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let runs: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sweep_runs WHERE replica = 'warner-60' AND finished_at IS NOT NULL",
        )
        .fetch_one(&app.pool)
        .await
        .expect("runs");
        if runs >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the worker never swept");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r: serde_json::Value = app
        .http
        .post(app.url("/api/v1/reservations"))
        .bearer_auth(&app.org.token)
        .json(&json!({"order_ref": "EW-ONTIME", "site": "par1", "profile": "epyc", "hold_seconds": 8}))
        .send()
        .await
        .expect("reserve")
        .json()
        .await
        .expect("reserve json");
    let id = r["id"].as_i64().expect("a reservation");
    let fence = r["fence"].as_i64().expect("its fence");

    // Waits (a bounded poll of the database) for the `n`th warning of the
    // hold; answers how late it was written after the deadline less 5 s,
    // in seconds, and the deadline it is about.
    let nth_warning = async |n: i64| -> (f64, chrono::DateTime<chrono::Utc>) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let row: Option<(f64, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
                "SELECT extract(epoch FROM e.at - (r.expires_at - interval '5 seconds'))::float8,
                        r.expires_at
                   FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id
                  WHERE e.reservation_id = $1 AND e.kind = 'expiring'
                  ORDER BY e.id OFFSET $2 - 1 LIMIT 1",
            )
            .bind(id)
            .bind(n)
            .fetch_optional(&app.pool)
            .await
            .expect("warning");
            if let Some(row) = row {
                return row;
            }
            assert!(
                Instant::now() < deadline,
                "warning {n} never came with a 60 s sweep"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (late, first_deadline) = nth_warning(1).await;
    eprintln!("first warning {late:.3} s after its time");
    assert!(
        (0.0..=2.0).contains(&late),
        "the first warning came {late} s after its time"
    );

    // An extension is a new deadline: warned once more, on time.
    let until = (first_deadline + chrono::Duration::seconds(4)).to_rfc3339();
    let r = app
        .http
        .post(app.url(&format!("/api/v1/reservations/{id}/extend")))
        .bearer_auth(&app.org.token)
        .json(&json!({"fence": fence, "until": until}))
        .send()
        .await
        .expect("extend");
    assert_eq!(r.status().as_u16(), 200);
    let (late, second_deadline) = nth_warning(2).await;
    eprintln!("second warning {late:.3} s after its time");
    assert!(second_deadline > first_deadline);
    assert!(
        (0.0..=2.0).contains(&late),
        "the second warning came {late} s after its time"
    );

    // Once per deadline: when the deadline has passed (the database's
    // clock), there are still two warnings, each with its own webhook.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let passed: bool = sqlx::query_scalar("SELECT $1 < clock_timestamp()")
            .bind(second_deadline)
            .fetch_one(&app.pool)
            .await
            .expect("clock");
        if passed {
            break;
        }
        assert!(Instant::now() < deadline, "the deadline never passed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = expiring_events(&app.pool, id).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(events.iter().all(|e| e.1.as_deref() == Some("warner-60")));
    let sent: Vec<(String, String)> = sqlx::query_as(
        "SELECT payload->>'type', payload->'reservation'->>'expires_at' FROM webhook_deliveries
          WHERE reservation_id = $1 AND payload->>'type' = 'reservation.expiring' ORDER BY event_id",
    )
    .bind(id)
    .fetch_all(&app.pool)
    .await
    .expect("outbox");
    let fmt = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    assert_eq!(
        sent,
        [
            ("reservation.expiring".to_owned(), fmt(first_deadline)),
            ("reservation.expiring".to_owned(), fmt(second_deadline)),
        ]
    );
    let _ = stop.send(true);
    worker.await.expect("the worker stops");
}
