//! Reservations after creation: read, convert (R10), cancel, and their
//! event timeline. Every transition checks the fence, the state and the
//! deadline (R11) in the same transaction that writes it.
//!
//! Cancel and convert run inside PostgreSQL, each as one statement: the
//! function `reservation_transition` of `sql/transitions.sql` locks the
//! machine row first,
//! then the reservation row (the allocator's order too, so the two never
//! deadlock and a new order can never slip in while a conversion is half
//! done), checks fence, state and deadline in that order, records an
//! overdue hold as expired (R11), and for a conversion writes the service
//! link before the reservation turns converted (R10: promote, never
//! release-then-write). The API calls it through `api_transition`, with the
//! token check in the same statement.

use crate::db::Db;
use crate::db::lock_order::Savepoint;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

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
    /// R13: how many machines its order holds, and which of them this is
    /// (1 of 1 for an order of one).
    pub quantity: i16,
    pub slot: i16,
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
    /// R13: the reservation belongs to an order of several machines, which
    /// is cancelled, converted or extended as a whole.
    #[error(
        "reservation {id} is one of the {quantity} machines of order {order_ref}; act on the order"
    )]
    PartOfOrder {
        id: i64,
        order_ref: String,
        quantity: i16,
    },
    /// The request did not name exactly the order's reservations.
    #[error("the request must name every reservation of the order once: {ids:?}")]
    Mismatch { ids: Vec<i64> },
    /// R14: the new deadline would make the whole hold longer than the cap.
    #[error("the hold cannot last more than {cap_seconds} s from its creation, until {latest}")]
    HoldCap {
        cap_seconds: u32,
        latest: DateTime<Utc>,
    },
    /// R15: a machine under the reservation (or the order) is not `ready`
    /// at the commit, so it is not sold.
    #[error("machine {asset_tag} is not ready; it cannot be sold")]
    MachineNotReady {
        reservation_id: i64,
        machine_id: i64,
        asset_tag: String,
    },
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The columns of `Reservation`, for `SELECT`s and `RETURNING`s.
pub const RESERVATION_COLUMNS: &str = "id, org_id, order_ref, machine_id, state, fence, reason, hold_seconds, \
     created_at, expires_at, ended_at, ended_by, end_reason, machine_snapshot AS machine, quantity, slot";

const LINK_COLUMNS: &str =
    "id, machine_id, reservation_id, service_ref, created_at, ended_at, ended_by";

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

