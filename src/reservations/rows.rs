//! The rows of reservations, their events and service links as Rust
//! values, and the column lists every read of them selects.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Reservation {
    pub id: i64,
    #[serde(skip)]
    pub org_id: i64,
    pub order_ref: String,
    #[serde(skip)]
    pub machine_id: i64,
    #[schema(schema_with = state_schema)]
    pub state: String,
    pub fence: i64,
    /// the frozen account of why that machine was chosen (R8)
    pub reason: String,
    /// the hold this reservation was given
    #[schema(minimum = 1, maximum = 86400)]
    pub hold_seconds: i32,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
    /// a staff email, a token name, sweep, conversion or allocator
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
    // R8: the machine as it was when it was chosen (the `machine_snapshot`
    // column), not as it is now.
    #[sqlx(json)]
    pub machine: MachineSnapshot,
    /// how many machines its order holds (R13); 1 for an order of one
    #[schema(minimum = 1, maximum = 16)]
    pub quantity: i16,
    /// which machine of its order this is, from 1
    #[schema(minimum = 1, maximum = 16)]
    pub slot: i16,
}

/// The frozen attributes of the chosen machine (R8).
/// Every field defaults: a row written by other means (an import, a test)
/// still reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
#[schema(
    as = MachineRef,
    description = "the machine as it was when it was reserved (R8)"
)]
pub struct MachineSnapshot {
    #[schema(required = true)]
    pub asset_tag: String,
    #[schema(required = true)]
    pub site: String,
    #[schema(required = true)]
    pub vendor: String,
    #[schema(required = true)]
    pub profile: String,
    /// the machine's status when it was reserved (frozen, R8)
    #[schema(required = true, value_type = crate::domain::MachineStatus)]
    pub status: String,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
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

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(as = ReservationEvent)]
pub struct Event {
    pub id: i64,
    /// database clock (clock_timestamp())
    pub at: DateTime<Utc>,
    #[schema(schema_with = event_kind_schema)]
    pub kind: String,
    #[schema(schema_with = from_state_schema, required = true)]
    pub from_state: Option<String>,
    #[schema(schema_with = state_schema)]
    pub to_state: String,
    /// a token name, a staff email, sweep, allocator, conversion, cancellation or extension
    pub actor: String,
    #[schema(required = true)]
    pub detail: Option<String>,
    /// set when the sweep wrote it
    #[schema(required = true)]
    pub replica: Option<String>,
    /// the sweep lease's fence, when the sweep wrote it
    #[schema(required = true)]
    pub lease_fence: Option<i64>,
}

/// The states of a reservation, as the API publishes them (the column's
/// check).
pub fn state_schema() -> utoipa::openapi::schema::ObjectBuilder {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["held", "converted", "expired", "cancelled"]))
}

/// The kinds of a reservation event, as the API publishes them.
pub fn event_kind_schema() -> utoipa::openapi::schema::ObjectBuilder {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some([
            "created",
            "converted",
            "cancelled",
            "expired",
            "extended",
            "machine_replaced",
            "expiring",
        ]))
}

/// An event's `from_state`: every event but the first leaves `held`.
pub fn from_state_schema() -> utoipa::openapi::schema::ObjectBuilder {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .enum_values(Some([serde_json::json!("held"), serde_json::Value::Null]))
}

/// The columns of `Reservation`, for `SELECT`s and `RETURNING`s.
pub const RESERVATION_COLUMNS: &str = "id, org_id, order_ref, machine_id, state, fence, reason, hold_seconds, \
     created_at, expires_at, ended_at, ended_by, end_reason, machine_snapshot AS machine, quantity, slot";

pub(super) const LINK_COLUMNS: &str =
    "id, machine_id, reservation_id, service_ref, created_at, ended_at, ended_by";

/// A reservation read from a function's row whose columns may all be NULL
/// (no reservation): the columns of `Reservation`, each optional.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct MaybeReservation {
    pub(super) id: Option<i64>,
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
