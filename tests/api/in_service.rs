//! `machines.in_service`, the machine's copy of whether it has a live service
//! link (sql/services.sql): the counts per pool state read it, so it must
//! agree with `service_links` after every way a link changes, concurrent
//! ones included.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::helpers::{FakeMachine, PROFILE, SITE, TestApp, spawn_app};

/// Machines of `org` whose copy disagrees with `service_links`.
async fn disagreeing(app: &TestApp, org: i64) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT m.asset_tag FROM machines m
          WHERE m.org_id = $1
            AND m.in_service IS DISTINCT FROM EXISTS (SELECT 1 FROM service_links l
                                                       WHERE l.machine_id = m.id AND l.ended_at IS NULL)
          ORDER BY m.asset_tag",
    )
    .bind(org)
    .fetch_all(&app.pool)
    .await
    .expect("compare the copy")
}

async fn in_service(app: &TestApp, org: i64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM machines WHERE org_id = $1 AND in_service")
        .bind(org)
        .fetch_one(&app.pool)
        .await
        .expect("count in service")
}

/// Reserves a machine through the API: (id, fence).
async fn reserve(app: &TestApp, order_ref: &str) -> (i64, i64) {
    let body = app
        .reserve_created(
            &app.org.token,
            json!({"order_ref": order_ref, "site": SITE, "profile": PROFILE}),
        )
        .await;
    (
        body["id"].as_i64().expect("id"),
        body["fence"].as_i64().expect("fence"),
    )
}

type Task = tokio::task::JoinHandle<(reqwest::StatusCode, Value)>;

/// `machines` machines tagged `{tag}-NN`; the 8 lowest ids sold (converted
/// through the API, their services returned), the next 8 held (id, fence).
async fn sold_and_held(app: &TestApp, tag: &str, machines: usize) -> (Vec<i64>, Vec<(i64, i64)>) {
    for i in 0..machines {
        FakeMachine::new()
            .tag(&format!("{tag}-{i:02}"))
            .create(&app.pool, app.org.id)
            .await;
    }
    let mut services = Vec::new();
    for i in 0..8 {
        let (id, fence) = reserve(app, &format!("SOLD-{i}")).await;
        let body = app
            .convert_ok(
                &app.org.token,
                id,
                json!({"fence": fence, "service_ref": format!("SRV-{i}")}),
            )
            .await;
        services.push(body["service"]["id"].as_i64().expect("service id"));
    }
    let mut holds = Vec::new();
    for i in 0..8 {
        holds.push(reserve(app, &format!("HELD-{i}")).await);
    }
    (services, holds)
}

