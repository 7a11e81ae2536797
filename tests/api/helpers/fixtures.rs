//! The fixtures every test file uses: requests and reservations as the
//! allocator takes them, machines generated in one statement, the decoys
//! of every exclusion, and the race of N orders released by a barrier.
//! One machine or one hold is written with the builders of fake.rs.

use std::sync::Arc;

use poolkeeper::allocator::{
    self, HoldSeconds, OrderSpec, Quantity, ReserveOutcome, ReserveRequest,
};
use poolkeeper::db::Db;
use poolkeeper::domain::{OrderRef, Profile, Site, Vendor};
use poolkeeper::reservations;
use sqlx::Connection;
use tokio::sync::Barrier;

use super::{FakeHold, FakeMachine, InService, TestDb};

/// A connection with the application's lock and statement timeouts, so that
/// a test that would wait on a lock fails instead of hanging.
pub async fn limited_connection(db: &TestDb) -> sqlx::PgConnection {
    sqlx::PgConnection::connect_with(&poolkeeper::db::with_session_limits(db.options.clone()))
        .await
        .expect("connect to the test database")
}

pub const SITE: &str = "par1";
pub const PROFILE: &str = "epyc-9354-256g";

pub fn spec(vendor: Option<&str>) -> OrderSpec {
    OrderSpec {
        site: Site::parse(SITE).expect("site"),
        profile: Profile::parse(PROFILE).expect("profile"),
        vendor: vendor.map(|v| Vendor::parse(v).expect("vendor")),
    }
}

pub fn request(order_ref: &str, vendor: Option<&str>) -> ReserveRequest {
    request_for(order_ref, PROFILE, vendor)
}

pub fn request_for(order_ref: &str, profile: &str, vendor: Option<&str>) -> ReserveRequest {
    ReserveRequest {
        order_ref: OrderRef::parse(order_ref).expect("order ref"),
        spec: OrderSpec {
            site: Site::parse(SITE).expect("site"),
            profile: Profile::parse(profile).expect("profile"),
            vendor: vendor.map(|v| Vendor::parse(v).expect("vendor")),
        },
        hold: HoldSeconds::new(900).expect("hold"),
        quantity: Quantity::ONE,
        actor: "test".to_owned(),
        segment: None,
        customer_ref: None,
        substitutes: Default::default(),
    }
}

pub async fn reserved(
    pool: &Db,
    org_id: i64,
    order_ref: &str,
    vendor: Option<&str>,
) -> reservations::Reservation {
    match allocator::reserve(pool, org_id, &request(order_ref, vendor))
        .await
        .expect("reserve")
    {
        ReserveOutcome::Created { reservation, .. } => reservation,
        other => panic!("expected a new reservation for {order_ref}, got {other:?}"),
    }
}

/// Machines generated in one statement, one per `g` in 1..=n: each column
/// is an SQL expression of `g` (a quoted literal is one too: `'par1'`).
pub struct Generated<'a> {
    pub tag: &'a str,
    pub site: &'a str,
    pub vendor: &'a str,
    pub profile: &'a str,
    pub status: &'a str,
}

/// Inserts the machines of `spec` for `org_id`; returns their ids.
pub async fn generated_machines(pool: &Db, org_id: i64, n: i64, spec: Generated<'_>) -> Vec<i64> {
    let sql = format!(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
         SELECT $1, {}, {}, {}, {}, {} FROM generate_series(1, $2) g
         RETURNING id",
        spec.tag, spec.site, spec.vendor, spec.profile, spec.status
    );
    // A fleet-size load outlasts the session's statement timeout (a limit
    // for requests, not for loading a test's data).
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await
        .expect("no statement timeout");
    let ids = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(n)
        .fetch_all(&mut *tx)
        .await
        .expect("insert generated machines");
    tx.commit().await.expect("commit generated machines");
    ids
}

/// `n` ready Dell machines of `SITE` and `PROFILE` (tags from the SQL
/// expression `tag` of `g`); returns their ids in insertion order.
pub async fn ready_machines(pool: &Db, org_id: i64, n: i64, tag: &str) -> Vec<i64> {
    generated_machines(
        pool,
        org_id,
        n,
        Generated {
            tag,
            site: &literal(SITE),
            vendor: "'dell'",
            profile: &literal(PROFILE),
            status: "'ready'",
        },
    )
    .await
}

/// A string as an SQL literal, for `Generated`'s columns.
pub fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// One decoy of every exclusion kind for `request(_, Some("dell"))`:
/// wrong site, wrong vendor, wrong profile, not ready, in service, held.
pub async fn decoys(pool: &Db, org_id: i64) {
    FakeMachine::new()
        .tag("X-site")
        .site("ams1")
        .create(pool, org_id)
        .await;
    FakeMachine::new()
        .tag("X-vendor")
        .vendor("hpe")
        .create(pool, org_id)
        .await;
    FakeMachine::new()
        .tag("X-profile")
        .profile("xeon-6430-128g")
        .create(pool, org_id)
        .await;
    FakeMachine::new()
        .tag("X-notready")
        .status("broken")
        .create(pool, org_id)
        .await;
    let sold = FakeMachine::new()
        .tag("X-service")
        .create(pool, org_id)
        .await;
    FakeHold::on(sold)
        .order("DECOY-SOLD")
        .state(InService)
        .bare()
        .create(pool, org_id)
        .await;
    let held = FakeMachine::new().tag("X-held").create(pool, org_id).await;
    FakeHold::on(held)
        .order("DECOY-HELD")
        .bare()
        .create(pool, org_id)
        .await;
}