pub async fn get(pool: &Db, org_id: i64, id: i64) -> Result<Option<Reservation>, sqlx::Error> {
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
        "SELECT {RESERVATION_COLUMNS} FROM reservations WHERE org_id = $1 AND order_ref = $2
          ORDER BY slot LIMIT 1"
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(order_ref)
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
    let sql = format!(
        "SELECT {RESERVATION_COLUMNS} FROM reservations WHERE org_id = $1 AND order_ref = $2 ORDER BY slot"
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(order_ref)
        .fetch_all(db)
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

/// Cancels a held reservation; `actor` is a staff email or a token name.
/// `reason` is stored as given: callers check it first with `check_reason`
/// (required, 1 to 500 characters).
///
/// A held reservation past its deadline is not cancelled: it is recorded as
/// expired, ended by `cancellation` (nobody decided before the deadline,
/// R2), that write is committed, and the answer is `Expired`.
pub async fn cancel(
    pool: &Db,
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
    transition_on(conn, org_id, id, fence, actor, Transition::Cancel(reason))
        .await
        .map(|(r, _)| r)
}

/// What a transition does, with its text.
#[derive(Debug, Clone, Copy)]
pub enum Transition<'a> {
    /// Cancel, with the reason (checked first with `check_reason`).
    Cancel(&'a str),
    /// Convert into the service with this reference.
    Convert(&'a ServiceRef),
}

impl Transition<'_> {
    fn action(&self) -> &'static str {
        match self {
            Transition::Cancel(_) => "cancel",
            Transition::Convert(_) => "convert",
        }
    }

    fn text(&self) -> &str {
        match self {
            Transition::Cancel(reason) => reason,
            Transition::Convert(service_ref) => service_ref.as_str(),
        }
    }
}

/// One transition, as one statement (`reservation_transition`).
async fn transition_on(
    conn: &mut PgConnection,
    org_id: i64,
    id: i64,
    fence: i64,
    actor: &str,
    what: Transition<'_>,
) -> Result<(Reservation, Option<ServiceLink>), TransitionError> {
    let mut run = 1;
    let row: TransitionRow = loop {
        let mut savepoint = Savepoint::begin(&mut *conn).await?;
        let outcome =
            sqlx::query_as("SELECT * FROM reservation_transition($1, $2, $3, $4, $5, $6)")
                .bind(org_id)
                .bind(id)
                .bind(fence)
                .bind(actor)
                .bind(what.action())
                .bind(what.text())
                .fetch_one(savepoint.conn())
                .await;
        match savepoint.end(outcome, run).await? {
            Some(row) => break row,
            None => run += 1,
        }
    };
    row.into_result()
}

/// `POST /api/v1/reservations/{id}/cancel` or `.../convert` in one statement
/// (`api_transition`): the token, its scope and both module switches are
/// checked in the same statement as the transition. Autocommit: an expiry
/// found at the point of use (R11) is committed with the refusal.
pub async fn transition_for_token(
    db: impl sqlx::PgExecutor<'_>,
    token_hash: &[u8],
    module_on: bool,
    id: i64,
    fence: i64,
    what: Transition<'_>,
) -> Result<
    Result<
        Result<(Reservation, Option<ServiceLink>), TransitionError>,
        crate::tokens::CallerRefusal,
    >,
    sqlx::Error,
> {
    let row: crate::tokens::CallerRow<TransitionRow> = sqlx::query_as(
        "SELECT c.caller, (c.result).* FROM api_transition($1, $2, $3, $4, $5, $6) c",
    )
    .bind(token_hash)
    .bind(module_on)
    .bind(id)
    .bind(fence)
    .bind(what.action())
    .bind(what.text())
    .fetch_one(db)
    .await?;
    match crate::tokens::CallerRefusal::parse(&row.caller)? {
        Some(refusal) => Ok(Err(refusal)),
        None => Ok(Ok(row.result.into_result())),
    }
}

/// A reservation read from a function's row whose columns may all be NULL
/// (no reservation): the columns of `Reservation`, each optional.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct MaybeReservation {
    id: Option<i64>,
    org_id: Option<i64>,
    order_ref: Option<String>,
    machine_id: Option<i64>,
    state: Option<String>,
    fence: Option<i64>,
    reason: Option<String>,
    hold_seconds: Option<i32>,
    created_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
    ended_by: Option<String>,
    end_reason: Option<String>,
    machine: Option<sqlx::types::Json<MachineSnapshot>>,
    quantity: Option<i16>,
    slot: Option<i16>,
}

impl MaybeReservation {
    /// The organization, also set on a refusal's row (no reservation).
    pub(crate) fn org_id(&self) -> Option<i64> {
        self.org_id
    }

    /// The reservation a function promised.
    pub(crate) fn required(self) -> Result<Reservation, sqlx::Error> {
        let missing = || {
            sqlx::Error::Protocol("a reservation was expected in the function's answer".to_owned())
        };
        Ok(Reservation {
            id: self.id.ok_or_else(missing)?,
            org_id: self.org_id.ok_or_else(missing)?,
            order_ref: self.order_ref.ok_or_else(missing)?,
            machine_id: self.machine_id.ok_or_else(missing)?,
            state: self.state.ok_or_else(missing)?,
            fence: self.fence.ok_or_else(missing)?,
            reason: self.reason.ok_or_else(missing)?,
            hold_seconds: self.hold_seconds.ok_or_else(missing)?,
            created_at: self.created_at.ok_or_else(missing)?,
            expires_at: self.expires_at.ok_or_else(missing)?,
            ended_at: self.ended_at,
            ended_by: self.ended_by,
            end_reason: self.end_reason,
            machine: self.machine.map(|j| j.0).unwrap_or_default(),
            quantity: self.quantity.unwrap_or(1),
            slot: self.slot.unwrap_or(1),
        })
    }
}

