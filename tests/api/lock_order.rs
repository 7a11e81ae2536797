//! The lock order (docs/rules.md): machines, then reservations, each in id
//! order, then only SKIP LOCKED. Each test lines its transactions up on
//! purpose: a session of the test holds the rows they need until every one
//! of them waits, then lets go, many rounds; no request may answer `503`
//! and the test's database (fresh, so at 0 before) may count no deadlock.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::healing::invariants;
use crate::helpers::{PROFILE, SITE, TestApp, spawn_app};

async fn put(app: &TestApp, tag: &str, status: &str) {
    let r = app
        .put_machine(&app.org.token, tag, SITE, "dell", PROFILE, status)
        .await;
    assert!(r.status().is_success(), "{}", r.status());
}

async fn ready(app: &TestApp, tag: &str) {
    put(app, tag, "ready").await;
}

/// The API's status change of `tags`, in a task of its own.
fn status_change(
    app: &Arc<TestApp>,
    tags: &[&str],
    status: &str,
) -> tokio::task::JoinHandle<(StatusCode, Value)> {
    let app = app.clone();
    let body = json!({"asset_tags": tags, "status": status});
    tokio::spawn(async move { app.post_json("/api/v1/status-changes", body).await })
}

/// Waits until `n` sessions of the server wait for a lock; fails after
/// `POLL_BOUND` when fewer do.
async fn until_waiting(app: &TestApp, n: i64) {
    crate::helpers::until(
        &format!("{n} sessions of the server waiting for a lock"),
        crate::helpers::POLL_BOUND,
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'
                    AND application_name = 'poolkeeper' AND pid <> pg_backend_pid()",
            )
            .fetch_one(&app.pool)
            .await
            .expect("pg_stat_activity");
            (waiting >= n).then_some(())
        },
    )
    .await
}

/// The deadlocks PostgreSQL counted in the test's database, once the test
/// is over. A backend reports its counters when it goes idle, at most once
/// a second, and always when it exits: every other session of the
/// database is ended first, and waited for, on a connection of its own.
async fn deadlocks_at_the_end(app: &TestApp) -> i64 {
    use sqlx::Connection;
    let mut conn = app.db.connection().await;
    let ended: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM (SELECT pid FROM pg_stat_activity
                           WHERE datname = current_database() AND pid <> pg_backend_pid()
                          OFFSET 0) others
          WHERE pg_terminate_backend(pid)",
    )
    .fetch_all(&mut conn)
    .await
    .expect("end the other sessions");
    let deadline = tokio::time::Instant::now() + crate::helpers::POLL_BOUND;
    loop {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
                .bind(&ended)
                .fetch_one(&mut conn)
                .await
                .expect("sessions left");
        if left == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {:?} for the {} terminated sessions to end, {left} left",
            crate::helpers::POLL_BOUND,
            ended.len()
        );
        tokio::task::yield_now().await;
    }
    let count = sqlx::query_scalar(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&mut conn)
    .await
    .expect("pg_stat_database");
    let _ = conn.close().await;
    count
}

/// Each member's machine of `order`, by slot.
async fn machines_of(app: &TestApp, order: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT m.asset_tag FROM reservations r JOIN machines m ON m.id = r.machine_id
          WHERE r.order_ref = $1 ORDER BY r.slot",
    )
    .bind(order)
    .fetch_all(&app.pool)
    .await
    .expect("machines of the order")
}