/// Runs `reserve` for each order on its own connection, all released
/// together by a barrier.
pub async fn race(pool: &Db, org_id: i64, orders: Vec<ReserveRequest>) -> Vec<ReserveOutcome> {
    let barrier = Arc::new(Barrier::new(orders.len()));
    let mut tasks = Vec::new();
    for req in orders {
        let mut conn = pool.acquire().await.expect("a connection per order");
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let outcome = allocator::reserve_on(&mut *conn, org_id, &req)
                .await
                .expect("reserve");
            // Pinned (behind a transaction-mode pooler) the connection is a
            // transaction: keep what it wrote.
            conn.finish().await.expect("commit");
            outcome
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

/// Checks one round of N orders on `eligible` machines among decoys.
pub async fn check_round(
    pool: &Db,
    org_id: i64,
    outcomes: &[ReserveOutcome],
    eligible: i64,
    round: usize,
) {
    let created = outcomes
        .iter()
        .filter(|o| matches!(o, ReserveOutcome::Created { .. }))
        .count() as i64;
    assert_eq!(
        created,
        eligible.min(outcomes.len() as i64),
        "round {round}: {outcomes:#?}"
    );
    let total_machines: i64 = sqlx::query_scalar("SELECT count(*) FROM machines WHERE org_id = $1")
        .bind(org_id)
        .fetch_one(pool)
        .await
        .expect("count");
    for o in outcomes {
        match o {
            ReserveOutcome::Created { reservation, .. } => {
                assert!(
                    reservation.machine.asset_tag.starts_with("OK-"),
                    "round {round}: a decoy was chosen"
                );
            }
            ReserveOutcome::Unavailable { excluded, .. } => {
                // Honest only when nothing was left: every eligible machine
                // is held by now, next to the held decoy.
                assert_eq!(excluded.candidates, 0, "round {round}");
                assert_eq!(excluded.held, eligible + 1, "round {round}: {excluded:?}");
                assert_eq!(
                    (
                        excluded.wrong_site,
                        excluded.wrong_vendor,
                        excluded.wrong_profile,
                        excluded.not_ready,
                        excluded.in_service
                    ),
                    (1, 1, 1, 1, 1),
                    "round {round}"
                );
                let sum = excluded.wrong_site
                    + excluded.wrong_vendor
                    + excluded.wrong_profile
                    + excluded.not_ready
                    + excluded.in_service
                    + excluded.held;
                assert_eq!(
                    sum, total_machines,
                    "round {round}: every machine has one reason"
                );
            }
            ReserveOutcome::Contended { walk, .. } => {
                assert!(
                    walk.scanned >= 1 && walk.scanned <= allocator::MAX_SCANNED,
                    "round {round}"
                );
            }
            ReserveOutcome::Existing { .. } => {
                panic!("round {round}: distinct orders cannot replay")
            }
            ReserveOutcome::Reserved { .. } | ReserveOutcome::CustomerLimit { .. } => {
                panic!("round {round}: no headroom and no cap here: {o:?}")
            }
        }
    }
    // The invariants, in SQL: one holder per machine, all on eligible machines.
    let (held, machines, on_eligible): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT r.machine_id), count(*) FILTER (WHERE m.asset_tag LIKE 'OK-%')
           FROM reservations r JOIN machines m ON m.id = r.machine_id
          WHERE r.org_id = $1 AND r.state = 'held' AND r.order_ref LIKE 'ORD-%'",
    )
    .bind(org_id)
    .fetch_one(pool)
    .await
    .expect("invariants");
    assert_eq!(
        (held, machines, on_eligible),
        (eligible, eligible, eligible),
        "round {round}"
    );
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id
          WHERE r.org_id = $1 AND e.kind = 'created'",
    )
    .bind(org_id)
    .fetch_one(pool)
    .await
    .expect("events");
    assert_eq!(
        events, eligible,
        "round {round}: one created event per reservation"
    );
}

/// The overview's chart as it will be once the sweep's holder has counted
/// past now: the count moved to now and organization `org` counted again
/// (the count itself stays a minute behind the clock: `activity::LAG`).
pub async fn count_activity_now(pool: &Db, org: i64) {
    sqlx::query("UPDATE activity_counted SET counted_until = clock_timestamp()")
        .execute(pool)
        .await
        .expect("move the count to now");
    poolkeeper::activity::recount(pool, org)
        .await
        .expect("count the organization's activity");
}
