//! The orders API of docs/api.md over HTTP: reserve, read, convert, cancel, end
//! a service; status codes, error codes, bodies, bad input, tenants.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::helpers::FakeMachine;
use crate::helpers::{PROFILE, SITE, decoys};
use crate::helpers::{TestApp, spawn_app, spawn_app_with};

fn reserve_body(order_ref: &str) -> Value {
    json!({"order_ref": order_ref, "site": SITE, "profile": PROFILE, "vendor": "dell"})
}

impl TestApp {
    async fn post(&self, token: &str, path: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .expect("request")
    }

    async fn post_raw(&self, token: &str, path: &str, body: &str) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .bearer_auth(token)
            .header("Content-Type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .expect("request")
    }

    async fn get_json(&self, token: &str, path: &str) -> (StatusCode, Value) {
        let r = self
            .http
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .expect("request");
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Rows written by the orders API, to prove that a refusal wrote nothing.
    async fn written(&self) -> (i64, i64, i64) {
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM reservations), (SELECT count(*) FROM reservation_events),
                    (SELECT count(*) FROM service_links WHERE ended_at IS NULL)",
        )
        .fetch_one(&self.pool)
        .await
        .expect("counts")
    }

    async fn overdue(&self, id: i64) {
        sqlx::query(
            "UPDATE reservations SET created_at = created_at - interval '1 hour',
                    expires_at = expires_at - interval '1 hour' WHERE id = $1",
        )
        .bind(id)
        .execute(&self.pool)
        .await
        .expect("make it overdue");
    }
}

fn seconds_between(body: &Value, from: &str, to: &str) -> i64 {
    let t = |k: &str| {
        chrono::DateTime::parse_from_rfc3339(body[k].as_str().expect("a timestamp"))
            .expect("rfc3339")
    };
    (t(to) - t(from)).num_seconds()
}

