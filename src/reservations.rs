//! Reservations after creation: read, convert (R10), cancel, and their
//! event timeline. Every transition checks the fence, the state and the
//! deadline (R11) in the same transaction that writes it.
//!
//! CONTRACT STUB: the types and signatures below are the interface the API
//! and the dashboard use; the bodies are being written (issue 3).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

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
    pub ended_at: Option<DateTime<Utc>>,
    pub ended_by: Option<String>,
    pub end_reason: Option<String>,
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
/// `Expired`, the reservation's own expiry (ended by `conversion`).
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

pub async fn get(
    _pool: &PgPool,
    _org_id: i64,
    _id: i64,
) -> Result<Option<Reservation>, sqlx::Error> {
    todo!("issue 3")
}

pub async fn events(_pool: &PgPool, _org_id: i64, _id: i64) -> Result<Vec<Event>, sqlx::Error> {
    todo!("issue 3")
}

/// Cancels a held reservation; `actor` is a staff email or a token name.
pub async fn cancel(
    _pool: &PgPool,
    _org_id: i64,
    _id: i64,
    _fence: i64,
    _actor: &str,
    _reason: &str,
) -> Result<Reservation, TransitionError> {
    todo!("issue 3")
}

/// Converts a held reservation into a service link in one transaction (R10).
pub async fn convert(
    _pool: &PgPool,
    _org_id: i64,
    _id: i64,
    _fence: i64,
    _actor: &str,
    _service_ref: &ServiceRef,
) -> Result<(Reservation, ServiceLink), TransitionError> {
    todo!("issue 3")
}