/// A row of the SQL type `transition_result`.
#[derive(Debug, sqlx::FromRow)]
struct TransitionRow {
    outcome: Option<String>,
    #[sqlx(flatten)]
    reservation: MaybeReservation,
    link_id: Option<i64>,
    link_service_ref: Option<String>,
    link_created_at: Option<DateTime<Utc>>,
    /// The link as it is now (F3: a replayed convert after its service
    /// ended shows the end).
    link_ended_at: Option<DateTime<Utc>>,
    link_ended_by: Option<String>,
}

impl TransitionRow {
    fn into_result(self) -> Result<(Reservation, Option<ServiceLink>), TransitionError> {
        let outcome = self.outcome.unwrap_or_default();
        if outcome == "not_found" {
            return Err(TransitionError::NotFound);
        }
        let r = self.reservation.required()?;
        match outcome.as_str() {
            // 'unchanged': an extension that asked for no later deadline.
            "ok" | "unchanged" => {
                let link = match (self.link_id, self.link_service_ref, self.link_created_at) {
                    (Some(id), Some(service_ref), Some(created_at)) => Some(ServiceLink {
                        id,
                        machine_id: r.machine_id,
                        reservation_id: r.id,
                        service_ref,
                        created_at,
                        ended_at: self.link_ended_at,
                        ended_by: self.link_ended_by,
                    }),
                    _ => None,
                };
                Ok((r, link))
            }
            "stale_fence" => Err(TransitionError::StaleFence),
            "part_of_order" => Err(TransitionError::PartOfOrder {
                id: r.id,
                order_ref: r.order_ref,
                quantity: r.quantity,
            }),
            "not_held" => Err(TransitionError::NotHeld { state: r.state }),
            "machine_not_ready" => Err(TransitionError::MachineNotReady {
                reservation_id: r.id,
                machine_id: r.machine_id,
                asset_tag: r.machine.asset_tag,
            }),
            "expired" => Err(TransitionError::Expired {
                expires_at: r.expires_at,
            }),
            other => Err(TransitionError::Database(sqlx::Error::Protocol(format!(
                "reservation_transition answered an unknown outcome {other:?}"
            )))),
        }
    }
}

impl TransitionRow {
    /// The rows of `order_transition`: one per reservation of the order,
    /// all with the same outcome.
    fn into_order(
        rows: Vec<TransitionRow>,
        cap_seconds: u32,
    ) -> Result<OrderAfter, TransitionError> {
        let outcome = rows
            .first()
            .and_then(|r| r.outcome.clone())
            .unwrap_or_else(|| "not_found".to_owned());
        match outcome.as_str() {
            "ok" | "unchanged" => rows.into_iter().map(TransitionRow::into_result).collect(),
            "not_found" => Err(TransitionError::NotFound),
            "mismatch" => Err(TransitionError::Mismatch {
                ids: rows.iter().filter_map(|r| r.reservation.id).collect(),
            }),
            "not_held" => {
                let order = rows
                    .into_iter()
                    .map(|r| r.reservation.required())
                    .collect::<Result<Vec<_>, _>>()?;
                let state = order
                    .iter()
                    .find(|r| r.state != "held")
                    .map(|r| r.state.clone())
                    .unwrap_or_default();
                Err(TransitionError::NotHeld { state })
            }
            "hold_cap" => {
                let created_at = rows.into_iter().next().map(|r| r.reservation.required());
                let created_at = created_at.transpose()?.map(|r| r.created_at);
                Err(TransitionError::HoldCap {
                    cap_seconds,
                    latest: created_at.unwrap_or_default()
                        + chrono::Duration::seconds(i64::from(cap_seconds)),
                })
            }
            // One reservation's refusal stands for the order's (stale_fence,
            // expired with the order's one deadline, part_of_order).
            _ => match rows.into_iter().next() {
                Some(row) => row.into_result().map(|one| vec![one]),
                None => Err(TransitionError::NotFound),
            },
        }
    }
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
    pool: &Db,
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
    let (r, link) = transition_on(
        conn,
        org_id,
        id,
        fence,
        actor,
        Transition::Convert(service_ref),
    )
    .await?;
    let link = link.ok_or_else(|| {
        TransitionError::Database(sqlx::Error::Protocol(
            "a conversion answered without its service link".to_owned(),
        ))
    })?;
    Ok((r, link))
}

