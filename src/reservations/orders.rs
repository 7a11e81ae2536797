//! Whole orders (R13): cancel, convert or extend every reservation of an
//! order or none, and the extension of one reservation (R14), each one
//! statement (`order_request_transition`, or `api_order_request` for an API
//! caller), the request passed as one value (`OrderRequest`).

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::rows::{Reservation, ServiceLink};
use super::transitions::{TransitionError, TransitionRow, transition_columns};

static ORDER_TRANSITION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {} FROM order_request_transition($1, $2, jsonb_populate_record(NULL::order_request, $3)) x
           LEFT JOIN reservations r ON r.id = x.id",
        transition_columns("x")
    )
});

static API_ORDER_TRANSITION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT c.caller, {} FROM api_order_request($1, $2, $3) c
           LEFT JOIN reservations r ON r.id = (c.result).id",
        transition_columns("(c.result)")
    )
});
use crate::db::lock_order::Savepoint;
use crate::domain::ServiceRef;

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
    /// The request's fields that a replay must repeat (F3): what an
    /// `IdempotencyMismatch` names (an extension is never one: with the
    /// same fence, another deadline is a new extension).
    pub fn replay_fields(&self) -> Vec<&'static str> {
        match self {
            OrderAction::Cancel { .. } => vec!["reason"],
            OrderAction::Convert { .. } => vec!["service_ref"],
            OrderAction::Extend { .. } => Vec::new(),
        }
    }
}

impl<'a> OrderAction<'a> {
    fn action(&self) -> &'static str {
        match self {
            OrderAction::Cancel { .. } => "cancel",
            OrderAction::Convert { .. } => "convert",
            OrderAction::Extend { .. } => "extend",
        }
    }

    fn reason(&self) -> Option<&'a str> {
        match *self {
            OrderAction::Cancel { reason } => Some(reason),
            OrderAction::Convert { .. } => None,
            OrderAction::Extend { reason, .. } => reason,
        }
    }

    fn texts(&self) -> Vec<&'a str> {
        match *self {
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

/// An order action as PostgreSQL reads it: one jsonb value read into the
/// `order_request` type, so that a field added here is an attribute there
/// and never another argument of a function (a key an older binary does
/// not send reads NULL).
#[derive(Debug, serde::Serialize)]
struct OrderRequest<'a> {
    order_ref: Option<&'a str>,
    ids: Vec<i64>,
    fences: Vec<i64>,
    texts: Vec<&'a str>,
    action: &'static str,
    reason: Option<&'a str>,
    seconds: Option<i32>,
    cap: Option<i32>,
    until: Option<DateTime<Utc>>,
}

impl<'a> OrderRequest<'a> {
    fn of(order_ref: Option<&'a str>, named: &[Named], what: &OrderAction<'a>) -> Self {
        let (seconds, cap) = what.seconds();
        let (ids, fences) = named.iter().map(|n| (n.id, n.fence)).unzip();
        OrderRequest {
            order_ref,
            ids,
            fences,
            texts: what.texts(),
            action: what.action(),
            reason: what.reason(),
            seconds,
            cap,
            until: what.until(),
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
/// (`order_request_transition`): all of its reservations or none (R13). With
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
    let request = sqlx::types::Json(OrderRequest::of(order_ref, named, &what));
    let mut run = 1;
    let rows: Vec<TransitionRow> = loop {
        let mut savepoint = Savepoint::begin(&mut *conn).await?;
        let outcome = sqlx::query_as(sqlx::AssertSqlSafe(ORDER_TRANSITION.as_str()))
            .bind(org_id)
            .bind(actor)
            .bind(&request)
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
/// (`api_order_request`): the token, its scope and both module switches
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
    let rows: Vec<crate::tokens::CallerRow<TransitionRow>> =
        sqlx::query_as(sqlx::AssertSqlSafe(API_ORDER_TRANSITION.as_str()))
            .bind(token_hash)
            .bind(module_on)
            .bind(sqlx::types::Json(OrderRequest::of(order_ref, named, &what)))
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
            "idempotency_mismatch" => Err(TransitionError::IdempotencyMismatch),
            "mismatch" => Err(TransitionError::Mismatch {
                ids: rows
                    .iter()
                    .filter_map(|r| r.reservation.as_ref().map(|r| r.id))
                    .collect(),
            }),
            "not_held" => {
                let order = rows
                    .into_iter()
                    .map(TransitionRow::required)
                    .collect::<Result<Vec<_>, _>>()?;
                let state = order.iter().map(|r| r.state).find(|s| !s.is_held());
                match state {
                    Some(state) => Err(TransitionError::NotHeld { state }),
                    None => Err(TransitionError::Database(sqlx::Error::Protocol(
                        "order_transition answered not_held for an order that is held".to_owned(),
                    ))),
                }
            }
            "hold_cap" => {
                let created_at = rows.into_iter().next().map(TransitionRow::required);
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
