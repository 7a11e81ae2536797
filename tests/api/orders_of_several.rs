//! R13: orders of several machines, all or nothing, called as a library on
//! separate connections released together by a barrier, with the
//! invariants checked in SQL; and the same orders over HTTP.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use poolkeeper::allocator::{self, Quantity, ReserveOutcome, ReserveRequest};
use poolkeeper::db::Db;
use poolkeeper::domain::{ReservationState, ServiceRef};
use poolkeeper::reservations::{self, Named, OrderAction, TransitionError};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::helpers::FakeMachine;
use crate::helpers::{PROFILE, SITE, decoys, race, request};
use crate::helpers::{create_org, migrated_db, spawn_app};

/// `request` for an order of `n` machines.
pub fn order(order_ref: &str, n: i64) -> ReserveRequest {
    ReserveRequest {
        quantity: Quantity::new(n).expect("quantity"),
        ..request(order_ref, Some("dell"))
    }
}

/// `n` eligible machines OK-0.. of the spec; their ids.
async fn eligible(pool: &Db, org_id: i64, n: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            FakeMachine::new()
                .tag(&format!("OK-{i}"))
                .create(pool, org_id)
                .await,
        );
    }
    ids
}

/// Orders whose held reservations are not all of their machines, read in
/// one statement (one snapshot): what no reader may ever see (R13).
const PARTIAL_ORDERS: &str = "SELECT count(*) FROM (
        SELECT r.order_ref FROM reservations r
         WHERE r.org_id = $1 AND r.state = 'held'
         GROUP BY r.order_ref HAVING count(*) <> max(r.quantity)) p";

/// Reads `PARTIAL_ORDERS` on its own connection until `stop`, and returns
/// how many samples it took and how many saw a partial order.
fn sampler(pool: &Db, org_id: i64, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(u64, i64)> {
    let pool = pool.clone();
    tokio::spawn(async move {
        let mut conn = pool.acquire().await.expect("the sampler's connection");
        let (mut samples, mut partial) = (0u64, 0i64);
        loop {
            // One more sample after the stop: the end state counts too.
            let last = stop.load(Ordering::SeqCst);
            let n: i64 = sqlx::query_scalar(PARTIAL_ORDERS)
                .bind(org_id)
                .fetch_one(&mut *conn)
                .await
                .expect("sample");
            samples += 1;
            partial += n;
            if last {
                break;
            }
            tokio::task::yield_now().await;
        }
        (samples, partial)
    })
}

/// R13 with R3: 8 concurrent orders of 2 machines on 5 eligible machines
/// (among decoys of every exclusion) give exactly 2 orders on 4 distinct
/// machines and 6 honest refusals (`unavailable`: 1 machine left, fewer
/// than 2); a sampler on its own connection, reading all through the race,
/// never sees an order holding 1 of its 2 machines. 10 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_orders_of_two_on_five_machines_give_two_orders_and_no_reader_sees_part_of_one() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    for round in 0..10 {
        let org = create_org(&pool, &format!("pairs-{round}"), true).await;
        decoys(&pool, org.id).await;
        eligible(&pool, org.id, 5).await;
        let stop = Arc::new(AtomicBool::new(false));
        let watch = sampler(&pool, org.id, stop.clone());
        let reqs = (0..8).map(|i| order(&format!("ORD-{i}"), 2)).collect();
        let outcomes = race(&pool, org.id, reqs).await;
        stop.store(true, Ordering::SeqCst);
        let (samples, partial) = watch.await.expect("sampler");
        assert!(samples >= 1);
        assert_eq!(partial, 0, "round {round}: a reader saw part of an order");
        let mut machines = Vec::new();
        let mut created = 0;
        for o in &outcomes {
            match o {
                ReserveOutcome::Created {
                    reservation,
                    others,
                    ..
                } => {
                    created += 1;
                    assert_eq!(others.len(), 1, "round {round}: {o:?}");
                    for r in std::iter::once(reservation).chain(others) {
                        assert!(r.machine.asset_tag.starts_with("OK-"), "round {round}");
                        assert_eq!(
                            (r.quantity, r.order_ref.as_str()),
                            (2, reservation.order_ref.as_str())
                        );
                        assert_eq!(r.expires_at, reservation.expires_at, "one deadline");
                        machines.push(r.machine_id);
                    }
                }
                ReserveOutcome::Unavailable { excluded, .. } => {
                    assert_eq!(excluded.candidates, 1, "round {round}: one machine is left");
                }
                other => panic!("round {round}: orders of several take turns: {other:?}"),
            }
        }
        assert_eq!(created, 2, "round {round}: {outcomes:#?}");
        machines.sort_unstable();
        machines.dedup();
        assert_eq!(machines.len(), 4, "round {round}: distinct machines");
        // The invariants, in SQL.
        let (held, distinct, orders, slots_ok): (i64, i64, i64, bool) = sqlx::query_as(
            "SELECT count(*), count(DISTINCT machine_id), count(DISTINCT order_ref),
                    coalesce(bool_and(quantity = 2 AND slot BETWEEN 1 AND 2), true)
               FROM reservations WHERE org_id = $1 AND order_ref LIKE 'ORD-%' AND state = 'held'",
        )
        .bind(org.id)
        .fetch_one(&pool)
        .await
        .expect("invariants");
        assert_eq!(
            (held, distinct, orders, slots_ok),
            (4, 4, 2, true),
            "round {round}"
        );
        let refused: (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE quantity = 2 AND reason = 'unavailable')
               FROM reservation_refusals WHERE org_id = $1",
        )
        .bind(org.id)
        .fetch_one(&pool)
        .await
        .expect("refusals");
        assert_eq!(
            refused,
            (6, 6),
            "round {round}: lost demand records the quantity"
        );
    }
}