/// Two racks, A with a machine of order O and one of order P, B with the
/// other machine of each, into maintenance at once. A session holds the
/// rows of both orders until both changes wait; each change then needs
/// both orders. O (dell) holds, P (hpe) holds, so
/// that a change taking the orders' rows machine by machine, in the order
/// of the machines, would take O then P on rack A and P then O
/// on rack B.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_status_changes_of_racks_that_share_orders_queue_instead_of_deadlocking() {
    let app = Arc::new(spawn_app().await);
    for round in 0..8 {
        let tag = |i: usize| format!("R{round}-{i}");
        // R-0 .. R-3, then a spare of each vendor for every hold.
        for (i, vendor) in ["dell", "hpe", "hpe", "dell", "dell", "dell", "hpe", "hpe"]
            .into_iter()
            .enumerate()
        {
            let r = app
                .put_machine(&app.org.token, &tag(i), SITE, vendor, PROFILE, "ready")
                .await;
            assert!(r.status().is_success(), "{}", r.status());
        }
        let (o, p) = (format!("O-{round}"), format!("P-{round}"));
        for (order, vendor) in [(&o, "dell"), (&p, "hpe")] {
            let (status, body) = app.post_json("/api/v1/reservations",
                json!({"order_ref": order, "site": SITE, "profile": PROFILE, "vendor": vendor, "quantity": 2}),
            )
            .await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
        }
        let (om, pm) = (machines_of(&app, &o).await, machines_of(&app, &p).await);
        assert_eq!(
            (om.clone(), pm.clone()),
            (vec![tag(0), tag(3)], vec![tag(1), tag(2)])
        );
        let mut blocker = app.pool.begin().await.expect("blocker");
        sqlx::query("SELECT 1 FROM reservations WHERE order_ref = ANY($1) FOR UPDATE")
            .bind(vec![o.clone(), p.clone()])
            .execute(&mut *blocker)
            .await
            .expect("hold the orders' rows");
        let a = status_change(&app, &[&om[0], &pm[0]], "maintenance");
        let b = status_change(&app, &[&pm[1], &om[1]], "maintenance");
        until_waiting(&app, 2).await;
        blocker.commit().await.expect("let go");
        for (rack, change) in [("A", a), ("B", b)] {
            let (code, body) = change.await.expect("status change task");
            assert_eq!(code, StatusCode::OK, "round {round}, rack {rack}: {body}");
        }
        invariants(&app, round).await;
        for order in [&o, &p] {
            let held: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM reservations r JOIN machines m ON m.id = r.machine_id
                  WHERE r.order_ref = $1 AND r.state = 'held' AND m.status = 'ready'",
            )
            .bind(order)
            .fetch_one(&app.pool)
            .await
            .expect("held");
            assert_eq!(held, 2, "round {round}: {order} moved whole to the spares");
        }
        sqlx::query("UPDATE machines SET status = 'retired' WHERE status = 'ready'")
            .execute(&app.pool)
            .await
            .expect("retire");
    }
    assert_eq!(deadlocks_at_the_end(&app).await, 0, "deadlocks counted");
}

/// A convert waits for the machine under its hold while a status change
/// moves the hold to a spare; a second status change of that spare waits
/// too. When the first commits, the convert holds a machine its hold has
/// left, and the second change may take the spare and wait for the hold's
/// row: the convert must then not wait for the spare while it holds the
/// row. Whichever of the two gets the spare first, the convert sells the
/// machine the hold is on when it commits: the spare, before the second
/// change, or the last ready machine, where the second change moved it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_convert_whose_hold_moves_while_it_waits_sells_where_the_hold_is() {
    let app = Arc::new(spawn_app().await);
    for round in 0..10 {
        let (old, spare, last) = (
            format!("V{round}-old"),
            format!("V{round}-spare"),
            format!("V{round}-last"),
        );
        ready(&app, &old).await;
        let order = format!("C-{round}");
        let hold = app
            .reserve_created(
                &app.org.token,
                json!({"order_ref": &order, "site": SITE, "profile": PROFILE, "quantity": 1}),
            )
            .await;
        ready(&app, &spare).await;
        let mut first = app.pool.begin().await.expect("first change");
        sqlx::query("UPDATE machines SET status = 'maintenance' WHERE asset_tag = $1")
            .bind(&old)
            .execute(&mut *first)
            .await
            .expect("move the hold to the spare");
        // Only now: the first change took the spare, not this one.
        ready(&app, &last).await;
        let id = hold["id"].as_i64().expect("id");
        let convert = {
            let (app, fence) = (app.clone(), hold["fence"].clone());
            tokio::spawn(async move {
                app.post_json(
                    &format!("/api/v1/reservations/{id}/convert"),
                    json!({"fence": fence, "service_ref": format!("svc-{id}")}),
                )
                .await
            })
        };
        until_waiting(&app, 1).await;
        let second = status_change(&app, &[&spare], "broken");
        until_waiting(&app, 2).await;
        first.commit().await.expect("first change commits");
        let (code, changed) = second.await.expect("second change task");
        assert_eq!(code, StatusCode::OK, "round {round}: {changed}");
        let (code, sold) = convert.await.expect("convert task");
        assert_eq!(code, StatusCode::OK, "round {round}: {sold}");
        assert_eq!(sold["state"], "converted", "round {round}: {sold}");
        let moved_again = !changed["holds"].as_array().expect("holds").is_empty();
        let expected = if moved_again { &last } else { &spare };
        assert_eq!(
            machines_of(&app, &order).await,
            std::slice::from_ref(expected),
            "round {round}: {changed}"
        );
        let link_machine: String = sqlx::query_scalar(
            "SELECT m.asset_tag FROM service_links s JOIN machines m ON m.id = s.machine_id
              WHERE s.reservation_id = $1",
        )
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .expect("the link");
        assert_eq!(
            &link_machine, expected,
            "round {round}: sold where it was held"
        );
        invariants(&app, round).await;
        sqlx::query("UPDATE machines SET status = 'retired' WHERE status = 'ready'")
            .execute(&app.pool)
            .await
            .expect("retire");
    }
    assert_eq!(deadlocks_at_the_end(&app).await, 0, "deadlocks counted");
}

