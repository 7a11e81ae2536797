//! Reservations after creation: read, convert (R10), cancel, and their
//! event timeline. Every transition checks the fence, the state and the
//! deadline (R11) in the same transaction that writes it.
//!
//! Lock order, everywhere a machine and its reservation are both written:
//! the machine row first, then the reservation row. The allocator locks the
//! machine (pass two) before it may expire an overdue reservation at the
//! point of use; convert does the same, so the two never deadlock and a new
//! order can never slip in while a conversion is half done.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

use crate::domain::ServiceRef;

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Reservation {
    pub id: i64,
    #[serde(skip)]
    pub org_id: i64,
    pub order_ref: String,
    #[serde(skip)]
    pub machine_id: i64,
    pub state: String,
    pub fence: i64,
    pub reason: String,
    pub hold_seconds: i32,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
    /// R8: the machine as it was when it was chosen (the `machine_snapshot`
    /// column), not as it is now.
    #[sqlx(json)]
    pub machine: MachineSnapshot,
}

/// The frozen attributes of the chosen machine (R8).
/// Every field defaults: a row written by other means (an import, a test)
/// still reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct MachineSnapshot {
    pub asset_tag: String,
    pub site: String,
    pub vendor: String,
    pub profile: String,
    pub status: String,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ServiceLink {
    pub id: i64,
    #[serde(skip)]
    pub machine_id: i64,
    pub reservation_id: i64,
    pub service_ref: String,
    pub created_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub ended_by: Option<String>,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Event {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub kind: String,
    pub from_state: Option<String>,
    pub to_state: String,
    pub actor: String,
    pub detail: Option<String>,
    pub replica: Option<String>,
    pub lease_fence: Option<i64>,
}

/// Why a convert or cancel was refused; nothing was written except, for
/// `Expired`, the reservation's own expiry (ended by `conversion` when a
/// convert found it overdue, `cancellation` when a cancel did).
#[derive(Debug, thiserror::Error)]
pub enum TransitionError {
    #[error("reservation not found")]
    NotFound,
    #[error("the fence does not match this reservation")]
    StaleFence,
    #[error("the reservation has already ended: {state}")]
    NotHeld { state: String },
    #[error("the reservation expired at {expires_at}")]
    Expired { expires_at: DateTime<Utc> },
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The columns of `Reservation`, for `SELECT`s and `RETURNING`s.
pub const RESERVATION_COLUMNS: &str = "id, org_id, order_ref, machine_id, state, fence, reason, hold_seconds, \
     created_at, expires_at, ended_at, ended_by, end_reason, machine_snapshot AS machine";

const LINK_COLUMNS: &str =
    "id, machine_id, reservation_id, service_ref, created_at, ended_at, ended_by";

/// Who ends an overdue reservation found by a conversion (R11, API.md).
pub const ENDED_BY_CONVERSION: &str = "conversion";
/// Who ends an overdue reservation found by a cancellation. Nobody decided
/// before the deadline, so it is recorded as expired, not cancelled (R2);
/// the actor names what found it, as `conversion` and `allocator` do.
pub const ENDED_BY_CANCELLATION: &str = "cancellation";

/// The longest cancellation reason, in characters.
pub const MAX_REASON_CHARS: usize = 500;

/// A cancellation reason: trimmed, 1 to 500 characters, no control
/// characters except newlines and tabs (a person wrote it).
pub fn check_reason(reason: &str) -> Result<&str, &'static str> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err("a reason is required");
    }
    if reason.chars().count() > MAX_REASON_CHARS {
        return Err("the reason must be at most 500 characters");
    }
    if reason
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err("the reason must not contain control characters");
    }
    Ok(reason)
}

pub async fn get(pool: &PgPool, org_id: i64, id: i64) -> Result<Option<Reservation>, sqlx::Error> {
    let sql =
        format!("SELECT {RESERVATION_COLUMNS} FROM reservations WHERE id = $1 AND org_id = $2");
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(org_id)
        .fetch_optional(pool)
        .await
}

