//! `/metrics`: only a `metrics` token reads it on the main listener (or
//! nobody there, with a listener of its own); the counters count what
//! happens, and the database's numbers are read by one replica for all of
//! them.

use std::collections::BTreeMap;
use std::sync::Arc;

use poolkeeper::metrics::Metrics;
use poolkeeper::startup::{AppState, Application};
use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::Barrier;

use crate::helpers::FakeMachine;
use crate::helpers::{spawn_app, test_settings};

/// The pool gauge of the machine the access tests insert.
const STOCK: &str =
    "poolkeeper_machines{org=\"acme\",profile=\"epyc\",site=\"par1\",state=\"sellable\"} 1";

/// `/metrics` on the main listener as `token` (none: no `Authorization`).
async fn get_metrics(app: &crate::helpers::TestApp, token: Option<&str>) -> (u16, String, String) {
    let mut req = app.http.get(app.url("/metrics"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("GET /metrics");
    let status = r.status().as_u16();
    let challenge = r
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, challenge, r.text().await.expect("body"))
}

/// The pool's stock is an operator's to read: no credentials is 401 with
/// a Bearer challenge, another scope 403, both without a single series;
/// a `metrics` token reads everything, whichever organization it was made
/// in, until it is revoked.
#[tokio::test]
async fn only_a_metrics_token_reads_metrics_on_the_main_listener() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("ST-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (status, challenge, body) = get_metrics(&app, None).await;
    assert_eq!((status, challenge.as_str()), (401, "Bearer"), "{body}");
    assert!(!body.contains("poolkeeper_"), "{body}");
    for (what, token) in [
        ("unknown token", "pk_not-a-token"),
        ("malformed header", ""),
    ] {
        let (status, _, body) = get_metrics(&app, Some(token)).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert!(!body.contains("poolkeeper_"), "{what}: {body}");
    }
    for token in [
        &app.org.token,
        &app.org.orders_token,
        &app.org.inventory_token,
    ] {
        let (status, _, body) = get_metrics(&app, Some(token)).await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("metrics scope"), "{body}");
        assert!(!body.contains("poolkeeper_"), "{body}");
    }
    // The operator's credential sees every organization's pool, the
    // token's own or not.
    for token in [&app.org.metrics_token, &app.other.metrics_token] {
        let (status, _, body) = get_metrics(&app, Some(token)).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains(STOCK), "{body}");
        assert!(body.contains("poolkeeper_build_info"), "{body}");
    }
    // Revoked: refused from the next request on.
    sqlx::query("UPDATE api_tokens SET revoked_at = clock_timestamp() WHERE org_id = $1 AND name = 'prometheus'")
        .bind(app.other.id)
        .execute(&app.pool)
        .await
        .expect("revoke");
    let (status, _, body) = get_metrics(&app, Some(&app.other.metrics_token)).await;
    assert_eq!(status, 401, "{body}");
    // The scope is an operator's alone: the database refuses it beside an
    // organization's API scopes.
    let mixed = poolkeeper::tokens::create(
        &app.pool,
        app.org.id,
        Some("mixed"),
        &[
            poolkeeper::domain::Scope::Orders,
            poolkeeper::domain::Scope::Metrics,
        ],
    )
    .await;
    assert!(mixed.is_err(), "a token of orders and metrics was created");
}