/// One task per hold converting it and one per service ending it, each
/// through the API once `barrier` lets it go.
fn converts_and_ends(
    app: &Arc<TestApp>,
    barrier: &Arc<Barrier>,
    holds: &[(i64, i64)],
    services: &[i64],
) -> Vec<Task> {
    let mut tasks = Vec::new();
    for (i, (id, fence)) in holds.iter().copied().enumerate() {
        let (app, barrier) = (app.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            app.convert(
                &app.org.token,
                id,
                json!({"fence": fence, "service_ref": format!("SRV-NEW-{i}")}),
            )
            .await
        }));
    }
    for &service in services {
        let (app, barrier) = (app.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            app.post_as(
                &app.org.token,
                &format!("/api/v1/services/{service}/end"),
                &json!({}),
            )
            .await
        }));
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn converts_and_ends_at_once_leave_every_machines_copy_true() {
    let app = Arc::new(spawn_app().await);
    let org = app.org.id;
    // 8 machines sold before the race, 8 held.
    let (services, holds) = sold_and_held(&app, "IS", 16).await;
    assert_eq!(in_service(&app, org).await, 8);
    assert_eq!(disagreeing(&app, org).await, Vec::<String>::new());

    // 16 writers released together, each through the API on its own
    // connection: 8 converts of the holds, 8 ends of the services.
    let barrier = Arc::new(Barrier::new(16));
    let tasks = converts_and_ends(&app, &barrier, &holds, &services);
    for t in tasks {
        let (status, body): (_, Value) = t.await.expect("task");
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(disagreeing(&app, org).await, Vec::<String>::new());
    assert_eq!(
        in_service(&app, org).await,
        8,
        "the 8 converted, not the 8 ended"
    );
    // What the counts read: R17's pool says the same.
    let (status, capacity) =
        crate::capacity::capacity(&app, &format!("?site={SITE}&profile={PROFILE}")).await;
    assert_eq!(status, 200, "{capacity}");
    assert_eq!(capacity["pools"][0]["sold"], 8, "{capacity}");
    assert_eq!(capacity["pools"][0]["held"], 0, "{capacity}");
}

/// Pass one skips the machines whose copy says they are in service
/// (`machines_sellable_idx`): reserves racing converts and ends of services
/// never hold a machine with a live link, and take machines that an ended
/// service has just freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reserves_racing_converts_and_ends_never_hold_a_machine_in_service() {
    let app = Arc::new(spawn_app().await);
    let org = app.org.id;
    // The 8 lowest ids sold, the next 8 held, 8 free.
    let (services, holds) = sold_and_held(&app, "RC", 24).await;

    // 24 clients released together: 8 converts, 8 ends, 8 new orders.
    let barrier = Arc::new(Barrier::new(24));
    let writes = converts_and_ends(&app, &barrier, &holds, &services);
    let mut orders = Vec::new();
    for i in 0..8 {
        let (app, barrier) = (app.clone(), barrier.clone());
        orders.push(tokio::spawn(async move {
            barrier.wait().await;
            app.reserve(
                &app.org.token,
                json!({"order_ref": format!("NEW-{i}"), "site": SITE, "profile": PROFILE}),
            )
            .await
        }));
    }
    for t in writes {
        let (status, body): (_, Value) = t.await.expect("task");
        assert_eq!(status, 200, "{body}");
    }
    let mut created = 0;
    for t in orders {
        let (status, body): (_, Value) = t.await.expect("task");
        match status.as_u16() {
            201 => created += 1,
            409 => assert_eq!(body["error"], "contended", "{body}"),
            _ => panic!("{status}: {body}"),
        }
    }
    assert!(created > 0, "8 machines were free before the race");
    let both: Vec<String> = sqlx::query_scalar(
        "SELECT m.asset_tag FROM machines m
           JOIN reservations r ON r.machine_id = m.id AND r.state = 'held'
           JOIN service_links l ON l.machine_id = m.id AND l.ended_at IS NULL
          WHERE m.org_id = $1",
    )
    .bind(org)
    .fetch_all(&app.pool)
    .await
    .expect("held and in service");
    assert_eq!(both, Vec::<String>::new());
    let held_in_service: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservations r JOIN machines m ON m.id = r.machine_id
          WHERE r.org_id = $1 AND r.state = 'held' AND m.in_service",
    )
    .bind(org)
    .fetch_one(&app.pool)
    .await
    .expect("held on a machine in service");
    assert_eq!(held_in_service, 0);
    assert_eq!(disagreeing(&app, org).await, Vec::<String>::new());
    assert_eq!(in_service(&app, org).await, 8, "the 8 converted");
}

#[tokio::test]
async fn a_link_inserted_moved_or_deleted_by_hand_keeps_the_copy_and_attaching_mends_drift() {
    let app = spawn_app().await;
    let org = app.org.id;
    let a = FakeMachine::new().tag("IS-A").create(&app.pool, org).await;
    let b = FakeMachine::new().tag("IS-B").create(&app.pool, org).await;
    let (hold, fence) = reserve(&app, "HAND-1").await;
    let body = app
        .convert_ok(
            &app.org.token,
            hold,
            json!({"fence": fence, "service_ref": "SRV-HAND"}),
        )
        .await;
    let link = body["service"]["id"].as_i64().expect("service id");
    let on: i64 = sqlx::query_scalar("SELECT machine_id FROM service_links WHERE id = $1")
        .bind(link)
        .fetch_one(&app.pool)
        .await
        .expect("the link's machine");
    let other = if on == a { b } else { a };
    let copy = |id: i64| {
        let app = &app;
        async move {
            sqlx::query_scalar::<_, bool>("SELECT in_service FROM machines WHERE id = $1")
                .bind(id)
                .fetch_one(&app.pool)
                .await
                .expect("copy")
        }
    };
    assert!(copy(on).await && !copy(other).await);

    // Moved to the other machine (an operator's repair): both rows follow.
    sqlx::query("UPDATE service_links SET machine_id = $2 WHERE id = $1")
        .bind(link)
        .bind(other)
        .execute(&app.pool)
        .await
        .expect("move the link");
    assert!(!copy(on).await && copy(other).await);
    // Deleted: the machine is no longer in service.
    sqlx::query("DELETE FROM service_links WHERE id = $1")
        .bind(link)
        .execute(&app.pool)
        .await
        .expect("delete the link");
    assert!(!copy(on).await && !copy(other).await);
    assert_eq!(disagreeing(&app, org).await, Vec::<String>::new());

    // A copy that drifted (written by hand, or before the trigger existed)
    // is mended when the definitions attach the trigger.
    let mut conn = app.pool.acquire().await.expect("connection");
    sqlx::query("UPDATE machines SET in_service = true WHERE id = $1")
        .bind(on)
        .execute(&mut *conn)
        .await
        .expect("drift");
    assert_eq!(disagreeing(&app, org).await.len(), 1);
    sqlx::raw_sql(include_str!("../../sql/services.sql"))
        .execute(&mut *conn)
        .await
        .expect("attach the trigger again");
    assert_eq!(disagreeing(&app, org).await, Vec::<String>::new());
}
