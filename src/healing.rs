//! R15 from the writer's side: a status change of one machine or many (a
//! rack into maintenance), in one transaction, and what it did to the holds
//! on them. The moving itself is the trigger's (sql/healing.sql), so that
//! every writer of `machines.status` heals; this module locks, writes and
//! reports, and can preview the same change by rolling it back.

use serde::Serialize;
use sqlx::PgConnection;

use crate::domain::{AssetTag, MachineStatus};
use crate::inventory::Machine;

/// At most this many machines in one change: a rack, with room to spare.
pub const MAX_MACHINES: usize = 500;

pub struct StatusChange<'a> {
    pub org_id: i64,
    pub tags: &'a [AssetTag],
    pub status: MachineStatus,
    /// Recorded on every event the change writes (`poolkeeper.actor`).
    pub actor: &'a str,
}

/// What one hold went through.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum HoldOutcome {
    /// R15: the hold kept its id, fence, order ref and deadline on an
    /// equivalent machine (event machine_replaced)
    Moved {
        reservation_id: i64,
        #[schema(value_type = crate::domain::OrderRef)]
        order_ref: String,
        /// the asset tag the hold left
        from: String,
        /// the equivalent machine it now holds
        to: String,
    },
    /// R15 and R13: some member of the order had no equivalent machine, so
    /// the order was cancelled whole, this member with it
    Cancelled {
        reservation_id: i64,
        #[schema(value_type = crate::domain::OrderRef)]
        order_ref: String,
        /// the asset tag the member held
        machine: String,
        #[schema(examples("machine PK-00011 broken; no equivalent machine in par1"))]
        reason: String,
    },
}

#[derive(Debug, Serialize)]
pub struct Changed {
    pub machines: Vec<Machine>,
    /// In order of the order ref, then the member's slot.
    pub holds: Vec<HoldOutcome>,
}

/// The change is refused whole, and nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// These tags name no machine of the organization.
    Unknown(Vec<String>),
}

#[derive(sqlx::FromRow)]
struct Locked {
    id: i64,
    asset_tag: String,
}

#[derive(sqlx::FromRow)]
struct EventRow {
    reservation_id: i64,
    kind: String,
    order_ref: String,
    replaced: Option<String>,
    machine: String,
    detail: Option<String>,
}

/// Makes the change on `conn`, which must be inside a transaction (the
/// caller commits, or rolls back for a preview). Everything it will wait
/// for is locked in the lock order before any machine is written, so that
/// two changes of overlapping racks, or of racks that share orders, queue
/// instead of deadlocking, with each other and with the transitions.
pub async fn change_status(
    conn: &mut PgConnection,
    change: &StatusChange<'_>,
) -> Result<Result<Changed, Refused>, sqlx::Error> {
    let tags: Vec<&str> = change.tags.iter().map(AssetTag::as_str).collect();
    sqlx::query("SELECT set_config('poolkeeper.actor', $1, true)")
        .bind(change.actor)
        .execute(&mut *conn)
        .await?;
    let locked: Vec<Locked> = sqlx::query_as(
        "SELECT id, asset_tag FROM machines WHERE org_id = $1 AND asset_tag = ANY($2) ORDER BY id",
    )
    .bind(change.org_id)
    .bind(&tags)
    .fetch_all(&mut *conn)
    .await?;
    let mut unknown: Vec<String> = tags
        .iter()
        .filter(|t| !locked.iter().any(|m| m.asset_tag == **t))
        .map(|t| (*t).to_owned())
        .collect();
    if !unknown.is_empty() {
        unknown.sort();
        unknown.dedup();
        return Ok(Err(Refused::Unknown(unknown)));
    }
    let ids: Vec<i64> = locked.iter().map(|m| m.id).collect();
    // The lock order (sql/locks.sql): every machine of the change, then the
    // rows of every order with a live hold on one of them, each in id order,
    // before any is written. Two changes of racks that share orders (rack A
    // with O's and P's machines, rack B with P's and O's others) then queue
    // on the first order's rows instead of each locking one order and
    // waiting for the other's.
    // Between the machines and the rows, the turns of the pools with
    // headroom that the holds on these machines belong to (R18: healing
    // decides on a pool's last machines as a reserve does).
    for step in [
        "SELECT lock_machines($1)",
        "SELECT pool_turns_of($1)",
        "SELECT lock_orders_on($1)",
    ] {
        sqlx::query(step).bind(&ids).execute(&mut *conn).await?;
    }
    // Every member of every order with a live hold on these machines: the
    // only rows the trigger can move or cancel.
    let members: Vec<i64> = sqlx::query_scalar(
        "SELECT r.id FROM reservations r
          WHERE (r.org_id, r.order_ref) IN (
                SELECT h.org_id, h.order_ref FROM reservations h
                 WHERE h.machine_id = ANY($1) AND h.state = 'held' AND h.expires_at > clock_timestamp())
            AND r.state = 'held'",
    )
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await?;
    // Machines already in that status are left alone (no new updated_at).
    sqlx::query(
        "UPDATE machines SET status = $2, updated_at = clock_timestamp()
          WHERE id = ANY($1) AND status <> $2",
    )
    .bind(&ids)
    .bind(change.status.as_str())
    .execute(&mut *conn)
    .await?;
    let machines: Vec<Machine> = sqlx::query_as(
        "SELECT id, asset_tag, site, vendor, profile, status, created_at, updated_at
           FROM machines WHERE id = ANY($1) ORDER BY asset_tag",
    )
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await?;
    let holds = hold_outcomes(conn, &members).await?;
    Ok(Ok(Changed { machines, holds }))
}