/// R9 for an order: 5 concurrent requests with one key and quantity 3 on
/// 6 machines give one order of 3; every answer is that order. 10 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_requests_with_one_key_and_quantity_three_give_one_order_of_three() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    for round in 0..10 {
        let org = create_org(&pool, &format!("idem3-{round}"), true).await;
        eligible(&pool, org.id, 6).await;
        let reqs = (0..5).map(|_| order("ORD-SAME", 3)).collect();
        let outcomes = race(&pool, org.id, reqs).await;
        let ids: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM reservations WHERE org_id = $1 ORDER BY slot")
                .bind(org.id)
                .fetch_all(&pool)
                .await
                .expect("the order");
        assert_eq!(ids.len(), 3, "round {round}: {outcomes:#?}");
        let mut created = 0;
        for o in &outcomes {
            let (first, others) = match o {
                ReserveOutcome::Created {
                    reservation,
                    others,
                    ..
                } => {
                    created += 1;
                    (reservation, others)
                }
                ReserveOutcome::Existing {
                    reservation,
                    others,
                } => (reservation, others),
                other => panic!("round {round}: one key, one order: {other:?}"),
            };
            let got: Vec<i64> = std::iter::once(first).chain(others).map(|r| r.id).collect();
            assert_eq!(got, ids, "round {round}: every answer is the one order");
        }
        assert_eq!(created, 1, "round {round}");
    }
}

