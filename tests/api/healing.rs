//! R15: a machine that is not `ready` is never sold. Convert (of one
//! reservation or of an order) refuses with `409 machine_not_ready`, writing
//! nothing; a status change racing a convert either comes after the sale or
//! makes the convert refuse.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::allocator::{PROFILE, SITE};
use crate::helpers::{TestApp, spawn_app};

async fn post(app: &TestApp, path: &str, body: Value) -> (StatusCode, Value) {
    let r = app
        .http
        .post(app.url(path))
        .bearer_auth(&app.org.token)
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn ready(app: &TestApp, tag: &str) {
    let r = app
        .put_machine(&app.org.token, tag, SITE, "dell", PROFILE, "ready")
        .await;
    assert!(r.status().is_success(), "{}", r.status());
}

async fn set_status(app: &TestApp, tag: &str, status: &str) {
    let r = app
        .put_machine(&app.org.token, tag, SITE, "dell", PROFILE, status)
        .await;
    assert_eq!(r.status(), StatusCode::OK);
}

/// Rows a convert writes: links, ended reservations, events.
async fn written(app: &TestApp) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM service_links),
                (SELECT count(*) FROM reservations WHERE state <> 'held'),
                (SELECT count(*) FROM reservation_events)",
    )
    .fetch_one(&app.pool)
    .await
    .expect("counts")
}

#[tokio::test]
async fn converting_a_machine_that_left_ready_is_refused_and_writes_nothing() {
    let app = spawn_app().await;
    ready(&app, "D-1").await;
    let (status, held) = post(
        &app,
        "/api/v1/reservations",
        json!({"order_ref": "O-1", "site": SITE, "profile": PROFILE}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    for status in ["broken", "maintenance", "provisioning", "retired"] {
        set_status(&app, "D-1", status).await;
        let before = written(&app).await;
        let (code, body) = post(
            &app,
            &format!("/api/v1/reservations/{}/convert", held["id"]),
            json!({"fence": held["fence"], "service_ref": "SVC-1"}),
        )
        .await;
        assert_eq!(code, StatusCode::CONFLICT, "{status}: {body}");
        assert_eq!(body["error"], "machine_not_ready", "{body}");
        assert_eq!(body["asset_tag"], "D-1", "{body}");
        assert_eq!(body["reservation_id"], held["id"], "{body}");
        assert!(
            body["message"].as_str().is_some_and(|m| m.contains("D-1")),
            "{body}"
        );
        assert_eq!(written(&app).await, before, "{status}: nothing written");
    }
    // Ready again: the same hold converts.
    set_status(&app, "D-1", "ready").await;
    let (code, body) = post(
        &app,
        &format!("/api/v1/reservations/{}/convert", held["id"]),
        json!({"fence": held["fence"], "service_ref": "SVC-1"}),
    )
    .await;
    assert_eq!(
        (code, body["state"].as_str()),
        (StatusCode::OK, Some("converted")),
        "{body}"
    );
}

#[tokio::test]
async fn an_order_with_one_machine_not_ready_is_not_converted_at_all() {
    let app = spawn_app().await;
    for tag in ["D-1", "D-2", "D-3"] {
        ready(&app, tag).await;
    }
    let (status, order) = post(
        &app,
        "/api/v1/reservations",
        json!({"order_ref": "O-3", "site": SITE, "profile": PROFILE, "quantity": 3}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    let rs = order["reservations"]
        .as_array()
        .expect("reservations")
        .clone();
    let second = rs[1]["machine"]["asset_tag"]
        .as_str()
        .expect("tag")
        .to_owned();
    set_status(&app, &second, "broken").await;
    let items: Vec<Value> = rs
        .iter()
        .enumerate()
        .map(
            |(i, r)| json!({"id": r["id"], "fence": r["fence"], "service_ref": format!("SVC-{i}")}),
        )
        .collect();
    let before = written(&app).await;
    let (code, body) = post(
        &app,
        "/api/v1/orders/O-3/convert",
        json!({"reservations": items}),
    )
    .await;
    assert_eq!(code, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"], "machine_not_ready", "{body}");
    assert_eq!(body["asset_tag"], second.as_str(), "{body}");
    assert_eq!(body["reservation_id"], rs[1]["id"], "{body}");
    assert_eq!(written(&app).await, before, "nothing written");
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservations WHERE order_ref = 'O-3' AND state = 'held'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("held");
    assert_eq!(held, 3, "the order is still held whole");
}

/// A status change and a convert of one machine, released together, 30
/// rounds: either the convert committed first (its link is dated before the
/// status change, which waited for the machine row), or it is refused with
/// `machine_not_ready` and wrote nothing; never a sale after the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_status_change_racing_a_convert_never_lets_a_sale_follow_it() {
    let app = Arc::new(spawn_app().await);
    let (mut sold, mut refused) = (0, 0);
    for round in 0..30 {
        let tag = format!("R-{round:02}");
        ready(&app, &tag).await;
        let (status, held) = post(
            &app,
            "/api/v1/reservations",
            json!({"order_ref": format!("O-{round}"), "site": SITE, "profile": PROFILE}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{held}");
        assert_eq!(held["machine"]["asset_tag"], tag.as_str());
        let barrier = Arc::new(Barrier::new(2));
        let change = {
            let (app, barrier, tag) = (app.clone(), barrier.clone(), tag.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                set_status(&app, &tag, "broken").await;
            })
        };
        let convert = {
            let (app, barrier, held) = (app.clone(), barrier.clone(), held.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                post(
                    &app,
                    &format!("/api/v1/reservations/{}/convert", held["id"]),
                    json!({"fence": held["fence"], "service_ref": format!("SVC-{round}")}),
                )
                .await
            })
        };
        change.await.expect("status task");
        let (code, body) = convert.await.expect("convert task");
        let (links, before_change, state): (i64, Option<bool>, String) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM service_links s WHERE s.reservation_id = r.id),
                    (SELECT s.created_at < m.updated_at FROM service_links s WHERE s.reservation_id = r.id),
                    r.state
               FROM reservations r JOIN machines m ON m.id = r.machine_id WHERE r.id = $1",
        )
        .bind(held["id"].as_i64().expect("id"))
        .fetch_one(&app.pool)
        .await
        .expect("after the round");
        match (code, body["error"].as_str()) {
            (StatusCode::OK, _) => {
                sold += 1;
                assert_eq!((links, state.as_str()), (1, "converted"), "round {round}");
                assert_eq!(
                    before_change,
                    Some(true),
                    "round {round}: sold before the change"
                );
            }
            (StatusCode::CONFLICT, Some("machine_not_ready")) => {
                refused += 1;
                assert_eq!((links, state.as_str()), (0, "held"), "round {round}");
            }
            other => panic!("round {round}: {other:?} {body}"),
        }
    }
    assert_eq!(sold + refused, 30);
}
