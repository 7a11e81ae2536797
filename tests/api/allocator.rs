//! The allocator (R3-R9) called as a library: pass one's explanation, the
//! walk's bounds, savepoints, constraint names, point-of-use expiry, and the
//! concurrency scenarios of docs/rules.md on separate connections.

use std::sync::Arc;

use poolkeeper::allocator::{self, Exclusion, Quantity, ReserveOutcome, WalkStats, Walked};
use poolkeeper::domain::{ReservationState, ServiceRef};
use poolkeeper::inventory::MachineFilter;
use poolkeeper::reservations::{self, TransitionError};
use sqlx::Connection;
use tokio::sync::Barrier;

use crate::helpers::{FakeHold, FakeMachine};
use crate::helpers::{
    Generated, PROFILE, SITE, check_round, create_org, decoys, generated_machines,
    limited_connection, literal, migrated_db, race, ready_machines, request, request_for, reserved,
    spec,
};

#[tokio::test]
async fn explain_gives_every_exclusion_in_order_and_reserve_agrees() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "acme", true).await;
    FakeMachine::new()
        .tag("A-site")
        .site("ams1")
        .create(&pool, org.id)
        .await;
    FakeMachine::new()
        .tag("B-vendor")
        .vendor("hpe")
        .create(&pool, org.id)
        .await;
    FakeMachine::new()
        .tag("C-profile")
        .profile("xeon")
        .create(&pool, org.id)
        .await;
    FakeMachine::new()
        .tag("D-notready")
        .status("maintenance")
        .create(&pool, org.id)
        .await;
    FakeMachine::new().tag("E-free").create(&pool, org.id).await;
    let verdicts = allocator::explain(
        &pool,
        org.id,
        &spec(Some("dell")),
        &MachineFilter::default(),
        None,
        100,
    )
    .await
    .expect("explain");
    let got: Vec<(String, Option<&str>)> = verdicts
        .iter()
        .map(|v| {
            (
                v.machine.asset_tag.clone(),
                v.exclusion.as_ref().map(|e| e.key().as_str()),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("A-site".into(), Some("wrong_site")),
            ("B-vendor".into(), Some("wrong_vendor")),
            ("C-profile".into(), Some("wrong_profile")),
            ("D-notready".into(), Some("not_ready")),
            ("E-free".into(), None),
        ]
    );
    let r = reserved(&pool, org.id, "ORD-1", Some("dell")).await;
    assert_eq!(r.machine.asset_tag, "E-free");
    assert_eq!(r.state, ReservationState::Held);
    let verdicts = allocator::explain(
        &pool,
        org.id,
        &spec(None),
        &MachineFilter::default(),
        Some("D-notready"),
        100,
    )
    .await
    .expect("explain");
    assert_eq!(verdicts.len(), 1);
    match &verdicts[0].exclusion {
        Some(Exclusion::Held {
            reservation_id,
            until,
        }) => {
            assert_eq!(*reservation_id, r.id);
            assert_eq!(*until, r.expires_at);
        }
        other => panic!("expected held, got {other:?}"),
    }
    assert!(
        verdicts[0]
            .exclusion
            .as_ref()
            .map(Exclusion::describe)
            .unwrap_or_default()
            .contains(&r.id.to_string())
    );
    let service = ServiceRef::parse("SRV-1").expect("service ref");
    reservations::convert(&pool, org.id, r.id, r.fence, "test", &service)
        .await
        .expect("convert");
    let verdicts = allocator::explain(
        &pool,
        org.id,
        &spec(None),
        &MachineFilter::default(),
        Some("D-notready"),
        100,
    )
    .await
    .expect("explain");
    assert_eq!(
        verdicts[0].exclusion,
        Some(Exclusion::InService {
            service_ref: "SRV-1".into()
        })
    );
    match allocator::reserve(&pool, org.id, &request("ORD-2", Some("dell")))
        .await
        .expect("reserve")
    {
        ReserveOutcome::Unavailable { excluded, .. } => {
            assert_eq!(
                (
                    excluded.wrong_site,
                    excluded.wrong_vendor,
                    excluded.wrong_profile,
                    excluded.not_ready,
                    excluded.in_service,
                    excluded.held
                ),
                (1, 1, 1, 1, 1, 0),
            );
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    let _ = (
        Arc::new(()),
        Barrier::new(1),
        WalkStats::default(),
        std::marker::PhantomData::<Walked>,
        sqlx::PgConnection::connect,
    );
    let _ = TransitionError::NotFound;
}

/// R7: the explanation, the `unavailable` counts and the candidate query
/// are one classification: they agree machine by machine.
#[tokio::test]
async fn explain_counts_and_candidates_agree() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "agree", true).await;
    decoys(&pool, org.id).await;
    for i in 0..3 {
        FakeMachine::new()
            .tag(&format!("OK-{i}"))
            .create(&pool, org.id)
            .await;
    }
    let overdue = FakeMachine::new()
        .tag("OK-overdue")
        .create(&pool, org.id)
        .await;
    let id = FakeHold::on(overdue)
        .order("ORD-LATE")
        .bare()
        .create(&pool, org.id)
        .await;
    sqlx::query("UPDATE reservations SET created_at = created_at - interval '1 hour', expires_at = expires_at - interval '1 hour' WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .expect("overdue");
    let spec = spec(Some("dell"));
    let verdicts = allocator::explain(&pool, org.id, &spec, &MachineFilter::default(), None, 1000)
        .await
        .expect("explain");
    let mut conn = limited_connection(&db).await;
    let counts = allocator::excluded_counts(&mut conn, org.id, &spec)
        .await
        .expect("counts");
    let n = |k: &str| {
        verdicts
            .iter()
            .filter(|v| v.exclusion.as_ref().map(|e| e.key().as_str()) == Some(k))
            .count() as i64
    };
    assert_eq!(
        (
            counts.wrong_site,
            counts.wrong_vendor,
            counts.wrong_profile,
            counts.not_ready,
            counts.in_service,
            counts.held
        ),
        (
            n("wrong_site"),
            n("wrong_vendor"),
            n("wrong_profile"),
            n("not_ready"),
            n("in_service"),
            n("held")
        )
    );
    assert_eq!(counts.held, 1, "an overdue hold is not an exclusion (R11)");
    let mut from_explain: Vec<String> = verdicts
        .iter()
        .filter(|v| v.exclusion.is_none())
        .map(|v| v.machine.asset_tag.clone())
        .collect();
    from_explain.sort();
    assert_eq!(from_explain, vec!["OK-0", "OK-1", "OK-2", "OK-overdue"]);
    assert_eq!(counts.candidates, 4);
    let two = allocator::lockable_now(&pool, org.id, &spec, Quantity::ONE)
        .await
        .expect("pass two");
    let mut lockable: Vec<String> = two.lockable.iter().map(|m| m.asset_tag.clone()).collect();
    lockable.sort();
    assert_eq!(
        lockable, from_explain,
        "the candidate query finds what explain calls candidates"
    );
}

/// R3: 8 concurrent orders, 3 eligible machines among decoys of every
/// exclusion kind: 3 reservations on 3 machines and 5 honest refusals; and
/// 2 orders on 1 machine: 1 and 1. 20 rounds each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_orders_three_machines_and_two_orders_one_machine() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    for (orders, eligible) in [(8usize, 3i64), (2, 1)] {
        for round in 0..20 {
            let org = create_org(&pool, &format!("r{orders}-{round}"), true).await;
            decoys(&pool, org.id).await;
            for i in 0..eligible {
                FakeMachine::new()
                    .tag(&format!("OK-{i}"))
                    .create(&pool, org.id)
                    .await;
            }
            let reqs = (0..orders)
                .map(|i| request(&format!("ORD-{i}"), Some("dell")))
                .collect();
            let outcomes = race(&pool, org.id, reqs).await;
            check_round(&pool, org.id, &outcomes, eligible, round).await;
        }
    }
}