/// R13: an order that cannot have every machine holds none. Three match but
/// one is locked by another open transaction: `contended`, and nothing of
/// the order was written (its two other machines are free again). Only two
/// match: `unavailable`, saying two; the refusal row records 3.
#[tokio::test]
async fn an_order_short_of_one_machine_holds_nothing() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "short", true).await;
    let ids = eligible(&pool, org.id, 3).await;
    let mut blocker = pool.acquire().await.expect("blocker");
    sqlx::query("BEGIN")
        .execute(&mut *blocker)
        .await
        .expect("begin");
    sqlx::query("SELECT id FROM machines WHERE id = $1 FOR UPDATE")
        .bind(ids[2])
        .execute(&mut *blocker)
        .await
        .expect("lock the third machine");
    let outcome = allocator::reserve(&pool, org.id, &order("ORD-3", 3))
        .await
        .expect("reserve");
    match &outcome {
        ReserveOutcome::Contended {
            walk, candidates, ..
        } => {
            assert_eq!(*candidates, 3);
            assert_eq!(walk.locked_by_others, 1, "{walk:?}");
        }
        other => panic!("expected contended, got {other:?}"),
    }
    sqlx::query("ROLLBACK")
        .execute(&mut *blocker)
        .await
        .expect("rollback");
    drop(blocker);
    let written: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM reservations WHERE org_id = $1),
                (SELECT count(*) FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id
                  WHERE r.org_id = $1)",
    )
    .bind(org.id)
    .fetch_one(&pool)
    .await
    .expect("written");
    assert_eq!(
        written,
        (0, 0),
        "the two machines it had taken were given back"
    );
    // Now one of the three is taken by an order of one: only 2 of 3 match.
    let single = allocator::reserve(&pool, org.id, &order("ORD-1", 1))
        .await
        .expect("reserve one");
    assert!(
        matches!(single, ReserveOutcome::Created { .. }),
        "{single:?}"
    );
    match allocator::reserve(&pool, org.id, &order("ORD-3b", 3))
        .await
        .expect("reserve")
    {
        ReserveOutcome::Unavailable { excluded, .. } => {
            assert_eq!((excluded.candidates, excluded.held), (2, 1));
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    let q: Vec<(String, i16)> = sqlx::query_as(
        "SELECT reason, quantity FROM reservation_refusals WHERE org_id = $1 ORDER BY id",
    )
    .bind(org.id)
    .fetch_all(&pool)
    .await
    .expect("refusals");
    assert_eq!(
        q,
        vec![("contended".to_owned(), 3), ("unavailable".to_owned(), 3)]
    );
}

/// Reserves an order of `n` on the pool; its reservations.
async fn reserved_order(
    pool: &Db,
    org_id: i64,
    order_ref: &str,
    n: i64,
) -> Vec<reservations::Reservation> {
    match allocator::reserve(pool, org_id, &order(order_ref, n))
        .await
        .expect("reserve")
    {
        ReserveOutcome::Created {
            reservation,
            others,
            ..
        } => std::iter::once(reservation).chain(others).collect(),
        other => panic!("expected an order, got {other:?}"),
    }
}

fn named(order: &[reservations::Reservation]) -> Vec<Named> {
    order
        .iter()
        .map(|r| Named {
            id: r.id,
            fence: r.fence,
        })
        .collect()
}

/// One order action in its own transaction, settled as the API does.
async fn act(
    pool: &Db,
    org_id: i64,
    order_ref: Option<&str>,
    named: &[Named],
    what: OrderAction<'_>,
) -> Result<reservations::OrderAfter, TransitionError> {
    let mut tx = pool.begin().await.expect("begin");
    let outcome =
        reservations::order_transition_on(&mut tx, org_id, order_ref, named, "test", what).await;
    reservations::settle(tx, outcome).await
}

/// R10 per machine, for an order: converting an order of 2 races new
/// orders of one for the same machines (the only ones of the spec). At
/// every instant a sampler sees each machine held or in service, never
/// free; the new orders are refused; the order is converted whole. 20 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn converting_an_order_races_new_orders_and_its_machines_are_never_free() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let refs = [
        ServiceRef::parse("SRV-A").expect("ref"),
        ServiceRef::parse("SRV-B").expect("ref"),
    ];
    for round in 0..20 {
        let org = create_org(&pool, &format!("promote-{round}"), true).await;
        let ids = eligible(&pool, org.id, 2).await;
        let order_ref = format!("ORD-{round}");
        let held = reserved_order(&pool, org.id, &order_ref, 2).await;
        let stop = Arc::new(AtomicBool::new(false));
        let free_seen = {
            let pool = pool.clone();
            let stop = stop.clone();
            let ids = ids.clone();
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.expect("sampler");
                let mut free = 0i64;
                loop {
                    let last = stop.load(Ordering::SeqCst);
                    let n: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM machines m WHERE m.id = ANY($1)
                            AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.machine_id = m.id AND r.state = 'held')
                            AND NOT EXISTS (SELECT 1 FROM service_links s WHERE s.machine_id = m.id AND s.ended_at IS NULL)",
                    )
                    .bind(&ids)
                    .fetch_one(&mut *conn)
                    .await
                    .expect("sample");
                    free += n;
                    if last {
                        break free;
                    }
                    tokio::task::yield_now().await;
                }
            })
        };
        let barrier = Arc::new(Barrier::new(3));
        let convert = {
            let (pool, barrier, named, refs, order_ref) = (
                pool.clone(),
                barrier.clone(),
                named(&held),
                refs.clone(),
                order_ref.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                act(
                    &pool,
                    org.id,
                    Some(&order_ref),
                    &named,
                    OrderAction::Convert {
                        service_refs: &refs,
                    },
                )
                .await
            })
        };
        let mut newcomers = Vec::new();
        for i in 0..2 {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            newcomers.push(tokio::spawn(async move {
                barrier.wait().await;
                allocator::reserve(&pool, org.id, &order(&format!("NEW-{i}"), 1))
                    .await
                    .expect("reserve")
            }));
        }
        let converted = convert.await.expect("task").expect("the order converts");
        assert_eq!(converted.len(), 2);
        assert!(
            converted
                .iter()
                .all(|(r, l)| r.state == ReservationState::Converted && l.is_some())
        );
        for n in newcomers {
            let o = n.await.expect("task");
            assert!(
                !matches!(o, ReserveOutcome::Created { .. }),
                "round {round}: a machine of the order was sold again: {o:?}"
            );
        }
        stop.store(true, Ordering::SeqCst);
        assert_eq!(
            free_seen.await.expect("sampler"),
            0,
            "round {round}: a machine was free"
        );
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM service_links WHERE org_id = $1 AND ended_at IS NULL",
        )
        .bind(org.id)
        .fetch_one(&pool)
        .await
        .expect("links");
        assert_eq!(live, 2, "round {round}");
    }
}

