//! Reads of reservations: one by id or order reference, an order's
//! reservations in slot order, a machine's, service links, the event
//! timeline. The reads of a `Reservation` are `query_as!`, checked against
//! the schema when built (the offline data in `.sqlx/` lets a build run
//! without a database): a new field of `Reservation` fails to compile
//! until each of them selects it.

use sqlx::PgConnection;

use super::rows::{Event, LINK_COLUMNS, MachineSnapshot, Reservation, ServiceLink};
use crate::db::Db;
use crate::domain::ReservationState;

pub async fn get(pool: &Db, org_id: i64, id: i64) -> Result<Option<Reservation>, sqlx::Error> {
    sqlx::query_as!(
        Reservation,
        r#"SELECT id, org_id, order_ref, machine_id, state AS "state: ReservationState", fence, reason,
                hold_seconds, created_at, expires_at, ended_at, ended_by, end_reason,
                machine_snapshot AS "machine: MachineSnapshot", quantity, slot, segment, customer_ref,
                coalesce(profile_asked, machine_snapshot->>'profile', '') AS "profile_asked!",
                (coalesce(profile_asked, machine_snapshot->>'profile', '')
                 <> coalesce(machine_snapshot->>'profile', '')) AS "substituted!"
             FROM reservations WHERE id = $1 AND org_id = $2"#,
        id,
        org_id
    )
    .fetch_optional(pool)
    .await
}

/// The reservation of `order_ref` in `org_id`, whatever its state.
pub async fn by_order_ref(
    conn: &mut PgConnection,
    org_id: i64,
    order_ref: &str,
) -> Result<Option<Reservation>, sqlx::Error> {
    sqlx::query_as!(
        Reservation,
        r#"SELECT id, org_id, order_ref, machine_id, state AS "state: ReservationState", fence, reason,
                hold_seconds, created_at, expires_at, ended_at, ended_by, end_reason,
                machine_snapshot AS "machine: MachineSnapshot", quantity, slot, segment, customer_ref,
                coalesce(profile_asked, machine_snapshot->>'profile', '') AS "profile_asked!",
                (coalesce(profile_asked, machine_snapshot->>'profile', '')
                 <> coalesce(machine_snapshot->>'profile', '')) AS "substituted!"
             FROM reservations WHERE org_id = $1 AND order_ref = $2
            ORDER BY slot LIMIT 1"#,
        org_id,
        order_ref
    )
    .fetch_optional(conn)
        .await
}

/// Every reservation of order `order_ref` in `org_id`, in slot order
/// (R13); empty if there is no such order.
pub async fn order_of(
    db: impl sqlx::PgExecutor<'_>,
    org_id: i64,
    order_ref: &str,
) -> Result<Vec<Reservation>, sqlx::Error> {
    sqlx::query_as!(
        Reservation,
        r#"SELECT id, org_id, order_ref, machine_id, state AS "state: ReservationState", fence, reason,
                hold_seconds, created_at, expires_at, ended_at, ended_by, end_reason,
                machine_snapshot AS "machine: MachineSnapshot", quantity, slot, segment, customer_ref,
                coalesce(profile_asked, machine_snapshot->>'profile', '') AS "profile_asked!",
                (coalesce(profile_asked, machine_snapshot->>'profile', '')
                 <> coalesce(machine_snapshot->>'profile', '')) AS "substituted!"
             FROM reservations WHERE org_id = $1 AND order_ref = $2 ORDER BY slot"#,
        org_id,
        order_ref
    )
    .fetch_all(db)
        .await
}

/// The reservations of machine `machine_id` of `org_id`, newest first, at
/// most `limit` (a machine's page; a hold that moved off it is on its new
/// machine).
pub async fn of_machine(
    pool: &Db,
    org_id: i64,
    machine_id: i64,
    limit: i64,
) -> Result<Vec<Reservation>, sqlx::Error> {
    sqlx::query_as!(
        Reservation,
        r#"SELECT id, org_id, order_ref, machine_id, state AS "state: ReservationState", fence, reason,
                hold_seconds, created_at, expires_at, ended_at, ended_by, end_reason,
                machine_snapshot AS "machine: MachineSnapshot", quantity, slot, segment, customer_ref,
                coalesce(profile_asked, machine_snapshot->>'profile', '') AS "profile_asked!",
                (coalesce(profile_asked, machine_snapshot->>'profile', '')
                 <> coalesce(machine_snapshot->>'profile', '')) AS "substituted!"
             FROM reservations WHERE machine_id = $1 AND org_id = $2
            ORDER BY created_at DESC LIMIT $3"#,
        machine_id,
        org_id,
        limit
    )
    .fetch_all(pool)
        .await
}

/// The service links of an order's converted reservations, by reservation.
pub async fn services_of_order(
    pool: &Db,
    org_id: i64,
    order_ref: &str,
) -> Result<Vec<ServiceLink>, sqlx::Error> {
    let sql = format!(
        "SELECT {cols} FROM service_links s
          WHERE s.org_id = $1
            AND s.reservation_id IN (SELECT r.id FROM reservations r WHERE r.org_id = $1 AND r.order_ref = $2)
          ORDER BY s.reservation_id",
        cols = LINK_COLUMNS
            .split(", ")
            .map(|c| format!("s.{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(order_ref)
        .fetch_all(pool)
        .await
}

/// The service link a converted reservation became, if any.
pub async fn service_of(
    pool: &Db,
    org_id: i64,
    reservation_id: i64,
) -> Result<Option<ServiceLink>, sqlx::Error> {
    let sql = format!(
        "SELECT {LINK_COLUMNS} FROM service_links WHERE reservation_id = $1 AND org_id = $2"
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(reservation_id)
        .bind(org_id)
        .fetch_optional(pool)
        .await
}

pub async fn events(pool: &Db, org_id: i64, id: i64) -> Result<Vec<Event>, sqlx::Error> {
    sqlx::query_as(
        "SELECT e.id, e.at, e.kind, e.from_state, e.to_state, e.actor, e.detail, e.replica, e.lease_fence
           FROM reservation_events e JOIN reservations r ON r.id = e.reservation_id
          WHERE e.reservation_id = $1 AND r.org_id = $2
          ORDER BY e.id",
    )
    .bind(id)
    .bind(org_id)
    .fetch_all(pool)
    .await
}
