//! F3 for every write of the API: one write path (a lost connection once
//! sent is `503 outcome_unknown`, class 40 is `503` with `Retry-After`),
//! replays that answer what happened (orders, services, extensions to an
//! absolute deadline), and the cap on every hold (R14).

use std::collections::BTreeSet;

use poolkeeper::api::write::{Shape, write};
use poolkeeper::error::ApiError;
use serde_json::{Value, json};

use crate::helpers::FakeMachine;
use crate::helpers::{TestApp, spawn_app, spawn_app_with};

/// Sends `body` to `url` with `method` and the org's full token.
async fn send(app: &TestApp, method: &str, path: &str, body: Option<&Value>) -> reqwest::Response {
    let url = app.url(path);
    let req = match method {
        "put" => app.http.put(url),
        "delete" => app.http.delete(url),
        _ => app.http.post(url),
    }
    .bearer_auth(&app.org.token);
    let req = match body {
        Some(b) => req.json(b),
        None => req,
    };
    req.send().await.expect("an answer")
}

async fn ok_json(resp: reqwest::Response, status: u16) -> Value {
    let got = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert_eq!(got, status, "{body}");
    body
}

/// `[{id, fence}]` of an order's body (or of one reservation's).
fn named(order: &Value) -> Vec<Value> {
    match order["reservations"].as_array() {
        Some(rs) => rs
            .iter()
            .map(|r| json!({"id": r["id"], "fence": r["fence"]}))
            .collect(),
        None => vec![json!({"id": order["id"], "fence": order["fence"]})],
    }
}

/// One write request of the walk: its document path and method, the URL
/// and body to send, and the answer when its backend dies mid-statement.
struct WriteCase {
    path: &'static str,
    method: &'static str,
    url: String,
    body: Option<Value>,
    /// `outcome_unknown` for a statement committed on its own;
    /// `unavailable` for a statement of a transaction whose COMMIT was
    /// never sent (nothing can have been written).
    answer: &'static str,
}

/// The write operations of the published document: every method but GET.
pub(crate) async fn write_operations(app: &TestApp) -> BTreeSet<(String, String)> {
    let doc: Value = app
        .http
        .get(app.url("/api/openapi.json"))
        .send()
        .await
        .expect("document")
        .json()
        .await
        .expect("json");
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            if matches!(method.as_str(), "post" | "put" | "patch" | "delete") {
                ops.insert((path.clone(), method.clone()));
            }
        }
    }
    ops
}