#[tokio::test]
async fn reserve_replay_read_convert_and_end_a_service() {
    let app = spawn_app().await;
    let r = app
        .put_machine(&app.org.token, "PK-1", SITE, "dell", PROFILE, "ready")
        .await;
    assert_eq!(r.status(), 201);
    let (status, body) = app.reserve(&app.org.token, reserve_body("ORD-1")).await;
    assert_eq!(status, 201, "{body}");
    for k in [
        "id",
        "order_ref",
        "state",
        "fence",
        "created_at",
        "expires_at",
        "reason",
    ] {
        assert!(!body[k].is_null(), "{k} missing: {body}");
    }
    assert_eq!(body["state"], "held");
    assert_eq!(body["order_ref"], "ORD-1");
    assert_eq!(
        body["machine"],
        json!({"asset_tag": "PK-1", "site": SITE, "vendor": "dell", "profile": PROFILE, "status": "ready"})
    );
    assert!(
        body["reason"]
            .as_str()
            .is_some_and(|r| r.contains("PK-1") && r.contains("vendor dell"))
    );
    assert_eq!(
        seconds_between(&body, "created_at", "expires_at"),
        900,
        "15 minutes by default"
    );
    assert!(body.get("ended_at").is_none());
    let id = body["id"].as_i64().expect("id");
    let fence = body["fence"].as_i64().expect("fence");
    // R8: the reason and the machine stay as they were when chosen.
    let frozen: (Value, Value, String) =
        sqlx::query_as("SELECT spec, machine_snapshot, reason FROM reservations WHERE id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .expect("row");
    assert_eq!(frozen.0["vendor"], "dell");
    assert_eq!(frozen.1["asset_tag"], "PK-1");
    assert_eq!(frozen.2, body["reason"].as_str().unwrap_or_default());

    // Replay: 200, the same reservation.
    let (status, again) = app.reserve(&app.org.token, reserve_body("ORD-1")).await;
    assert_eq!(status, 200);
    assert_eq!(again["id"], id);
    let (status, got) = app
        .get_json(&app.org.orders_token, &format!("/api/v1/reservations/{id}"))
        .await;
    assert_eq!((status, &got["fence"]), (StatusCode::OK, &json!(fence)));
    let (status, got) = app
        .get_json(&app.org.token, "/api/v1/reservations?order_ref=ORD-1")
        .await;
    assert_eq!((status, &got["id"]), (StatusCode::OK, &json!(id)));
    let (status, _) = app
        .get_json(&app.org.token, "/api/v1/reservations?order_ref=ORD-NONE")
        .await;
    assert_eq!(status, 404);
    let (status, _) = app
        .get_json(&app.org.token, "/api/v1/reservations/999999")
        .await;
    assert_eq!(status, 404);

    // Convert: 200, converted, with the service link.
    let r = app
        .post(
            &app.org.token,
            &format!("/api/v1/reservations/{id}/convert"),
            &json!({"fence": fence, "service_ref": "SRV-9"}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["state"], "converted");
    assert_eq!(body["ended_by"], "checkout");
    assert_eq!(body["service"]["service_ref"], "SRV-9");
    let service = body["service"]["id"].as_i64().expect("service id");
    let (_, got) = app
        .get_json(&app.org.token, &format!("/api/v1/reservations/{id}"))
        .await;
    assert_eq!(got["service"]["id"], service);
    // Ended now: a convert into another service by the same caller is
    // another request under the same key (422, naming the field) ...
    let (status, body) = app
        .post_as(
            &app.org.token,
            &format!("/api/v1/reservations/{id}/convert"),
            &json!({"fence": fence, "service_ref": "SRV-10"}),
        )
        .await;
    assert_eq!(
        (status, &body["error"], &body["fields"]),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            &json!("idempotency_mismatch"),
            &json!(["service_ref"])
        ),
        "{body}"
    );
    // ... and a cancel, or a convert by another caller, is not_held with
    // the state.
    for (token, action, extra) in [
        (&app.org.token, "cancel", json!({"reason": "late"})),
        (
            &app.org.orders_token,
            "convert",
            json!({"service_ref": "SRV-10"}),
        ),
    ] {
        let mut b = extra;
        b["fence"] = json!(fence);
        let r = app
            .post(token, &format!("/api/v1/reservations/{id}/{action}"), &b)
            .await;
        assert_eq!(r.status(), 409);
        let body: Value = r.json().await.expect("json");
        assert_eq!(
            (body["error"].as_str(), body["state"].as_str()),
            (Some("not_held"), Some("converted"))
        );
    }
    // The machine is in service: a new order finds nothing.
    let (status, body) = app.reserve(&app.org.token, reserve_body("ORD-2")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("unavailable"))
    );
    assert_eq!(body["excluded"]["in_service"], 1);

    // End the service: the machine must be wiped before it is sold again.
    let r = app
        .post(
            &app.org.token,
            &format!("/api/v1/services/{service}/end"),
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let link: Value = r.json().await.expect("json");
    assert_eq!(link["ended_by"], "checkout");
    let (_, m) = app.get_json(&app.org.token, "/api/v1/machines/PK-1").await;
    assert_eq!(m["status"], "provisioning");
    // F3: the same end again (its answer lost) answers the service as the
    // first end left it, and writes nothing; another token's end is refused.
    app.put_machine(&app.org.token, "PK-1", SITE, "dell", PROFILE, "maintenance")
        .await;
    let r = app
        .post(
            &app.org.token,
            &format!("/api/v1/services/{service}/end"),
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let again: Value = r.json().await.expect("json");
    assert_eq!(again, link, "the service as the first end left it");
    let (_, m) = app.get_json(&app.org.token, "/api/v1/machines/PK-1").await;
    assert_eq!(m["status"], "maintenance", "a replayed end writes nothing");
    let r = app
        .post(
            &app.org.orders_token,
            &format!("/api/v1/services/{service}/end"),
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"], "not_live");
    app.put_machine(
        &app.org.token,
        "PK-1",
        SITE,
        "dell",
        PROFILE,
        "provisioning",
    )
    .await;
    let (status, body) = app.reserve(&app.org.token, reserve_body("ORD-3")).await;
    assert_eq!(
        (status, body["excluded"]["not_ready"].as_i64()),
        (StatusCode::CONFLICT, Some(1))
    );

    // Custom hold, computed by the database.
    app.put_machine(&app.org.token, "PK-2", SITE, "dell", PROFILE, "ready")
        .await;
    let mut b = reserve_body("ORD-4");
    b["hold_seconds"] = json!(60);
    let r = app.post(&app.org.token, "/api/v1/reservations", &b).await;
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.expect("json");
    assert_eq!(seconds_between(&body, "created_at", "expires_at"), 60);
    assert_eq!(body["machine"]["asset_tag"], "PK-2");

    let count = |label: &str| app.metrics.reservations.with_label_values(&[label]).get();
    assert_eq!(
        (
            count("created"),
            count("existing"),
            count("unavailable"),
            count("contended")
        ),
        (2, 1, 2, 0)
    );
}

#[tokio::test]
async fn overdue_stale_and_cancelled_reservations_get_their_codes() {
    let app = spawn_app().await;
    for tag in ["PK-1", "PK-2", "PK-3"] {
        app.put_machine(&app.org.token, tag, SITE, "dell", PROFILE, "ready")
            .await;
    }
    let (_, a) = app.reserve(&app.org.token, reserve_body("ORD-A")).await;
    let (_, b) = app.reserve(&app.org.token, reserve_body("ORD-B")).await;
    let (_, c) = app.reserve(&app.org.token, reserve_body("ORD-C")).await;
    let id = |v: &Value| v["id"].as_i64().expect("id");
    let fence = |v: &Value| v["fence"].as_i64().expect("fence");

    // Stale fence: refused, nothing written.
    let before = app.written().await;
    let r = app
        .post(
            &app.org.token,
            &format!("/api/v1/reservations/{}/convert", id(&a)),
            &json!({"fence": fence(&b), "service_ref": "SRV-1"}),
        )
        .await;
    assert_eq!(r.status(), 409);
    assert_eq!(
        r.json::<Value>().await.expect("json")["error"],
        "stale_fence"
    );
    let r = app
        .post(
            &app.org.token,
            &format!("/api/v1/reservations/{}/cancel", id(&a)),
            &json!({"fence": fence(&a) + 1000, "reason": "x"}),
        )
        .await;
    assert_eq!(
        r.json::<Value>().await.expect("json")["error"],
        "stale_fence"
    );
    assert_eq!(app.written().await, before);

    // R11: past the deadline, no sweep ran: convert says expired and the
    // reservation is recorded as expired by the conversion.
    app.overdue(id(&a)).await;
    let r = app
        .post(
            &app.org.token,
            &format!("/api/v1/reservations/{}/convert", id(&a)),
            &json!({"fence": fence(&a), "service_ref": "SRV-1"}),
        )
        .await;
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"], "expired");
    assert!(body["expires_at"].is_string(), "{body}");
    let (_, got) = app
        .get_json(&app.org.token, &format!("/api/v1/reservations/{}", id(&a)))
        .await;
    assert_eq!(
        (got["state"].as_str(), got["ended_by"].as_str()),
        (Some("expired"), Some("conversion"))
    );
    assert!(got["ended_at"].is_string());
    assert_eq!(app.count("SELECT count(*) FROM service_links").await, 0);

    // Cancel of an overdue one: expired too (nobody decided in time).
    app.overdue(id(&b)).await;
    let r = app
        .post(
            &app.org.token,
            &format!("/api/v1/reservations/{}/cancel", id(&b)),
            &json!({"fence": fence(&b), "reason": "customer left"}),
        )
        .await;
    assert_eq!(r.json::<Value>().await.expect("json")["error"], "expired");
    let (_, got) = app
        .get_json(&app.org.token, &format!("/api/v1/reservations/{}", id(&b)))
        .await;
    assert_eq!(
        (got["state"].as_str(), got["ended_by"].as_str()),
        (Some("expired"), Some("cancellation"))
    );

    // Cancel: who and why; a replay of the order says so (200, cancelled).
    let r = app
        .post(
            &app.org.token,
            &format!("/api/v1/reservations/{}/cancel", id(&c)),
            &json!({"fence": fence(&c), "reason": "  payment declined  "}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["state"], "cancelled");
    let (status, replay) = app.reserve(&app.org.token, reserve_body("ORD-C")).await;
    assert_eq!(status, 200);
    assert_eq!(
        (
            replay["id"].as_i64(),
            replay["state"].as_str(),
            replay["ended_by"].as_str(),
            replay["end_reason"].as_str()
        ),
        (
            Some(id(&c)),
            Some("cancelled"),
            Some("checkout"),
            Some("payment declined")
        )
    );
    // The timeline answers "cancelled or timed out?" without logs.
    let (status, events) = app
        .get_json(
            &app.org.token,
            &format!("/api/v1/reservations/{}/events", id(&c)),
        )
        .await;
    assert_eq!(status, 200);
    let kinds: Vec<(&str, &str)> = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap_or(""),
                e["actor"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![("created", "checkout"), ("cancelled", "checkout")]
    );
    let (_, events) = app
        .get_json(
            &app.org.token,
            &format!("/api/v1/reservations/{}/events", id(&a)),
        )
        .await;
    assert_eq!(events["events"][1]["kind"], "expired");
    assert_eq!(events["events"][1]["actor"], "conversion");

    // The machines of the ended reservations are free again.
    let (status, _) = app.reserve(&app.org.token, reserve_body("ORD-D")).await;
    assert_eq!(status, 201);
}

/// R3 through HTTP, once: 8 concurrent orders, 3 eligible machines among
/// decoys: three 201s on three machines, five 409s that say which refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_concurrent_http_orders_on_three_machines() {
    let app = Arc::new(spawn_app().await);
    decoys(&app.pool, app.org.id).await;
    for i in 0..3 {
        FakeMachine::new()
            .tag(&format!("OK-{i}"))
            .create(&app.pool, app.org.id)
            .await;
    }
    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (app, barrier) = (app.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let r = app
                .post(
                    &app.org.token,
                    "/api/v1/reservations",
                    &reserve_body(&format!("ORD-{i}")),
                )
                .await;
            let retry_after = r.headers().get("Retry-After").is_some();
            let status = r.status();
            (status, retry_after, r.json::<Value>().await.expect("json"))
        }));
    }
    let mut machines = Vec::new();
    let mut refusals = 0;
    for t in tasks {
        let (status, retry_after, body) = t.await.expect("task");
        match status.as_u16() {
            201 => machines.push(
                body["machine"]["asset_tag"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            ),
            409 => {
                refusals += 1;
                match body["error"].as_str() {
                    Some("contended") => assert!(retry_after, "contended says when to retry"),
                    Some("unavailable") => {
                        assert!(!retry_after, "unavailable is not a retry");
                        assert_eq!(body["excluded"]["held"], 4, "{body}");
                        for k in [
                            "wrong_site",
                            "wrong_vendor",
                            "wrong_profile",
                            "not_ready",
                            "in_service",
                        ] {
                            assert_eq!(body["excluded"][k], 1, "{k}: {body}");
                        }
                    }
                    other => panic!("unexpected refusal {other:?}: {body}"),
                }
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    machines.sort();
    assert_eq!(machines, vec!["OK-0", "OK-1", "OK-2"]);
    assert_eq!(refusals, 5);
    let held = app
        .count("SELECT count(DISTINCT machine_id) FROM reservations WHERE state = 'held' AND order_ref LIKE 'ORD-%'")
        .await;
    assert_eq!(held, 3);
}

#[tokio::test]
async fn bad_input_on_every_order_endpoint_is_400_invalid_and_writes_nothing() {
    let app = spawn_app().await;
    app.put_machine(&app.org.token, "PK-1", SITE, "dell", PROFILE, "ready")
        .await;
    app.put_machine(&app.org.token, "PK-2", SITE, "dell", PROFILE, "ready")
        .await;
    let (_, held) = app.reserve(&app.org.token, reserve_body("ORD-HELD")).await;
    let id = held["id"].as_i64().expect("id");
    let fence = held["fence"].as_i64().expect("fence");
    let with = |k: &str, v: Value| {
        let mut b = reserve_body("ORD-NEW");
        b[k] = v;
        b.to_string()
    };
    let without = |k: &str| {
        let mut b = reserve_body("ORD-NEW");
        b.as_object_mut().map(|o| o.remove(k));
        b.to_string()
    };
    let reserve_cases: Vec<(&str, String)> = vec![
        ("hold 0", with("hold_seconds", json!(0))),
        ("hold 86401", with("hold_seconds", json!(86_401))),
        ("hold -1", with("hold_seconds", json!(-1))),
        ("hold string", with("hold_seconds", json!("x"))),
        ("hold fraction", with("hold_seconds", json!(1.5))),
        ("empty order_ref", with("order_ref", json!(""))),
        (
            "200-char order_ref",
            with("order_ref", json!("A".repeat(200))),
        ),
        ("control character", with("order_ref", json!("ORD\u{1}1"))),
        ("order_ref number", with("order_ref", json!(12))),
        ("site wrong type", with("site", json!(["par1"]))),
        ("vendor empty", with("vendor", json!(""))),
        ("missing order_ref", without("order_ref")),
        ("missing site", without("site")),
        ("missing profile", without("profile")),
        ("unknown field", with("color", json!("red"))),
        ("malformed", "{\"order_ref\": ".to_owned()),
        ("not an object", "[]".to_owned()),
        ("empty body", String::new()),
        ("oversized", with("order_ref", json!("A".repeat(300_000)))),
    ];
    let convert = format!("/api/v1/reservations/{id}/convert");
    let cancel = format!("/api/v1/reservations/{id}/cancel");
    let mut cases: Vec<(String, String, String)> = reserve_cases
        .into_iter()
        .map(|(what, body)| (what.to_owned(), "/api/v1/reservations".to_owned(), body))
        .collect();
    for (what, body) in [
        (
            "fence string",
            json!({"fence": "1", "service_ref": "SRV-1"}).to_string(),
        ),
        ("missing fence", json!({"service_ref": "SRV-1"}).to_string()),
        ("missing service_ref", json!({"fence": fence}).to_string()),
        (
            "empty service_ref",
            json!({"fence": fence, "service_ref": ""}).to_string(),
        ),
        (
            "service_ref control",
            json!({"fence": fence, "service_ref": "SRV\n1"}).to_string(),
        ),
        (
            "unknown field",
            json!({"fence": fence, "service_ref": "SRV-1", "x": 1}).to_string(),
        ),
        ("malformed", "{".to_owned()),
    ] {
        cases.push((format!("convert: {what}"), convert.clone(), body));
    }
    for (what, body) in [
        ("missing reason", json!({"fence": fence}).to_string()),
        (
            "empty reason",
            json!({"fence": fence, "reason": ""}).to_string(),
        ),
        (
            "blank reason",
            json!({"fence": fence, "reason": "   "}).to_string(),
        ),
        (
            "501-char reason",
            json!({"fence": fence, "reason": "r".repeat(501)}).to_string(),
        ),
        (
            "reason control",
            json!({"fence": fence, "reason": "a\u{7}b"}).to_string(),
        ),
        (
            "reason wrong type",
            json!({"fence": fence, "reason": 5}).to_string(),
        ),
        (
            "fence float",
            json!({"fence": 1.5, "reason": "x"}).to_string(),
        ),
        (
            "unknown field",
            json!({"fence": fence, "reason": "x", "y": 1}).to_string(),
        ),
        ("malformed", "nope".to_owned()),
    ] {
        cases.push((format!("cancel: {what}"), cancel.clone(), body));
    }
    let good_convert = json!({"fence": fence, "service_ref": "SRV-1"}).to_string();
    for path in [
        "/api/v1/reservations/abc/convert",
        "/api/v1/reservations/1.5/cancel",
        "/api/v1/services/x/end",
    ] {
        cases.push((
            format!("non-numeric id {path}"),
            path.to_owned(),
            good_convert.clone(),
        ));
    }
    let before = app.written().await;
    for (what, path, body) in cases {
        let r = app.post_raw(&app.org.token, &path, &body).await;
        assert_eq!(r.status(), 400, "{what}");
        let b: Value = r.json().await.expect("json error body");
        assert_eq!(b["error"], "invalid", "{what}: {b}");
        assert_eq!(app.written().await, before, "{what} wrote something");
    }
    for path in [
        "/api/v1/reservations/abc",
        "/api/v1/reservations/99999999999999999999999",
        "/api/v1/reservations?order_ref=",
        "/api/v1/reservations?order_ref=a%01b",
        "/api/v1/reservations",
        "/api/v1/reservations?order_ref=X&other=1",
    ] {
        let (status, body) = app.get_json(&app.org.token, path).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid")),
            "{path}: {body}"
        );
    }
    // The held reservation is untouched.
    let (_, got) = app
        .get_json(&app.org.token, &format!("/api/v1/reservations/{id}"))
        .await;
    assert_eq!(got["state"], "held");
}

/// Another organization's reservation or service is 404 everywhere.
#[tokio::test]
async fn another_organizations_objects_are_404() {
    let app = spawn_app().await;
    app.put_machine(&app.org.token, "PK-1", SITE, "dell", PROFILE, "ready")
        .await;
    let (_, res) = app.reserve(&app.org.token, reserve_body("ORD-1")).await;
    let id = res["id"].as_i64().expect("id");
    let fence = res["fence"].as_i64().expect("fence");
    app.put_machine(&app.org.token, "PK-2", SITE, "dell", PROFILE, "ready")
        .await;
    let (_, sold) = app.reserve(&app.org.token, reserve_body("ORD-2")).await;
    let r = app
        .post(
            &app.org.token,
            &format!("/api/v1/reservations/{}/convert", sold["id"]),
            &json!({"fence": sold["fence"], "service_ref": "SRV-1"}),
        )
        .await;
    let service = r.json::<Value>().await.expect("json")["service"]["id"]
        .as_i64()
        .expect("service");
    let before = app.written().await;
    let other = &app.other.token;
    for path in [
        format!("/api/v1/reservations/{id}"),
        "/api/v1/reservations?order_ref=ORD-1".to_owned(),
        format!("/api/v1/reservations/{id}/events"),
    ] {
        let (status, body) = app.get_json(other, &path).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found")),
            "{path}"
        );
    }
    for (path, body) in [
        (
            format!("/api/v1/reservations/{id}/convert"),
            json!({"fence": fence, "service_ref": "SRV-2"}),
        ),
        (
            format!("/api/v1/reservations/{id}/cancel"),
            json!({"fence": fence, "reason": "mine now"}),
        ),
        (format!("/api/v1/services/{service}/end"), json!({})),
    ] {
        let r = app.post(other, &path, &body).await;
        assert_eq!(r.status(), 404, "{path}");
    }
    assert_eq!(app.written().await, before);
    // The other organization's order with the same order_ref is its own.
    app.put_machine(other, "PK-1", SITE, "dell", PROFILE, "ready")
        .await;
    let r = app
        .post(other, "/api/v1/reservations", &reserve_body("ORD-1"))
        .await;
    assert_eq!(r.status(), 201);
}

/// R12 and scopes: every orders endpoint checks the module and the scope.
#[tokio::test]
async fn orders_endpoints_need_the_module_and_the_orders_scope() {
    let app = spawn_app_with(|s| s.datacenter_module = false).await;
    let calls: [(&str, &str); 6] = [
        ("POST", "/api/v1/reservations"),
        ("GET", "/api/v1/reservations?order_ref=ORD-1"),
        ("GET", "/api/v1/reservations/1"),
        ("POST", "/api/v1/reservations/1/convert"),
        ("POST", "/api/v1/reservations/1/cancel"),
        ("POST", "/api/v1/services/1/end"),
    ];
    for (method, path) in calls {
        let req = match method {
            "POST" => app.http.post(app.url(path)).body("{not json"),
            _ => app.http.get(app.url(path)),
        };
        let r = req
            .bearer_auth(&app.org.token)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 403, "{method} {path}");
        assert_eq!(
            r.json::<Value>().await.expect("json")["error"],
            "module_disabled",
            "{method} {path}"
        );
    }
    let app = spawn_app().await;
    for (method, path) in calls {
        let req = match method {
            "POST" => app.http.post(app.url(path)).body("{}"),
            _ => app.http.get(app.url(path)),
        };
        let r = req
            .bearer_auth(&app.org.inventory_token)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 403, "{method} {path}");
        assert_eq!(
            r.json::<Value>().await.expect("json")["error"],
            "forbidden",
            "{method} {path}"
        );
        let req = match method {
            "POST" => app.http.post(app.url(path)).body("{}"),
            _ => app.http.get(app.url(path)),
        };
        let r = req.send().await.expect("request");
        assert_eq!(r.status(), 401, "{method} {path} without a token");
    }
    // The per-organization half of the switch.
    sqlx::query("UPDATE organizations SET datacenter_enabled = false WHERE id = $1")
        .bind(app.org.id)
        .execute(&app.pool)
        .await
        .expect("switch off");
    let r = app
        .post(
            &app.org.token,
            "/api/v1/reservations",
            &reserve_body("ORD-1"),
        )
        .await;
    assert_eq!(r.status(), 403);
    assert_eq!(app.written().await, (0, 0, 0));
}