/// What the change did to the holds of `members` (moved to another machine
/// or cancelled), read from the events this transaction wrote.
async fn hold_outcomes(
    conn: &mut PgConnection,
    members: &[i64],
) -> Result<Vec<HoldOutcome>, sqlx::Error> {
    // The events this transaction wrote: its own xid on the row version.
    let events: Vec<EventRow> = sqlx::query_as(
        "SELECT e.reservation_id, e.kind, r.order_ref, old.asset_tag AS replaced,
                m.asset_tag AS machine, e.detail
           FROM reservation_events e
           JOIN reservations r ON r.id = e.reservation_id
           JOIN machines m ON m.id = r.machine_id
           LEFT JOIN machines old ON old.id = e.replaced_machine_id
          WHERE e.reservation_id = ANY($1)
            AND e.kind IN ('machine_replaced', 'cancelled')
            AND e.xmin = (pg_current_xact_id()::text::bigint % 4294967296)::text::xid
          ORDER BY r.order_ref, r.slot, e.id",
    )
    .bind(members)
    .fetch_all(&mut *conn)
    .await?;
    Ok(events
        .into_iter()
        .map(|e| match (e.kind.as_str(), e.replaced) {
            ("machine_replaced", Some(from)) => HoldOutcome::Moved {
                reservation_id: e.reservation_id,
                order_ref: e.order_ref,
                from,
                to: e.machine,
            },
            _ => HoldOutcome::Cancelled {
                reservation_id: e.reservation_id,
                order_ref: e.order_ref,
                machine: e.machine,
                reason: e.detail.unwrap_or_default(),
            },
        })
        .collect())
}

/// The same change, rolled back: what it would do now. A hold can still
/// move elsewhere, or a machine be taken, before the change is confirmed;
/// the confirmation reports what did happen.
pub async fn preview(
    db: &crate::db::Db,
    change: &StatusChange<'_>,
) -> Result<Result<Changed, Refused>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let outcome = change_status(&mut tx, change).await;
    tx.rollback().await?;
    outcome
}

/// One line per hold, in words, for the dashboard and the logs:
/// "DEMO-HOLD-0003 moves from PK-00011 to PK-00045".
pub fn describe(hold: &HoldOutcome) -> String {
    match hold {
        HoldOutcome::Moved {
            order_ref,
            from,
            to,
            ..
        } => format!("{order_ref}: {from} to {to}"),
        HoldOutcome::Cancelled {
            order_ref,
            machine,
            reason,
            ..
        } => format!("{order_ref} on {machine}: cancelled whole ({reason})"),
    }
}