/// F3 for every write route: its statement is sent and waits (on table
/// locks the test holds), its backend is terminated, and the answer is
/// `503` with `Retry-After`, valid by the document: `outcome_unknown` for a
/// write whose statement commits on its own (the client cannot tell the
/// wait from its commit's), `unavailable` for one whose statement runs in a
/// transaction whose COMMIT was never sent (nothing was written). The
/// retry, unchanged, then does it (here the first attempt had not
/// committed). A write route of the document without a case fails the
/// test, so a new write must come here and through `api::write`;
/// `lost_commits.rs` kills each at its commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_route_whose_backend_dies_mid_statement_answers_503() {
    let app = spawn_app_with(|s| s.webhook_allow_private = true).await;
    // A second profile, retired: what a declaration of substitutes names.
    FakeMachine::new()
        .tag("W-BIG")
        .profile("epyc-big")
        .status("retired")
        .create(&app.pool, app.org.id)
        .await;
    for i in 0..12 {
        FakeMachine::new()
            .tag(&format!("W-{i:02}"))
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    let convert_one = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-W-CONVERT", "site": "par1", "profile": "epyc", "quantity": 1}),
        )
        .await;
    let cancel_one = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-W-CANCEL", "site": "par1", "profile": "epyc", "quantity": 1}),
        )
        .await;
    let extend_one = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-W-EXTEND", "site": "par1", "profile": "epyc", "quantity": 1}),
        )
        .await;
    let convert_two = app.reserve_created(&app.org.token, json!({"order_ref": "ORD-W-CONVERT2", "site": "par1", "profile": "epyc", "quantity": 2})).await;
    let cancel_two = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-W-CANCEL2", "site": "par1", "profile": "epyc", "quantity": 2}),
        )
        .await;
    let extend_two = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-W-EXTEND2", "site": "par1", "profile": "epyc", "quantity": 2}),
        )
        .await;
    let served = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-W-SERVED", "site": "par1", "profile": "epyc", "quantity": 1}),
        )
        .await;
    let link = ok_json(
        send(
            &app,
            "post",
            &format!("/api/v1/reservations/{}/convert", served["id"]),
            Some(&json!({"fence": served["fence"], "service_ref": "SRV-W-END"})),
        )
        .await,
        200,
    )
    .await;
    // A hold to move, and spares for it and for the reserve case.
    for i in 12..15 {
        FakeMachine::new()
            .tag(&format!("W-{i:02}"))
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    let moving = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-W-MOVE", "site": "par1", "profile": "epyc", "quantity": 1}),
        )
        .await;
    let until = (chrono::Utc::now() + chrono::Duration::seconds(1200))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let items = |order: &Value, prefix: &str| -> Vec<Value> {
        named(order)
            .into_iter()
            .enumerate()
            .map(|(i, mut n)| {
                n["service_ref"] = json!(format!("{prefix}-{i}"));
                n
            })
            .collect()
    };
    let cases = vec![
        WriteCase {
            path: "/api/v1/machines/{asset_tag}",
            method: "put",
            url: "/api/v1/machines/W-NEW".into(),
            body: Some(
                json!({"site": "par1", "vendor": "dell", "profile": "epyc", "status": "maintenance"}),
            ),
            answer: "outcome_unknown",
        },
        WriteCase {
            path: "/api/v1/reservations",
            method: "post",
            url: "/api/v1/reservations".into(),
            body: Some(json!({"order_ref": "ORD-W-NEW", "site": "par1", "profile": "epyc"})),
            answer: "outcome_unknown",
        },
        WriteCase {
            path: "/api/v1/reservations/{id}/convert",
            method: "post",
            url: format!("/api/v1/reservations/{}/convert", convert_one["id"]),
            body: Some(json!({"fence": convert_one["fence"], "service_ref": "SRV-W-1"})),
            answer: "outcome_unknown",
        },
        WriteCase {
            path: "/api/v1/reservations/{id}/cancel",
            method: "post",
            url: format!("/api/v1/reservations/{}/cancel", cancel_one["id"]),
            body: Some(json!({"fence": cancel_one["fence"], "reason": "customer left"})),
            answer: "outcome_unknown",
        },
        WriteCase {
            path: "/api/v1/reservations/{id}/extend",
            method: "post",
            url: format!("/api/v1/reservations/{}/extend", extend_one["id"]),
            body: Some(json!({"fence": extend_one["fence"], "until": until})),
            answer: "outcome_unknown",
        },
        WriteCase {
            path: "/api/v1/orders/{order_ref}/convert",
            method: "post",
            url: "/api/v1/orders/ORD-W-CONVERT2/convert".into(),
            body: Some(json!({"reservations": items(&convert_two, "SRV-W2")})),
            answer: "outcome_unknown",
        },
        WriteCase {
            path: "/api/v1/orders/{order_ref}/cancel",
            method: "post",
            url: "/api/v1/orders/ORD-W-CANCEL2/cancel".into(),
            body: Some(json!({"reservations": named(&cancel_two), "reason": "customer left"})),
            answer: "outcome_unknown",
        },
        WriteCase {
            path: "/api/v1/orders/{order_ref}/extend",
            method: "post",
            url: "/api/v1/orders/ORD-W-EXTEND2/extend".into(),
            body: Some(json!({"reservations": named(&extend_two), "until": until})),
            answer: "outcome_unknown",
        },
        WriteCase {
            path: "/api/v1/services/{id}/end",
            method: "post",
            url: format!("/api/v1/services/{}/end", link["service"]["id"]),
            body: None,
            answer: "unavailable",
        },
        WriteCase {
            path: "/api/v1/webhook",
            method: "put",
            url: "/api/v1/webhook".into(),
            body: Some(json!({"url": "http://127.0.0.1:8081/hooks/poolkeeper"})),
            answer: "unavailable",
        },
        // After the PUT above: there is a webhook to delete.
        WriteCase {
            path: "/api/v1/webhook",
            method: "delete",
            url: "/api/v1/webhook".into(),
            body: None,
            answer: "unavailable",
        },
        WriteCase {
            path: "/api/v1/headroom",
            method: "put",
            url: "/api/v1/headroom".into(),
            body: Some(
                json!({"site": "par1", "profile": "epyc", "segment": "enterprise", "machines": 2}),
            ),
            answer: "unavailable",
        },
        WriteCase {
            path: "/api/v1/substitutes",
            method: "put",
            url: "/api/v1/substitutes".into(),
            body: Some(json!({"profile": "epyc", "substitutes": ["epyc-big"]})),
            answer: "unavailable",
        },
        WriteCase {
            path: "/api/v1/status-changes",
            method: "post",
            url: "/api/v1/status-changes".into(),
            body: Some(
                json!({"asset_tags": [moving["machine"]["asset_tag"]], "status": "maintenance"}),
            ),
            answer: "unavailable",
        },
    ];
    let covered: BTreeSet<(String, String)> = cases
        .iter()
        .map(|c| (c.path.to_owned(), c.method.to_owned()))
        .collect();
    assert_eq!(
        covered,
        write_operations(&app).await,
        "every write route of the document has a case here"
    );

    let mut conformance = crate::openapi::Conformance::new(&app).await;
    for case in &cases {
        let what = format!("{} {}", case.method, case.path);
        // Every table a write of the API writes, locked against writers
        // and row locks (plain reads pass): the write's statement waits.
        let mut blocker = app.db.connection().await;
        sqlx::query("BEGIN")
            .execute(&mut blocker)
            .await
            .expect("begin");
        sqlx::query("LOCK TABLE machines, reservations, service_links, webhooks, headroom, substitutes IN EXCLUSIVE MODE")
            .execute(&mut blocker)
            .await
            .expect("lock");
        let request = {
            let http = app.http.clone();
            let token = app.org.token.clone();
            let url = app.url(&case.url);
            let method = case.method;
            let body = case.body.clone();
            tokio::spawn(async move {
                let req = match method {
                    "put" => http.put(url),
                    "delete" => http.delete(url),
                    _ => http.post(url),
                }
                .bearer_auth(token);
                let req = match body {
                    Some(b) => req.json(&b),
                    None => req,
                };
                req.send().await.expect("an answer")
            })
        };
        crate::helpers::terminate_session_where(
            &app.pool,
            "wait_event_type = 'Lock' AND application_name = 'poolkeeper' AND pid <> pg_backend_pid()",
        )
        .await;
        let resp = request.await.expect("the request task");
        let status = resp.status().as_u16();
        let retry_after = resp.headers().get("retry-after").is_some();
        let answer: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 503, "{what}: {answer}");
        assert!(retry_after, "{what}: Retry-After");
        assert_eq!(answer["error"], case.answer, "{what}: {answer}");
        conformance.record(case.path, case.method, 503, retry_after, &answer);
        sqlx::query("ROLLBACK")
            .execute(&mut blocker)
            .await
            .expect("rollback");
        // Not committed here (the statement was waiting): the retry,
        // unchanged, does it now.
        let retry = send(&app, case.method, &case.url, case.body.as_ref()).await;
        let status = retry.status().as_u16();
        let answer: Value = retry.json().await.unwrap_or(Value::Null);
        assert!(
            (200..300).contains(&status),
            "{what} retried: {status} {answer}"
        );
    }
    assert!(
        conformance.failures.is_empty(),
        "{:?}",
        conformance.failures
    );
}