/// With `POOLKEEPER_METRICS_BIND`, `/metrics` is served there alone and
/// without a token (an address an operator keeps private); the main
/// listener answers 404, token or not.
#[tokio::test]
async fn metrics_bind_serves_metrics_alone_and_the_main_port_does_not() {
    let db = crate::helpers::migrated_db().await;
    let pool = db.pool().await;
    let org = crate::helpers::create_org(&pool, "acme", true).await;
    FakeMachine::new()
        .tag("ST-1")
        .profile("epyc")
        .create(&pool, org.id)
        .await;
    let mut settings = test_settings();
    settings.metrics_bind = Some("127.0.0.1:0".parse().expect("address"));
    let app = Application::build(AppState::new(settings, pool, Metrics::new())).expect("build");
    let (port, metrics_port) = (app.port(), app.metrics_port().expect("a metrics port"));
    assert_ne!(port, metrics_port);
    tokio::spawn(app.run_until_stopped());
    let http = reqwest::Client::new();
    for token in [None, Some(&org.metrics_token)] {
        let mut req = http.get(format!("http://127.0.0.1:{port}/metrics"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let main = req.send().await.expect("main");
        assert_eq!(main.status().as_u16(), 404, "token: {}", token.is_some());
        let body = main.text().await.expect("body");
        assert!(!body.contains("poolkeeper_"), "{body}");
    }
    let own = http
        .get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(own.status().as_u16(), 200);
    let text = own.text().await.expect("body");
    assert!(text.contains(STOCK), "{text}");
    // A probe's HEAD answers as the GET does, without a body.
    let head = http
        .head(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .send()
        .await
        .expect("HEAD metrics");
    assert_eq!(head.status().as_u16(), 200);
    assert!(head.text().await.expect("body").is_empty());
    // Only /metrics there: the API is not on the metrics address.
    let api = http
        .get(format!("http://127.0.0.1:{metrics_port}/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(api.status().as_u16(), 404);
}

/// Every sample of an exposition, by `name{labels}` as printed.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

async fn scrape(app: &crate::helpers::TestApp) -> BTreeMap<String, f64> {
    let text = app.metrics_text().await;
    samples(&text)
}

fn grew(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, key: &str, by: f64) {
    let (b, a) = (
        before.get(key).copied().unwrap_or(0.0),
        after.get(key).copied().unwrap_or(0.0),
    );
    assert!(a - b >= by, "{key}: {b} then {a}, expected +{by}");
}

/// A reserve, a refusal and a 404 move their counters, and the gauges read
/// from the database follow the pool.
#[tokio::test]
async fn the_counters_count_requests_outcomes_and_the_pool() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("MX-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let before = scrape(&app).await;
    let reserve = |order: &'static str| {
        app.http
            .post(app.url("/api/v1/reservations"))
            .bearer_auth(&app.org.token)
            .json(&json!({"order_ref": order, "site": "par1", "profile": "epyc"}))
            .send()
    };
    assert_eq!(
        reserve("MX-A").await.expect("reserve").status(),
        StatusCode::CREATED
    );
    assert_eq!(
        reserve("MX-B").await.expect("reserve").status(),
        StatusCode::CONFLICT
    );
    let missing = app
        .http
        .get(app.url("/api/v1/reservations/999999"))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("get");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    // The database's numbers are shared for DB_STATE_MAX_AGE: age them.
    sqlx::query("UPDATE metrics_snapshot SET read_at = read_at - interval '1 hour'")
        .execute(&app.pool)
        .await
        .expect("age the snapshot");
    let after = scrape(&app).await;
    grew(
        &before,
        &after,
        "poolkeeper_http_request_duration_seconds_count{method=\"POST\",route=\"/api/v1/reservations\",status=\"2xx\"}",
        1.0,
    );
    grew(
        &before,
        &after,
        "poolkeeper_http_request_duration_seconds_count{method=\"POST\",route=\"/api/v1/reservations\",status=\"4xx\"}",
        1.0,
    );
    grew(
        &before,
        &after,
        "poolkeeper_http_request_duration_seconds_count{method=\"GET\",route=\"/api/v1/reservations/{id}\",status=\"4xx\"}",
        1.0,
    );
    let outcomes: f64 = after
        .iter()
        .filter(|(k, _)| k.starts_with("poolkeeper_reserve_outcomes_total"))
        .map(|(_, v)| v)
        .sum();
    let outcomes_before: f64 = before
        .iter()
        .filter(|(k, _)| k.starts_with("poolkeeper_reserve_outcomes_total"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(outcomes - outcomes_before, 2.0, "{after:#?}");
    assert_eq!(
        after
            .get("poolkeeper_machines{org=\"acme\",profile=\"epyc\",site=\"par1\",state=\"held\"}"),
        Some(&1.0),
        "{after:#?}"
    );
    assert_eq!(
        before.get(
            "poolkeeper_machines{org=\"acme\",profile=\"epyc\",site=\"par1\",state=\"sellable\"}"
        ),
        Some(&1.0),
        "{before:#?}"
    );
}

/// Ten replicas scraped at once read the database's numbers once, and all
/// report the same; when the snapshot is older than its age, one of them
/// reads again for all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_replicas_read_the_database_numbers_once_per_interval() {
    let app = spawn_app().await;
    for i in 0..3 {
        FakeMachine::new()
            .tag(&format!("TR-{i}"))
            .site("ams1")
            .vendor("hpe")
            .profile("xeon")
            .create(&app.pool, app.org.id)
            .await;
    }
    let pool = app.db.pool().await;
    let replicas: Vec<Metrics> = (0..10).map(|_| Metrics::new()).collect();
    for round in 0..2 {
        let barrier = Arc::new(Barrier::new(replicas.len()));
        let texts = futures_util::future::join_all(replicas.iter().map(|m| {
            let (barrier, pool) = (barrier.clone(), &pool);
            async move {
                barrier.wait().await;
                m.scrape(pool).await
            }
        }))
        .await;
        let reads: u64 = replicas.iter().map(|m| m.db_state.reads.get()).sum();
        assert_eq!(reads, round + 1, "round {round}: one read for all");
        // Every replica that found the lock taken served the snapshot
        // there was: in the first round none existed yet, so only the
        // reader and those that came after it report the machines.
        let line =
            "poolkeeper_machines{org=\"acme\",profile=\"xeon\",site=\"ams1\",state=\"sellable\"} 3";
        let reporting = texts.iter().filter(|t| t.contains(line)).count();
        assert!(reporting >= 1, "round {round}");
        if round == 1 {
            assert_eq!(reporting, replicas.len(), "round {round}");
        }
        // The snapshot grows old (as DB_STATE_MAX_AGE passing would do).
        sqlx::query("UPDATE metrics_snapshot SET read_at = read_at - interval '1 hour'")
            .execute(&app.pool)
            .await
            .expect("age the snapshot");
    }
}

/// R17 and R18 in the gauges: headroom per pool and segment, and what an
/// order without a segment could take, each organization's under its own
/// `org` label (one tenant's empty pool never hides under another's full
/// pool of the same names); a snapshot written by a replica that does not
/// know these series still reads.
#[tokio::test]
async fn the_pool_gauges_say_the_headroom_and_what_is_available() {
    let app = spawn_app().await;
    let other = crate::helpers::create_org(&app.pool, "rival", true).await;
    for tag in ["HR-1", "HR-2", "HR-3"] {
        FakeMachine::new()
            .tag(tag)
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    FakeMachine::new()
        .tag("HR-4")
        .profile("epyc")
        .status("broken")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("HR-5")
        .vendor("hpe")
        .profile("epyc")
        .create(&app.pool, other.id)
        .await;
    let put = app
        .http
        .put(app.url("/api/v1/headroom"))
        .bearer_auth(&app.org.token)
        .json(&json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": 2}))
        .send()
        .await
        .expect("put headroom");
    assert_eq!(put.status(), StatusCode::OK);
    sqlx::query(
        "INSERT INTO headroom (org_id, site, profile, segment, machines, updated_by)
         VALUES ($1, 'par1', 'epyc', 'enterprise', 5, 'test')",
    )
    .bind(other.id)
    .execute(&app.pool)
    .await
    .expect("headroom of the other organization");
    // An older replica's snapshot, without the capacity series: still read.
    sqlx::query(
        "INSERT INTO metrics_snapshot (id, read_at, body)
         VALUES (true, now(), '{\"machines\": [], \"holds_soon\": 0, \"holds_overdue\": 0,
                 \"pending\": 0, \"leases\": []}')
         ON CONFLICT (id) DO UPDATE SET read_at = EXCLUDED.read_at, body = EXCLUDED.body",
    )
    .execute(&app.pool)
    .await
    .expect("an older snapshot");
    let old = scrape(&app).await;
    assert!(
        !old.keys().any(|k| k.starts_with("poolkeeper_pool_")),
        "{old:#?}"
    );
    sqlx::query("UPDATE metrics_snapshot SET read_at = read_at - interval '1 hour'")
        .execute(&app.pool)
        .await
        .expect("age the snapshot");
    let after = scrape(&app).await;
    let errors = "poolkeeper_metrics_db_errors_total";
    assert_eq!(after.get(errors), Some(&0.0), "{after:#?}");
    let series = [
        // Ours: 3 sellable less 2 kept; the other's: 1 sellable, 5 kept.
        (
            "poolkeeper_pool_headroom{org=\"acme\",profile=\"epyc\",segment=\"enterprise\",site=\"par1\"}",
            2.0,
        ),
        (
            "poolkeeper_pool_headroom{org=\"rival\",profile=\"epyc\",segment=\"enterprise\",site=\"par1\"}",
            5.0,
        ),
        (
            "poolkeeper_pool_available{org=\"acme\",profile=\"epyc\",site=\"par1\"}",
            1.0,
        ),
        (
            "poolkeeper_pool_available{org=\"rival\",profile=\"epyc\",site=\"par1\"}",
            0.0,
        ),
        (
            "poolkeeper_machines{org=\"acme\",profile=\"epyc\",site=\"par1\",state=\"sellable\"}",
            3.0,
        ),
        (
            "poolkeeper_machines{org=\"acme\",profile=\"epyc\",site=\"par1\",state=\"not_ready\"}",
            1.0,
        ),
        (
            "poolkeeper_machines{org=\"rival\",profile=\"epyc\",site=\"par1\",state=\"sellable\"}",
            1.0,
        ),
    ];
    for (key, want) in series {
        assert_eq!(after.get(key), Some(&want), "{key}: {after:#?}");
    }
}

/// The gauges count what the overview and the capacity answer count (R17,
/// one count): an overdue hold that no sweep has expired yet is sellable
/// (the allocator expires it at the point of use), so `available` never
/// exceeds `sellable`.
#[tokio::test]
async fn an_overdue_hold_is_counted_as_the_capacity_answer_counts_it() {
    let app = spawn_app().await;
    let overdue = FakeMachine::new()
        .tag("OD-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    FakeMachine::new()
        .tag("OD-2")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let hold = crate::helpers::FakeHold::on(overdue)
        .order("OD-ORDER")
        .create(&app.pool, app.org.id)
        .await;
    app.make_overdue(hold).await;
    let capacity: serde_json::Value = app
        .http
        .get(app.url("/api/v1/capacity?site=par1&profile=epyc"))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("capacity")
        .json()
        .await
        .expect("json");
    let pool = &capacity["pools"][0];
    let gauges = scrape(&app).await;
    let gauge = |state: &str| {
        gauges
            .get(&format!(
                "poolkeeper_machines{{org=\"acme\",profile=\"epyc\",site=\"par1\",state=\"{state}\"}}"
            ))
            .copied()
    };
    for state in ["sellable", "held", "sold", "not_ready"] {
        assert_eq!(
            gauge(state),
            pool[state].as_f64(),
            "{state}: {capacity} against {gauges:#?}"
        );
    }
    assert_eq!(pool["sellable"], 2, "{capacity}");
    assert_eq!(
        gauges.get("poolkeeper_pool_available{org=\"acme\",profile=\"epyc\",site=\"par1\"}"),
        Some(&2.0),
        "{gauges:#?}"
    );
}

/// The dashboard's database errors are counted with the API's, each under
/// its surface, by SQLSTATE class: a page and an API read that meet a
/// missing table (42P01) each move their own series.
#[tokio::test]
async fn database_errors_are_counted_by_class_for_the_api_and_the_dashboard() {
    let app = spawn_app().await;
    let admin = app.staff("ana@acme.example", "admin").await;
    assert_eq!(admin.page("/audit").await.0, 200);
    let dashboard = "poolkeeper_db_errors_total{class=\"42\",surface=\"dashboard\"}";
    let api = "poolkeeper_db_errors_total{class=\"42\",surface=\"api\"}";
    let before = scrape(&app).await;

    sqlx::query("ALTER TABLE audit_log RENAME TO audit_log_gone")
        .execute(&app.pool)
        .await
        .expect("rename");
    assert_eq!(admin.page("/audit").await.0, 500);
    let after_page = scrape(&app).await;
    grew(&before, &after_page, dashboard, 1.0);

    sqlx::query("ALTER TABLE reservations RENAME TO reservations_gone")
        .execute(&app.pool)
        .await
        .expect("rename");
    let r = app
        .http
        .get(app.url("/api/v1/reservations/1"))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let after_api = scrape(&app).await;
    grew(&after_page, &after_api, api, 1.0);
}
