//! Cancel and convert of one reservation (R10, R11), each one statement
//! (`reservation_transition`, or `api_transition` for an API caller), and
//! `settle`, which ends a transition's transaction.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::rows::{Reservation, ServiceLink};
use crate::db::Db;
use crate::db::lock_order::Savepoint;
use crate::domain::ServiceRef;

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
    NotHeld {
        state: crate::domain::ReservationState,
    },
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
    /// F3: the replay of a convert or cancel this caller made, with the
    /// same fence but another service_ref or reason: another request under
    /// the same key, refused; the reservation stays as the original left it.
    #[error("this reservation was already ended by this caller with another request")]
    IdempotencyMismatch,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

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

impl<'a> Transition<'a> {
    /// The request's fields that a replay must repeat (F3): what an
    /// `IdempotencyMismatch` names.
    pub fn replay_fields(&self) -> Vec<&'static str> {
        match self {
            Transition::Cancel(_) => vec!["reason"],
            Transition::Convert(_) => vec!["service_ref"],
        }
    }

    fn action(&self) -> &'static str {
        match self {
            Transition::Cancel(_) => "cancel",
            Transition::Convert(_) => "convert",
        }
    }

    /// The request as PostgreSQL reads it: one jsonb value read into the
    /// `transition_request` type (a field added here is an attribute
    /// there, never another argument of a function).
    fn request(&self, id: i64, fence: i64) -> sqlx::types::Json<TransitionRequest<'a>> {
        let (reason, service_ref) = match *self {
            Transition::Cancel(reason) => (Some(reason), None),
            Transition::Convert(service_ref) => (None, Some(service_ref.as_str())),
        };
        sqlx::types::Json(TransitionRequest {
            id,
            fence,
            action: self.action(),
            reason,
            service_ref,
        })
    }
}

/// A cancel or convert of one reservation, as `transition_request`.
#[derive(Debug, serde::Serialize)]
struct TransitionRequest<'a> {
    id: i64,
    fence: i64,
    action: &'static str,
    reason: Option<&'a str>,
    service_ref: Option<&'a str>,
}

/// One transition, as one statement (`transition_request_of`).
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
        let outcome = sqlx::query_as(sqlx::AssertSqlSafe(TRANSITION.as_str()))
            .bind(org_id)
            .bind(actor)
            .bind(what.request(id, fence))
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
/// (`api_transition_request`): the token, its scope and both module switches are
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
    let row: crate::tokens::CallerRow<TransitionRow> =
        sqlx::query_as(sqlx::AssertSqlSafe(API_TRANSITION.as_str()))
            .bind(token_hash)
            .bind(module_on)
            .bind(what.request(id, fence))
            .fetch_one(db)
            .await?;
    match crate::tokens::CallerRefusal::parse(&row.caller)? {
        Some(refusal) => Ok(Err(refusal)),
        None => Ok(Ok(row.result.into_result())),
    }
}

/// The columns of a `transition_result` `of` (an alias or `(c.result)`)
/// as `TransitionRow` reads them, with `r` the reservation's row joined by
/// id. The type's flat columns are the reservation as the transition left
/// it; the columns it lacks are the ones fixed when the order was written
/// (segment, customer), which the statement's snapshot reads as well as
/// the function's would. The functions declare how many rows they answer
/// (`ROWS`): at the default estimate of 1,000 the planner hashed the whole
/// table for this join (a sequential scan of every reservation ever made
/// on every cancel, seen by the bench's auto_explain).
pub(super) fn transition_columns(of: &str) -> String {
    let mut cols: Vec<String> = [
        "outcome",
        "link_id",
        "link_service_ref",
        "link_created_at",
        "link_ended_at",
        "link_ended_by",
    ]
    .iter()
    .map(|c| format!("{of}.{c}"))
    .collect();
    // The reservation as the transition left it (the flat type's columns,
    // frozen); a column the type lacks is one a transition never writes,
    // fixed when the order was written, and is read from `r`.
    const FLAT: [&str; 15] = [
        "id",
        "org_id",
        "order_ref",
        "machine_id",
        "state",
        "fence",
        "reason",
        "hold_seconds",
        "created_at",
        "expires_at",
        "ended_at",
        "ended_by",
        "end_reason",
        "quantity",
        "slot",
    ];
    for c in super::rows::RESERVATION_FIELDS {
        cols.push(match c {
            "machine_snapshot" => format!("{of}.machine AS machine_snapshot"),
            c if FLAT.contains(&c) => format!("{of}.{c}"),
            c => super::rows::reservation_column("r", c),
        });
    }
    cols.join(", ")
}

static TRANSITION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {} FROM transition_request_of($1, $2, jsonb_populate_record(NULL::transition_request, $3)) x
           LEFT JOIN reservations r ON r.id = x.id",
        transition_columns("x")
    )
});

static API_TRANSITION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT c.caller, {} FROM api_transition_request($1, $2, $3) c
           LEFT JOIN reservations r ON r.id = (c.result).id",
        transition_columns("(c.result)")
    )
});

/// A row of the SQL type `transition_result` (`transition_columns`): its
/// outcome, its link and its reservation, if any.
#[derive(Debug)]
pub(super) struct TransitionRow {
    pub(super) outcome: Option<String>,
    pub(super) reservation: Option<Reservation>,
    link_id: Option<i64>,
    link_service_ref: Option<String>,
    link_created_at: Option<DateTime<Utc>>,
    /// The link as it is now (F3: a replayed convert after its service
    /// ended shows the end).
    link_ended_at: Option<DateTime<Utc>>,
    link_ended_by: Option<String>,
}

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for TransitionRow {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        Ok(TransitionRow {
            outcome: row.try_get("outcome")?,
            reservation: Reservation::of_answer(row)?,
            link_id: row.try_get("link_id")?,
            link_service_ref: row.try_get("link_service_ref")?,
            link_created_at: row.try_get("link_created_at")?,
            link_ended_at: row.try_get("link_ended_at")?,
            link_ended_by: row.try_get("link_ended_by")?,
        })
    }
}

impl TransitionRow {
    /// The reservation the function promised.
    pub(super) fn required(self) -> Result<Reservation, sqlx::Error> {
        self.reservation.ok_or_else(|| {
            sqlx::Error::Protocol("a reservation was expected in the function's answer".to_owned())
        })
    }
}

impl TransitionRow {
    pub(super) fn into_result(
        mut self,
    ) -> Result<(Reservation, Option<ServiceLink>), TransitionError> {
        let outcome = self.outcome.take().unwrap_or_default();
        if outcome == "not_found" {
            return Err(TransitionError::NotFound);
        }
        let (link_id, link_service_ref, link_created_at, link_ended_at, link_ended_by) = (
            self.link_id.take(),
            self.link_service_ref.take(),
            self.link_created_at.take(),
            self.link_ended_at.take(),
            self.link_ended_by.take(),
        );
        let r = self.required()?;
        match outcome.as_str() {
            // 'unchanged': an extension that asked for no later deadline.
            "ok" | "unchanged" => {
                let link = match (link_id, link_service_ref, link_created_at) {
                    (Some(id), Some(service_ref), Some(created_at)) => Some(ServiceLink {
                        id,
                        machine_id: r.machine_id,
                        reservation_id: r.id,
                        service_ref,
                        created_at,
                        ended_at: link_ended_at,
                        ended_by: link_ended_by,
                    }),
                    _ => None,
                };
                Ok((r, link))
            }
            "stale_fence" => Err(TransitionError::StaleFence),
            "idempotency_mismatch" => Err(TransitionError::IdempotencyMismatch),
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
