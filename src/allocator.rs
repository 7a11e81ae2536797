//! The allocator (R3-R9): pass one explains every machine, pass two locks
//! one candidate at a time.
//!
//! CONTRACT STUB: the types and signatures below are the interface the API
//! and the dashboard use; the bodies are being written (issue 3).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::domain::{MachineStatus, Profile, Site, Vendor};
use crate::inventory::{Machine, MachineFilter};

/// What an order asks for.
#[derive(Debug, Clone)]
pub struct OrderSpec {
    pub site: Site,
    pub profile: Profile,
    pub vendor: Option<Vendor>,
}

/// Why a machine is not a candidate for a spec (pass one), in the order the
/// allocator checks them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Exclusion {
    WrongSite,
    WrongVendor,
    WrongProfile,
    NotReady {
        status: MachineStatus,
    },
    InService {
        service_ref: String,
    },
    Held {
        reservation_id: i64,
        until: DateTime<Utc>,
    },
}

impl Exclusion {
    /// The key of API.md's `excluded` counts: wrong_site, wrong_vendor,
    /// wrong_profile, not_ready, in_service, held.
    pub fn key(&self) -> &'static str {
        match self {
            Exclusion::WrongSite => "wrong_site",
            Exclusion::WrongVendor => "wrong_vendor",
            Exclusion::WrongProfile => "wrong_profile",
            Exclusion::NotReady { .. } => "not_ready",
            Exclusion::InService { .. } => "in_service",
            Exclusion::Held { .. } => "held",
        }
    }

    /// One plain sentence for staff.
    pub fn describe(&self) -> String {
        todo!("issue 3")
    }
}

/// A machine and the allocator's verdict on it: `None` means a candidate.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub machine: Machine,
    pub exclusion: Option<Exclusion>,
}

/// Pass one, callable on its own: the machines of `org_id` matching
/// `filter`, ordered by asset tag after `after`, at most `limit`, each with
/// its exclusion for `spec` (the same rules reserve applies).
pub async fn explain(
    _pool: &PgPool,
    _org_id: i64,
    _spec: &OrderSpec,
    _filter: &MachineFilter,
    _after: Option<&str>,
    _limit: i64,
) -> Result<Vec<Verdict>, sqlx::Error> {
    todo!("issue 3")
}

/// Pass two, callable on its own: of the candidates of pass one (at most the
/// walk's bound), which could be locked right now and which are locked by
/// someone else. Locks nothing beyond its own rolled-back transaction.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PassTwo {
    pub lockable: Vec<Machine>,
    pub locked_by_others: Vec<Machine>,
}

pub async fn lockable_now(
    _pool: &PgPool,
    _org_id: i64,
    _spec: &OrderSpec,
) -> Result<PassTwo, sqlx::Error> {
    todo!("issue 3")
}