/// A rack of 80 held machines into maintenance, every hold moved to a
/// spare, in one transaction that opens no subtransaction per hold (80 is
/// past the 64 subtransactions a backend caches). A row written inside a
/// subtransaction carries the subtransaction's id as its xmin, so every
/// moved reservation must carry the transaction's own.
#[tokio::test]
async fn a_rack_into_maintenance_heals_eighty_holds_without_a_subtransaction_each() {
    use crate::helpers::{Generated, generated_machines, literal};
    use poolkeeper::domain::{AssetTag, MachineStatus};
    use poolkeeper::healing::{self, HoldOutcome, StatusChange};
    let app = spawn_app().await;
    const HOLDS: usize = 80;
    let (site, profile) = (literal(SITE), literal(PROFILE));
    let rack = |tag| Generated {
        tag,
        site: &site,
        vendor: "'dell'",
        profile: &profile,
        status: "'ready'",
    };
    generated_machines(
        &app.pool,
        app.org.id,
        HOLDS as i64,
        rack("'K-' || lpad(g::text, 3, '0')"),
    )
    .await;
    for i in 1..=HOLDS {
        app.reserve_created(&app.org.token, json!({"order_ref": &format!("S-{i:03}"), "site": SITE, "profile": PROFILE, "quantity": 1})).await;
    }
    generated_machines(
        &app.pool,
        app.org.id,
        HOLDS as i64,
        rack("'Z-' || lpad(g::text, 3, '0')"),
    )
    .await;
    let tags: Vec<AssetTag> = (1..=HOLDS)
        .map(|i| AssetTag::parse(&format!("K-{i:03}")).expect("tag"))
        .collect();
    let mut tx = app.pool.begin().await.expect("begin");
    let changed = healing::change_status(
        &mut tx,
        &StatusChange {
            org_id: app.org.id,
            tags: &tags,
            status: MachineStatus::parse("maintenance").expect("status"),
            actor: "test",
        },
    )
    .await
    .expect("change")
    .expect("known machines");
    let moved = changed
        .holds
        .iter()
        .filter(|h| matches!(h, HoldOutcome::Moved { .. }))
        .count();
    assert_eq!(moved, HOLDS, "{:?}", changed.holds);
    let (ours, others): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE r.xmin = top.xid), count(*) FILTER (WHERE r.xmin <> top.xid)
           FROM reservations r,
                (SELECT (pg_current_xact_id()::text::bigint % 4294967296)::text::xid AS xid) top
          WHERE r.order_ref LIKE 'S-%'",
    )
    .fetch_one(&mut *tx)
    .await
    .expect("xmin of the moved holds");
    assert_eq!(
        (ours, others),
        (HOLDS as i64, 0),
        "every moved hold written by the transaction itself, none by a subtransaction"
    );
    tx.commit().await.expect("commit");
    invariants(&app, 0).await;
}
