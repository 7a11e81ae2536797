//! Inventory API: PUT/GET /api/v1/machines, auth, scopes, tenant isolation.

use serde_json::{Value, json};

use crate::helpers::spawn_app;

#[tokio::test]
async fn put_creates_then_updates() {
    let app = spawn_app().await;
    let r = app
        .put_machine(
            &app.org.token,
            "SRV-001",
            "par1",
            "dell",
            "epyc-9354-256g",
            "ready",
        )
        .await;
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["asset_tag"], "SRV-001");
    assert_eq!(body["status"], "ready");

    let r = app
        .put_machine(
            &app.org.token,
            "SRV-001",
            "par1",
            "dell",
            "epyc-9354-256g",
            "maintenance",
        )
        .await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["status"], "maintenance");
    assert_eq!(app.count("SELECT count(*) FROM machines").await, 1);

    let r = app
        .http
        .get(app.url("/api/v1/machines?site=par1&status=maintenance"))
        .bearer_auth(&app.org.inventory_token)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["machines"].as_array().map(Vec::len), Some(1));
    let r = app
        .http
        .get(app.url("/api/v1/machines?status=ready"))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("request");
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["machines"].as_array().map(Vec::len), Some(0));
}

#[tokio::test]
async fn bad_bodies_are_400_invalid_and_write_nothing() {
    let app = spawn_app().await;
    let good = json!({"site": "par1", "vendor": "dell", "profile": "p1", "status": "ready"});
    let mut cases: Vec<(&str, String)> = vec![
        ("unknown status", json!({"site": "par1", "vendor": "dell", "profile": "p1", "status": "sold"}).to_string()),
        ("wrong type", json!({"site": 12, "vendor": "dell", "profile": "p1", "status": "ready"}).to_string()),
        ("missing field", json!({"site": "par1", "vendor": "dell", "status": "ready"}).to_string()),
        ("unknown field", json!({"site": "par1", "vendor": "dell", "profile": "p1", "status": "ready", "x": 1}).to_string()),
        ("malformed", "{\"site\": \"par1\",".to_owned()),
        ("not an object", "[]".to_owned()),
        ("empty site", json!({"site": "", "vendor": "dell", "profile": "p1", "status": "ready"}).to_string()),
        ("control character", json!({"site": "par\u{7}1", "vendor": "dell", "profile": "p1", "status": "ready"}).to_string()),
        ("oversized", json!({"site": "x".repeat(100_000), "vendor": "dell", "profile": "p1", "status": "ready"}).to_string()),
    ];
    cases.push(("bad asset tag", good.to_string()));
    for (what, body) in cases {
        let path = if what == "bad asset tag" {
            "/api/v1/machines/bad%20tag"
        } else {
            "/api/v1/machines/SRV-1"
        };
        let r = app
            .http
            .put(app.url(path))
            .bearer_auth(&app.org.token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 400, "{what}");
        let body: Value = r.json().await.expect("json error body");
        assert_eq!(body["error"], "invalid", "{what}: {body}");
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}"
        );
    }
    assert_eq!(app.count("SELECT count(*) FROM machines").await, 0);
}

#[tokio::test]
async fn tokens_scopes_and_tenants() {
    let app = spawn_app().await;
    let body = json!({"site": "par1", "vendor": "dell", "profile": "p1", "status": "ready"});

    let r = app
        .http
        .put(app.url("/api/v1/machines/SRV-1"))
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 401, "missing token");
    let r = app
        .http
        .get(app.url("/api/v1/machines"))
        .bearer_auth("pk_not-a-token")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 401, "unknown token");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"], "unauthorized");

    let r = app
        .put_machine(
            &app.org.orders_token,
            "SRV-1",
            "par1",
            "dell",
            "p1",
            "ready",
        )
        .await;
    assert_eq!(r.status(), 403, "orders-only token on inventory");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"], "forbidden");
    assert_eq!(app.count("SELECT count(*) FROM machines").await, 0);

    // Another organization's machine is 404, and the same asset tag is free
    // for us: tags are unique per organization.
    assert_eq!(
        app.put_machine(&app.other.token, "SRV-9", "par1", "dell", "p1", "ready")
            .await
            .status(),
        201
    );
    let r = app
        .http
        .get(app.url("/api/v1/machines/SRV-9"))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"], "not_found");
    let r = app
        .http
        .get(app.url("/api/v1/machines"))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("request");
    let v: Value = r.json().await.expect("json");
    assert_eq!(
        v["machines"].as_array().map(Vec::len),
        Some(0),
        "no other tenant's machines listed"
    );
    assert_eq!(
        app.put_machine(&app.org.token, "SRV-9", "ams1", "hpe", "p2", "ready")
            .await
            .status(),
        201
    );
    let other_site: String =
        sqlx::query_scalar("SELECT site FROM machines WHERE org_id = $1 AND asset_tag = 'SRV-9'")
            .bind(app.other.id)
            .fetch_one(&app.pool)
            .await
            .expect("row");
    assert_eq!(
        other_site, "par1",
        "the other organization's machine is untouched"
    );
}

#[tokio::test]
async fn revoked_tokens_are_refused() {
    let app = spawn_app().await;
    sqlx::query("UPDATE api_tokens SET revoked_at = clock_timestamp() WHERE name = 'checkout' AND org_id = $1")
        .bind(app.org.id)
        .execute(&app.pool)
        .await
        .expect("revoke");
    let r = app
        .put_machine(&app.org.token, "SRV-1", "par1", "dell", "p1", "ready")
        .await;
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn health_and_readiness() {
    let app = spawn_app().await;
    assert_eq!(
        app.http
            .get(app.url("/healthz"))
            .send()
            .await
            .expect("request")
            .status(),
        200
    );
    assert_eq!(
        app.http
            .get(app.url("/readyz"))
            .send()
            .await
            .expect("request")
            .status(),
        200
    );
    let metrics = app.metrics_text().await;
    assert!(metrics.contains("poolkeeper_sweeps_total"), "{metrics}");
}
