//! R14: extending a hold, over HTTP and against its races (the sweep at the
//! deadline, convert and cancel, another extension), each released by a
//! barrier on separate connections, with the invariants checked in SQL.

use std::sync::Arc;
use std::time::Duration;

use poolkeeper::allocator;
use poolkeeper::db::Db;
use poolkeeper::lease::{self, Claim, SWEEP_KEY};
use poolkeeper::reservations::{self, Named, OrderAction, TransitionError};
use poolkeeper::sweep;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::helpers::FakeMachine;
use crate::helpers::{PROFILE, SITE};
use crate::helpers::{create_org, migrated_db, spawn_app, spawn_app_with};
use crate::orders_of_several::order;

const CAP: u32 = 3600;

/// One extension in its own transaction, settled as the API does.
async fn extend(
    pool: &Db,
    org_id: i64,
    r: Named,
    seconds: u32,
) -> Result<reservations::OrderAfter, TransitionError> {
    let mut tx = pool.begin().await.expect("begin");
    let outcome = reservations::order_transition_on(
        &mut tx,
        org_id,
        None,
        &[r],
        "test",
        OrderAction::Extend {
            seconds,
            until: None,
            cap_seconds: CAP,
            reason: Some("3-D Secure"),
        },
    )
    .await;
    reservations::settle(tx, outcome).await
}

/// A held reservation of one new machine; its id and fence.
async fn held(pool: &Db, org_id: i64, tag: &str) -> Named {
    FakeMachine::new().tag(tag).create(pool, org_id).await;
    match allocator::reserve(pool, org_id, &order(&format!("ORD-{tag}"), 1))
        .await
        .expect("reserve")
    {
        allocator::ReserveOutcome::Created { reservation, .. } => Named {
            id: reservation.id,
            fence: reservation.fence,
        },
        other => panic!("expected a reservation, got {other:?}"),
    }
}

fn at(v: &Value) -> chrono::DateTime<chrono::FixedOffset> {
    chrono::DateTime::parse_from_rfc3339(v.as_str().expect("a timestamp")).expect("rfc3339")
}