/// R9: 5 concurrent requests with one order_ref on 4 machines: one
/// reservation; every answer is that reservation or `contended`. 20 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_requests_one_order_ref_give_one_reservation() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    for round in 0..20 {
        let org = create_org(&pool, &format!("idem-{round}"), true).await;
        for i in 0..4 {
            FakeMachine::new()
                .tag(&format!("OK-{i}"))
                .create(&pool, org.id)
                .await;
        }
        let reqs = (0..5).map(|_| request("ORD-SAME", None)).collect();
        let outcomes = race(&pool, org.id, reqs).await;
        let (count, held): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE state = 'held') FROM reservations WHERE org_id = $1",
        )
        .bind(org.id)
        .fetch_one(&pool)
        .await
        .expect("count");
        assert_eq!((count, held), (1, 1), "round {round}: {outcomes:#?}");
        let id: i64 = sqlx::query_scalar("SELECT id FROM reservations WHERE org_id = $1")
            .bind(org.id)
            .fetch_one(&pool)
            .await
            .expect("the reservation");
        let mut created = 0;
        for o in &outcomes {
            match o {
                ReserveOutcome::Created { reservation, .. } => {
                    created += 1;
                    assert_eq!(reservation.id, id);
                }
                ReserveOutcome::Existing { reservation, .. } => {
                    assert_eq!(reservation.id, id, "round {round}")
                }
                ReserveOutcome::Contended { .. } => {}
                ReserveOutcome::Unavailable { .. }
                | ReserveOutcome::Reserved { .. }
                | ReserveOutcome::CustomerLimit { .. } => {
                    panic!("round {round}: machines were left: {outcomes:#?}")
                }
            }
        }
        assert_eq!(created, 1, "round {round}");
    }
}

/// R4: with 30 candidates row-locked by other open transactions, reserve
/// answers `contended` at once, after scanning 25, without waiting on a lock
/// and without an insert attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_walk_stops_after_25_locked_candidates_without_waiting() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "bound", true).await;
    let mut machines = Vec::new();
    for i in 0..30 {
        machines.push(
            FakeMachine::new()
                .tag(&format!("OK-{i:02}"))
                .create(&pool, org.id)
                .await,
        );
    }
    // Three other transactions hold ten machine rows each, and stay open.
    let mut holders = Vec::new();
    for k in 0..3i64 {
        let mut conn = limited_connection(&db).await;
        sqlx::query("BEGIN")
            .execute(&mut conn)
            .await
            .expect("begin");
        // By key: a scan with OFFSET would lock the rows it skips too.
        let ids: Vec<i64> = machines[(k * 10) as usize..(k * 10 + 10) as usize].to_vec();
        let locked: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM machines WHERE id = ANY($1) FOR UPDATE")
                .bind(&ids)
                .fetch_all(&mut conn)
                .await
                .expect("lock ten machines");
        assert_eq!(locked.len(), 10);
        holders.push(conn);
    }
    let started = std::time::Instant::now();
    let outcome = allocator::reserve(&pool, org.id, &request("ORD-1", None))
        .await
        .expect("reserve");
    let elapsed = started.elapsed();
    match outcome {
        ReserveOutcome::Contended {
            walk, candidates, ..
        } => {
            assert_eq!(walk.scanned, 25, "{walk:?}");
            assert_eq!(walk.locked_by_others, 25);
            assert_eq!(
                walk.attempts, 0,
                "a locked candidate is skipped, not an attempt"
            );
            assert_eq!(candidates, 30);
        }
        other => panic!("expected contended, got {other:?}"),
    }
    // lock_timeout is 5 s: waiting on any of those locks would show.
    assert!(
        elapsed < std::time::Duration::from_secs(2),
        "reserve waited: {elapsed:?}"
    );
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM reservations")
            .fetch_one(&pool)
            .await
            .expect("count"),
        0
    );
    for mut conn in holders {
        sqlx::query("ROLLBACK")
            .execute(&mut conn)
            .await
            .expect("rollback");
    }
    // Released, the same order gets a machine.
    let r = reserved(&pool, org.id, "ORD-1", None).await;
    assert_eq!(r.machine.asset_tag, "OK-00");
}

/// R4: pass one reads a first batch of 4 + N candidates; when every one of
/// them is row-locked by another transaction, the walk widens once to the
/// rest of the bound and takes the first free machine after them, counting
/// every candidate it looked at.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_walk_whose_first_batch_is_locked_widens_and_takes_the_next_machine() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "widen", true).await;
    let mut machines = Vec::new();
    for i in 0..8 {
        machines.push(
            FakeMachine::new()
                .tag(&format!("W-{i:02}"))
                .create(&pool, org.id)
                .await,
        );
    }
    // The first batch of an order of one is 5 machines: all locked.
    let mut holder = limited_connection(&db).await;
    sqlx::query("BEGIN")
        .execute(&mut holder)
        .await
        .expect("begin");
    let locked: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM machines WHERE id = ANY($1) FOR UPDATE")
            .bind(&machines[..5])
            .fetch_all(&mut holder)
            .await
            .expect("lock five machines");
    assert_eq!(locked.len(), 5);
    let outcome = allocator::reserve(&pool, org.id, &request("ORD-W", None))
        .await
        .expect("reserve");
    match outcome {
        ReserveOutcome::Created {
            reservation, walk, ..
        } => {
            assert_eq!(reservation.machine.asset_tag, "W-05");
            assert_eq!(walk.scanned, 6, "{walk:?}");
            assert_eq!(walk.locked_by_others, 5, "{walk:?}");
            assert_eq!(walk.attempts, 1, "{walk:?}");
        }
        other => panic!("expected created, got {other:?}"),
    }
    sqlx::query("ROLLBACK")
        .execute(&mut holder)
        .await
        .expect("rollback");
}

/// R5/R6: a collision on the first attempt (a competitor committed a held
/// reservation on the first candidate after pass one) is rolled back to its
/// savepoint; the same transaction goes on to insert on the next candidate.
#[tokio::test]
async fn a_lost_insert_race_is_rolled_back_to_its_savepoint_and_the_next_candidate_wins() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "savepoint", true).await;
    let first = FakeMachine::new().tag("OK-1").create(&pool, org.id).await;
    let second = FakeMachine::new().tag("OK-2").create(&pool, org.id).await;
    let mut conn = limited_connection(&db).await;
    let mut tx = conn.begin().await.expect("begin");
    sqlx::query("SELECT 1")
        .execute(&mut *tx)
        .await
        .expect("the transaction is open");
    // Pass one (as the allocator saw it) had both; now a competitor commits
    // a hold on the first from another connection.
    let competitor = FakeHold::on(first)
        .order("ORD-FASTER")
        .bare()
        .create(&pool, org.id)
        .await;
    let req = request("ORD-1", None);
    let mut walk = WalkStats::default();
    let walked = allocator::walk_candidates(&mut tx, org.id, &req, &[first, second], &mut walk)
        .await
        .expect("the walk survives the violation");
    let r = match walked {
        Walked::Created(mut order) if order.len() == 1 => order.remove(0),
        other => panic!("expected a reservation, got {other:?}"),
    };
    assert_eq!(r.machine_id, second);
    assert_eq!(walk.attempts, 2, "the lost race was an attempt: {walk:?}");
    // Same transaction, still healthy: it sees its own insert and commits.
    let mine: i64 =
        sqlx::query_scalar("SELECT count(*) FROM reservations WHERE order_ref = 'ORD-1'")
            .fetch_one(&mut *tx)
            .await
            .expect("the transaction is not aborted");
    assert_eq!(mine, 1);
    tx.commit().await.expect("commit");
    let held: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT id, machine_id FROM reservations WHERE state = 'held' ORDER BY machine_id",
    )
    .fetch_all(&pool)
    .await
    .expect("held");
    assert_eq!(held, vec![(competitor, first), (r.id, second)]);
}

