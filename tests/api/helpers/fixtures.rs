//! The fixtures every test file uses: machines (one, or many generated in
//! one statement), requests and reservations as the allocator takes them,
//! held and in-service rows written directly, the decoys of every
//! exclusion, and the race of N orders released by a barrier. Each write
//! of a machine goes through `machine` or `generated_machines`.

use std::sync::Arc;

use poolkeeper::allocator::{
    self, HoldSeconds, OrderSpec, Quantity, ReserveOutcome, ReserveRequest,
};
use poolkeeper::db::Db;
use poolkeeper::domain::{OrderRef, Profile, Site, Vendor};
use poolkeeper::reservations;
use sqlx::Connection;
use tokio::sync::Barrier;

use super::TestDb;

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
    }
}

/// Inserts a machine directly; returns its id.
pub async fn machine(
    pool: &Db,
    org_id: i64,
    tag: &str,
    site: &str,
    vendor: &str,
    profile: &str,
    status: &str,
) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(org_id)
    .bind(tag)
    .bind(site)
    .bind(vendor)
    .bind(profile)
    .bind(status)
    .fetch_one(pool)
    .await
    .expect("insert machine")
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
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(n)
        .fetch_all(pool)
        .await
        .expect("insert generated machines")
}

/// A string as an SQL literal, for `Generated`'s columns.
pub fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A held reservation written directly (a decoy, or a competitor that
/// committed behind the allocator's back).
pub async fn held_directly(pool: &Db, org_id: i64, machine_id: i64, order_ref: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason, hold_seconds, expires_at)
         VALUES ($1, $2, $3, '{}', '{}', 'written by a test', 900, clock_timestamp() + interval '15 minutes')
         RETURNING id",
    )
    .bind(org_id)
    .bind(order_ref)
    .bind(machine_id)
    .fetch_one(pool)
    .await
    .expect("insert a held reservation")
}

/// A live service link on `machine_id`, with the converted reservation it came from.
pub async fn in_service_directly(pool: &Db, org_id: i64, machine_id: i64, order_ref: &str) {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot, reason,
                                   hold_seconds, expires_at, ended_at, ended_by)
         VALUES ($1, $2, $3, 'converted', '{}', '{}', 'written by a test', 900,
                 clock_timestamp() + interval '15 minutes', clock_timestamp(), 'test')
         RETURNING id",
    )
    .bind(org_id)
    .bind(order_ref)
    .bind(machine_id)
    .fetch_one(pool)
    .await
    .expect("insert a converted reservation");
    sqlx::query("INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref) VALUES ($1, $2, $3, $4)")
        .bind(org_id)
        .bind(machine_id)
        .bind(id)
        .bind(format!("SRV-{order_ref}"))
        .execute(pool)
        .await
        .expect("insert a service link");
}

/// One decoy of every exclusion kind for `request(_, Some("dell"))`:
/// wrong site, wrong vendor, wrong profile, not ready, in service, held.
pub async fn decoys(pool: &Db, org_id: i64) {
    machine(pool, org_id, "X-site", "ams1", "dell", PROFILE, "ready").await;
    machine(pool, org_id, "X-vendor", SITE, "hpe", PROFILE, "ready").await;
    machine(
        pool,
        org_id,
        "X-profile",
        SITE,
        "dell",
        "xeon-6430-128g",
        "ready",
    )
    .await;
    machine(pool, org_id, "X-notready", SITE, "dell", PROFILE, "broken").await;
    let sold = machine(pool, org_id, "X-service", SITE, "dell", PROFILE, "ready").await;
    in_service_directly(pool, org_id, sold, "DECOY-SOLD").await;
    let held = machine(pool, org_id, "X-held", SITE, "dell", PROFILE, "ready").await;
    held_directly(pool, org_id, held, "DECOY-HELD").await;
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