/// Over HTTP: an extension keeps the fence and moves the deadline to the
/// seconds asked from the database's clock, with an `extended` event (actor,
/// old and new deadline, reason) and its webhook; past the cap it is `409
/// hold_cap_exceeded` naming the cap; a stale fence is `409 stale_fence`; a
/// reservation past its deadline is `409 expired` and recorded expired by
/// `extension` (R11), then `409 not_held`; bad seconds are `400`; a
/// reservation of an order of several is `409 part_of_order`, and the order
/// extends whole.
#[tokio::test]
async fn extend_over_http() {
    let app = spawn_app_with(|s| s.hold_max_seconds = 1800).await;
    sqlx::query("INSERT INTO webhooks (org_id, url, secret, updated_by) VALUES ($1, 'https://hooks.example/x', repeat('s', 32), 'test')")
        .bind(app.org.id)
        .execute(&app.pool)
        .await
        .expect("a webhook");
    for i in 0..4 {
        FakeMachine::new()
            .tag(&format!("OK-{i}"))
            .create(&app.pool, app.org.id)
            .await;
    }
    let (status, r) = app
        .post_json(
            "/api/v1/reservations",
            json!({"order_ref": "ORD-1", "site": SITE, "profile": PROFILE, "hold_seconds": 60}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_i64().expect("id");
    let path = format!("/api/v1/reservations/{id}/extend");
    for bad in [
        json!({"fence": r["fence"], "seconds": 0}),
        json!({"fence": r["fence"], "seconds": 1.5}),
        json!({"fence": r["fence"]}),
        json!({"fence": r["fence"], "seconds": 60, "reason": " "}),
    ] {
        let (status, _) = app.post_json(&path, bad.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let (status, stale) = app
        .post_json(
            &path,
            json!({"fence": r["fence"].as_i64().unwrap_or(0) + 1, "seconds": 600}),
        )
        .await;
    assert_eq!(
        (status, stale["error"].as_str()),
        (StatusCode::CONFLICT, Some("stale_fence"))
    );
    let (status, ext) = app
        .post_json(
            &path,
            json!({"fence": r["fence"], "seconds": 600, "reason": "bank review"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{ext}");
    assert_eq!(ext["fence"], r["fence"], "the fence does not change");
    assert_eq!(ext["state"], "held");
    let (now, deadline): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT clock_timestamp(), expires_at FROM reservations WHERE id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .expect("deadline");
    assert_eq!(
        at(&ext["expires_at"]).timestamp_micros(),
        deadline.timestamp_micros()
    );
    let ahead = (deadline - now).num_seconds();
    assert!(
        (590..=600).contains(&ahead),
        "600 s from the database's clock: {ahead}"
    );
    let (kind, actor, detail): (String, String, String) = sqlx::query_as(
        "SELECT kind, actor, detail FROM reservation_events WHERE reservation_id = $1 ORDER BY id DESC LIMIT 1",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .expect("event");
    assert_eq!((kind.as_str(), actor.as_str()), ("extended", "checkout"));
    assert!(
        detail.contains("deadline moved from") && detail.ends_with(": bank review"),
        "{detail}"
    );
    let hooks: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM webhook_deliveries WHERE reservation_id = $1 AND payload->>'type' = 'reservation.extended'",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .expect("outbox");
    assert_eq!(hooks, 1, "the webhook reservation.extended");
    // Past the cap (1800 s from creation).
    let (status, cap) = app
        .post_json(&path, json!({"fence": r["fence"], "seconds": 3600}))
        .await;
    assert_eq!(
        (status, cap["error"].as_str()),
        (StatusCode::CONFLICT, Some("hold_cap_exceeded")),
        "{cap}"
    );
    assert_eq!(cap["cap_seconds"], 1800);
    assert_eq!(
        (at(&cap["latest_expires_at"]) - at(&r["created_at"])).num_seconds(),
        1800
    );
    // Past the deadline: refused, and the expiry is written there (R11).
    sqlx::query("UPDATE reservations SET created_at = created_at - interval '1 hour', expires_at = clock_timestamp() - interval '1 second' WHERE id = $1")
        .bind(id)
        .execute(&app.pool)
        .await
        .expect("overdue");
    let (status, late) = app
        .post_json(&path, json!({"fence": r["fence"], "seconds": 60}))
        .await;
    assert_eq!(
        (status, late["error"].as_str()),
        (StatusCode::CONFLICT, Some("expired")),
        "{late}"
    );
    let ended: (String, String) =
        sqlx::query_as("SELECT state, ended_by FROM reservations WHERE id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .expect("state");
    assert_eq!(ended, ("expired".to_owned(), "extension".to_owned()));
    let (status, again) = app
        .post_json(&path, json!({"fence": r["fence"], "seconds": 60}))
        .await;
    assert_eq!(
        (status, again["error"].as_str(), again["state"].as_str()),
        (StatusCode::CONFLICT, Some("not_held"), Some("expired"))
    );
    // An order of several: one reservation alone is refused, the order extends whole.
    let (status, o) = app
        .post_json(
            "/api/v1/reservations",
            json!({"order_ref": "ORD-2", "site": SITE, "profile": PROFILE, "quantity": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{o}");
    let rs = o["reservations"].as_array().expect("reservations").clone();
    let (status, alone) = app
        .post_json(
            &format!("/api/v1/reservations/{}/extend", rs[0]["id"]),
            json!({"fence": rs[0]["fence"], "seconds": 600}),
        )
        .await;
    assert_eq!(
        (status, alone["error"].as_str()),
        (StatusCode::CONFLICT, Some("part_of_order"))
    );
    let named: Vec<Value> = rs
        .iter()
        .map(|r| json!({"id": r["id"], "fence": r["fence"]}))
        .collect();
    let (status, whole) = app
        .post_json(
            "/api/v1/orders/ORD-2/extend",
            json!({"reservations": named, "seconds": 1200}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let deadlines: Vec<&Value> = whole["reservations"]
        .as_array()
        .expect("rs")
        .iter()
        .map(|r| &r["expires_at"])
        .collect();
    assert!(
        deadlines.iter().all(|d| **d == whole["expires_at"]),
        "one deadline: {whole}"
    );
    assert!(at(&whole["expires_at"]) > at(&o["expires_at"]));
}

/// R14 against the sweep at the deadline (R11): 30 holds whose deadlines
/// fall around the moment the barrier releases an extension of each and a
/// sweep of all. For each hold, either the extension won (held, its new
/// deadline, an `extended` event, no expiry) or the sweep did (expired by
/// the sweep, the extension refused `expired` or `not_held`), never both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn extend_against_the_sweep_at_the_deadline() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "deadline", true).await;
    let mandate = match lease::claim(&pool, SWEEP_KEY, "sweeper", Duration::from_secs(60))
        .await
        .expect("claim")
    {
        Claim::Acquired(m) => m,
        Claim::HeldByOther => panic!("the sweep lease is free in a new database"),
    };
    let mut holds = Vec::new();
    for i in 0..30 {
        holds.push(held(&pool, org.id, &format!("D-{i:02}")).await);
    }
    // Deadlines from 1.5 s ago to 1.4 s ahead, by the database's clock.
    sqlx::query(
        "UPDATE reservations SET created_at = clock_timestamp() - interval '10 minutes',
                expires_at = clock_timestamp() + (100 * (right(order_ref, 2)::int - 15)) * interval '1 millisecond'
          WHERE org_id = $1",
    )
    .bind(org.id)
    .execute(&pool)
    .await
    .expect("deadlines around now");
    let barrier = Arc::new(Barrier::new(holds.len() + 1));
    let mut tasks = Vec::new();
    for h in holds.clone() {
        let (pool, barrier) = (pool.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            (h.id, extend(&pool, org.id, h, 600).await)
        }));
    }
    let sweeper = {
        let (pool, barrier) = (pool.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            sweep::expire_batch(&pool, "sweeper", mandate.fence, 500)
                .await
                .expect("sweep")
        })
    };
    let mut extended_ok = std::collections::HashMap::new();
    for t in tasks {
        let (id, outcome) = t.await.expect("task");
        match &outcome {
            Ok(_) => {}
            Err(TransitionError::Expired { .. }) | Err(TransitionError::NotHeld { .. }) => {}
            Err(e) => panic!("reservation {id}: {e:?}"),
        }
        extended_ok.insert(id, outcome.is_ok());
    }
    sweeper.await.expect("sweeper");
    let rows: Vec<(i64, String, Option<String>, i64, i64, bool)> = sqlx::query_as(
        "SELECT r.id, r.state, r.ended_by,
                (SELECT count(*) FROM reservation_events e WHERE e.reservation_id = r.id AND e.kind = 'extended'),
                (SELECT count(*) FROM reservation_events e WHERE e.reservation_id = r.id AND e.kind = 'expired'),
                r.expires_at > clock_timestamp() + interval '500 seconds'
           FROM reservations r WHERE r.org_id = $1",
    )
    .bind(org.id)
    .fetch_all(&pool)
    .await
    .expect("rows");
    let (mut won_by_extension, mut won_by_expiry) = (0, 0);
    for (id, state, ended_by, extended, expired, moved) in rows {
        if extended_ok[&id] {
            assert_eq!(
                (state.as_str(), extended, expired, moved),
                ("held", 1, 0, true),
                "reservation {id}"
            );
            won_by_extension += 1;
        } else {
            assert_eq!(
                (state.as_str(), extended, expired),
                ("expired", 0, 1),
                "reservation {id}"
            );
            assert!(
                matches!(ended_by.as_deref(), Some("sweep") | Some("extension")),
                "{ended_by:?}"
            );
            won_by_expiry += 1;
        }
    }
    // The holds already overdue when the barrier opened expired; those
    // with 1.4 s to go were extended.
    assert!(
        won_by_expiry >= 1 && won_by_extension >= 1,
        "{won_by_expiry} {won_by_extension}"
    );
}

/// R14 against convert and cancel: one wins, the locks order them and the
/// fence they both name decides what the other finds. 20 rounds each.
/// Extension first: both succeed, the `extended` event before the end.
/// Cancel or convert first: the extension is refused `not_held` and
/// writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn extend_against_convert_and_cancel() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "versus", true).await;
    let service = poolkeeper::domain::ServiceRef::parse("SRV-1").expect("ref");
    for round in 0..40 {
        let h = held(&pool, org.id, &format!("V-{round:02}")).await;
        let barrier = Arc::new(Barrier::new(2));
        let ext = {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                extend(&pool, org.id, h, 900).await
            })
        };
        let convert = round % 2 == 0;
        let end = {
            let (pool, barrier, service) = (pool.clone(), barrier.clone(), service.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                if convert {
                    reservations::convert(&pool, org.id, h.id, h.fence, "test", &service)
                        .await
                        .map(|(r, _)| r)
                } else {
                    reservations::cancel(&pool, org.id, h.id, h.fence, "test", "gave up").await
                }
            })
        };
        let ext = ext.await.expect("task");
        let end = end
            .await
            .expect("task")
            .expect("convert or cancel wins or follows");
        let kinds: Vec<String> = sqlx::query_scalar(
            "SELECT kind FROM reservation_events WHERE reservation_id = $1 ORDER BY id",
        )
        .bind(h.id)
        .fetch_all(&pool)
        .await
        .expect("events");
        let last = if convert { "converted" } else { "cancelled" };
        assert_eq!(end.state.as_str(), last);
        match ext {
            Ok(_) => assert_eq!(kinds, vec!["created", "extended", last], "round {round}"),
            Err(TransitionError::NotHeld { state }) => {
                assert_eq!(state.as_str(), last);
                assert_eq!(kinds, vec!["created", last], "round {round}");
            }
            Err(e) => panic!("round {round}: {e:?}"),
        }
    }
}

/// R14: two extensions of one hold at once may both succeed, one after the
/// other (neither changes the fence); the cap on the whole hold holds
/// whatever their order: 20 rounds of two extensions, one within the cap
/// and one past it, and two within it (the second to commit may find the
/// deadline already later than it asks, and then writes nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_extensions_at_once_keep_the_cap() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "twice", true).await;
    for round in 0..20 {
        let h = held(&pool, org.id, &format!("T-{round:02}")).await;
        let asks: [u32; 2] = if round % 2 == 0 {
            [1800, 3000]
        } else {
            [1800, 4000]
        };
        let barrier = Arc::new(Barrier::new(2));
        let mut tasks = Vec::new();
        for seconds in asks {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                extend(&pool, org.id, h, seconds).await
            }));
        }
        let mut ok = 0;
        for (t, seconds) in tasks.into_iter().zip(asks) {
            match t.await.expect("task") {
                Ok(after) => {
                    ok += 1;
                    assert_eq!(after[0].0.fence, h.fence, "the fence does not change");
                }
                Err(TransitionError::HoldCap { cap_seconds, .. }) => {
                    assert_eq!((cap_seconds, seconds), (CAP, 4000), "round {round}");
                }
                Err(e) => panic!("round {round}: {e:?}"),
            }
        }
        let (within, events): (bool, i64) = sqlx::query_as(
            "SELECT r.expires_at <= r.created_at + make_interval(secs => $2),
                    (SELECT count(*) FROM reservation_events e WHERE e.reservation_id = r.id AND e.kind = 'extended')
               FROM reservations r WHERE r.id = $1",
        )
        .bind(h.id)
        .bind(f64::from(CAP))
        .fetch_one(&pool)
        .await
        .expect("cap");
        assert!(within, "round {round}: the cap holds");
        // An extension that finds the other's later deadline asks for less
        // than is left: it answers the hold as it is and writes nothing.
        assert!(
            (1..=ok).contains(&events),
            "round {round}: {events} events for {ok} extensions"
        );
        assert_eq!(ok, if round % 2 == 0 { 2 } else { 1 }, "round {round}");
    }
}

/// The API refuses an extension with the module off like every other
/// order call (R12), and reading an unknown order is 404.
#[tokio::test]
async fn extend_and_orders_need_the_module() {
    let app = spawn_app().await;
    let r = app
        .http
        .get(app.url("/api/v1/orders/NOPE"))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    sqlx::query("UPDATE organizations SET datacenter_enabled = false WHERE id = $1")
        .bind(app.org.id)
        .execute(&app.pool)
        .await
        .expect("switch off");
    let (status, body) = app
        .post_json(
            "/api/v1/reservations/1/extend",
            json!({"fence": 1, "seconds": 60}),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("module_disabled"))
    );
}