/// R6: the two unique rules are told apart by the constraint's name, and
/// the allocator answers each as it means.
#[tokio::test]
async fn both_unique_constraints_are_told_apart_by_name() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "names", true).await;
    let a = FakeMachine::new().tag("OK-1").create(&pool, org.id).await;
    let b = FakeMachine::new().tag("OK-2").create(&pool, org.id).await;
    FakeHold::on(a)
        .order("ORD-A")
        .bare()
        .create(&pool, org.id)
        .await;
    let insert = |machine_id: i64, order_ref: &'static str| {
        FakeHold::on(machine_id)
            .order(order_ref)
            .bare()
            .reason("x")
            .deadline("1 hour")
            .try_create(&pool, org.id)
    };
    let machine_taken = insert(a, "ORD-B").await.expect_err("machine taken");
    assert_eq!(
        poolkeeper::db::violated_unique(&machine_taken),
        Some("reservations_one_holder_per_machine")
    );
    let order_taken = insert(b, "ORD-A").await.expect_err("order taken");
    assert_eq!(
        poolkeeper::db::violated_unique(&order_taken),
        Some("reservations_order_ref_unique_per_org")
    );
    // Through an error of our own wrapping it, too (the cause chain).
    let wrapped = anyhow::Error::from(order_taken).context("reserving");
    assert_eq!(
        poolkeeper::db::violated_unique(wrapped.as_ref()),
        Some("reservations_order_ref_unique_per_org")
    );

    // The allocator: an order that got a reservation behind its back (after
    // its first R9 ask) gets that reservation, not a second one.
    let mut conn = limited_connection(&db).await;
    let mut tx = conn.begin().await.expect("begin");
    let mut walk = WalkStats::default();
    match allocator::walk_candidates(&mut tx, org.id, &request("ORD-A", None), &[b], &mut walk)
        .await
        .expect("walk")
    {
        Walked::Existing(order) => {
            let [r] = &order[..] else {
                panic!("an order of one: {order:?}")
            };
            assert_eq!(r.order_ref, "ORD-A");
            assert_eq!(r.machine_id, a);
        }
        other => panic!("expected the existing reservation, got {other:?}"),
    }
    tx.commit().await.expect("commit");
    // And a machine taken is the next candidate's turn, then the bound.
    let mut tx = conn.begin().await.expect("begin");
    let mut walk = WalkStats::default();
    let walked = allocator::walk_candidates(
        &mut tx,
        org.id,
        &request("ORD-C", None),
        &[a, a, a, a, a, a],
        &mut walk,
    )
    .await
    .expect("walk");
    assert!(matches!(walked, Walked::Nothing), "{walked:?}");
    assert_eq!(
        walk.attempts,
        allocator::MAX_ATTEMPTS,
        "at most 5 attempts: {walk:?}"
    );
    tx.rollback().await.expect("rollback");
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM reservations")
            .fetch_one(&pool)
            .await
            .expect("count"),
        1
    );
}

/// R10: a conversion racing a new order for the same machine, 200 times:
/// the new order never gets the machine, and it never has two holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn convert_racing_a_new_order_never_frees_the_machine() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "promote", true).await;
    let service = ServiceRef::parse("SRV-1").expect("service ref");
    for round in 0..200 {
        let profile = format!("p-{round}");
        let m = FakeMachine::new()
            .tag(&format!("OK-{round}"))
            .profile(&profile)
            .create(&pool, org.id)
            .await;
        let r = match allocator::reserve(
            &pool,
            org.id,
            &request_for(&format!("FIRST-{round}"), &profile, None),
        )
        .await
        .expect("reserve")
        {
            ReserveOutcome::Created { reservation, .. } => reservation,
            other => panic!("round {round}: {other:?}"),
        };
        let barrier = Arc::new(Barrier::new(2));
        let mut c2 = pool.acquire().await.expect("conn");
        let b1 = barrier.clone();
        let p1 = pool.clone();
        let service = service.clone();
        let org_id = org.id;
        let convert = tokio::spawn(async move {
            b1.wait().await;
            reservations::convert(&p1, org_id, r.id, r.fence, "test", &service).await
        });
        let b2 = barrier.clone();
        let req = request_for(&format!("SECOND-{round}"), &profile, None);
        let order = tokio::spawn(async move {
            b2.wait().await;
            allocator::reserve_on(&mut *c2, org_id, &req)
                .await
                .expect("reserve")
        });
        let converted = convert.await.expect("task");
        let second = order.await.expect("task");
        assert!(converted.is_ok(), "round {round}: {converted:?}");
        match &second {
            ReserveOutcome::Unavailable { excluded, .. } => {
                assert_eq!(
                    excluded.held + excluded.in_service,
                    1,
                    "round {round}: {excluded:?}"
                )
            }
            other => panic!(
                "round {round}: the new order got an answer other than unavailable: {other:?}"
            ),
        }
        let (holders, live, second_rows): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM reservations WHERE machine_id = $1 AND state = 'held'),
                    (SELECT count(*) FROM service_links WHERE machine_id = $1 AND ended_at IS NULL),
                    (SELECT count(*) FROM reservations WHERE machine_id = $1 AND order_ref LIKE 'SECOND-%')",
        )
        .bind(m)
        .fetch_one(&pool)
        .await
        .expect("invariants");
        assert_eq!((holders, live, second_rows), (0, 1, 0), "round {round}");
    }
}