/// R13: cancel and convert act on the whole order or not at all. A stale
/// fence on one reservation converts none; a request that leaves one out
/// is refused; the single-reservation endpoints refuse a reservation of an
/// order of several; an overdue order is recorded expired, all of it (R11);
/// a cancel cancels all of it.
#[tokio::test]
async fn cancel_and_convert_act_on_the_whole_order_or_none_of_it() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "whole", true).await;
    eligible(&pool, org.id, 6).await;
    let refs: Vec<ServiceRef> = ["S1", "S2", "S3"]
        .iter()
        .map(|s| ServiceRef::parse(s).expect("ref"))
        .collect();
    let order = reserved_order(&pool, org.id, "ORD-A", 3).await;
    let mut stale = named(&order);
    stale[2].fence += 1000;
    let convert = OrderAction::Convert {
        service_refs: &refs,
    };
    assert!(matches!(
        act(&pool, org.id, Some("ORD-A"), &stale, convert).await,
        Err(TransitionError::StaleFence)
    ));
    assert!(matches!(
        act(&pool, org.id, Some("ORD-A"), &named(&order)[..2], OrderAction::Cancel { reason: "x" }).await,
        Err(TransitionError::Mismatch { ids }) if ids.len() == 3
    ));
    match reservations::cancel(&pool, org.id, order[1].id, order[1].fence, "test", "one").await {
        Err(TransitionError::PartOfOrder {
            quantity,
            order_ref,
            ..
        }) => {
            assert_eq!((quantity, order_ref.as_str()), (3, "ORD-A"));
        }
        other => panic!("expected part_of_order, got {other:?}"),
    }
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservations WHERE order_ref = 'ORD-A' AND state = 'held'",
    )
    .fetch_one(&pool)
    .await
    .expect("held");
    assert_eq!(held, 3, "nothing was written by the refusals");
    // Convert: all three, each with its own service.
    let after = act(&pool, org.id, Some("ORD-A"), &named(&order), convert)
        .await
        .expect("convert the order");
    let services: Vec<&str> = after
        .iter()
        .map(|(_, l)| l.as_ref().map(|l| l.service_ref.as_str()).unwrap_or(""))
        .collect();
    assert_eq!(services, vec!["S1", "S2", "S3"]);
    // Cancel another order whole.
    let b = reserved_order(&pool, org.id, "ORD-B", 2).await;
    let cancelled = act(
        &pool,
        org.id,
        Some("ORD-B"),
        &named(&b),
        OrderAction::Cancel { reason: "gave up" },
    )
    .await
    .expect("cancel");
    assert!(
        cancelled
            .iter()
            .all(|(r, _)| r.state == ReservationState::Cancelled
                && r.end_reason.as_deref() == Some("gave up"))
    );
    // An overdue order is not converted: every reservation of it expires.
    let c = reserved_order(&pool, org.id, "ORD-C", 1).await;
    sqlx::query(
        "UPDATE reservations SET created_at = created_at - interval '1 hour',
                expires_at = expires_at - interval '1 hour' WHERE order_ref = 'ORD-C'",
    )
    .execute(&pool)
    .await
    .expect("overdue");
    let one = [refs[0].clone()];
    assert!(matches!(
        act(
            &pool,
            org.id,
            Some("ORD-C"),
            &named(&c),
            OrderAction::Convert { service_refs: &one }
        )
        .await,
        Err(TransitionError::Expired { .. })
    ));
    let ended: Vec<(String, String)> =
        sqlx::query_as("SELECT state, ended_by FROM reservations WHERE order_ref = 'ORD-C'")
            .fetch_all(&pool)
            .await
            .expect("ended");
    assert_eq!(ended, vec![("expired".to_owned(), "conversion".to_owned())]);
}