/// R9 through HTTP, once: 5 concurrent requests with one order_ref on 4
/// machines: one 201, and every other answer is that reservation (200) or
/// `contended`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_concurrent_http_requests_with_one_order_ref() {
    let app = Arc::new(spawn_app().await);
    for i in 0..4 {
        FakeMachine::new()
            .tag(&format!("OK-{i}"))
            .create(&app.pool, app.org.id)
            .await;
    }
    let barrier = Arc::new(Barrier::new(5));
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let (app, barrier) = (app.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let r = app
                .post(
                    &app.org.token,
                    "/api/v1/reservations",
                    &reserve_body("ORD-SAME"),
                )
                .await;
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.expect("json"))
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.expect("task"));
    }
    let id: i64 = sqlx::query_scalar("SELECT id FROM reservations WHERE order_ref = 'ORD-SAME'")
        .fetch_one(&app.pool)
        .await
        .expect("exactly one reservation");
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1);
    assert_eq!(
        answers.iter().filter(|(s, _)| *s == 201).count(),
        1,
        "{answers:?}"
    );
    for (status, body) in &answers {
        match status {
            200 | 201 => assert_eq!(body["id"], id),
            409 => assert_eq!(body["error"], "contended", "{body}"),
            other => panic!("unexpected {other}: {body}"),
        }
    }
}