/// R10/R11: the same race when the reservation is already overdue: the
/// conversion expires it, or the new order expires it at the point of use
/// and takes the machine; never both a live service and a new holder. This
/// is the race the machine row lock (taken first by both) decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn convert_of_an_overdue_hold_racing_a_new_order_gives_the_machine_once() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "overdue-race", true).await;
    let service = ServiceRef::parse("SRV-1").expect("service ref");
    let (mut won_by_order, mut refused_both) = (0, 0);
    for round in 0..100 {
        let profile = format!("p-{round}");
        let m = FakeMachine::new()
            .tag(&format!("OK-{round}"))
            .profile(&profile)
            .create(&pool, org.id)
            .await;
        let r = match allocator::reserve(
            &pool,
            org.id,
            &request_for(&format!("FIRST-{round}"), &profile, None),
        )
        .await
        .expect("reserve")
        {
            ReserveOutcome::Created { reservation, .. } => reservation,
            other => panic!("round {round}: {other:?}"),
        };
        sqlx::query(
            "UPDATE reservations SET created_at = created_at - interval '1 hour',
                    expires_at = expires_at - interval '1 hour' WHERE id = $1",
        )
        .bind(r.id)
        .execute(&pool)
        .await
        .expect("overdue");
        let barrier = Arc::new(Barrier::new(2));
        let mut c2 = pool.acquire().await.expect("conn");
        let (b1, b2) = (barrier.clone(), barrier.clone());
        let (p1, service, org_id) = (pool.clone(), service.clone(), org.id);
        let convert = tokio::spawn(async move {
            b1.wait().await;
            reservations::convert(&p1, org_id, r.id, r.fence, "test", &service).await
        });
        let req = request_for(&format!("SECOND-{round}"), &profile, None);
        let order = tokio::spawn(async move {
            b2.wait().await;
            allocator::reserve_on(&mut *c2, org_id, &req)
                .await
                .expect("reserve")
        });
        let converted = convert.await.expect("task");
        let second = order.await.expect("task");
        assert!(
            matches!(
                converted,
                Err(TransitionError::Expired { .. }) | Err(TransitionError::NotHeld { .. })
            ),
            "round {round}: an overdue hold was converted: {converted:?}"
        );
        match &second {
            ReserveOutcome::Created { .. } => won_by_order += 1,
            ReserveOutcome::Contended { .. } => refused_both += 1,
            other => panic!("round {round}: {other:?}"),
        }
        let (holders, live, first_state): (i64, i64, String) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM reservations WHERE machine_id = $1 AND state = 'held'),
                    (SELECT count(*) FROM service_links WHERE machine_id = $1 AND ended_at IS NULL),
                    (SELECT state FROM reservations WHERE id = $2)",
        )
        .bind(m)
        .bind(r.id)
        .fetch_one(&pool)
        .await
        .expect("invariants");
        assert_eq!(live, 0, "round {round}");
        assert_eq!(first_state, "expired", "round {round}");
        let created = i64::from(matches!(second, ReserveOutcome::Created { .. }));
        assert_eq!(holders, created, "round {round}");
    }
    eprintln!(
        "overdue race: new order won {won_by_order}, refused while the conversion held the machine {refused_both}"
    );
}

/// R11: an overdue held reservation does not block a new order: the
/// allocator expires it at the point of use, in the same transaction.
#[tokio::test]
async fn an_overdue_hold_is_expired_at_the_point_of_use() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "overdue", true).await;
    let m = FakeMachine::new().tag("OK-1").create(&pool, org.id).await;
    let old = reserved(&pool, org.id, "ORD-OLD", None).await;
    sqlx::query(
        "UPDATE reservations SET created_at = created_at - interval '1 hour', expires_at = expires_at - interval '1 hour'
          WHERE id = $1",
    )
    .bind(old.id)
    .execute(&pool)
    .await
    .expect("make it overdue");
    // Pass one already counts it as a candidate.
    let verdicts = allocator::explain(
        &pool,
        org.id,
        &spec(None),
        &MachineFilter::default(),
        None,
        10,
    )
    .await
    .expect("explain");
    assert_eq!(verdicts[0].exclusion, None);
    let new = reserved(&pool, org.id, "ORD-NEW", None).await;
    assert_eq!(new.machine_id, m);
    assert!(
        new.reason
            .contains(&format!("reservation {} was overdue", old.id)),
        "{}",
        new.reason
    );
    let old = reservations::get(&pool, org.id, old.id)
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(old.state, ReservationState::Expired);
    assert_eq!(old.ended_by.as_deref(), Some("allocator"));
    let events = reservations::events(&pool, org.id, old.id)
        .await
        .expect("events");
    let last = events.last().expect("an event");
    assert_eq!(
        (
            last.kind.as_str(),
            last.actor.as_str(),
            last.from_state.map(ReservationState::as_str)
        ),
        ("expired", "allocator", Some("held"))
    );
}

/// R11/R10 on the library: convert and cancel judge the deadline by the
/// database clock whether or not a sweep ran, and record the expiry.
#[tokio::test]
async fn overdue_convert_and_cancel_record_an_expiry_and_refuse() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "deadline", true).await;
    FakeMachine::new().tag("OK-1").create(&pool, org.id).await;
    FakeMachine::new().tag("OK-2").create(&pool, org.id).await;
    let a = reserved(&pool, org.id, "ORD-A", None).await;
    let b = reserved(&pool, org.id, "ORD-B", None).await;
    sqlx::query(
        "UPDATE reservations SET created_at = created_at - interval '1 hour', expires_at = expires_at - interval '1 hour'",
    )
    .execute(&pool)
    .await
    .expect("make them overdue");
    let service = ServiceRef::parse("SRV-1").expect("ref");
    let err = reservations::convert(&pool, org.id, a.id, a.fence, "checkout", &service)
        .await
        .expect_err("overdue");
    assert!(matches!(err, TransitionError::Expired { .. }), "{err:?}");
    let err = reservations::cancel(
        &pool,
        org.id,
        b.id,
        b.fence,
        "support@x.example",
        "customer left",
    )
    .await
    .expect_err("overdue");
    assert!(matches!(err, TransitionError::Expired { .. }), "{err:?}");
    let a = reservations::get(&pool, org.id, a.id)
        .await
        .expect("get")
        .expect("a");
    let b = reservations::get(&pool, org.id, b.id)
        .await
        .expect("get")
        .expect("b");
    assert_eq!(
        (a.state, a.ended_by.as_deref()),
        (ReservationState::Expired, Some("conversion"))
    );
    assert_eq!(
        (b.state, b.ended_by.as_deref()),
        (ReservationState::Expired, Some("cancellation"))
    );
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM service_links")
            .fetch_one(&pool)
            .await
            .expect("count"),
        0
    );
    // Now ended: the same calls say so, with the state.
    let err = reservations::convert(&pool, org.id, a.id, a.fence, "checkout", &service)
        .await
        .expect_err("ended");
    assert!(
        matches!(err, TransitionError::NotHeld { ref state } if *state == ReservationState::Expired),
        "{err:?}"
    );
    let err = reservations::cancel(&pool, org.id, a.id, a.fence + 1000, "x", "y")
        .await
        .expect_err("stale");
    assert!(matches!(err, TransitionError::StaleFence), "{err:?}");
    let err = reservations::cancel(&pool, org.id + 1000, a.id, a.fence, "x", "y")
        .await
        .expect_err("not found");
    assert!(matches!(err, TransitionError::NotFound), "{err:?}");
}

/// Pass two on its own: what is locked by someone else is reported as such,
/// and the look itself leaves nothing locked.
#[tokio::test]
async fn lockable_now_tells_locked_from_lockable_and_locks_nothing() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "passtwo", true).await;
    let a = FakeMachine::new().tag("OK-1").create(&pool, org.id).await;
    FakeMachine::new().tag("OK-2").create(&pool, org.id).await;
    let mut holder = limited_connection(&db).await;
    sqlx::query("BEGIN")
        .execute(&mut holder)
        .await
        .expect("begin");
    sqlx::query("SELECT id FROM machines WHERE id = $1 FOR UPDATE")
        .bind(a)
        .execute(&mut holder)
        .await
        .expect("lock");
    let two = allocator::lockable_now(&pool, org.id, &spec(None), Quantity::ONE)
        .await
        .expect("pass two");
    let tags = |ms: &[poolkeeper::inventory::Machine]| {
        ms.iter().map(|m| m.asset_tag.clone()).collect::<Vec<_>>()
    };
    assert_eq!(tags(&two.locked_by_others), vec!["OK-1"]);
    assert_eq!(tags(&two.lockable), vec!["OK-2"]);
    // Nothing of ours is left locked: another transaction can lock OK-2 at once.
    let free: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM machines WHERE asset_tag = 'OK-2' FOR UPDATE SKIP LOCKED",
    )
    .fetch_optional(&pool)
    .await
    .expect("probe");
    assert!(free.is_some());
    sqlx::query("ROLLBACK")
        .execute(&mut holder)
        .await
        .expect("rollback");
    for e in [
        Exclusion::WrongSite,
        Exclusion::WrongVendor,
        Exclusion::WrongProfile,
        Exclusion::NotReady {
            status: poolkeeper::domain::MachineStatus::Maintenance,
        },
        Exclusion::InService {
            service_ref: "SRV-9".into(),
        },
    ] {
        assert!(!e.describe().is_empty());
    }
    assert!(
        Exclusion::NotReady {
            status: poolkeeper::domain::MachineStatus::Maintenance
        }
        .describe()
        .contains("maintenance")
    );
}

