//! R15: a machine that is not `ready` is never sold. Convert (of one
//! reservation or of an order) refuses with `409 machine_not_ready`, writing
//! nothing; a status change racing a convert either comes after the sale or
//! makes the convert refuse. A hold whose machine leaves `ready` moves to an
//! equivalent machine, or its order is cancelled whole.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::helpers::{PROFILE, SITE};
use crate::helpers::{TestApp, spawn_app};

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

/// Item 1 is proved on its own: with healing off (as for a writer that
/// would bypass it), convert's own check is what refuses.
async fn healing_off(app: &TestApp) {
    sqlx::query("ALTER TABLE machines DISABLE TRIGGER machines_heal_holds")
        .execute(&app.pool)
        .await
        .expect("healing off");
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
    healing_off(&app).await;
    ready(&app, "D-1").await;
    let (status, held) = app
        .post_json(
            "/api/v1/reservations",
            json!({"order_ref": "O-1", "site": SITE, "profile": PROFILE}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    for status in ["broken", "maintenance", "provisioning", "retired"] {
        set_status(&app, "D-1", status).await;
        let before = written(&app).await;
        let (code, body) = app
            .post_json(
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
    let (code, body) = app
        .post_json(
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
    healing_off(&app).await;
    for tag in ["D-1", "D-2", "D-3"] {
        ready(&app, tag).await;
    }
    let (status, order) = app
        .post_json(
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
    let (code, body) = app
        .post_json("/api/v1/orders/O-3/convert", json!({"reservations": items}))
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
    healing_off(&app).await;
    let (mut sold, mut refused) = (0, 0);
    for round in 0..30 {
        let tag = format!("R-{round:02}");
        ready(&app, &tag).await;
        let (status, held) = app
            .post_json(
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
                app.post_json(
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

/// Registers a webhook directly, so that events write outbox rows.
async fn webhook(app: &TestApp) {
    sqlx::query(
        "INSERT INTO webhooks (org_id, url, secret, updated_by)
         VALUES ($1, 'http://192.0.2.1/hook', repeat('s', 32), 'test')",
    )
    .bind(app.org.id)
    .execute(&app.pool)
    .await
    .expect("webhook");
}

/// The outbox's payloads of reservation `id`: (type, machine's asset tag).
async fn deliveries(app: &TestApp, id: &Value) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT payload->>'type', payload->'reservation'->'machine'->>'asset_tag'
           FROM webhook_deliveries WHERE reservation_id = $1 ORDER BY event_id",
    )
    .bind(id.as_i64().expect("id"))
    .fetch_all(&app.pool)
    .await
    .expect("deliveries")
}

#[tokio::test]
async fn a_hold_whose_machine_breaks_moves_to_an_equivalent_machine() {
    let app = spawn_app().await;
    webhook(&app).await;
    for tag in ["D-1", "D-2"] {
        ready(&app, tag).await;
    }
    // An equivalent but for the vendor: never a replacement of a dell order.
    let r = app
        .put_machine(&app.org.token, "H-1", SITE, "hpe", PROFILE, "ready")
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let (status, held) = app
        .post_json(
            "/api/v1/reservations",
            json!({"order_ref": "O-1", "site": SITE, "profile": PROFILE, "vendor": "dell"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    assert_eq!(held["machine"]["asset_tag"], "D-1");
    set_status(&app, "D-1", "broken").await;
    let (code, now) = app_get(&app, &format!("/api/v1/reservations/{}", held["id"])).await;
    assert_eq!(code, StatusCode::OK);
    for k in [
        "id",
        "fence",
        "order_ref",
        "expires_at",
        "created_at",
        "state",
    ] {
        assert_eq!(now[k], held[k], "{k} kept: {now}");
    }
    assert_eq!(now["machine"]["asset_tag"], "D-2", "{now}");
    let reason = now["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("D-2") && reason.contains("replaced D-1"),
        "{reason}"
    );
    let events: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT kind, actor, coalesce(detail, '') FROM reservation_events WHERE reservation_id = $1 ORDER BY id",
    )
    .bind(held["id"].as_i64().expect("id"))
    .fetch_all(&app.pool)
    .await
    .expect("events");
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(
        (events[1].0.as_str(), events[1].1.as_str()),
        ("machine_replaced", "checkout")
    );
    assert!(
        events[1].2.contains("D-1 broken") && events[1].2.contains("moved to D-2"),
        "{events:?}"
    );
    assert_eq!(
        deliveries(&app, &held["id"]).await,
        vec![
            ("reservation.created".to_owned(), "D-1".to_owned()),
            ("reservation.machine_replaced".to_owned(), "D-2".to_owned())
        ]
    );
    // D-2 breaks too: only the hpe machine is left, which the order did not
    // ask for: cancelled, in words, by the one who changed the status.
    set_status(&app, "D-2", "maintenance").await;
    let (_, gone) = app_get(&app, &format!("/api/v1/reservations/{}", held["id"])).await;
    assert_eq!(gone["state"], "cancelled", "{gone}");
    assert_eq!(gone["ended_by"], "checkout", "{gone}");
    assert_eq!(
        gone["end_reason"], "machine D-2 maintenance; no equivalent machine in par1",
        "{gone}"
    );
    // The hold that moved converts on its new machine; no hold is left on a
    // machine that is not ready.
    let stray: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservations r JOIN machines m ON m.id = r.machine_id
          WHERE r.state = 'held' AND m.status <> 'ready'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("stray");
    assert_eq!(stray, 0);
}

#[tokio::test]
async fn an_order_stays_whole_moved_member_by_member_or_cancelled_whole() {
    let app = spawn_app().await;
    for tag in ["D-1", "D-2", "D-3"] {
        ready(&app, tag).await;
    }
    let (status, order) = app
        .post_json(
            "/api/v1/reservations",
            json!({"order_ref": "O-2", "site": SITE, "profile": PROFILE, "quantity": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    let tags = || async {
        sqlx::query_as::<_, (String, String)>(
            "SELECT r.state, m.asset_tag FROM reservations r JOIN machines m ON m.id = r.machine_id
              WHERE r.order_ref = 'O-2' ORDER BY r.slot",
        )
        .fetch_all(&app.pool)
        .await
        .expect("order")
    };
    assert_eq!(
        tags().await,
        vec![("held".into(), "D-1".into()), ("held".into(), "D-2".into())]
    );
    set_status(&app, "D-1", "broken").await;
    assert_eq!(
        tags().await,
        vec![("held".into(), "D-3".into()), ("held".into(), "D-2".into())]
    );
    set_status(&app, "D-2", "broken").await;
    let after: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT state, ended_by, end_reason FROM reservations WHERE order_ref = 'O-2' ORDER BY slot",
    )
    .fetch_all(&app.pool)
    .await
    .expect("order");
    let words = "machine D-2 broken; no equivalent machine in par1";
    assert_eq!(
        after,
        vec![
            ("cancelled".into(), "checkout".into(), words.into()),
            ("cancelled".into(), "checkout".into(), words.into())
        ]
    );
}

async fn app_get(app: &TestApp, path: &str) -> (StatusCode, Value) {
    let r = app
        .http
        .get(app.url(path))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("request");
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The invariants of R1, R13 and R15 after every round: no machine held
/// twice, no order partly held, every hold on a ready machine that matches
/// the order's frozen spec.
pub(crate) async fn invariants(app: &TestApp, round: usize) {
    let (twice, partly, off_ready): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM (SELECT machine_id FROM reservations WHERE state = 'held'
                                        GROUP BY machine_id HAVING count(*) > 1) t),
                (SELECT count(*) FROM (SELECT order_ref FROM reservations GROUP BY org_id, order_ref
                                        HAVING count(*) FILTER (WHERE state = 'held') NOT IN (0, max(quantity))) p),
                (SELECT count(*) FROM reservations r JOIN machines m ON m.id = r.machine_id
                  WHERE r.state = 'held'
                    AND (m.status <> 'ready' OR m.site <> r.spec->>'site' OR m.profile <> r.spec->>'profile'
                         OR m.vendor <> coalesce(r.spec->>'vendor', m.vendor)))",
    )
    .fetch_one(&app.pool)
    .await
    .expect("invariants");
    assert_eq!((twice, partly, off_ready), (0, 0, 0), "round {round}");
}

/// A status change racing reserves on the same site, 10 rounds: the hold
/// moves only to a machine nobody else holds (R1), or its order is
/// cancelled; the reserves take what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_status_change_racing_reserves_never_takes_a_held_machine() {
    let app = Arc::new(spawn_app().await);
    for round in 0..10 {
        for i in 0..4 {
            ready(&app, &format!("S{round}-{i}")).await;
        }
        let (status, held) = app
            .post_json(
                "/api/v1/reservations",
                json!({"order_ref": format!("H-{round}"), "site": SITE, "profile": PROFILE}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{held}");
        let tag = held["machine"]["asset_tag"]
            .as_str()
            .expect("tag")
            .to_owned();
        let barrier = Arc::new(Barrier::new(4));
        let mut reserves = Vec::new();
        for k in 0..3 {
            let (app, barrier) = (app.clone(), barrier.clone());
            reserves.push(tokio::spawn(async move {
                barrier.wait().await;
                app.post_json("/api/v1/reservations",
                    json!({"order_ref": format!("R-{round}-{k}"), "site": SITE, "profile": PROFILE}),
                )
                .await
                .0
            }));
        }
        let change = {
            let (app, barrier) = (app.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                set_status(&app, &tag, "maintenance").await;
            })
        };
        change.await.expect("status task");
        let mut created = 0;
        for r in reserves {
            let code = r.await.expect("reserve task");
            assert!(
                code == StatusCode::CREATED || code == StatusCode::CONFLICT,
                "round {round}: {code}"
            );
            created += i64::from(code == StatusCode::CREATED);
        }
        invariants(&app, round).await;
        // Three free machines for three reserves and one hold to move: all
        // four end up held, or the hold's order was cancelled for lack of one.
        let (state,): (String,) = sqlx::query_as("SELECT state FROM reservations WHERE id = $1")
            .bind(held["id"].as_i64().expect("id"))
            .fetch_one(&app.pool)
            .await
            .expect("hold");
        match state.as_str() {
            "held" => assert!(
                created <= 2,
                "round {round}: {created} created beside the moved hold"
            ),
            "cancelled" => assert_eq!(
                created, 3,
                "round {round}: cancelled while a machine was free"
            ),
            other => panic!("round {round}: {other}"),
        }
        // Clear the round: every machine out of the pool.
        sqlx::query("UPDATE reservations SET state = 'cancelled', ended_at = now(), ended_by = 't', end_reason = 't' WHERE state = 'held'")
            .execute(&app.pool)
            .await
            .expect("clear");
        sqlx::query("UPDATE machines SET status = 'retired'")
            .execute(&app.pool)
            .await
            .expect("retire");
    }
}

/// Two status changes of two machines of one order at once, 15 rounds, with
/// one spare machine: one member moves to the spare, the other then finds
/// none and the order is cancelled whole; never a deadlock, never an order
/// partly held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_status_changes_of_one_order_keep_it_whole() {
    let app = Arc::new(spawn_app().await);
    for round in 0..15 {
        for i in 0..3 {
            ready(&app, &format!("T{round}-{i}")).await;
        }
        let (status, order) = app.post_json("/api/v1/reservations",
            json!({"order_ref": format!("O-{round}"), "site": SITE, "profile": PROFILE, "quantity": 2}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{order}");
        let barrier = Arc::new(Barrier::new(2));
        let mut tasks = Vec::new();
        for r in order["reservations"].as_array().expect("reservations") {
            let tag = r["machine"]["asset_tag"].as_str().expect("tag").to_owned();
            let (app, barrier) = (app.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                set_status(&app, &tag, "broken").await;
            }));
        }
        for t in tasks {
            t.await.expect("status task");
        }
        invariants(&app, round).await;
        let states: Vec<String> =
            sqlx::query_scalar("SELECT state FROM reservations WHERE order_ref = $1 ORDER BY slot")
                .bind(format!("O-{round}"))
                .fetch_all(&app.pool)
                .await
                .expect("order");
        assert_eq!(states, vec!["cancelled", "cancelled"], "round {round}");
        sqlx::query("UPDATE machines SET status = 'retired'")
            .execute(&app.pool)
            .await
            .expect("retire");
    }
}

/// The hold and the machine under it, with the last event of the hold.
async fn hold_now(app: &TestApp, id: &Value) -> (String, String, String, String) {
    sqlx::query_as(
        "SELECT m.asset_tag, r.state, e.kind, coalesce(e.detail, '')
           FROM reservations r JOIN machines m ON m.id = r.machine_id
           JOIN LATERAL (SELECT kind, detail FROM reservation_events
                          WHERE reservation_id = r.id ORDER BY id DESC LIMIT 1) e ON true
          WHERE r.id = $1",
    )
    .bind(id.as_i64().expect("id"))
    .fetch_one(&app.pool)
    .await
    .expect("hold")
}

/// R15 for hardware: a PUT that changes a held machine's site, profile or
/// the vendor its order named moves the hold to an equivalent machine, as
/// a status change does, and the order converts there; with no equivalent
/// machine the order is cancelled whole, in words; a change the order does
/// not care about (a vendor it did not name) leaves the hold where it is.
#[tokio::test]
async fn a_hold_whose_machine_changes_hardware_moves_or_its_order_is_cancelled() {
    let app = spawn_app().await;
    webhook(&app).await;
    ready(&app, "PK-03").await;
    let held = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-1", "site": SITE, "profile": PROFILE, "vendor": "dell"}),
        )
        .await;
    ready(&app, "PK-04").await;
    let r = app
        .put_machine(&app.org.token, "PK-03", "ams9", "hpe", "tiny-vm", "ready")
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let (tag, state, kind, detail) = hold_now(&app, &held["id"]).await;
    assert_eq!(
        (tag.as_str(), state.as_str(), kind.as_str()),
        ("PK-04", "held", "machine_replaced")
    );
    assert!(
        detail.contains(&format!(
            "machine PK-03 changed (site {SITE} to ams9, vendor dell to hpe, profile {PROFILE} to tiny-vm); moved to PK-04"
        )),
        "{detail}"
    );
    assert_eq!(
        deliveries(&app, &held["id"])
            .await
            .last()
            .map(|d| d.0.as_str()),
        Some("reservation.machine_replaced"),
    );
    let (code, sold) = app
        .post_json(
            &format!("/api/v1/reservations/{}/convert", held["id"]),
            json!({"fence": held["fence"], "service_ref": "svc-1"}),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{sold}");
    assert_eq!(sold["machine"]["asset_tag"], "PK-04", "{sold}");

    // No equivalent machine: the order is cancelled whole, by the PUT's token.
    ready(&app, "PK-05").await;
    let alone = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-2", "site": SITE, "profile": PROFILE, "vendor": "dell"}),
        )
        .await;
    let r = app
        .put_machine(&app.org.token, "PK-05", SITE, "hpe", PROFILE, "ready")
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let (tag, state, kind, detail) = hold_now(&app, &alone["id"]).await;
    assert_eq!(
        (tag.as_str(), state.as_str(), kind.as_str()),
        ("PK-05", "cancelled", "cancelled")
    );
    assert!(
        detail.contains(&format!(
            "machine PK-05 changed (vendor dell to hpe); no equivalent machine in {SITE}"
        )),
        "{detail}"
    );

    // Any vendor: the new vendor still matches, so nothing moves.
    set_status(&app, "PK-05", "retired").await;
    ready(&app, "PK-06").await;
    let any = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "ORD-3", "site": SITE, "profile": PROFILE, "vendor": null}),
        )
        .await;
    let before = written(&app).await;
    let r = app
        .put_machine(&app.org.token, "PK-06", SITE, "hpe", PROFILE, "ready")
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let (tag, state, kind, _) = hold_now(&app, &any["id"]).await;
    assert_eq!(
        (tag.as_str(), state.as_str(), kind.as_str()),
        ("PK-06", "held", "created")
    );
    assert_eq!(written(&app).await, before);
    invariants(&app, 0).await;
}

/// Convert's own check, with healing off (as for a writer that would
/// bypass it): a machine that no longer matches the order's spec is not
/// sold, `409 machine_not_ready`, and nothing is written.
#[tokio::test]
async fn converting_a_machine_that_no_longer_matches_the_order_is_refused() {
    let app = spawn_app().await;
    healing_off(&app).await;
    ready(&app, "D-1").await;
    let held = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": "O-1", "site": SITE, "profile": PROFILE, "vendor": "dell"}),
        )
        .await;
    for (site, vendor, profile) in [
        ("ams9", "dell", PROFILE),
        (SITE, "hpe", PROFILE),
        (SITE, "dell", "tiny-vm"),
    ] {
        let r = app
            .put_machine(&app.org.token, "D-1", site, vendor, profile, "ready")
            .await;
        assert_eq!(r.status(), StatusCode::OK);
        let before = written(&app).await;
        let (code, body) = app
            .post_json(
                &format!("/api/v1/reservations/{}/convert", held["id"]),
                json!({"fence": held["fence"], "service_ref": "svc-1"}),
            )
            .await;
        assert_eq!(
            code,
            StatusCode::CONFLICT,
            "{site} {vendor} {profile}: {body}"
        );
        assert_eq!(body["error"], "machine_not_ready", "{body}");
        assert_eq!(written(&app).await, before, "{site} {vendor} {profile}");
    }
}