/// What an order transition does (R13, R14), with its texts.
#[derive(Debug, Clone, Copy)]
pub enum OrderAction<'a> {
    /// Cancel every reservation of the order, with one reason.
    Cancel { reason: &'a str },
    /// Convert every reservation of the order: one service reference per
    /// named reservation, in the order they are named.
    Convert { service_refs: &'a [ServiceRef] },
    /// Extend the hold (R14): the deadline becomes `until`, or without it
    /// `seconds` from now by the database's clock (never earlier than it
    /// was), and the whole hold may not last more than `cap_seconds` from
    /// creation. With `until` the same request again answers the same
    /// deadline (F3); with `seconds` it moves it again.
    Extend {
        seconds: u32,
        until: Option<DateTime<Utc>>,
        cap_seconds: u32,
        reason: Option<&'a str>,
    },
}

impl OrderAction<'_> {
    fn action(&self) -> &'static str {
        match self {
            OrderAction::Cancel { .. } => "cancel",
            OrderAction::Convert { .. } => "convert",
            OrderAction::Extend { .. } => "extend",
        }
    }

    fn reason(&self) -> Option<&str> {
        match self {
            OrderAction::Cancel { reason } => Some(reason),
            OrderAction::Convert { .. } => None,
            OrderAction::Extend { reason, .. } => *reason,
        }
    }

    fn texts(&self) -> Vec<&str> {
        match self {
            OrderAction::Convert { service_refs } => {
                service_refs.iter().map(ServiceRef::as_str).collect()
            }
            _ => Vec::new(),
        }
    }

    fn seconds(&self) -> (Option<i32>, Option<i32>) {
        match self {
            OrderAction::Extend {
                seconds,
                cap_seconds,
                until,
                ..
            } => (
                until
                    .is_none()
                    .then(|| i32::try_from(*seconds).ok())
                    .flatten(),
                i32::try_from(*cap_seconds).ok(),
            ),
            _ => (None, None),
        }
    }

    fn until(&self) -> Option<DateTime<Utc>> {
        match self {
            OrderAction::Extend { until, .. } => *until,
            _ => None,
        }
    }

    fn cap_seconds(&self) -> u32 {
        match self {
            OrderAction::Extend { cap_seconds, .. } => *cap_seconds,
            _ => 0,
        }
    }
}

/// A reservation named by a request: its id and the fence the caller holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named {
    pub id: i64,
    pub fence: i64,
}

/// Every reservation of an order after an order transition, in slot order,
/// each with its service link once converted.
pub type OrderAfter = Vec<(Reservation, Option<ServiceLink>)>;

/// Cancel, convert or extend a whole order in the caller's transaction
/// (`order_transition`): all of its reservations or none (R13). With
/// `order_ref` `None`, the order of reservation `named[0]`, which must be an
/// order of one (`PartOfOrder` otherwise): the single-reservation extension.
/// Finish with `settle` (an expiry found at the point of use is committed).
pub async fn order_transition_on(
    conn: &mut PgConnection,
    org_id: i64,
    order_ref: Option<&str>,
    named: &[Named],
    actor: &str,
    what: OrderAction<'_>,
) -> Result<OrderAfter, TransitionError> {
    order_transition_changed_on(conn, org_id, order_ref, named, actor, what)
        .await
        .map(|(order, _)| order)
}