async fn explain_plan(
    conn: &mut sqlx::PgConnection,
    explain: &str,
    org_id: i64,
) -> serde_json::Value {
    sqlx::query_scalar(sqlx::AssertSqlSafe(explain.to_owned()))
        .bind(org_id)
        .bind(SITE)
        .bind(PROFILE)
        .bind(None::<String>)
        .bind(allocator::MAX_SCANNED as i64)
        .fetch_one(conn)
        .await
        .expect("explain")
}

/// The total shared buffers an EXPLAIN (ANALYZE, BUFFERS) plan touched.
fn buffers(plan: &serde_json::Value) -> i64 {
    let p = &plan[0]["Plan"];
    p["Shared Hit Blocks"].as_i64().unwrap_or(0) + p["Shared Read Blocks"].as_i64().unwrap_or(0)
}

/// Machines `ids` of `org_id` sold, in bulk: each with a converted
/// reservation and a live service link (whose trigger marks the machine in
/// service).
async fn sell(pool: &poolkeeper::db::Db, org_id: i64, ids: &[i64]) {
    sqlx::query(
        "WITH sold AS (
             INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot, reason,
                                       hold_seconds, expires_at, ended_at, ended_by)
             SELECT $1, 'SOLD-' || m.id, m.id, 'converted', '{}', '{}', 'sold', 900,
                    clock_timestamp() + interval '15 minutes', clock_timestamp(), 'test'
               FROM machines m WHERE m.org_id = $1 AND m.id = ANY($2)
             RETURNING id, machine_id)
         INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref)
         SELECT $1, machine_id, id, 'SRV-' || id FROM sold",
    )
    .bind(org_id)
    .bind(ids)
    .execute(pool)
    .await
    .expect("machines in service");
}

/// The candidate query stays on its indexes as history grows: with 50,000
/// ended reservations it touches a bounded number of buffers, and the same
/// query without index scans exceeds that bound (so the bound can fail).
#[tokio::test]
async fn the_candidate_query_stays_on_indexes_with_a_large_history() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "history", true).await;
    // 20 candidates, and 2,000 machines of other sites and profiles.
    generated_machines(
        &pool,
        org.id,
        2020,
        Generated {
            tag: "'M-' || g",
            site: "CASE WHEN g <= 20 THEN 'par1' ELSE 'ams1' END",
            vendor: "'dell'",
            profile: "CASE WHEN g <= 20 THEN 'epyc-9354-256g' ELSE 'xeon-6430-128g' END",
            status: "CASE WHEN g % 7 = 0 AND g > 20 THEN 'broken' ELSE 'ready' END",
        },
    )
    .await;
    // 50,000 ended reservations, most of them on the candidates. These bulk
    // rows are SQL of their own: FakeHold writes one row per statement.
    sqlx::query(
        "INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot, reason, hold_seconds,
                                   created_at, expires_at, ended_at, ended_by, end_reason)
         SELECT $1, 'H-' || g, ids.ids[1 + g % 40], CASE WHEN g % 3 = 0 THEN 'cancelled' ELSE 'expired' END,
                '{\"site\": \"par1\"}', '{\"asset_tag\": \"M-1\"}', 'history of a busy pool', 900,
                clock_timestamp() - interval '2 days', clock_timestamp() - interval '2 days' + interval '15 minutes',
                clock_timestamp() - interval '2 days' + interval '15 minutes', 'sweep', 'history'
           FROM generate_series(1, 50000) g,
                (SELECT array_agg(id ORDER BY id) AS ids FROM machines WHERE org_id = $1) ids",
    )
    .bind(org.id)
    .execute(&pool)
    .await
    .expect("history");
    // A third of them were converted, and their service links have ended since.
    sqlx::query(
        "UPDATE reservations SET state = 'converted' WHERE org_id = $1 AND state = 'cancelled'",
    )
    .bind(org.id)
    .execute(&pool)
    .await
    .expect("converted history");
    sqlx::query(
        "INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at, ended_at, ended_by)
         SELECT org_id, machine_id, id, 'SRV-' || id, ended_at, ended_at + interval '1 hour', 'test'
           FROM reservations WHERE org_id = $1 AND state = 'converted'",
    )
    .bind(org.id)
    .execute(&pool)
    .await
    .expect("ended service links");
    // And a busy present: 1,000 held reservations and 300 live services on
    // machines of other specs.
    sqlx::query(
        "INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason, hold_seconds, expires_at)
         SELECT $1, 'NOW-' || m.id, m.id, '{}', '{}', 'held now', 900, clock_timestamp() + interval '15 minutes'
           FROM machines m WHERE m.org_id = $1 AND m.site = 'ams1' ORDER BY m.id LIMIT 1000",
    )
    .bind(org.id)
    .execute(&pool)
    .await
    .expect("held now");
    let last: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM machines WHERE org_id = $1 AND site = 'ams1' ORDER BY id DESC LIMIT 300",
    )
    .bind(org.id)
    .fetch_all(&pool)
    .await
    .expect("the last 300 of ams1");
    sell(&pool, org.id, &last).await;
    sqlx::query("ANALYZE")
        .execute(&pool)
        .await
        .expect("analyze");
    let mut conn = limited_connection(&db).await;
    let explain = format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
        allocator::candidate_query()
    );
    let plan = explain_plan(&mut conn, &explain, org.id).await;
    let rows = plan[0]["Plan"]["Actual Rows"].as_f64().unwrap_or(0.0);
    assert_eq!(rows, 20.0, "every candidate is found: {plan}");
    let indexed = buffers(&plan);
    const BOUND: i64 = 250;
    assert!(
        indexed <= BOUND,
        "the candidate query touched {indexed} buffers: {plan:#}"
    );
    let text = plan.to_string();
    assert!(
        !text.contains("\"Seq Scan\""),
        "a sequential scan: {plan:#}"
    );
    assert!(
        text.contains("reservations_one_holder_per_machine"),
        "{plan:#}"
    );
    assert!(
        text.contains("service_links_one_live_per_machine"),
        "{plan:#}"
    );
    assert!(text.contains("machines_sellable_idx"), "{plan:#}");
    // The same query, forbidden its indexes, blows through the bound.
    sqlx::query("BEGIN")
        .execute(&mut conn)
        .await
        .expect("begin");
    sqlx::query("SET LOCAL enable_indexscan = off")
        .execute(&mut conn)
        .await
        .expect("set");
    sqlx::query("SET LOCAL enable_bitmapscan = off")
        .execute(&mut conn)
        .await
        .expect("set");
    let plan = explain_plan(&mut conn, &explain, org.id).await;
    sqlx::query("ROLLBACK")
        .execute(&mut conn)
        .await
        .expect("rollback");
    let scanned = buffers(&plan);
    assert!(
        scanned > BOUND * 4,
        "without indexes: {scanned} buffers (indexed: {indexed})"
    );
    eprintln!("candidate query: {indexed} buffers on indexes, {scanned} without");
}
/// Pass one steps over no sold machine. A shop's oldest machines, the
/// lowest ids, are the ones it has sold; the candidate list, planned
/// generically as the allocator's functions force it, goes straight to the
/// first unsold one on `machines_sellable_idx`, and a reserve takes it. The
/// same walk over every machine's verdict (the copy `in_service` unused)
/// probes each sold machine first and blows through the bound.
#[tokio::test]
async fn pass_one_steps_over_the_machines_in_service() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "sold", true).await;
    let ids = ready_machines(&pool, org.id, 600, "'S-' || lpad(g::text, 4, '0')").await;
    sell(&pool, org.id, &ids[..500]).await;
    sqlx::query("ANALYZE")
        .execute(&pool)
        .await
        .expect("analyze");
    let mut conn = limited_connection(&db).await;
    for set in [
        "SET plan_cache_mode = force_generic_plan",
        "SET enable_seqscan = off",
        "SET enable_sort = off",
    ] {
        sqlx::query(set).execute(&mut conn).await.expect("set");
    }
    let args = format!(
        "({}, {}, {}, NULL, 5)",
        org.id,
        literal(SITE),
        literal(PROFILE)
    );
    let walk = |name: &str, query: &str| {
        (
            format!("PREPARE {name}(bigint, text, text, text, bigint) AS {query}"),
            format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {name}{args}"),
        )
    };
    let mut plans = Vec::new();
    for (name, query) in [
        ("sellable", allocator::candidate_query()),
        (
            "every_verdict",
            "SELECT * FROM machine_verdicts($1, $2, $3, $4) v
              WHERE v.site = $2 AND v.profile = $3 AND v.status = 'ready' AND v.exclusion IS NULL
              ORDER BY v.id LIMIT $5"
                .to_owned(),
        ),
    ] {
        let (prepare, explain) = walk(name, &query);
        sqlx::query(sqlx::AssertSqlSafe(prepare))
            .execute(&mut conn)
            .await
            .expect("prepare");
        let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
            .fetch_one(&mut conn)
            .await
            .expect("explain");
        plans.push(plan);
    }
    let candidates: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM machine_candidates($1, $2, $3, NULL, 5)")
            .bind(org.id)
            .bind(SITE)
            .bind(PROFILE)
            .fetch_all(&mut conn)
            .await
            .expect("candidates");
    assert_eq!(candidates, ids[500..505]);
    let (sellable, every) = (&plans[0], &plans[1]);
    assert_eq!(
        sellable[0]["Plan"]["Actual Rows"].as_f64(),
        Some(5.0),
        "{sellable:#}"
    );
    let text = sellable.to_string();
    assert!(text.contains("machines_sellable_idx"), "{sellable:#}");
    const BOUND: i64 = 80;
    let (walked, probed) = (buffers(sellable), buffers(every));
    assert!(walked <= BOUND, "{walked} buffers: {sellable:#}");
    assert!(probed > BOUND * 4, "over every verdict: {probed} buffers");
    eprintln!("candidates past 500 sold machines: {walked} buffers, {probed} without the copy");
    // And a reserve takes the first machine not in service.
    let reservation = reserved(&pool, org.id, "ORD-PAST-SOLD", None).await;
    assert_eq!(reservation.machine_id, ids[500]);
}