/// The reservation of `order_ref` in `org_id`, whatever its state.
pub async fn by_order_ref(
    conn: &mut PgConnection,
    org_id: i64,
    order_ref: &str,
) -> Result<Option<Reservation>, sqlx::Error> {
    let sql = format!(
        "SELECT {RESERVATION_COLUMNS} FROM reservations WHERE org_id = $1 AND order_ref = $2"
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(order_ref)
        .fetch_optional(conn)
        .await
}

/// The service link a converted reservation became, if any.
pub async fn service_of(
    pool: &PgPool,
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

pub async fn events(pool: &PgPool, org_id: i64, id: i64) -> Result<Vec<Event>, sqlx::Error> {
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

/// Writes one event of a reservation's timeline.
pub(crate) async fn record_event(
    conn: &mut PgConnection,
    reservation_id: i64,
    kind: &str,
    from_state: Option<&str>,
    to_state: &str,
    actor: &str,
    detail: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(reservation_id)
    .bind(kind)
    .bind(from_state)
    .bind(to_state)
    .bind(actor)
    .bind(detail)
    .execute(conn)
    .await?;
    Ok(())
}

/// Ends a held reservation: `to_state` is `expired`, `cancelled` or
/// `converted`. Only a held row changes; returns it, or None when it was no
/// longer held.
async fn end(
    conn: &mut PgConnection,
    id: i64,
    to_state: &str,
    ended_by: &str,
    end_reason: &str,
) -> Result<Option<Reservation>, sqlx::Error> {
    let sql = format!(
        "UPDATE reservations
            SET state = $2, ended_at = clock_timestamp(), ended_by = $3, end_reason = $4
          WHERE id = $1 AND state = 'held'
         RETURNING {RESERVATION_COLUMNS}"
    );
    let row: Option<Reservation> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(to_state)
        .bind(ended_by)
        .bind(end_reason)
        .fetch_optional(&mut *conn)
        .await?;
    if let Some(r) = &row {
        let kind = to_state;
        record_event(
            conn,
            r.id,
            kind,
            Some("held"),
            to_state,
            ended_by,
            Some(end_reason),
        )
        .await?;
    }
    Ok(row)
}

/// Expires, at the point of use, the held reservation of `machine_id` whose
/// deadline has passed (R11), with its event. Returns the expired id. The
/// caller holds the machine's row lock.
pub(crate) async fn expire_overdue_on_machine(
    conn: &mut PgConnection,
    machine_id: i64,
    ended_by: &str,
    detail: &str,
) -> Result<Option<i64>, sqlx::Error> {
    let id: Option<i64> = sqlx::query_scalar(
        "UPDATE reservations
            SET state = 'expired', ended_at = clock_timestamp(), ended_by = $2, end_reason = $3
          WHERE machine_id = $1 AND state = 'held' AND expires_at <= clock_timestamp()
         RETURNING id",
    )
    .bind(machine_id)
    .bind(ended_by)
    .bind(detail)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(id) = id {
        record_event(
            conn,
            id,
            "expired",
            Some("held"),
            "expired",
            ended_by,
            Some(detail),
        )
        .await?;
    }
    Ok(id)
}

/// A reservation locked for a transition, with the database's verdict on
/// its deadline.
#[derive(sqlx::FromRow)]
struct Locked {
    #[sqlx(flatten)]
    reservation: Reservation,
    overdue: bool,
}

/// Locks the reservation (machine row first, see the module comment) and
/// checks fence, state and deadline, in that order. An overdue held
/// reservation is recorded as expired by `found_by`; the caller must commit
/// that write even though the transition is refused.
async fn lock_for_transition(
    conn: &mut PgConnection,
    org_id: i64,
    id: i64,
    fence: i64,
    found_by: &str,
    attempted_by: &str,
    what: &str,
) -> Result<Result<Reservation, TransitionError>, sqlx::Error> {
    let machine_id: Option<i64> =
        sqlx::query_scalar("SELECT machine_id FROM reservations WHERE id = $1 AND org_id = $2")
            .bind(id)
            .bind(org_id)
            .fetch_optional(&mut *conn)
            .await?;
    let Some(machine_id) = machine_id else {
        return Ok(Err(TransitionError::NotFound));
    };
    // R10: the machine row is the allocator's lock too; while we hold it no
    // new order can lock this machine, and an order that holds it finishes first.
    sqlx::query("SELECT id FROM machines WHERE id = $1 FOR UPDATE")
        .bind(machine_id)
        .execute(&mut *conn)
        .await?;
    // R11: the deadline is judged by the database's clock, after the locks.
    let sql = format!(
        "SELECT {RESERVATION_COLUMNS}, (expires_at <= clock_timestamp()) AS overdue
           FROM reservations WHERE id = $1 AND org_id = $2 FOR UPDATE"
    );
    let locked: Option<Locked> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(org_id)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(Locked {
        reservation,
        overdue,
    }) = locked
    else {
        return Ok(Err(TransitionError::NotFound));
    };
    if reservation.fence != fence {
        return Ok(Err(TransitionError::StaleFence));
    }
    if reservation.state != "held" {
        return Ok(Err(TransitionError::NotHeld {
            state: reservation.state,
        }));
    }
    if overdue {
        let detail = format!(
            "{what} by {attempted_by} after the deadline ({}); nobody decided in time",
            reservation.expires_at.format("%Y-%m-%d %H:%M:%S UTC")
        );
        end(conn, id, "expired", found_by, &detail).await?;
        return Ok(Err(TransitionError::Expired {
            expires_at: reservation.expires_at,
        }));
    }
    Ok(Ok(reservation))
}

/// Cancels a held reservation; `actor` is a staff email or a token name.
/// `reason` is stored as given: callers check it first with `check_reason`
/// (required, 1 to 500 characters).
///
/// A held reservation past its deadline is not cancelled: it is recorded as
/// expired, ended by `cancellation` (nobody decided before the deadline,
/// R2), that write is committed, and the answer is `Expired`.
pub async fn cancel(
    pool: &PgPool,
    org_id: i64,
    id: i64,
    fence: i64,
    actor: &str,
    reason: &str,
) -> Result<Reservation, TransitionError> {
    let mut tx = pool.begin().await?;
    let outcome = cancel_on(&mut tx, org_id, id, fence, actor, reason).await;
    settle(tx, outcome).await
}

/// `cancel` inside the caller's transaction, so that the caller can write
/// more (an audit row) atomically with it; finish with `settle`.
pub async fn cancel_on(
    conn: &mut PgConnection,
    org_id: i64,
    id: i64,
    fence: i64,
    actor: &str,
    reason: &str,
) -> Result<Reservation, TransitionError> {
    lock_for_transition(
        conn,
        org_id,
        id,
        fence,
        ENDED_BY_CANCELLATION,
        actor,
        "cancellation requested",
    )
    .await??;
    end(conn, id, "cancelled", actor, reason)
        .await?
        .ok_or_else(|| TransitionError::NotHeld {
            state: "unknown".into(),
        })
}

/// Ends a transition's transaction: commit on success, and on `Expired`
/// too (R11: the expiry found at the point of use is recorded even though
/// the transition is refused); roll back on any other refusal.
pub async fn settle<T>(
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
    outcome: Result<T, TransitionError>,
) -> Result<T, TransitionError> {
    match &outcome {
        Ok(_) | Err(TransitionError::Expired { .. }) => tx.commit().await?,
        Err(_) => tx.rollback().await?,
    }
    outcome
}

/// Converts a held reservation into a service link in one transaction (R10).
///
/// The link is written first while the reservation is still held, then the
/// reservation turns converted: at every instant another order sees one or
/// the other.
pub async fn convert(
    pool: &PgPool,
    org_id: i64,
    id: i64,
    fence: i64,
    actor: &str,
    service_ref: &ServiceRef,
) -> Result<(Reservation, ServiceLink), TransitionError> {
    let mut tx = pool.begin().await?;
    let outcome = convert_on(&mut tx, org_id, id, fence, actor, service_ref).await;
    settle(tx, outcome).await
}

/// `convert` inside the caller's transaction; finish with `settle`.
pub async fn convert_on(
    conn: &mut PgConnection,
    org_id: i64,
    id: i64,
    fence: i64,
    actor: &str,
    service_ref: &ServiceRef,
) -> Result<(Reservation, ServiceLink), TransitionError> {
    let held = lock_for_transition(
        conn,
        org_id,
        id,
        fence,
        ENDED_BY_CONVERSION,
        actor,
        "conversion requested",
    )
    .await??;
    // R11: the link's creation time and the deadline check are one reading
    // of the database's clock, so no link is ever dated after the deadline
    // (the deadline may pass between the check above and this statement).
    let sql = format!(
        "WITH t AS (SELECT clock_timestamp() AS at)
         INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at)
         SELECT $1, $2, $3, $4, t.at FROM t JOIN reservations r ON r.id = $3 AND r.expires_at > t.at
         RETURNING {LINK_COLUMNS}"
    );
    let link: Option<ServiceLink> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(held.machine_id)
        .bind(held.id)
        .bind(service_ref.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    let Some(link) = link else {
        let detail = format!(
            "conversion requested by {actor} reached the deadline ({}); nobody decided in time",
            held.expires_at.format("%Y-%m-%d %H:%M:%S UTC")
        );
        // Committed by `settle`, like every expiry found at the point of use.
        end(conn, id, "expired", ENDED_BY_CONVERSION, &detail).await?;
        return Err(TransitionError::Expired {
            expires_at: held.expires_at,
        });
    };
    let converted = end(
        conn,
        id,
        "converted",
        actor,
        &format!("converted into service {service_ref}"),
    )
    .await?
    .ok_or_else(|| TransitionError::NotHeld {
        state: "unknown".into(),
    })?;
    Ok((converted, link))
}

/// Why ending a service link was refused.
#[derive(Debug, thiserror::Error)]
pub enum EndServiceError {
    #[error("service link not found")]
    NotFound,
    #[error("the service link has already ended")]
    NotLive,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Ends a live service link; its machine goes to `provisioning` (it must be
/// wiped before it is sold again), so it is not a candidate until the
/// datacenter team says it is ready.
pub async fn end_service(
    pool: &PgPool,
    org_id: i64,
    id: i64,
    actor: &str,
) -> Result<ServiceLink, EndServiceError> {
    let mut tx = pool.begin().await?;
    let machine_id: Option<i64> =
        sqlx::query_scalar("SELECT machine_id FROM service_links WHERE id = $1 AND org_id = $2")
            .bind(id)
            .bind(org_id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(machine_id) = machine_id else {
        return Err(EndServiceError::NotFound);
    };
    // Machine row first, as everywhere else.
    sqlx::query("SELECT id FROM machines WHERE id = $1 FOR UPDATE")
        .bind(machine_id)
        .execute(&mut *tx)
        .await?;
    let sql = format!(
        "UPDATE service_links SET ended_at = clock_timestamp(), ended_by = $3
          WHERE id = $1 AND org_id = $2 AND ended_at IS NULL
         RETURNING {LINK_COLUMNS}"
    );
    let link: Option<ServiceLink> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(org_id)
        .bind(actor)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(link) = link else {
        return Err(EndServiceError::NotLive);
    };
    sqlx::query(
        "UPDATE machines SET status = 'provisioning', updated_at = clock_timestamp() WHERE id = $1",
    )
    .bind(machine_id)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(link)
}