/// An overdue order of several is expired whole at the point of use (R11
/// with R13): a new order that takes one of its machines expires its other
/// reservation too, since they share one deadline.
#[tokio::test]
async fn an_overdue_order_expires_whole_at_the_point_of_use() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "late", true).await;
    eligible(&pool, org.id, 2).await;
    reserved_order(&pool, org.id, "ORD-OLD", 2).await;
    sqlx::query(
        "UPDATE reservations SET created_at = created_at - interval '1 hour',
                expires_at = expires_at - interval '1 hour' WHERE order_ref = 'ORD-OLD'",
    )
    .execute(&pool)
    .await
    .expect("overdue");
    let new = allocator::reserve(&pool, org.id, &order("ORD-NEW", 1))
        .await
        .expect("reserve");
    assert!(matches!(new, ReserveOutcome::Created { .. }), "{new:?}");
    let old: Vec<(String, String)> = sqlx::query_as(
        "SELECT state, ended_by FROM reservations WHERE order_ref = 'ORD-OLD' ORDER BY slot",
    )
    .fetch_all(&pool)
    .await
    .expect("old");
    assert_eq!(
        old,
        vec![
            ("expired".to_owned(), "allocator".to_owned()),
            ("expired".to_owned(), "allocator".to_owned())
        ]
    );
}