/// F3: SQLSTATE class 40 (here a deadlock and a serialization failure,
/// raised by PostgreSQL) on the write path is `503 unavailable` with
/// `Retry-After`: the transaction was rolled back, nothing was written, and
/// the same request again is safe. Never `500`. 40003 (statement completion
/// unknown) is `outcome_unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_40_on_a_write_is_503_with_retry_after_never_500() {
    let app = spawn_app().await;
    for (code, shape, answer) in [
        ("40P01", Shape::Statement, "unavailable"),
        ("40001", Shape::Transaction, "unavailable"),
        ("40003", Shape::Statement, "outcome_unknown"),
    ] {
        let sql = format!(
            "DO $$ BEGIN RAISE EXCEPTION 'raised for the test' USING ERRCODE = '{code}'; END $$"
        );
        let err = write(&app.pool, shape, async |conn| {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                .execute(conn)
                .await
                .map(|_| ())
        })
        .await
        .expect_err("raised");
        assert_eq!(err.code(), answer, "{code}: {err:?}");
        let resp = actix_web::ResponseError::error_response(&err);
        assert_eq!(resp.status().as_u16(), 503, "{code}");
        assert!(resp.headers().contains_key("retry-after"), "{code}");
        // And the same error met outside the write path (a read) is 503 too.
        let read = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&app.pool)
            .await
            .expect_err("raised");
        assert!(
            matches!(
                ApiError::from(read),
                ApiError::Unavailable(_) | ApiError::OutcomeUnknown(_)
            ),
            "{code}"
        );
    }
}