/// A fresh deployment does not slow as it fills: a plan cached
/// while `reservations` was analyzed empty must stay on the arbiter index
/// once the table has grown. The connection takes the settings the
/// allocator's functions declare (read from the catalog, so removing them
/// fails this test), caches the generic plan of the re-check under the lock
/// while the table is empty, then explains it after 5,000 reservations.
#[tokio::test]
async fn plans_cached_on_an_empty_table_stay_on_the_arbiter_index_as_it_fills() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "fresh", true).await;
    let first = FakeMachine::new().tag("F-0001").create(&pool, org.id).await;
    // F-00002 to F-05000, after the first.
    ready_machines(&pool, org.id, 4999, "'F-' || lpad((g + 1)::text, 5, '0')").await;
    sqlx::query("ANALYZE")
        .execute(&pool)
        .await
        .expect("analyze empty");
    let config: Vec<String> = sqlx::query_scalar(
        "SELECT unnest(proconfig) FROM pg_proc WHERE proname IN ('reserve_walk_slots', 'reserve_order')",
    )
    .fetch_all(&pool)
    .await
    .expect("function settings");
    assert!(
        config.iter().any(|c| c == "enable_seqscan=off"),
        "the allocator's functions keep their plans off sequential scans: {config:?}"
    );
    let mut conn = limited_connection(&db).await;
    take_settings(&mut conn, &config).await;
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut conn)
        .await
        .expect("generic plans");
    // The re-check of reserve_walk_slots, and pass one's candidates.
    for (name, sql) in [
        (
            "recheck",
            "PREPARE recheck(bigint, text, text, text, bigint) AS
             SELECT * FROM machine_verdicts($1, $2, $3, $4) v WHERE v.id = $5",
        ),
        (
            "candidates",
            "PREPARE candidates(bigint, text, text, text, bigint) AS
             SELECT * FROM machine_candidates($1, $2, $3, $4, $5)",
        ),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect(name);
        let execute = format!(
            "EXECUTE {name}({}, '{SITE}', '{PROFILE}', NULL, {first})",
            org.id
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(execute))
            .execute(&mut conn)
            .await
            .expect("cached while empty");
    }
    // The table fills (no ANALYZE: autoanalyze has not come by yet), in one
    // statement (FakeHold writes one row per statement).
    sqlx::query(
        "INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot, reason,
                                   hold_seconds, expires_at, ended_at, ended_by, end_reason)
         SELECT $1, 'FILL-' || m.id, m.id, CASE WHEN m.id % 2 = 0 THEN 'held' ELSE 'cancelled' END,
                '{}', '{}', 'filling', 900, clock_timestamp() + interval '15 minutes',
                CASE WHEN m.id % 2 = 0 THEN NULL ELSE clock_timestamp() END,
                CASE WHEN m.id % 2 = 0 THEN NULL ELSE 'test' END, NULL
           FROM machines m WHERE m.org_id = $1",
    )
    .bind(org.id)
    .execute(&pool)
    .await
    .expect("fill");
    for name in ["recheck", "candidates"] {
        let explain = format!(
            "EXPLAIN (FORMAT JSON) EXECUTE {name}({}, '{SITE}', '{PROFILE}', NULL, {first})",
            org.id
        );
        let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
            .fetch_one(&mut conn)
            .await
            .expect("explain");
        let text = plan.to_string();
        assert!(
            !text.contains("\"Seq Scan\""),
            "{name}: a sequential scan: {plan:#}"
        );
        assert!(
            text.contains("reservations_one_holder_per_machine"),
            "{name}: the held probe is not on the arbiter index: {plan:#}"
        );
        assert!(
            !text.contains("reservations_held_by_deadline_idx")
                && !text.contains("reservations_by_machine_idx"),
            "{name}: the held probe walks more than one entry per machine: {plan:#}"
        );
    }
}