/// Over HTTP: quantity 3 answers `201` with the order (3 reservations, one
/// deadline, distinct machines), a replay `200` with the same, `GET
/// /orders/{ref}` the same; the order converts with one service per
/// machine; quantity 0 and 17 are `400` and write nothing; a reservation of
/// the order alone is `409 part_of_order`.
#[tokio::test]
async fn an_order_of_three_over_http() {
    let app = spawn_app().await;
    for i in 0..4 {
        FakeMachine::new()
            .tag(&format!("OK-{i}"))
            .create(&app.pool, app.org.id)
            .await;
    }
    let body =
        |q: Value| json!({"order_ref": "ORD-3", "site": SITE, "profile": PROFILE, "quantity": q});
    for bad in [json!(0), json!(17), json!(2.5), json!("3")] {
        let r = app
            .http
            .post(app.url("/api/v1/reservations"))
            .bearer_auth(&app.org.token)
            .json(&body(bad.clone()))
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "quantity {bad}");
    }
    let post = |path: &'static str, b: Value| {
        let app = &app;
        async move {
            let r = app
                .http
                .post(app.url(path))
                .bearer_auth(&app.org.token)
                .json(&b)
                .send()
                .await
                .expect("request");
            let status = r.status();
            (status, r.json::<Value>().await.expect("json"))
        }
    };
    let (status, created) = post("/api/v1/reservations", body(json!(3))).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["quantity"], 3);
    let rs = created["reservations"]
        .as_array()
        .expect("reservations")
        .clone();
    assert_eq!(rs.len(), 3);
    let mut tags: Vec<&str> = rs
        .iter()
        .map(|r| r["machine"]["asset_tag"].as_str().expect("tag"))
        .collect();
    tags.sort_unstable();
    tags.dedup();
    assert_eq!(tags.len(), 3);
    assert!(
        rs.iter()
            .all(|r| r["expires_at"] == created["expires_at"] && r["state"] == "held")
    );
    let (status, replay) = post("/api/v1/reservations", body(json!(3))).await;
    assert_eq!((status, &replay), (StatusCode::OK, &created));
    let read = app
        .http
        .get(app.url("/api/v1/orders/ORD-3"))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("get");
    assert_eq!(read.status(), StatusCode::OK);
    assert_eq!(read.json::<Value>().await.expect("json"), created);
    let id = rs[0]["id"].as_i64().expect("id");
    let (status, alone) = app
        .post_json(
            &format!("/api/v1/reservations/{id}/cancel"),
            json!({"fence": rs[0]["fence"], "reason": "one of three"}),
        )
        .await;
    assert_eq!(
        (status, alone["error"].as_str()),
        (StatusCode::CONFLICT, Some("part_of_order")),
        "{alone}"
    );
    let items: Vec<Value> = rs
        .iter()
        .enumerate()
        .map(
            |(i, r)| json!({"id": r["id"], "fence": r["fence"], "service_ref": format!("SRV-{i}")}),
        )
        .collect();
    let (status, converted) = post(
        "/api/v1/orders/ORD-3/convert",
        json!({"reservations": items}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{converted}");
    let states: Vec<(&str, &str)> = converted["reservations"]
        .as_array()
        .expect("reservations")
        .iter()
        .map(|r| {
            (
                r["state"].as_str().unwrap_or(""),
                r["service"]["service_ref"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        states,
        vec![
            ("converted", "SRV-0"),
            ("converted", "SRV-1"),
            ("converted", "SRV-2")
        ]
    );
    // 2 of 3: one machine is left.
    let (status, refused) = post(
        "/api/v1/reservations",
        json!({"order_ref": "ORD-X", "site": SITE, "profile": PROFILE, "quantity": 3}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        (refused["error"].as_str(), refused["candidates"].as_i64()),
        (Some("unavailable"), Some(1))
    );
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or("")
            .contains("only 1 of the 3"),
        "{refused}"
    );
}

/// F3 for the actions of an order and of a single reservation: the same
/// action replayed unchanged answers what it did; the same key (the ids
/// and fences) with another reason or other services is `422
/// idempotency_mismatch` naming the field, and writes nothing.
#[tokio::test]
async fn a_replayed_cancel_or_convert_with_another_reason_or_service_is_refused_naming_it() {
    let app = spawn_app().await;
    for i in 0..5 {
        FakeMachine::new()
            .tag(&format!("RM-{i}"))
            .create(&app.pool, app.org.id)
            .await;
    }
    let post = async |path: &str, b: Value| app.post_as(&app.org.token, path, &b).await;
    let reserve = async |order_ref: &str, quantity: i64| {
        let (status, body) = post(
            "/api/v1/reservations",
            json!({"order_ref": order_ref, "site": SITE, "profile": PROFILE, "quantity": quantity}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body
    };
    let written = async || -> i64 {
        sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM reservation_events) + (SELECT count(*) FROM service_links)
                  + (SELECT count(*) FROM reservations WHERE state = 'held')",
        )
        .fetch_one(&app.pool)
        .await
        .expect("count")
    };
    let mismatch = |what: &str, status: StatusCode, body: &Value, field: &str| {
        assert_eq!(
            (status, &body["error"], &body["fields"]),
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                &json!("idempotency_mismatch"),
                &json!([field])
            ),
            "{what}: {body}"
        );
    };

    // One reservation, cancelled: again with the same reason 200, with
    // another reason 422.
    let one = reserve("RM-ONE", 1).await;
    let (id, fence) = (&one["id"], &one["fence"]);
    let cancel = format!("/api/v1/reservations/{id}/cancel");
    let (status, first) = post(&cancel, json!({"fence": fence, "reason": "declined"})).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, again) = post(&cancel, json!({"fence": fence, "reason": "declined"})).await;
    assert_eq!((status, &again), (StatusCode::OK, &first));
    let before = written().await;
    let (status, other) = post(&cancel, json!({"fence": fence, "reason": "fraud"})).await;
    mismatch("cancel", status, &other, "reason");
    assert_eq!(written().await, before, "nothing written");

    // An order of two, cancelled: the same, for the whole order.
    let two = reserve("RM-TWO", 2).await;
    let named: Vec<Value> = two["reservations"]
        .as_array()
        .expect("reservations")
        .iter()
        .map(|r| json!({"id": r["id"], "fence": r["fence"]}))
        .collect();
    let body = |reason: &str| json!({"reservations": named, "reason": reason});
    let (status, first) = post("/api/v1/orders/RM-TWO/cancel", body("declined")).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, again) = post("/api/v1/orders/RM-TWO/cancel", body("declined")).await;
    assert_eq!((status, &again), (StatusCode::OK, &first));
    let before = written().await;
    let (status, other) = post("/api/v1/orders/RM-TWO/cancel", body("fraud")).await;
    mismatch("order cancel", status, &other, "reason");
    assert_eq!(written().await, before, "nothing written");

    // An order of two, converted: other services for the same ids and
    // fences are another request.
    let conv = reserve("RM-CONV", 2).await;
    let items = |prefix: &str| -> Vec<Value> {
        conv["reservations"]
            .as_array()
            .expect("reservations")
            .iter()
            .enumerate()
            .map(|(i, r)| json!({"id": r["id"], "fence": r["fence"], "service_ref": format!("{prefix}-{i}")}))
            .collect()
    };
    let path = "/api/v1/orders/RM-CONV/convert";
    let (status, first) = post(path, json!({"reservations": items("SRV")})).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, again) = post(path, json!({"reservations": items("SRV")})).await;
    assert_eq!((status, &again), (StatusCode::OK, &first));
    let before = written().await;
    let (status, other) = post(path, json!({"reservations": items("OTHER")})).await;
    mismatch("order convert", status, &other, "service_ref");
    assert_eq!(written().await, before, "nothing written");
    let links: Vec<String> = sqlx::query_scalar(
        "SELECT s.service_ref FROM service_links s JOIN reservations r ON r.id = s.reservation_id
          WHERE r.order_ref = 'RM-CONV' ORDER BY r.slot",
    )
    .fetch_all(&app.pool)
    .await
    .expect("links");
    assert_eq!(
        links,
        ["SRV-0", "SRV-1"],
        "the first request's services stand"
    );
}