/// F3: a connection lost on a statement before the COMMIT was sent left
/// nothing written: `503 unavailable` ("nothing was written"), on the API's
/// write path in a transaction and on the dashboard's; only a statement
/// committed on its own (or a COMMIT) is `outcome_unknown`. The statement
/// here ends its own session (SQLSTATE 57P01, or the broken connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_before_the_commit_was_sent_is_unavailable_not_outcome_unknown() {
    let app = spawn_app().await;
    let die = async |conn: &mut sqlx::PgConnection| {
        sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
            .execute(conn)
            .await
            .map(|_| ())
    };
    for (shape, answer) in [
        (Shape::Transaction, "unavailable"),
        (Shape::Statement, "outcome_unknown"),
    ] {
        let err = write(&app.pool, shape, die)
            .await
            .expect_err("its session ended");
        assert_eq!(err.code(), answer, "{shape:?}: {err:?}");
        let resp = actix_web::ResponseError::error_response(&err);
        assert_eq!(resp.status().as_u16(), 503, "{shape:?}");
        assert!(resp.headers().contains_key("retry-after"), "{shape:?}");
    }
    // The same error met outside a commit, on the dashboard: the page says
    // nothing was changed.
    let mut tx = app.pool.begin().await.expect("begin");
    let lost = sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
        .execute(&mut *tx)
        .await
        .expect_err("its session ended");
    drop(tx);
    let page = poolkeeper::dashboard::DashError::from(lost);
    assert!(
        matches!(page, poolkeeper::dashboard::DashError::Unavailable(_)),
        "{page:?}"
    );
    assert!(page.to_string().contains("nothing was changed"), "{page}");
}

