//! `/metrics`: the counters count what happens, and the database's numbers
//! are read by one replica for all of them.

use std::collections::BTreeMap;
use std::sync::Arc;

use poolkeeper::metrics::Metrics;
use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::Barrier;

use crate::helpers::spawn_app;

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
    app.insert_machine(app.org.id, "MX-1", "par1", "dell", "epyc", "ready")
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
        after.get("poolkeeper_machines{profile=\"epyc\",site=\"par1\",state=\"held\"}"),
        Some(&1.0),
        "{after:#?}"
    );
    assert_eq!(
        before.get("poolkeeper_machines{profile=\"epyc\",site=\"par1\",state=\"sellable\"}"),
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
        app.insert_machine(
            app.org.id,
            &format!("TR-{i}"),
            "ams1",
            "hpe",
            "xeon",
            "ready",
        )
        .await;
    }
    let pool = app.db.pool().await;
    let replicas: Vec<Metrics> = (0..10).map(|_| Metrics::new()).collect();
    let machines = poolkeeper::ops::machines_sql();
    for round in 0..2 {
        let barrier = Arc::new(Barrier::new(replicas.len()));
        let texts = futures_util::future::join_all(replicas.iter().map(|m| {
            let (barrier, pool, machines) = (barrier.clone(), &pool, &machines);
            async move {
                barrier.wait().await;
                m.scrape(pool, machines).await
            }
        }))
        .await;
        let reads: u64 = replicas.iter().map(|m| m.db_state.reads.get()).sum();
        assert_eq!(reads, round + 1, "round {round}: one read for all");
        // Every replica that found the lock taken served the snapshot
        // there was: in the first round none existed yet, so only the
        // reader and those that came after it report the machines.
        let line = "poolkeeper_machines{profile=\"xeon\",site=\"ams1\",state=\"sellable\"} 3";
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
