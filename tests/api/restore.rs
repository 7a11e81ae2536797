//! F5: after a restore, nothing handed out before it matches anything
//! handed out after it. A logical dump (`pg_dump -Fc`, `pg_restore`) here;
//! a physical backup recovered to a point in time is the drill of
//! tests/components/restore.rs.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use poolkeeper::db::Db;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};

use crate::helpers::receiver::Receiver;
use crate::helpers::replicas::Replica;
use crate::helpers::{TestApp, TestDb, empty_db, spawn_app};

const SITE: &str = "par1";
const PROFILE: &str = "r650";

/// What the order service and a replica were told, before the restore.
struct Told {
    before: (i64, i64),
    lost: (i64, i64),
    max_event: i64,
    /// The newest event the dump has.
    max_event_kept: i64,
    lost_lease_fence: i64,
}

async fn post(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    path: &str,
    body: Value,
) -> (StatusCode, Value) {
    let r = http
        .post(format!("{base}{path}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn reserve(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    order: &str,
) -> (i64, i64, String) {
    let (status, body) = post(
        http,
        base,
        token,
        "/api/v1/reservations",
        json!({"order_ref": order, "site": SITE, "profile": PROFILE}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "reserve {order}: {body}");
    (
        body["id"].as_i64().expect("id"),
        body["fence"].as_i64().expect("fence"),
        body["machine"]["asset_tag"]
            .as_str()
            .expect("machine")
            .to_owned(),
    )
}

/// A reserve through a server whose pool may still hold connections the
/// restore broke: those answer 503 and are dropped; bounded.
async fn reserve_through_503(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    order: &str,
) -> (i64, i64, String) {
    let body = json!({"order_ref": order, "site": SITE, "profile": PROFILE});
    for _ in 0..50 {
        let (status, answer) = post(http, base, token, "/api/v1/reservations", body.clone()).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            continue;
        }
        assert_eq!(status, StatusCode::CREATED, "reserve {order}: {answer}");
        return (
            answer["id"].as_i64().expect("id"),
            answer["fence"].as_i64().expect("fence"),
            answer["machine"]["asset_tag"]
                .as_str()
                .expect("machine")
                .to_owned(),
        );
    }
    panic!("reserve {order}: still 503 after 50 tries");
}

/// The scenario's first steps: machines DR-1..DR-3, a webhook, `BEFORE-1`
/// and a sweep lease claim; the dump; then `LOST-1` and another claim,
/// which the dump does not have.
async fn history_and_dump(app: &TestApp, dump: &Path) -> Told {
    for tag in ["DR-1", "DR-2", "DR-3"] {
        let r = app
            .put_machine(&app.org.token, tag, SITE, "dell", PROFILE, "ready")
            .await;
        assert!(r.status().is_success(), "put {tag}");
    }
    sqlx::query(
        "INSERT INTO webhooks (org_id, url, secret, updated_by)
         VALUES ($1, 'https://hooks.example.invalid/pk', repeat('s', 32), 'test')",
    )
    .bind(app.org.id)
    .execute(&app.pool)
    .await
    .expect("a webhook");
    let (b_id, b_fence, b_machine) =
        reserve(&app.http, &app.address, &app.org.token, "BEFORE-1").await;
    assert_eq!(b_machine, "DR-1");
    claim(&app.pool, "before").await;
    let max_event_kept: i64 = sqlx::query_scalar("SELECT max(id) FROM reservation_events")
        .fetch_one(&app.pool)
        .await
        .expect("events");

    pg_dump(&app.db, dump).await;

    let (l_id, l_fence, l_machine) =
        reserve(&app.http, &app.address, &app.org.token, "LOST-1").await;
    assert_eq!(l_machine, "DR-2");
    let lost_lease_fence = claim(&app.pool, "lost").await;
    let max_event: i64 = sqlx::query_scalar("SELECT max(id) FROM reservation_events")
        .fetch_one(&app.pool)
        .await
        .expect("events");
    Told {
        before: (b_id, b_fence),
        lost: (l_id, l_fence),
        max_event,
        max_event_kept,
        lost_lease_fence,
    }
}

/// A claim of the sweep's key by `holder` (another holder each time: the
/// lease is free when its previous holder's expired, so here a fresh key).
async fn claim(pool: &Db, holder: &str) -> i64 {
    let key = format!("restore-test-{holder}");
    match poolkeeper::lease::claim(pool, &key, holder, Duration::from_secs(60))
        .await
        .expect("claim")
    {
        poolkeeper::lease::Claim::Acquired(m) => m.fence,
        poolkeeper::lease::Claim::HeldByOther => panic!("a fresh key is free"),
    }
}

async fn pg_dump(db: &TestDb, file: &Path) {
    let out = tokio::process::Command::new("pg_dump")
        .args(["-Fc", "-f"])
        .arg(file)
        .arg("-d")
        .arg(db.url())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run pg_dump (the postgresql-client package)");
    assert!(
        out.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `pg_restore --single-transaction`: nothing of the restore is visible
/// until all of it is (docs/operations.md).
async fn pg_restore(db: &TestDb, file: &Path) {
    let out = tokio::process::Command::new("pg_restore")
        .args(["--single-transaction", "--exit-on-error", "-d"])
        .arg(db.url())
        .arg(file)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run pg_restore (the postgresql-client package)");
    assert!(
        out.status.success(),
        "pg_restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn dump_file() -> PathBuf {
    std::env::temp_dir().join(format!("pk-restore-{:08x}.dump", rand::random::<u32>()))
}

/// What every restore must leave, checked on the restored database through
/// `base` (a server on it) and `pool`.
async fn check_after_restore(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    pool: &Db,
    told: &Told,
    new: (i64, i64, String),
) {
    let (new_id, new_fence, new_machine) = new;
    // The restored database has no LOST-1: DR-2 is free again and goes to
    // the new order, as it did before the check existed.
    assert_eq!(new_machine, "DR-2");
    // Every sequence-issued value after the restore exceeds every one
    // before it, the lost ones included.
    assert!(
        new_id > told.lost.0,
        "new id {new_id} <= lost id {}",
        told.lost.0
    );
    assert!(
        new_fence > told.lost.1,
        "new fence {new_fence} <= lost fence {}",
        told.lost.1
    );
    let (min_new_event,): (i64,) =
        sqlx::query_as("SELECT min(id) FROM reservation_events WHERE reservation_id = $1")
            .bind(new_id)
            .fetch_one(pool)
            .await
            .expect("events of the new reservation");
    assert!(
        min_new_event > told.max_event,
        "event {min_new_event} <= {}",
        told.max_event
    );
    // L4 across the restore: a claim gets a fence above any before it.
    let fence = claim(pool, "after").await;
    assert!(
        fence > told.lost_lease_fence,
        "lease fence {fence} <= {}",
        told.lost_lease_fence
    );

    // Step 4: the order service acts on LOST-1 with what it was told. Its
    // id names nothing now: 404, and the new hold is untouched.
    let (lost_id, lost_fence) = told.lost;
    for (action, body) in [
        (
            "cancel",
            json!({"fence": lost_fence, "reason": "customer gave up"}),
        ),
        (
            "convert",
            json!({"fence": lost_fence, "service_ref": "SRV-LOST-1"}),
        ),
    ] {
        let (status, answer) = post(
            http,
            base,
            token,
            &format!("/api/v1/reservations/{lost_id}/{action}"),
            body,
        )
        .await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "{action} of LOST-1: {answer}"
        );
    }
    let (state, fence): (String, i64) =
        sqlx::query_as("SELECT state, fence FROM reservations WHERE id = $1")
            .bind(new_id)
            .fetch_one(pool)
            .await
            .expect("the new reservation");
    assert_eq!((state.as_str(), fence), ("held", new_fence));
    let links: i64 = sqlx::query_scalar("SELECT count(*) FROM service_links")
        .fetch_one(pool)
        .await
        .expect("links");
    assert_eq!(links, 0, "nothing was sold under LOST-1's reference");

    // A pair the restored database does have still acts: BEFORE-1.
    let (b_id, b_fence) = told.before;
    let (status, answer) = post(
        http,
        base,
        token,
        &format!("/api/v1/reservations/{b_id}/cancel"),
        json!({"fence": b_fence, "reason": "after the restore"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "cancel of BEFORE-1: {answer}");

    // The webhook stream marks the restore, with an event id past every
    // event before it.
    let marks: Vec<(i64, String, Value)> = sqlx::query_as(
        "SELECT (payload->>'event_id')::bigint, payload->>'type', payload FROM webhook_deliveries
          WHERE event_id IS NULL",
    )
    .fetch_all(pool)
    .await
    .expect("restore marks");
    assert_eq!(
        marks.len(),
        1,
        "one mark for the one organization with a webhook"
    );
    assert_eq!(marks[0].1, "database.restored");
    assert!(marks[0].0 > told.max_event);
    assert_eq!(
        marks[0].2["restore"]["last_kept_event_id"],
        json!(told.max_event_kept)
    );
    // The body sent is the payload: it is what the OpenAPI document says.
    let mut doc: Value = http
        .get(format!("{base}/api/openapi.json"))
        .send()
        .await
        .expect("openapi")
        .json()
        .await
        .expect("json");
    doc["$ref"] = json!("#/components/schemas/DatabaseRestoredDelivery");
    let schema = jsonschema::validator_for(&doc).expect("the document compiles");
    let errors: Vec<String> = schema
        .iter_errors(&marks[0].2)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    let changes: i64 = sqlx::query_scalar("SELECT count(*) FROM incarnation_changes")
        .fetch_one(pool)
        .await
        .expect("changes");
    assert_eq!(changes, 1, "the new incarnation is logged once");
}

/// The four steps of the failure F5 prevents, as the operator does them: a dump, `LOST-1`
/// after it, the dump restored into a fresh database, `poolkeeper serve`
/// started on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_from_before_a_restore_never_acts_on_a_reservation_made_after_it() {
    let app = spawn_app().await;
    let dump = dump_file();
    let told = history_and_dump(&app, &dump).await;

    let restored = empty_db().await;
    pg_restore(&restored, &dump).await;
    let _ = std::fs::remove_file(&dump);
    // The organization's webhook, pointed at a receiver of the test's.
    let receiver = Receiver::start().await;
    let pool = restored.pool().await;
    sqlx::query("UPDATE webhooks SET url = $1")
        .bind(receiver.url())
        .execute(&pool)
        .await
        .expect("the webhook's url");
    let replica = Replica::start(
        &format!("restored-{:08x}", rand::random::<u32>()),
        &[
            ("DATABASE_URL", restored.url()),
            ("POOLKEEPER_WEBHOOK_ALLOW_PRIVATE", "on".to_owned()),
        ],
    )
    .await;
    let base = format!("http://127.0.0.1:{}", replica.port);
    let new = reserve(&app.http, &base, &app.org.token, "NEW-AFTER-RESTORE").await;
    check_after_restore(&app.http, &base, &app.org.token, &pool, &told, new).await;

    // The mark reaches the consumer, signed like any event, its
    // Poolkeeper-Event-Id its event_id.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mark = loop {
        let found = receiver
            .requests()
            .into_iter()
            .find(|r| r.json()["type"] == "database.restored" && r.answered == 200);
        if let Some(r) = found {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "no database.restored delivery in 60 s: {}",
            replica.log()
        );
        // The worker polls on its own schedule: nothing to wait on.
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(json!(mark.event_id), mark.json()["event_id"]);
    assert!(mark.event_id > told.max_event);
}

/// The same, restored in place (the database dropped and created again
/// under its name) while a server keeps running on it: its pool's
/// connections die with the database, and every new one checks before it
/// is handed out; one opened while the restore was under way (no check to
/// run yet) is closed at its next acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_keeps_running_through_a_restore_in_place_checks_before_it_serves_again() {
    let app = spawn_app().await;
    let dump = dump_file();
    let told = history_and_dump(&app, &dump).await;

    let admin = app.db.options.clone().database("postgres");
    let mut conn = PgConnection::connect_with(&admin).await.expect("admin");
    for sql in [
        format!("DROP DATABASE {} WITH (FORCE)", app.db.name),
        format!("CREATE DATABASE {}", app.db.name),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect("drop and create");
    }
    // The running server's pool reconnects to the empty database (a
    // worker's tick, say) before the restore is in: nothing to check yet.
    // Its connections to the dropped database fail once each and are
    // dropped; then one opens on the empty database.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = sqlx::query("SELECT 1").execute(&app.pool).await {
        assert!(Instant::now() < deadline, "no connection: {e}");
    }
    pg_restore(&app.db, &dump).await;
    let _ = std::fs::remove_file(&dump);
    let _ = conn.close().await;

    let new =
        reserve_through_503(&app.http, &app.address, &app.org.token, "NEW-AFTER-RESTORE").await;
    check_after_restore(
        &app.http,
        &app.address,
        &app.org.token,
        &app.pool,
        &told,
        new,
    )
    .await;
}

/// Copies of one database (a template copy, a restore) are told apart, and
/// a database checked again is the same one: the check advances nothing.
#[tokio::test]
async fn the_same_database_checked_again_advances_nothing() {
    let app = spawn_app().await;
    let before: i64 = sqlx::query_scalar("SELECT nextval('reservation_fence_seq')")
        .fetch_one(&app.pool)
        .await
        .expect("nextval");
    for _ in 0..3 {
        let outcome = poolkeeper::db::incarnation::verify(&app.pool)
            .await
            .expect("verify");
        assert_eq!(outcome, poolkeeper::db::incarnation::Incarnation::Same);
    }
    let after: i64 = sqlx::query_scalar("SELECT nextval('reservation_fence_seq')")
        .fetch_one(&app.pool)
        .await
        .expect("nextval");
    assert_eq!(after, before + 1);
    let changes: i64 = sqlx::query_scalar("SELECT count(*) FROM incarnation_changes")
        .fetch_one(&app.pool)
        .await
        .expect("changes");
    assert_eq!(changes, 0);
}

/// A restore the fingerprint cannot see (a data directory copied back and
/// started without recovery) is declared by the operator: the next check
/// advances every sequence, once.
#[tokio::test]
async fn a_restore_declared_by_the_operator_advances_every_sequence_once() {
    let app = spawn_app().await;
    let before: i64 = sqlx::query_scalar("SELECT nextval('lease_fence_seq')")
        .fetch_one(&app.pool)
        .await
        .expect("nextval");
    let said: String = sqlx::query_scalar("SELECT incarnation_declare_restored()")
        .fetch_one(&app.pool)
        .await
        .expect("declare");
    assert!(said.contains("timeline -1 -> "), "{said}");
    let (after, floor): (i64, i64) = sqlx::query_as(
        "SELECT nextval('lease_fence_seq'), incarnation_floor(clock_timestamp() - interval '1 minute')",
    )
    .fetch_one(&app.pool)
    .await
    .expect("nextval");
    assert!(
        after > before && after >= floor,
        "{after} after {before}, floor {floor}"
    );
    assert_eq!(
        poolkeeper::db::incarnation::verify(&app.pool)
            .await
            .expect("verify"),
        poolkeeper::db::incarnation::Incarnation::Same
    );
}

/// Replicas starting together on a restored copy: eight first connections
/// check at once (released together), and the copy is advanced once: one
/// check advances, the others wait for it and find the new fingerprint;
/// one logged change, one webhook event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn first_connections_checking_together_advance_once() {
    let app = spawn_app().await;
    let dump = dump_file();
    history_and_dump(&app, &dump).await;
    let restored = empty_db().await;
    pg_restore(&restored, &dump).await;
    let _ = std::fs::remove_file(&dump);

    const N: usize = 8;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(N));
    let mut tasks = Vec::new();
    for _ in 0..N {
        // Plain connections: no pool, so no check before the barrier.
        let mut conn = PgConnection::connect_with(&restored.options)
            .await
            .expect("connect");
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let outcome = poolkeeper::db::incarnation::verify(&mut conn)
                .await
                .expect("verify");
            let _ = conn.close().await;
            outcome
        }));
    }
    let mut advanced = 0;
    for t in tasks {
        match tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("a check ended within 60 s")
            .expect("join")
        {
            poolkeeper::db::incarnation::Incarnation::Advanced(_) => advanced += 1,
            poolkeeper::db::incarnation::Incarnation::Same => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(advanced, 1);
    let pool = restored.pool().await;
    let (changes, marks): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM incarnation_changes),
                (SELECT count(*) FROM webhook_deliveries WHERE event_id IS NULL)",
    )
    .fetch_one(&pool)
    .await
    .expect("counts");
    assert_eq!((changes, marks), (1, 1));
}