/// F3 for orders (R13): an order's convert or cancel retried unchanged
/// after it committed answers `200` with the order as that action left it;
/// other service refs by the same caller are `422 idempotency_mismatch`;
/// another action or another actor stay `409 not_held`; a convert replayed
/// after its service ended shows the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_action_replayed_answers_200_with_the_order_it_left() {
    let app = spawn_app().await;
    for i in 0..6 {
        FakeMachine::new()
            .tag(&format!("R-{i}"))
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    let mut conformance = crate::openapi::Conformance::new(&app).await;
    let order = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-R-CONVERT", "site": "par1", "profile": "epyc", "quantity": 2}),
        )
        .await;
    let items: Vec<Value> = named(&order)
        .into_iter()
        .enumerate()
        .map(|(i, mut n)| {
            n["service_ref"] = json!(format!("SRV-R-{i}"));
            n
        })
        .collect();
    let convert = json!({ "reservations": items });
    let url = "/api/v1/orders/ORD-R-CONVERT/convert";
    let first = ok_json(send(&app, "post", url, Some(&convert)).await, 200).await;
    let replay = ok_json(send(&app, "post", url, Some(&convert)).await, 200).await;
    assert_eq!(
        first, replay,
        "the replay answers the order as the convert left it"
    );
    conformance.record(
        "/api/v1/orders/{order_ref}/convert",
        "post",
        200,
        false,
        &replay,
    );
    // Other service refs under the same fences: another request.
    let mut other = convert.clone();
    other["reservations"][0]["service_ref"] = json!("SRV-R-OTHER");
    let refused = ok_json(send(&app, "post", url, Some(&other)).await, 422).await;
    assert_eq!(refused["error"], "idempotency_mismatch", "{refused}");
    // A cancel of the converted order: not this action either.
    let cancel_converted = json!({"reservations": named(&order), "reason": "too late"});
    let refused = ok_json(
        send(
            &app,
            "post",
            "/api/v1/orders/ORD-R-CONVERT/cancel",
            Some(&cancel_converted),
        )
        .await,
        409,
    )
    .await;
    assert_eq!(refused["error"], "not_held", "{refused}");
    // The service of slot 1 ends; the replay shows it as it is now.
    let service = first["reservations"][0]["service"]["id"].clone();
    ok_json(
        send(
            &app,
            "post",
            &format!("/api/v1/services/{service}/end"),
            None,
        )
        .await,
        200,
    )
    .await;
    let replay = ok_json(send(&app, "post", url, Some(&convert)).await, 200).await;
    assert!(
        replay["reservations"][0]["service"]["ended_at"].is_string(),
        "{replay}"
    );
    assert!(
        replay["reservations"][1]["service"]["ended_at"].is_null(),
        "{replay}"
    );
    conformance.record(
        "/api/v1/orders/{order_ref}/convert",
        "post",
        200,
        false,
        &replay,
    );

    // Cancel, replayed.
    let order = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-R-CANCEL", "site": "par1", "profile": "epyc", "quantity": 2}),
        )
        .await;
    let cancel = json!({"reservations": named(&order), "reason": "customer left"});
    let url = "/api/v1/orders/ORD-R-CANCEL/cancel";
    let first = ok_json(send(&app, "post", url, Some(&cancel)).await, 200).await;
    let replay = ok_json(send(&app, "post", url, Some(&cancel)).await, 200).await;
    assert_eq!(first, replay);
    assert!(
        replay["reservations"]
            .as_array()
            .expect("reservations")
            .iter()
            .all(|r| r["state"] == "cancelled"),
        "{replay}"
    );
    // With a stale fence: still stale_fence, checked first.
    let mut stale = cancel.clone();
    stale["reservations"][1]["fence"] = json!(-1);
    let refused = ok_json(send(&app, "post", url, Some(&stale)).await, 409).await;
    assert_eq!(refused["error"], "stale_fence", "{refused}");

    // A convert replayed through the reservation after its service ended.
    let one = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-R-ONE", "site": "par1", "profile": "epyc", "quantity": 1}),
        )
        .await;
    let body = json!({"fence": one["fence"], "service_ref": "SRV-R-ONE"});
    let url = format!("/api/v1/reservations/{}/convert", one["id"]);
    let first = ok_json(send(&app, "post", &url, Some(&body)).await, 200).await;
    ok_json(
        send(
            &app,
            "post",
            &format!("/api/v1/services/{}/end", first["service"]["id"]),
            None,
        )
        .await,
        200,
    )
    .await;
    let replay = ok_json(send(&app, "post", &url, Some(&body)).await, 200).await;
    assert!(replay["service"]["ended_at"].is_string(), "{replay}");
    assert_eq!(replay["service"]["id"], first["service"]["id"]);
    conformance.record(
        "/api/v1/reservations/{id}/convert",
        "post",
        200,
        false,
        &replay,
    );
    assert!(
        conformance.failures.is_empty(),
        "{:?}",
        conformance.failures
    );
}