/// The hot path's lookups by key stay on their key's index when the plans
/// were cached while `reservations` was analyzed empty (a new deployment,
/// before autoanalyze comes by). On such a table every index led by
/// `org_id` costs the same, and a plain `(org_id, created_at)` index (the
/// overview's chart) was chosen for the R9 lookup by order_ref and the
/// transition's lookups by id: each then read the organization's whole
/// history (found by bench item 8 on a small fresh database: the reserve
/// rate fell by a third in a few seconds, and recovered at once after an
/// ANALYZE). Measured here as buffers, which count the functions' nested
/// statements.
#[tokio::test]
async fn plans_cached_on_an_empty_table_look_reservations_up_by_their_keys() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "fresh-keys", true).await;
    for i in 0..100 {
        FakeMachine::new()
            .tag(&format!("K-{i:04}"))
            .create(&pool, org.id)
            .await;
    }
    // Analyzed empty, and kept so for the test: autoanalyze would re-plan.
    sqlx::raw_sql("ANALYZE; ALTER TABLE reservations SET (autovacuum_enabled = off)")
        .execute(&pool)
        .await
        .expect("analyze empty");
    let mut conn = limited_connection(&db).await;
    let reserve = |order_ref: String| {
        format!(
            "SELECT (x.reservation).id, (x.reservation).fence FROM reserve_order_request({}, 'test',
                 '{{\"order_ref\": \"{order_ref}\", \"site\": \"{SITE}\", \"profile\": \"{PROFILE}\", \"hold_seconds\": 900}}') x",
            org.id
        )
    };
    let cancel = |id: i64, fence: i64| {
        format!(
            "SELECT * FROM reservation_transition({}, {id}, {fence}, 'test', 'cancel', 'keys')",
            org.id
        )
    };
    // Plans cached while empty: a reserve, its replay, a cancel.
    for _ in 0..2 {
        let (id, fence): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(reserve("KEYS-0".into())))
            .fetch_one(&mut conn)
            .await
            .expect("reserve while empty");
        sqlx::raw_sql(sqlx::AssertSqlSafe(cancel(id, fence)))
            .execute(&mut conn)
            .await
            .expect("cancel while empty");
    }
    // The history grows (no ANALYZE), in one statement (FakeHold writes one
    // row per statement).
    sqlx::query(
        "INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot, reason,
                                   hold_seconds, expires_at, ended_at, ended_by, end_reason)
         SELECT $1, 'OLD-' || g, (SELECT min(id) FROM machines WHERE org_id = $1) + g % 100,
                'cancelled', '{}', '{}', 'history', 900, clock_timestamp() + interval '15 minutes',
                clock_timestamp(),
                'test', NULL
           FROM generate_series(1, 20000) g",
    )
    .bind(org.id)
    .execute(&pool)
    .await
    .expect("history");
    let buffers = |plan: &serde_json::Value| {
        let top = &plan[0]["Plan"];
        top["Shared Hit Blocks"].as_i64().unwrap_or(i64::MAX)
            + top["Shared Read Blocks"].as_i64().unwrap_or(i64::MAX / 2)
    };
    let explain = |sql: String| format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}");
    let plan: serde_json::Value =
        sqlx::query_scalar(sqlx::AssertSqlSafe(explain(reserve("KEYS-1".into()))))
            .fetch_one(&mut conn)
            .await
            .expect("reserve after the history grew");
    let reserved = buffers(&plan);
    let (id, fence): (i64, i64) = sqlx::query_as(
        "SELECT id, fence FROM reservations WHERE org_id = $1 AND order_ref = 'KEYS-1'",
    )
    .bind(org.id)
    .fetch_one(&pool)
    .await
    .expect("the reservation");
    let plan: serde_json::Value =
        sqlx::query_scalar(sqlx::AssertSqlSafe(explain(cancel(id, fence))))
            .fetch_one(&mut conn)
            .await
            .expect("cancel after the history grew");
    let cancelled = buffers(&plan);
    // 20,000 ended reservations: reading them costs thousands of buffers;
    // the keyed lookups, a few dozen.
    assert!(
        reserved < 300 && cancelled < 300,
        "buffers with 20,000 ended reservations and plans cached while empty: \
         reserve {reserved}, cancel {cancelled}"
    );
}

/// The cancel and convert statements (of one reservation and of an order,
/// through the API's one-statement functions and the dashboard's) read the
/// reservation they answer by its key, whatever the history: with 20,000
/// ended reservations, analyzed, no sequential scan of `reservations` in
/// their transaction (`pg_stat_xact_user_tables` counts this backend's).
/// A plain join of the function's rows, which the planner expects to be
/// 1,000, hashed the whole table on every cancel (bench item 1 at a fifth
/// of its rate).
#[tokio::test]
async fn cancels_and_converts_read_their_reservation_by_its_key_at_any_history() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "keyed-answers", true).await;
    for i in 0..8 {
        FakeMachine::new()
            .tag(&format!("KA-{i}"))
            .create(&pool, org.id)
            .await;
    }
    sqlx::query(
        "INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot, reason,
                                   hold_seconds, expires_at, ended_at, ended_by, end_reason)
         SELECT $1, 'OLD-' || g, (SELECT min(id) FROM machines WHERE org_id = $1) + g % 8,
                'cancelled', '{}', '{}', 'history', 900, clock_timestamp() + interval '15 minutes',
                clock_timestamp(), 'test', NULL
           FROM generate_series(1, 20000) g",
    )
    .bind(org.id)
    .execute(&pool)
    .await
    .expect("history");
    sqlx::query("ANALYZE reservations")
        .execute(&pool)
        .await
        .expect("analyze");
    let token = poolkeeper::tokens::digest(&org.token);
    let mut conn = db.connection().await;
    let seq_scans = async |conn: &mut sqlx::PgConnection| -> i64 {
        sqlx::query_scalar(
            "SELECT coalesce(sum(seq_scan), 0)::bigint FROM pg_stat_xact_user_tables
              WHERE relname = 'reservations'",
        )
        .fetch_one(conn)
        .await
        .expect("seq_scan")
    };
    let hold = async |order_ref: &str, quantity: i64| -> Vec<reservations::Named> {
        let mut req = request(order_ref, None);
        req.quantity = Quantity::new(quantity).expect("quantity");
        match allocator::reserve(&pool, org.id, &req)
            .await
            .expect("reserve")
        {
            ReserveOutcome::Created {
                reservation,
                others,
                ..
            } => std::iter::once(&reservation)
                .chain(others.iter())
                .map(|r| reservations::Named {
                    id: r.id,
                    fence: r.fence,
                })
                .collect(),
            other => panic!("a hold for {order_ref}: {other:?}"),
        }
    };
    // The API's cancel of one reservation.
    let one = hold("KA-ONE", 1).await;
    let mut tx = conn.begin().await.expect("begin");
    reservations::transition_for_token(
        &mut *tx,
        &token,
        true,
        one[0].id,
        one[0].fence,
        reservations::Transition::Cancel("keyed"),
    )
    .await
    .expect("statement")
    .expect("caller")
    .expect("cancelled");
    assert_eq!(seq_scans(&mut tx).await, 0, "the API's cancel");
    tx.commit().await.expect("commit");
    // The API's convert of an order of two.
    let two = hold("KA-TWO", 2).await;
    let refs = [
        ServiceRef::parse("SRV-KA-1").expect("ref"),
        ServiceRef::parse("SRV-KA-2").expect("ref"),
    ];
    let mut tx = conn.begin().await.expect("begin");
    reservations::order_transition_for_token(
        &mut tx,
        &token,
        true,
        Some("KA-TWO"),
        &two,
        reservations::OrderAction::Convert {
            service_refs: &refs,
        },
    )
    .await
    .expect("statement")
    .expect("caller")
    .expect("converted");
    assert_eq!(seq_scans(&mut tx).await, 0, "the API's order convert");
    tx.commit().await.expect("commit");
    // The dashboard's cancel of one reservation.
    let three = hold("KA-THREE", 1).await;
    let mut tx = conn.begin().await.expect("begin");
    reservations::cancel_on(
        &mut tx,
        org.id,
        three[0].id,
        three[0].fence,
        "staff",
        "keyed",
    )
    .await
    .expect("cancelled");
    assert_eq!(seq_scans(&mut tx).await, 0, "the dashboard's cancel");
    tx.commit().await.expect("commit");
}

