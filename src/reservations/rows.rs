//! The rows of reservations, their events and service links as Rust
//! values, and the column lists every read of them selects.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::{EventKind, ReservationState};

/// A reservation: every column of `reservations` a reader uses, typed.
/// The one shape of a reservation read anywhere (the API, the pages, the
/// webhooks' reads, the answers of reserve and of the transitions, the
/// test fixtures): a new column is a field here, and `query_as!` points at
/// each read that must select it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Reservation {
    pub id: i64,
    #[serde(skip)]
    pub org_id: i64,
    pub order_ref: String,
    #[serde(skip)]
    pub machine_id: i64,
    #[schema(schema_with = state_schema)]
    pub state: ReservationState,
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
    #[sqlx(rename = "machine_snapshot")]
    pub machine: MachineSnapshot,
    /// how many machines its order holds (R13); 1 for an order of one
    #[schema(minimum = 1, maximum = 16)]
    pub quantity: i16,
    /// which machine of its order this is, from 1
    #[schema(minimum = 1, maximum = 16)]
    pub slot: i16,
    /// the segment the order named (R18), frozen with it; null: none
    #[schema(required = true)]
    pub segment: Option<String>,
    /// the end customer the order named (R19), frozen with it; null: none
    #[schema(required = true)]
    pub customer_ref: Option<String>,
    /// the profile the order asked for (R20); the machine's profile is the
    /// one that serves it
    pub profile_asked: String,
    /// whether a declared substitute of the asked profile serves the order (R20)
    pub substituted: bool,
}

impl Reservation {
    /// The reservation of a function's answer (`reserve_answer`,
    /// `transition_result`), selected as its columns: `None` when they are
    /// NULL (a refusal, no reservation).
    pub(crate) fn of_answer(
        row: &sqlx::postgres::PgRow,
    ) -> Result<Option<Reservation>, sqlx::Error> {
        use sqlx::{FromRow, Row};
        let id: Option<i64> = row.try_get("id")?;
        id.map(|_| Reservation::from_row(row)).transpose()
    }
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

// Read from its jsonb column as itself, so that a `Reservation` is read
// whole by `query_as!` and by `FromRow` alike.
impl sqlx::Type<sqlx::Postgres> for MachineSnapshot {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <sqlx::types::Json<MachineSnapshot> as sqlx::Type<sqlx::Postgres>>::type_info()
    }
    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <sqlx::types::Json<MachineSnapshot> as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for MachineSnapshot {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        <sqlx::types::Json<MachineSnapshot> as sqlx::Decode<sqlx::Postgres>>::decode(value)
            .map(|j| j.0)
    }
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
    pub kind: EventKind,
    #[schema(schema_with = from_state_schema, required = true)]
    pub from_state: Option<ReservationState>,
    #[schema(schema_with = state_schema)]
    pub to_state: ReservationState,
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

/// The columns of `Reservation`, in one place: a new field of the type is a
/// name here (a read that lacks it fails with the column's name in every
/// test that reads a reservation).
pub const RESERVATION_FIELDS: [&str; 20] = [
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
    "machine_snapshot",
    "quantity",
    "slot",
    "segment",
    "customer_ref",
    "profile_asked",
    "substituted",
];

/// Field `c` of `RESERVATION_FIELDS` of row `of`, for a `SELECT`. R20:
/// `profile_asked` is the asked profile whoever served (the column is NULL
/// when the asked profile served) and `substituted` whether it differs
/// from the machine's; both read the same from a row already read this
/// way (a subquery's), so they may be applied twice.
pub fn reservation_column(of: &str, c: &str) -> String {
    match c {
        "profile_asked" => format!(
            "coalesce({of}.profile_asked, {of}.machine_snapshot->>'profile', '') AS profile_asked"
        ),
        "substituted" => format!(
            "(coalesce({of}.profile_asked, {of}.machine_snapshot->>'profile', '') \
              <> coalesce({of}.machine_snapshot->>'profile', '')) AS substituted"
        ),
        c => format!("{of}.{c}"),
    }
}

/// The columns of `Reservation` of row `of` (a table alias, or a
/// composite such as `(x.reservation)`), for a `SELECT`. Named one by one,
/// never `of.*`: a statement kept prepared while a migration adds a column
/// would otherwise change its result type under a running replica.
pub fn reservation_columns(of: &str) -> String {
    RESERVATION_FIELDS
        .iter()
        .map(|c| reservation_column(of, c))
        .collect::<Vec<_>>()
        .join(", ")
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

pub(super) const LINK_COLUMNS: &str =
    "id, machine_id, reservation_id, service_ref, created_at, ended_at, ended_by";
