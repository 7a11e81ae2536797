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
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Reservation {
    pub id: i64,
    #[serde(skip)]
    pub org_id: i64,
    pub order_ref: String,
    #[serde(skip)]
    pub machine_id: i64,
    pub state: ReservationState,
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
    #[sqlx(rename = "machine_snapshot")]
    pub machine: MachineSnapshot,
    /// R13: how many machines its order holds, and which of them this is
    /// (1 of 1 for an order of one).
    pub quantity: i16,
    pub slot: i16,
    /// R18: the segment the order named, frozen with it. Staff see it; the
    /// API's answer shows what its document lists.
    #[serde(skip)]
    pub segment: Option<String>,
    /// R19: the end customer the order named, frozen with it.
    #[serde(skip)]
    pub customer_ref: Option<String>,
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
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct MachineSnapshot {
    pub asset_tag: String,
    pub site: String,
    pub vendor: String,
    pub profile: String,
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
    pub kind: EventKind,
    pub from_state: Option<ReservationState>,
    pub to_state: ReservationState,
    pub actor: String,
    pub detail: Option<String>,
    pub replica: Option<String>,
    pub lease_fence: Option<i64>,
}

/// The columns of `Reservation`, in one place: a new field of the type is a
/// name here (a read that lacks it fails with the column's name in every
/// test that reads a reservation).
pub const RESERVATION_FIELDS: [&str; 18] = [
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
];

/// The columns of `Reservation` of row `of` (a table alias, or a
/// composite such as `(x.reservation)`), for a `SELECT`. Named one by one,
/// never `of.*`: a statement kept prepared while a migration adds a column
/// would otherwise change its result type under a running replica.
pub fn reservation_columns(of: &str) -> String {
    RESERVATION_FIELDS
        .iter()
        .map(|c| format!("{of}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) const LINK_COLUMNS: &str =
    "id, machine_id, reservation_id, service_ref, created_at, ended_at, ended_by";