/// R13 at the end of a hold: three orders (of 2, 3 and 2 machines) past
/// their deadline are expired at once by two sweep batches of one order
/// each and by three orders of one that want their machines (the
/// allocator's point-of-use expiry), all on separate connections released
/// together by a barrier. A sampler reading all through never sees an order
/// partly held, and each old order ends whole: every slot expired. 10
/// rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_order_expires_whole_and_no_reader_sees_part_of_it_held() {
    use poolkeeper::lease::{self, Claim, SWEEP_KEY};
    let db = migrated_db().await;
    let pool = db.pool().await;
    let mandate = match lease::claim(
        &pool,
        SWEEP_KEY,
        "expiry-test",
        std::time::Duration::from_secs(600),
    )
    .await
    .expect("claim")
    {
        Claim::Acquired(m) => m,
        Claim::HeldByOther => panic!("the sweep lease is free in a fresh database"),
    };
    for round in 0..10 {
        let org = create_org(&pool, &format!("expiry-{round}"), true).await;
        eligible(&pool, org.id, 7).await;
        let old = [("OLD-A", 2), ("OLD-B", 3), ("OLD-C", 2)];
        let made = race(
            &pool,
            org.id,
            old.iter().map(|(r, n)| order(r, *n)).collect(),
        )
        .await;
        assert!(
            made.iter()
                .all(|o| matches!(o, ReserveOutcome::Created { .. })),
            "round {round}: {made:?}"
        );
        // Their one deadline passes, by the database's clock.
        sqlx::query(
            "UPDATE reservations SET created_at = clock_timestamp() - interval '10 minutes',
                                     expires_at = clock_timestamp() - interval '1 second'
              WHERE org_id = $1",
        )
        .bind(org.id)
        .execute(&pool)
        .await
        .expect("overdue");
        let stop = Arc::new(AtomicBool::new(false));
        let watch = sampler(&pool, org.id, stop.clone());
        let barrier = Arc::new(Barrier::new(5));
        let mut sweeps = Vec::new();
        for _ in 0..2 {
            let mut conn = pool.acquire().await.expect("a connection per batch");
            let barrier = barrier.clone();
            let fence = mandate.fence;
            sweeps.push(tokio::spawn(async move {
                barrier.wait().await;
                let n = poolkeeper::sweep::expire_batch(&mut *conn, "expiry-test", fence, 1)
                    .await
                    .expect("batch");
                conn.finish().await.expect("commit");
                n
            }));
        }
        let mut orders = Vec::new();
        for i in 0..3 {
            let mut conn = pool.acquire().await.expect("a connection per order");
            let barrier = barrier.clone();
            let org_id = org.id;
            orders.push(tokio::spawn(async move {
                let req = order(&format!("NEW-{i}"), 1);
                barrier.wait().await;
                let outcome = allocator::reserve_on(&mut *conn, org_id, &req)
                    .await
                    .expect("reserve");
                conn.finish().await.expect("commit");
                outcome
            }));
        }
        for s in sweeps {
            s.await.expect("sweep task");
        }
        for o in orders {
            o.await.expect("order task");
        }
        // Whatever is left overdue, the next sweep takes.
        poolkeeper::sweep::expire_batch(&pool, "expiry-test", mandate.fence, 500)
            .await
            .expect("last batch");
        stop.store(true, Ordering::SeqCst);
        let (samples, partial) = watch.await.expect("sampler");
        assert!(samples >= 1);
        assert_eq!(
            partial, 0,
            "round {round}: a reader saw part of an order held"
        );
        let states: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT order_ref, count(*), count(*) FILTER (WHERE state = 'expired')
               FROM reservations WHERE org_id = $1 AND order_ref LIKE 'OLD-%'
              GROUP BY order_ref ORDER BY order_ref",
        )
        .bind(org.id)
        .fetch_all(&pool)
        .await
        .expect("states");
        assert_eq!(
            states,
            vec![
                ("OLD-A".to_owned(), 2, 2),
                ("OLD-B".to_owned(), 3, 3),
                ("OLD-C".to_owned(), 2, 2)
            ],
            "round {round}: every old order ended whole"
        );
    }
}