/// Every function that steers its plans by disabling node types also turns
/// JIT off: a disabled node the planner must keep costs 10^10, past
/// jit_above_cost, and JIT would compile that statement at every call
/// (half a second each, seen in reserves with substitutes). The control:
/// with the same steering and JIT left on, the server does compile the
/// substitutes' ordered turns, so the first check would see a regression.
#[tokio::test]
async fn functions_that_steer_their_plans_never_compile_them_with_jit() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let missing: Vec<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p
          WHERE p.pronamespace = 'public'::regnamespace
            AND p.proconfig && ARRAY['enable_seqscan=off', 'enable_sort=off']
            AND NOT p.proconfig @> ARRAY['jit=off']
          ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("function settings");
    assert!(
        missing.is_empty(),
        "functions that steer plans without `SET jit = off`: {missing:?}"
    );
    let available: bool = sqlx::query_scalar("SELECT pg_jit_available()")
        .fetch_one(&pool)
        .await
        .expect("jit available");
    assert!(
        available,
        "this PostgreSQL cannot JIT-compile (its llvmjit library is missing), so this test cannot tell \
         whether the functions' settings keep JIT off: install the server package with its JIT support"
    );
    let config: Vec<String> = sqlx::query_scalar(
        "SELECT unnest(proconfig) FROM pg_proc WHERE proname = 'reserve_substituting'",
    )
    .fetch_all(&pool)
    .await
    .expect("reserve_substituting's settings");
    assert!(
        config.iter().any(|c| c == "enable_sort=off"),
        "the control needs a function that disables sorts: {config:?}"
    );
    // The ordered turns of substitute_turns, under the function's settings.
    const TURNS: &str = "EXPLAIN (ANALYZE, FORMAT JSON)
        SELECT x.p FROM (SELECT DISTINCT p FROM unnest(ARRAY['b', 'a']) p
                          WHERE EXISTS (SELECT 1 FROM headroom h
                                         WHERE h.org_id = 1 AND h.site = 'par1' AND h.profile = p)) x
         ORDER BY hashtext('1/par1/' || x.p), x.p";
    let compiled = |with_jit: bool| {
        let config = config.clone();
        let db = &db;
        async move {
            let mut conn = limited_connection(db).await;
            let settings: Vec<String> = config
                .iter()
                .map(|c| {
                    if with_jit && c == "jit=off" {
                        "jit=on".to_owned()
                    } else {
                        c.clone()
                    }
                })
                .collect();
            take_settings(&mut conn, &settings).await;
            let plan: serde_json::Value = sqlx::query_scalar(TURNS)
                .fetch_one(&mut conn)
                .await
                .expect("explain");
            plan[0].get("JIT").is_some()
        }
    };
    assert!(
        compiled(true).await,
        "control: with the steering settings and JIT on, the server should compile the ordered turns"
    );
    assert!(
        !compiled(false).await,
        "reserve_substituting's settings compile the ordered turns with JIT"
    );
}

/// A sold-out pool's lookups stay on the pool's indexes when one profile
/// fills the statistics: the organization's machines are all of one
/// profile when ANALYZE runs, then a profile with no sellable machine is
/// added (a reserve of it is refused, or served by a substitute). The
/// generic plans the allocator keeps per connection (its functions'
/// settings, read from the catalog) must read a few index pages, not every
/// machine of the site (143 buffers here before the profile's estimate was
/// fixed).
#[tokio::test]
async fn a_sold_out_pools_lookups_read_its_index_not_the_site_when_one_profile_fills_the_statistics()
 {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "oneprofile", true).await;
    sqlx::query(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
         SELECT $1, 'ONE-' || lpad(g::text, 5, '0'), 's' || (1 + g % 10), 'dell', 'epyc-main', 'ready'
           FROM generate_series(1, 10000) g",
    )
    .bind(org.id)
    .execute(&pool)
    .await
    .expect("machines");
    sqlx::query("ANALYZE machines")
        .execute(&pool)
        .await
        .expect("analyze");
    sqlx::query(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
         SELECT $1, 'OUT-' || g, 's' || (1 + g % 10), 'dell', 'epyc-out', 'maintenance'
           FROM generate_series(1, 10) g",
    )
    .bind(org.id)
    .execute(&pool)
    .await
    .expect("the sold-out profile");
    let config: Vec<String> = sqlx::query_scalar(
        "SELECT unnest(proconfig) FROM pg_proc WHERE proname = 'reserve_substituting'",
    )
    .fetch_all(&pool)
    .await
    .expect("settings");
    let mut conn = limited_connection(&db).await;
    take_settings(&mut conn, &config).await;
    for (name, sql, args) in [
        (
            "candidates",
            "PREPARE candidates(bigint, text, text, text, bigint) AS
             SELECT c.id FROM machine_candidates($1, $2, $3, $4, $5) c",
            "($1, 's3', 'epyc-out', NULL, 5)",
        ),
        (
            "matching",
            "PREPARE matching(bigint, text, text, text) AS
             SELECT count(*) FROM machine_verdicts($1, $2, $3, $4) v
              WHERE v.site = $2 AND v.profile = $3 AND v.status = 'ready' AND v.exclusion IS NULL",
            "($1, 's3', 'epyc-out', NULL)",
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect("prepare");
        let explain = format!(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {name}{}",
            args.replace("$1", &org.id.to_string())
        );
        let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
            .fetch_one(&mut conn)
            .await
            .expect("explain");
        let text = plan.to_string();
        let hit = plan[0]["Plan"]["Shared Hit Blocks"]
            .as_i64()
            .unwrap_or(i64::MAX)
            + plan[0]["Plan"]["Shared Read Blocks"].as_i64().unwrap_or(0);
        assert!(
            hit <= 10 && !text.contains("machines_by_site_idx"),
            "{name}: the sold-out pool's lookup read {hit} buffers: {plan:#}"
        );
    }
}

/// Takes on `conn` the settings `settings` (`name=value`, as pg_proc's
/// proconfig lists a function's), as the function's own statements run.
async fn take_settings(conn: &mut sqlx::PgConnection, settings: &[String]) {
    for setting in settings {
        let (name, value) = setting.split_once('=').expect("name=value");
        sqlx::query("SELECT set_config($1, $2, false)")
            .bind(name)
            .bind(value)
            .execute(&mut *conn)
            .await
            .expect("set");
    }
}