/// `order_transition_on`, also saying whether anything changed: false for
/// an extension that asked for no later deadline (nothing was written, so
/// there is nothing to audit).
pub async fn order_transition_changed_on(
    conn: &mut PgConnection,
    org_id: i64,
    order_ref: Option<&str>,
    named: &[Named],
    actor: &str,
    what: OrderAction<'_>,
) -> Result<(OrderAfter, bool), TransitionError> {
    let (seconds, cap) = what.seconds();
    let (ids, fences): (Vec<i64>, Vec<i64>) = named.iter().map(|n| (n.id, n.fence)).unzip();
    let mut run = 1;
    let rows: Vec<TransitionRow> = loop {
        let mut savepoint = Savepoint::begin(&mut *conn).await?;
        let outcome = sqlx::query_as(
            "SELECT * FROM order_transition($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(org_id)
        .bind(order_ref)
        .bind(&ids)
        .bind(&fences)
        .bind(what.texts())
        .bind(actor)
        .bind(what.action())
        .bind(what.reason())
        .bind(seconds)
        .bind(cap)
        .bind(what.until())
        .fetch_all(savepoint.conn())
        .await;
        match savepoint.end(outcome, run).await? {
            Some(rows) => break rows,
            None => run += 1,
        }
    };
    let changed = rows
        .first()
        .is_some_and(|r| r.outcome.as_deref() != Some("unchanged"));
    TransitionRow::into_order(rows, what.cap_seconds()).map(|order| (order, changed))
}

/// `order_transition_on` for an API caller, in one autocommitted statement
/// (`api_order_transition`): the token, its scope and both module switches
/// checked in the same statement as the transition.
pub async fn order_transition_for_token(
    conn: &mut PgConnection,
    token_hash: &[u8],
    module_on: bool,
    order_ref: Option<&str>,
    named: &[Named],
    what: OrderAction<'_>,
) -> Result<Result<Result<OrderAfter, TransitionError>, crate::tokens::CallerRefusal>, sqlx::Error>
{
    let (seconds, cap) = what.seconds();
    let rows: Vec<crate::tokens::CallerRow<TransitionRow>> = sqlx::query_as(
        "SELECT c.caller, (c.result).* FROM api_order_transition($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) c",
    )
    .bind(token_hash)
    .bind(module_on)
    .bind(order_ref)
    .bind(named.iter().map(|n| n.id).collect::<Vec<i64>>())
    .bind(named.iter().map(|n| n.fence).collect::<Vec<i64>>())
    .bind(what.texts())
    .bind(what.action())
    .bind(what.reason())
    .bind(seconds)
    .bind(cap)
    .bind(what.until())
    .fetch_all(conn)
    .await?;
    let caller = rows
        .first()
        .map(|r| r.caller.clone())
        .ok_or_else(|| sqlx::Error::Protocol("api_order_transition answered no row".to_owned()))?;
    match crate::tokens::CallerRefusal::parse(&caller)? {
        Some(refusal) => Ok(Err(refusal)),
        None => Ok(Ok(TransitionRow::into_order(
            rows.into_iter().map(|r| r.result).collect(),
            what.cap_seconds(),
        ))),
    }
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
    pool: &Db,
    org_id: i64,
    id: i64,
    actor: &str,
) -> Result<ServiceLink, EndServiceError> {
    let mut tx = pool.begin().await?;
    let link = end_service_on(&mut tx, org_id, id, actor).await??;
    tx.commit().await?;
    Ok(link)
}

/// `end_service` in the caller's transaction: the database's errors
/// outside, the refusals inside (`NotFound`, `NotLive`: nothing written).
/// A link this same actor ended already is answered as it is (a retry).
pub async fn end_service_on(
    tx: &mut PgConnection,
    org_id: i64,
    id: i64,
    actor: &str,
) -> Result<Result<ServiceLink, EndServiceError>, sqlx::Error> {
    let machine_id: Option<i64> =
        sqlx::query_scalar("SELECT machine_id FROM service_links WHERE id = $1 AND org_id = $2")
            .bind(id)
            .bind(org_id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(machine_id) = machine_id else {
        return Ok(Err(EndServiceError::NotFound));
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
        // F3: the same end again, after an answer that was lost, answers
        // the service as that end left it; an end by anyone else stays
        // refused, so the caller can tell the two apart.
        let sql = format!(
            "SELECT {LINK_COLUMNS} FROM service_links
              WHERE id = $1 AND org_id = $2 AND ended_at IS NOT NULL AND ended_by = $3"
        );
        let ours: Option<ServiceLink> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(org_id)
            .bind(actor)
            .fetch_optional(&mut *tx)
            .await?;
        return Ok(ours.ok_or(EndServiceError::NotLive));
    };
    sqlx::query(
        "UPDATE machines SET status = 'provisioning', updated_at = clock_timestamp() WHERE id = $1",
    )
    .bind(machine_id)
    .execute(&mut *tx)
    .await?;
    Ok(Ok(link))
}