/// R14 and F3: an extension to an absolute deadline (`until`) answers that
/// deadline, and retried unchanged answers `200` with the same one, for a
/// reservation and for an order; past the cap it is `409
/// hold_cap_exceeded` naming the latest deadline allowed; `seconds` and
/// `until` together, or neither, are `400`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_until_a_deadline_retried_answers_the_same_deadline() {
    let app = spawn_app().await;
    for i in 0..3 {
        FakeMachine::new()
            .tag(&format!("U-{i}"))
            .profile("epyc")
            .create(&app.pool, app.org.id)
            .await;
    }
    let mut conformance = crate::openapi::Conformance::new(&app).await;
    let cap = i64::from(app.settings.hold_max_seconds);
    let at = |s: i64| {
        (chrono::Utc::now() + chrono::Duration::seconds(s))
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    let parse = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v.as_str().expect("a date"))
            .expect("rfc 3339")
            .with_timezone(&chrono::Utc)
    };

    let one = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-U-ONE", "site": "par1", "profile": "epyc", "quantity": 1}),
        )
        .await;
    let url = format!("/api/v1/reservations/{}/extend", one["id"]);
    let until = at(cap / 2);
    let body = json!({"fence": one["fence"], "until": until});
    let first = ok_json(send(&app, "post", &url, Some(&body)).await, 200).await;
    assert_eq!(parse(&first["expires_at"]), parse(&json!(until)), "{first}");
    assert_eq!(first["fence"], one["fence"]);
    let retry = ok_json(send(&app, "post", &url, Some(&body)).await, 200).await;
    assert_eq!(retry["expires_at"], first["expires_at"], "{retry}");
    conformance.record(
        "/api/v1/reservations/{id}/extend",
        "post",
        200,
        false,
        &retry,
    );
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservation_events WHERE reservation_id = $1 AND kind = 'extended'",
    )
    .bind(one["id"].as_i64().expect("id"))
    .fetch_one(&app.pool)
    .await
    .expect("events");
    assert_eq!(events, 1, "the retry wrote nothing");

    // Past the cap: 409 naming the latest deadline allowed, nothing moved.
    let far = json!({"fence": one["fence"], "until": at(cap + 600)});
    let refused = ok_json(send(&app, "post", &url, Some(&far)).await, 409).await;
    assert_eq!(refused["error"], "hold_cap_exceeded", "{refused}");
    let created = parse(&one["created_at"]);
    assert_eq!(
        parse(&refused["latest_expires_at"]),
        created + chrono::Duration::seconds(cap),
        "{refused}"
    );
    conformance.record(
        "/api/v1/reservations/{id}/extend",
        "post",
        409,
        false,
        &refused,
    );
    // The latest allowed, asked for, is granted.
    let latest = json!({"fence": one["fence"], "until": refused["latest_expires_at"]});
    let granted = ok_json(send(&app, "post", &url, Some(&latest)).await, 200).await;
    assert_eq!(
        granted["expires_at"], refused["latest_expires_at"],
        "{granted}"
    );

    for bad in [
        json!({"fence": one["fence"], "until": at(60), "seconds": 60}),
        json!({"fence": one["fence"]}),
        json!({"fence": one["fence"], "until": "tomorrow"}),
    ] {
        let refused = ok_json(send(&app, "post", &url, Some(&bad)).await, 400).await;
        assert_eq!(refused["error"], "invalid", "{bad}: {refused}");
    }

    // An order of two, extended as a whole, retried.
    let order = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-U-TWO", "site": "par1", "profile": "epyc", "quantity": 2}),
        )
        .await;
    let until = at(cap / 3);
    let body = json!({"reservations": named(&order), "until": until});
    let url = "/api/v1/orders/ORD-U-TWO/extend";
    let first = ok_json(send(&app, "post", url, Some(&body)).await, 200).await;
    let retry = ok_json(send(&app, "post", url, Some(&body)).await, 200).await;
    assert_eq!(first, retry);
    for r in retry["reservations"].as_array().expect("reservations") {
        assert_eq!(parse(&r["expires_at"]), parse(&json!(until)), "{retry}");
    }
    conformance.record(
        "/api/v1/orders/{order_ref}/extend",
        "post",
        200,
        false,
        &retry,
    );
    assert!(
        conformance.failures.is_empty(),
        "{:?}",
        conformance.failures
    );
}

/// R14: the cap is on every hold: a reserve's `hold_seconds` above
/// `POOLKEEPER_HOLD_MAX_SECONDS` is `400` naming the cap and writes
/// nothing, and the served document's maximum is the deployment's cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_seconds_above_the_cap_is_400_naming_it() {
    let app = spawn_app_with(|s| s.hold_max_seconds = 1800).await;
    FakeMachine::new()
        .tag("C-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let resp = send(
        &app,
        "post",
        "/api/v1/reservations",
        Some(&json!({"order_ref": "ORD-C-1", "site": "par1", "profile": "epyc", "hold_seconds": 1801})),
    )
    .await;
    let refused = ok_json(resp, 400).await;
    assert_eq!(refused["error"], "invalid");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("1800"),
        "{refused}"
    );
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 0);
    let resp = send(
        &app,
        "post",
        "/api/v1/reservations",
        Some(&json!({"order_ref": "ORD-C-1", "site": "par1", "profile": "epyc", "hold_seconds": 1800})),
    )
    .await;
    let held = ok_json(resp, 201).await;
    assert_eq!(held["hold_seconds"], 1800);
    let doc: Value = app
        .http
        .get(app.url("/api/openapi.json"))
        .send()
        .await
        .expect("document")
        .json()
        .await
        .expect("json");
    assert_eq!(
        doc.pointer("/components/schemas/ReserveBody/properties/hold_seconds/maximum"),
        Some(&json!(1800))
    );
}