/// R6: the same order_ref with the same request replays the original; with
/// another request (a reference scheme that repeats) it is `422
/// idempotency_mismatch` naming the fields that differ, the original
/// stands, and nothing is written.
#[tokio::test]
async fn a_reused_order_ref_with_another_request_is_refused_naming_the_fields() {
    let app = spawn_app().await;
    for (tag, site, profile) in [("IM-1", "par1", "epyc"), ("IM-2", "ams1", "xeon")] {
        FakeMachine::new()
            .tag(tag)
            .site(site)
            .profile(profile)
            .create(&app.pool, app.org.id)
            .await;
    }
    let first =
        json!({"order_ref": "IDEM-1", "site": "par1", "profile": "epyc", "customer_ref": "C1"});
    let (status, held) = app.reserve(&app.org.token, first.clone()).await;
    assert_eq!(status, 201, "{held}");
    // The same request again: the original answer.
    let (status, again) = app.reserve(&app.org.token, first.clone()).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], held["id"]);
    let written = async || {
        app.count(
            "SELECT (SELECT count(*) FROM reservations) + (SELECT count(*) FROM reservation_events)
                  + (SELECT count(*) FROM reservation_refusals)",
        )
        .await
    };
    let before = written().await;
    for (other, fields) in [
        (
            json!({"order_ref": "IDEM-1", "site": "ams1", "profile": "xeon", "customer_ref": "C2"}),
            json!(["site", "profile", "customer_ref"]),
        ),
        (
            json!({"order_ref": "IDEM-1", "site": "par1", "profile": "epyc", "customer_ref": "C1",
                   "quantity": 2, "hold_seconds": 600, "vendor": "dell"}),
            json!(["vendor", "quantity", "hold_seconds"]),
        ),
        (
            json!({"order_ref": "IDEM-1", "site": "par1", "profile": "epyc", "customer_ref": "C1",
                   "segment": "enterprise"}),
            json!(["segment"]),
        ),
    ] {
        let (status, answer) = app.reserve(&app.org.token, other.clone()).await;
        assert_eq!(status, 422, "{other}: {answer}");
        assert_eq!(answer["error"], "idempotency_mismatch", "{answer}");
        assert_eq!(answer["fields"], fields, "{other}: {answer}");
    }
    assert_eq!(written().await, before, "nothing written");
    let (status, still) = app.reserve(&app.org.token, first).await;
    assert_eq!(
        (status, &still["id"]),
        (StatusCode::OK, &held["id"]),
        "{still}"
    );
    assert_eq!(still["machine"]["asset_tag"], "IM-1");
}
