//! The allocator (R3-R9): pass one explains every machine, pass two locks
//! one candidate at a time.
//!
//! The rules run inside PostgreSQL, in the functions of
//! `sql/allocator.sql`, so that a reserve is one
//! statement (one round trip) instead of a dozen. Where each rule lives:
//!
//! - R3, lock one candidate at a time (`FOR UPDATE SKIP LOCKED` on its key),
//!   R4, the bound (25 scanned, 5 attempts for one machine; 24 + N and 4 + N
//!   for an order of N, see [`max_scanned`]; a locked candidate is skipped,
//!   not an attempt), R5, every insert attempt in a savepoint (a
//!   `BEGIN ... EXCEPTION` block), R6, the violated constraint told apart by
//!   its name (`GET STACKED DIAGNOSTICS ... CONSTRAINT_NAME`), R8, the frozen
//!   reason, and R11, an overdue holder (and the rest of its order) expired
//!   at the point of use: `reserve_walk_slots`.
//! - R13, all of an order's machines or none: `reserve_order_walk` runs the
//!   walk of an order of several in a savepoint of its own and rolls it back
//!   when it ends short; called alone by [`walk_candidates`].
//! - R7, the two passes and the two refusals (for N machines: `unavailable`
//!   when fewer than N match, `contended` when N match but fewer could be
//!   locked), R9, the idempotency key asked twice (for the whole order), and
//!   the turn that orders of several machines of one site and profile take:
//!   `reserve_order_request`, called by [`reserve_on`].
//! - R7's one definition of why a machine is or is not a candidate:
//!   `machine_verdicts`, a plain SQL function the planner inlines into every
//!   caller: the dashboard's explanation ([`explain`]), the counts
//!   ([`excluded_counts`]), the candidates (`machine_candidates`) and the
//!   re-check under the lock. The reasons staff see are the allocator's by
//!   construction.
//! - The API's token check folded into the same statement:
//!   `api_reserve_order_request` ([`reserve_for_token`]).
//!
//! This module turns the functions' rows into Rust values and keeps the
//! parts that only read (the explanation, pass two on its own for why-not).

use std::collections::BTreeMap;

use crate::db::Db;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgConnection, PgExecutor};
use tracing::Instrument;

use crate::domain::{
    CustomerRef, MachineStatus, OrderRef, ParseError, Profile, Segment, Site, SubstitutesMode,
    Vendor,
};
use crate::inventory::{Machine, MachineFilter};
use crate::reservations::{self, Reservation};
use crate::tokens::{CallerRefusal, CallerRow};

/// R4: at most this many candidates are scanned by one reserve.
pub const MAX_SCANNED: usize = 25;
/// R4: at most this many insert attempts (each a savepoint, R5) per reserve.
pub const MAX_ATTEMPTS: usize = 5;
/// What `contended` tells the caller to wait before retrying, in seconds.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// What an order asks for.
#[derive(Debug, Clone, Serialize)]
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

crate::domain::closed_set! {
    /// The key of an exclusion: the `excluded` counts of docs/api.md, the
    /// verdict `machine_verdicts` writes, the groups of Why not? and of
    /// lost demand; in the order the allocator checks them (R7), with the
    /// words staff read on every page.
    pub enum ExclusionKey("exclusion") {
        WrongSite = "wrong_site", "at another site";
        WrongVendor = "wrong_vendor", "other vendor";
        WrongProfile = "wrong_profile", "other profile";
        NotReady = "not_ready", "not ready";
        InService = "in_service", "in service";
        Held = "held", "held";
    }
}

impl Exclusion {
    /// The key of the `excluded` counts (docs/api.md).
    pub fn key(&self) -> ExclusionKey {
        match self {
            Exclusion::WrongSite => ExclusionKey::WrongSite,
            Exclusion::WrongVendor => ExclusionKey::WrongVendor,
            Exclusion::WrongProfile => ExclusionKey::WrongProfile,
            Exclusion::NotReady { .. } => ExclusionKey::NotReady,
            Exclusion::InService { .. } => ExclusionKey::InService,
            Exclusion::Held { .. } => ExclusionKey::Held,
        }
    }

    /// One plain sentence for staff.
    pub fn describe(&self) -> String {
        match self {
            Exclusion::WrongSite => "At another site than the one ordered.".to_owned(),
            Exclusion::WrongVendor => "From another vendor than the one ordered.".to_owned(),
            Exclusion::WrongProfile => "Another hardware profile than the one ordered.".to_owned(),
            Exclusion::NotReady { status } => format!("Not ready: its status is {status}."),
            Exclusion::InService { service_ref } => format!("In service: sold as {service_ref}."),
            Exclusion::Held {
                reservation_id,
                until,
            } => format!(
                "Held by reservation {reservation_id} until {}.",
                until.format("%Y-%m-%d %H:%M:%S UTC")
            ),
        }
    }
}

/// A machine and the allocator's verdict on it: `None` means a candidate.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub machine: Machine,
    pub exclusion: Option<Exclusion>,
}

/// R7, the one definition (the SQL function `machine_verdicts`): every
/// machine of org `$1` selected by `scope` (on alias `m`), with why it is
/// not a candidate for site `$2`, profile `$3` and vendor `$4` (NULL: any).
fn classified(scope: &str) -> String {
    format!(
        "SELECT m.id, m.asset_tag, m.site, m.vendor, m.profile, m.status, m.created_at, m.updated_at,
                m.exclusion, m.service_ref, m.held_by, m.held_until
           FROM machine_verdicts($1, $2, $3, $4::text) m
          WHERE {scope}"
    )
}

/// Pass one's candidate query (the SQL function `machine_candidates`): `$5`
/// candidates of the spec, in id order, on `machines_sellable_idx`.
pub fn candidate_query() -> String {
    "SELECT * FROM machine_candidates($1, $2, $3, $4::text, $5)".to_owned()
}

/// A row of `classified`.
#[derive(Debug, sqlx::FromRow)]
struct Classified {
    #[sqlx(flatten)]
    machine: Machine,
    exclusion: Option<ExclusionKey>,
    service_ref: Option<String>,
    held_by: Option<i64>,
    held_until: Option<DateTime<Utc>>,
}

impl Classified {
    fn exclusion(&self) -> Option<Exclusion> {
        Some(match self.exclusion? {
            ExclusionKey::WrongSite => Exclusion::WrongSite,
            ExclusionKey::WrongVendor => Exclusion::WrongVendor,
            ExclusionKey::WrongProfile => Exclusion::WrongProfile,
            // The schema's CHECK keeps status to the known values.
            ExclusionKey::NotReady => Exclusion::NotReady {
                status: MachineStatus::parse(&self.machine.status).unwrap_or(MachineStatus::Broken),
            },
            ExclusionKey::InService => Exclusion::InService {
                service_ref: self.service_ref.clone().unwrap_or_default(),
            },
            ExclusionKey::Held => Exclusion::Held {
                reservation_id: self.held_by.unwrap_or_default(),
                until: self.held_until.unwrap_or_default(),
            },
        })
    }
}

fn bind_spec<'q, O>(
    q: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    org_id: i64,
    spec: &'q OrderSpec,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    q.bind(org_id)
        .bind(spec.site.as_str())
        .bind(spec.profile.as_str())
        .bind(spec.vendor.as_ref().map(Vendor::as_str))
}

/// `explain`'s statement: `$1`-`$4` org, site, profile, vendor of the
/// spec, `$5`-`$8` the filter's columns, `$9` its state, `$10` after
/// (public for the plan test); the limit is written in.
pub fn explain_sql(filter: &MachineFilter, after: bool, limit: i64) -> String {
    // Each combination of filters is a statement of its own, planned once
    // (`inventory::optional_sql`, `inventory::limit_sql`).
    format!(
        "{} ORDER BY m.asset_tag {}",
        classified(&format!(
            "{} AND {} AND {}",
            crate::inventory::filter_columns_sql(filter, 5),
            crate::inventory::optional_sql(
                9,
                &format!("{} =", crate::inventory::pool_state_probe_sql()),
                filter.state.is_some()
            ),
            crate::inventory::optional_sql(10, "m.asset_tag >", after),
        )),
        crate::inventory::limit_sql(limit),
    )
}

/// Pass one, callable on its own: the machines of `org_id` matching
/// `filter`, ordered by asset tag after `after`, at most `limit`, each with
/// its exclusion for `spec` (the same rules reserve applies).
pub async fn explain(
    pool: &Db,
    org_id: i64,
    spec: &OrderSpec,
    filter: &MachineFilter,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<Verdict>, sqlx::Error> {
    let sql = explain_sql(filter, after.is_some(), limit);
    let rows: Vec<Classified> = bind_spec(sqlx::query_as(sqlx::AssertSqlSafe(sql)), org_id, spec)
        .bind(filter.site.as_ref().map(Site::as_str))
        .bind(filter.vendor.as_ref().map(Vendor::as_str))
        .bind(filter.profile.as_ref().map(Profile::as_str))
        .bind(filter.status.map(MachineStatus::as_str))
        .bind(filter.state.map(crate::inventory::PoolState::as_str))
        .bind(after)
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| Verdict {
            exclusion: row.exclusion(),
            machine: row.machine,
        })
        .collect())
}

/// Pass one's candidates for `spec`, at most `limit`, in id order.
async fn candidates(
    conn: &mut PgConnection,
    org_id: i64,
    spec: &OrderSpec,
    limit: usize,
) -> Result<Vec<Machine>, sqlx::Error> {
    let rows: Vec<Classified> = bind_spec(
        sqlx::query_as(sqlx::AssertSqlSafe(candidate_query())),
        org_id,
        spec,
    )
    .bind(limit as i64)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|r| r.machine).collect())
}

/// The `excluded` counts of docs/api.md: how many machines of the organization are
/// excluded for each reason, plus how many are candidates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(description = "machines of the organization excluded from the order, by reason")]
pub struct ExcludedCounts {
    #[schema(minimum = 0)]
    pub wrong_site: i64,
    #[schema(minimum = 0)]
    pub wrong_vendor: i64,
    #[schema(minimum = 0)]
    pub wrong_profile: i64,
    #[schema(minimum = 0)]
    pub not_ready: i64,
    #[schema(minimum = 0)]
    pub in_service: i64,
    #[schema(minimum = 0)]
    pub held: i64,
    #[serde(skip)]
    pub candidates: i64,
}

impl ExcludedCounts {
    /// The count of one key.
    pub fn get(&self, key: ExclusionKey) -> i64 {
        match key {
            ExclusionKey::WrongSite => self.wrong_site,
            ExclusionKey::WrongVendor => self.wrong_vendor,
            ExclusionKey::WrongProfile => self.wrong_profile,
            ExclusionKey::NotReady => self.not_ready,
            ExclusionKey::InService => self.in_service,
            ExclusionKey::Held => self.held,
        }
    }
}

/// Every machine of the organization, counted by verdict: R7's precedence
/// (`machine_verdicts`) over the figures kept per pool (`pool_machines`,
/// sql/pool_figures.sql), since a machine is of another site, vendor or
/// profile by its pool, and not ready or in service by its status and its
/// copy of the live link (sql/services.sql); held are the live holds on the
/// spec's ready machines not in service, few. One statement, one snapshot:
/// the counts grow with the pools, not the machines (counting every
/// machine's verdict took 539 ms at 400,000). `excluded_counts_plain_sql`
/// is the count machine by machine that the tests compare it with.
pub async fn excluded_counts(
    conn: &mut PgConnection,
    org_id: i64,
    spec: &OrderSpec,
) -> Result<ExcludedCounts, sqlx::Error> {
    type Seven = (i64, i64, i64, i64, i64, i64, i64);
    let (wrong_site, wrong_vendor, wrong_profile, not_ready, in_service, ready, held): Seven =
        bind_spec(sqlx::query_as(EXCLUDED_COUNTS_SQL), org_id, spec)
            .fetch_one(conn)
            .await?;
    Ok(ExcludedCounts {
        wrong_site,
        wrong_vendor,
        wrong_profile,
        not_ready,
        in_service,
        held,
        candidates: ready - held,
    })
}

/// `excluded_counts`' statement: `$1`-`$4` org, site, profile, vendor.
/// `ready` is the spec's ready machines not in service: candidates and
/// held. A hold past its deadline holds nothing (R11), as in R7.
pub const EXCLUDED_COUNTS_SQL: &str = "
    WITH f AS (
        SELECT f.*, f.site <> $2 AS site_off,
               $4::text IS NOT NULL AND f.vendor <> $4 AS vendor_off,
               f.profile <> $3 AS profile_off
          FROM pool_machines f WHERE f.org_id = $1)
    SELECT coalesce(sum(f.machines) FILTER (WHERE f.site_off), 0)::bigint,
           coalesce(sum(f.machines) FILTER (WHERE NOT f.site_off AND f.vendor_off), 0)::bigint,
           coalesce(sum(f.machines) FILTER (WHERE NOT f.site_off AND NOT f.vendor_off AND f.profile_off), 0)::bigint,
           coalesce(sum(f.machines) FILTER (WHERE NOT (f.site_off OR f.vendor_off OR f.profile_off)
                                              AND f.status <> 'ready'), 0)::bigint,
           coalesce(sum(f.machines) FILTER (WHERE NOT (f.site_off OR f.vendor_off OR f.profile_off)
                                              AND f.status = 'ready' AND f.in_service), 0)::bigint,
           coalesce(sum(f.machines) FILTER (WHERE NOT (f.site_off OR f.vendor_off OR f.profile_off)
                                              AND f.status = 'ready' AND NOT f.in_service), 0)::bigint,
           (SELECT count(*) FROM reservations r
              JOIN machines m ON m.id = r.machine_id
             WHERE r.org_id = $1 AND r.state = 'held' AND r.expires_at > clock_timestamp()
               AND m.org_id = $1 AND m.site = $2 AND m.profile = $3 AND ($4::text IS NULL OR m.vendor = $4)
               AND m.status = 'ready' AND NOT m.in_service)
      FROM f";

/// The counts of `excluded_counts` made machine by machine (R7's verdict of
/// every machine, grouped): what the tests compare the kept counts with.
pub fn excluded_counts_plain_sql() -> String {
    format!(
        "SELECT c.exclusion, count(*) FROM ({}) c GROUP BY c.exclusion",
        classified("true")
    )
}

/// Pass two, callable on its own: of the candidates of pass one (at most the
/// walk's bound for an order of `quantity`), which could be locked right now and which are locked by
/// someone else. Locks nothing beyond its own rolled-back transaction.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PassTwo {
    pub lockable: Vec<Machine>,
    pub locked_by_others: Vec<Machine>,
}

pub async fn lockable_now(
    pool: &Db,
    org_id: i64,
    spec: &OrderSpec,
    quantity: Quantity,
) -> Result<PassTwo, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let mut out = PassTwo::default();
    // R4 for an order of N: the walk of such an order looks this far.
    for machine in candidates(&mut tx, org_id, spec, max_scanned(quantity)).await? {
        // R3: one row, by its key; each lock is released at once (savepoint)
        // so that this look never holds more than one machine.
        let mut probe = tx.begin().await?;
        if lock_machine(&mut probe, machine.id).await? {
            out.lockable.push(machine);
        } else {
            out.locked_by_others.push(machine);
        }
        probe.rollback().await?;
    }
    tx.rollback().await?;
    Ok(out)
}

/// R3: locks one candidate by its key, skipping it if another transaction
/// holds it. The status is re-checked on the newest row version.
async fn lock_machine(conn: &mut PgConnection, machine_id: i64) -> Result<bool, sqlx::Error> {
    let locked: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM machines WHERE id = $1 AND status = 'ready' FOR UPDATE SKIP LOCKED",
    )
    .bind(machine_id)
    .fetch_optional(conn)
    .await?;
    Ok(locked.is_some())
}

/// A reservation's lifetime in seconds: 1 to 86400 (the schema's range).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct HoldSeconds(u32);

impl HoldSeconds {
    pub const MAX: i64 = 86_400;

    pub fn new(seconds: i64) -> Result<HoldSeconds, ParseError> {
        if (1..=Self::MAX).contains(&seconds) {
            Ok(HoldSeconds(seconds as u32))
        } else {
            Err(ParseError {
                what: "hold_seconds",
                problem: "must be a whole number of seconds from 1 to 86400".to_owned(),
            })
        }
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

/// How many machines an order asks for (R13): 1 to 16.
///
/// The bound keeps one reserve's savepoints (R5: at most 4 + N insert
/// attempts, plus one for the whole order) well under the 64 subtransactions
/// a backend caches, and the machine rows one transaction holds few; the
/// schema's `reservations_order_quantity_range` says the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Quantity(u8);

impl Quantity {
    pub const MAX: i64 = 16;
    pub const ONE: Quantity = Quantity(1);

    pub fn new(n: i64) -> Result<Quantity, ParseError> {
        if (1..=Self::MAX).contains(&n) {
            Ok(Quantity(n as u8))
        } else {
            Err(ParseError {
                what: "quantity",
                problem: format!("an order asks for 1 to {} machines, not {n}", Self::MAX),
            })
        }
    }

    pub fn get(self) -> u8 {
        self.0
    }
}

/// R4 for an order of N machines: at most 24 + N candidates scanned (the
/// slack of an order of one, 24 skipped or gone besides the one taken,
/// whatever N).
pub fn max_scanned(quantity: Quantity) -> usize {
    MAX_SCANNED - 1 + usize::from(quantity.get())
}

/// A reserve request: the one value the SQL functions receive (as jsonb,
/// read into the type `reserve_request` by `jsonb_populate_record`), so
/// that an optional field is a field here and an attribute there, never
/// another argument of a function. Serialized with the attributes' names.
#[derive(Debug, Clone, Serialize)]
pub struct ReserveRequest {
    pub order_ref: OrderRef,
    #[serde(flatten)]
    pub spec: OrderSpec,
    #[serde(rename = "hold_seconds")]
    pub hold: HoldSeconds,
    /// How many machines, all or none (R13).
    pub quantity: Quantity,
    /// Who asked: a token name or a staff email (the `created` event's
    /// actor); an argument of its own, not part of what is asked.
    #[serde(skip)]
    pub actor: String,
    /// R18: the segment the order belongs to (it may take that segment's
    /// headroom); none: an order of no segment.
    pub segment: Option<Segment>,
    /// R19: the end customer, whose live holds the organization may cap.
    pub customer_ref: Option<CustomerRef>,
    /// R20: whether the declared substitutes of the profile may serve.
    pub substitutes: SubstitutesMode,
}

/// What pass two did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WalkStats {
    /// Candidates of pass one looked at (at most `MAX_SCANNED`).
    pub scanned: usize,
    /// Candidates skipped because another transaction held their row lock.
    pub locked_by_others: usize,
    /// Candidates found no longer eligible once locked (in service, not ready).
    pub gone: usize,
    /// Insert attempts (savepoints); at most `MAX_ATTEMPTS`.
    pub attempts: usize,
}

/// R6/R9: what an order was first asked with, as stored with its first
/// reservation (its spec, as asked; its size, hold, segment and customer).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AskedWith {
    pub site: String,
    pub profile: String,
    pub vendor: Option<String>,
    pub quantity: i16,
    pub hold_seconds: i32,
    pub segment: Option<String>,
    pub customer_ref: Option<String>,
    /// R20: "allowed" or NULL (none).
    pub substitutes: Option<String>,
}

impl ReserveRequest {
    /// R6: the fields in which this request differs from the one that first
    /// used its `order_ref` (empty: the same request, a replay). The hold is
    /// compared as resolved (a default counts as asked).
    pub fn differs_from(&self, first: &AskedWith) -> Vec<&'static str> {
        let mut fields = Vec::new();
        let mut differ = |field: &'static str, same: bool| {
            if !same {
                fields.push(field);
            }
        };
        differ("site", self.spec.site.as_str() == first.site);
        differ("profile", self.spec.profile.as_str() == first.profile);
        differ(
            "vendor",
            self.spec.vendor.as_ref().map(Vendor::as_str) == first.vendor.as_deref(),
        );
        differ("quantity", i16::from(self.quantity.get()) == first.quantity);
        differ(
            "hold_seconds",
            i64::from(self.hold.get()) == i64::from(first.hold_seconds),
        );
        differ(
            "segment",
            self.segment.as_ref().map(Segment::as_str) == first.segment.as_deref(),
        );
        differ(
            "customer_ref",
            self.customer_ref.as_ref().map(CustomerRef::as_str) == first.customer_ref.as_deref(),
        );
        differ(
            "substitutes",
            self.substitutes.as_str() == first.substitutes.as_deref().unwrap_or("none"),
        );
        fields
    }
}

/// What order `order_ref` of `org_id` was first asked with; `None` when no
/// reservation carries it. Read only on a replay, never on a new order.
pub async fn asked_with(
    db: impl sqlx::PgExecutor<'_>,
    org_id: i64,
    order_ref: &str,
) -> Result<Option<AskedWith>, sqlx::Error> {
    sqlx::query_as(
        "SELECT r.spec->>'site' AS site, coalesce(r.profile_asked, r.spec->>'profile') AS profile,
                r.spec->>'vendor' AS vendor, r.quantity, r.hold_seconds, r.segment, r.customer_ref,
                r.spec->>'substitutes' AS substitutes
           FROM reservations r
          WHERE r.org_id = $1 AND r.order_ref = $2
          ORDER BY r.slot
          LIMIT 1",
    )
    .bind(org_id)
    .bind(order_ref)
    .fetch_optional(db)
    .await
}

#[derive(Debug, Clone)]
pub enum ReserveOutcome {
    /// A new order (201): `reservation` is its first machine (slot 1),
    /// `others` the rest of an order of several, in slot order.
    Created {
        reservation: Reservation,
        others: Vec<Reservation>,
        walk: WalkStats,
    },
    /// The order was already written, whatever its state (200): its first
    /// reservation and the others, as for `Created`.
    Existing {
        reservation: Reservation,
        others: Vec<Reservation>,
    },
    /// Something matched but someone was faster, or the walk hit its bound:
    /// retry in a moment (409 with Retry-After).
    Contended {
        walk: WalkStats,
        candidates: i64,
        org_id: i64,
        alternatives: Vec<Alternative>,
    },
    /// Nothing matches: buy hardware (409, no Retry-After).
    Unavailable {
        excluded: ExcludedCounts,
        org_id: i64,
        alternatives: Vec<Alternative>,
    },
    /// R18: enough machines match, but the sellable ones left are kept
    /// for other segments.
    Reserved {
        candidates: i64,
        kept: BTreeMap<String, i64>,
        org_id: i64,
        alternatives: Vec<Alternative>,
    },
    /// R19: the customer already holds `holds` machines of a cap of `limit`.
    CustomerLimit { limit: i64, holds: i64, org_id: i64 },
}

/// R17: another site whose pool could fill the same order now, or (R20) a
/// declared substitute at the same site that could.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Alternative {
    pub site: String,
    /// the profile that would serve: a substitute's at the same site (named first, in the declared order), else the one asked
    pub profile: String,
    #[schema(minimum = 0)]
    pub available: i64,
}

impl ReserveOutcome {
    /// The metric label of this outcome.
    pub fn label(&self) -> &'static str {
        match self {
            ReserveOutcome::Created { .. } => "created",
            ReserveOutcome::Existing { .. } => "existing",
            ReserveOutcome::Contended { .. } => "contended",
            ReserveOutcome::Unavailable { .. } => "unavailable",
            ReserveOutcome::Reserved { .. } => "reserved",
            ReserveOutcome::CustomerLimit { .. } => "customer_limit",
        }
    }

    /// The organization of a refusal (the caller's, read with its token).
    pub fn refused_org(&self) -> Option<i64> {
        match self {
            ReserveOutcome::Contended { org_id, .. }
            | ReserveOutcome::Unavailable { org_id, .. }
            | ReserveOutcome::Reserved { org_id, .. }
            | ReserveOutcome::CustomerLimit { org_id, .. } => Some(*org_id),
            ReserveOutcome::Created { .. } | ReserveOutcome::Existing { .. } => None,
        }
    }

    /// The organization and the alternatives of a refusal that carries
    /// them (R17): empty from the reserve, filled by `alternatives`.
    pub fn alternatives_mut(&mut self) -> Option<(i64, &mut Vec<Alternative>)> {
        match self {
            ReserveOutcome::Contended {
                org_id,
                alternatives,
                ..
            }
            | ReserveOutcome::Unavailable {
                org_id,
                alternatives,
                ..
            }
            | ReserveOutcome::Reserved {
                org_id,
                alternatives,
                ..
            } => Some((*org_id, alternatives)),
            _ => None,
        }
    }
}

/// R17 and R20: the declared substitutes at the same site that could fill
/// `req` now (in the declared order), then the other sites whose pool of
/// the same profile (and vendor) could, most available first. A statement
/// of its own, read after a refusal, so that the reserve's turns are not
/// held while the other pools are counted.
pub async fn alternatives(
    db: impl PgExecutor<'_>,
    org_id: i64,
    req: &ReserveRequest,
) -> Result<Vec<Alternative>, sqlx::Error> {
    let found: sqlx::types::Json<Vec<Alternative>> = sqlx::query_scalar(
        "SELECT alternatives_with_substitutes($1, $2, $3, $4::text, $5::text, $6)",
    )
    .bind(org_id)
    .bind(req.spec.site.as_str())
    .bind(req.spec.profile.as_str())
    .bind(req.spec.vendor.as_ref().map(Vendor::as_str))
    .bind(req.segment.as_ref().map(Segment::as_str))
    .bind(i32::from(req.quantity.get()))
    .fetch_one(db)
    .await?;
    Ok(found.0)
}

/// What the walk over a candidate list ended with: every reservation of
/// the order, in slot order, or nothing.
#[derive(Debug)]
pub enum Walked {
    Created(Vec<Reservation>),
    Existing(Vec<Reservation>),
    /// No insert succeeded; the caller decides between contended and unavailable.
    Nothing,
}

/// Reserves a machine for `req.order_ref` in `org_id` (R3-R9).
pub async fn reserve(
    pool: &Db,
    org_id: i64,
    req: &ReserveRequest,
) -> Result<ReserveOutcome, sqlx::Error> {
    reserve_on(pool, org_id, req).await
}

/// `reserve` on a given connection or transaction (tests run many of these
/// on separate connections): one statement, `reserve_order_request` (R7, R9, R13;
/// pass two in `reserve_walk_slots`). A statement outside a transaction
/// commits on its own (on the `Db`, pinned or not); inside the caller's, it
/// is part of it.
pub async fn reserve_on(
    db: impl PgExecutor<'_>,
    org_id: i64,
    req: &ReserveRequest,
) -> Result<ReserveOutcome, sqlx::Error> {
    let rows: Vec<ReserveRow> = sqlx::query_as(sqlx::AssertSqlSafe(RESERVE.as_str()))
        .bind(org_id)
        .bind(&req.actor)
        .bind(sqlx::types::Json(req))
        .fetch_all(db)
        .await?;
    ReserveRow::into_outcome(rows)
}

/// `POST /api/v1/reservations` in one statement (`api_reserve_order_request`): the token
/// (by its SHA-256), its scope and both module switches are checked in the
/// same statement as the reserve, so a revoked token is refused from the
/// very next request with no round trip of its own. `req.actor` is ignored:
/// the actor is the token's name.
pub async fn reserve_for_token(
    db: impl sqlx::PgExecutor<'_>,
    token_hash: &[u8],
    module_on: bool,
    req: &ReserveRequest,
) -> Result<Result<ReserveOutcome, CallerRefusal>, sqlx::Error> {
    // The statement is a child span of the request's; when that trace is
    // sampled, its traceparent is a comment before the statement, so that
    // it shows in pg_stat_activity and the PostgreSQL log. Such a statement
    // is not kept prepared (its text is unique); the others are.
    let span = tracing::info_span!(
        "db.statement",
        otel.kind = "client",
        db.system = "postgresql",
        db.operation = "api_reserve_order_request"
    );
    let rows: Vec<CallerRow<ReserveRow>> = async {
        let traced = crate::telemetry::sampled_traceparent();
        let sql = match &traced {
            Some(tp) => format!("/* traceparent='{tp}' */ {}", *API_RESERVE),
            None => API_RESERVE.clone(),
        };
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .persistent(traced.is_none())
            .bind(token_hash)
            .bind(module_on)
            .bind(sqlx::types::Json(req))
            .fetch_all(db)
            .await
    }
    .instrument(span)
    .await?;
    let caller = rows.first().map(|r| r.caller.clone()).ok_or_else(|| {
        sqlx::Error::Protocol("api_reserve_order_request answered no row".to_owned())
    })?;
    match CallerRefusal::parse(&caller)? {
        Some(refusal) => Ok(Err(refusal)),
        None => ReserveRow::into_outcome(rows.into_iter().map(|r| r.result).collect()).map(Ok),
    }
}

/// The columns of a `reserve_answer` `of` (an alias, or `(c.answer)`) as
/// `ReserveRow` reads them: the reservation's one by one
/// (`reservations::reservation_columns`).
fn answer_columns(of: &str) -> String {
    format!(
        "{of}.outcome, {of}.org_id AS answer_org_id, {of}.scanned, {of}.locked_by_others, {of}.gone, \
         {of}.attempts, {of}.candidates, {of}.excluded, {of}.alternatives, {}",
        reservations::reservation_columns(&format!("({of}.reservation)"))
    )
}

/// `reserve_on`'s statement: `$1` org, `$2` actor, `$3` the request.
static RESERVE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {} FROM reserve_order_request($1, $2, $3) x",
        answer_columns("x")
    )
});

/// `reserve_for_token`'s statement: `$1` the token's digest, `$2` the
/// deployment's module switch, `$3` the request.
static API_RESERVE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT c.caller, {} FROM api_reserve_order_request($1, $2, $3) c",
        answer_columns("(c.answer)")
    )
});

/// `walk_candidates`' statement: `$4` the candidates.
static WALK: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {} FROM reserve_order_walk($1, $2, jsonb_populate_record(NULL::reserve_request, $3), $4) x",
        answer_columns("x")
    )
});

/// A row of the SQL type `reserve_answer` (`answer_columns`): the
/// outcome, the walk's counters, a refusal's counts, and the reservation,
/// if any.
#[derive(Debug)]
struct ReserveRow {
    outcome: Option<String>,
    /// The organization, set on a refusal's row too (R17's alternatives).
    org_id: Option<i64>,
    reservation: Option<Reservation>,
    scanned: Option<i32>,
    locked_by_others: Option<i32>,
    gone: Option<i32>,
    attempts: Option<i32>,
    candidates: Option<i64>,
    excluded: Option<sqlx::types::Json<serde_json::Value>>,
    alternatives: Option<sqlx::types::Json<Vec<Alternative>>>,
}

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for ReserveRow {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        Ok(ReserveRow {
            outcome: row.try_get("outcome")?,
            org_id: row.try_get("answer_org_id")?,
            reservation: Reservation::of_answer(row)?,
            scanned: row.try_get("scanned")?,
            locked_by_others: row.try_get("locked_by_others")?,
            gone: row.try_get("gone")?,
            attempts: row.try_get("attempts")?,
            candidates: row.try_get("candidates")?,
            excluded: row.try_get("excluded")?,
            alternatives: row.try_get("alternatives")?,
        })
    }
}

impl ReserveRow {
    fn walk(&self) -> WalkStats {
        let n = |v: Option<i32>| v.unwrap_or(0).max(0) as usize;
        WalkStats {
            scanned: n(self.scanned),
            locked_by_others: n(self.locked_by_others),
            gone: n(self.gone),
            attempts: n(self.attempts),
        }
    }

    /// The rows of `reserve_walk_slots` / `reserve_order_walk`: one per
    /// reservation of the order ('created' or 'existing'), or one 'nothing'.
    fn walked(rows: Vec<ReserveRow>) -> Result<Walked, sqlx::Error> {
        let outcome = rows
            .first()
            .and_then(|r| r.outcome.clone())
            .unwrap_or_default();
        let reservations = || -> Result<Vec<Reservation>, sqlx::Error> {
            rows.into_iter()
                .map(|r| {
                    r.reservation.ok_or_else(|| {
                        sqlx::Error::Protocol(
                            "the walk answered a row without its reservation".to_owned(),
                        )
                    })
                })
                .collect()
        };
        Ok(match outcome.as_str() {
            "created" => Walked::Created(reservations()?),
            "existing" => Walked::Existing(reservations()?),
            "nothing" => Walked::Nothing,
            other => {
                return Err(sqlx::Error::Protocol(format!(
                    "the walk answered an unknown outcome {other:?}"
                )));
            }
        })
    }

    fn into_outcome(mut rows: Vec<ReserveRow>) -> Result<ReserveOutcome, sqlx::Error> {
        let Some(first) = rows.first_mut() else {
            return Err(sqlx::Error::Protocol(
                "reserve_order_request answered no row".to_owned(),
            ));
        };
        let walk = first.walk();
        let candidates = first.candidates.unwrap_or(0);
        let alternatives = first.alternatives.take().map(|j| j.0).unwrap_or_default();
        let org_id = first.org_id.unwrap_or(0);
        let excluded = first.excluded.take().map(|j| j.0).unwrap_or_default();
        let number = |key: &str| {
            excluded
                .get(key)
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(0)
        };
        Ok(match first.outcome.as_deref().unwrap_or_default() {
            "contended" => ReserveOutcome::Contended {
                walk,
                candidates,
                org_id,
                alternatives,
            },
            "unavailable" => {
                let mut counts: ExcludedCounts = serde_json::from_value(excluded.clone())
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
                counts.candidates = candidates;
                ReserveOutcome::Unavailable {
                    excluded: counts,
                    org_id,
                    alternatives,
                }
            }
            "reserved" => ReserveOutcome::Reserved {
                candidates,
                kept: excluded
                    .get("kept")
                    .and_then(|k| serde_json::from_value(k.clone()).ok())
                    .unwrap_or_default(),
                org_id,
                alternatives,
            },
            "customer_limit" => ReserveOutcome::CustomerLimit {
                limit: number("limit"),
                holds: number("holds"),
                org_id,
            },
            _ => match Self::walked(rows)? {
                Walked::Created(order) => {
                    let (reservation, others) = split_order(order)?;
                    ReserveOutcome::Created {
                        reservation,
                        others,
                        walk,
                    }
                }
                Walked::Existing(order) => {
                    let (reservation, others) = split_order(order)?;
                    ReserveOutcome::Existing {
                        reservation,
                        others,
                    }
                }
                Walked::Nothing => {
                    return Err(sqlx::Error::Protocol(
                        "reserve_order_request ended without an answer".to_owned(),
                    ));
                }
            },
        })
    }
}

/// An order's first reservation and the others.
fn split_order(order: Vec<Reservation>) -> Result<(Reservation, Vec<Reservation>), sqlx::Error> {
    let mut order = order.into_iter();
    let first = order
        .next()
        .ok_or_else(|| sqlx::Error::Protocol("an order without reservations".to_owned()))?;
    Ok((first, order.collect()))
}

/// Pass two over `candidates` (machine ids, in order), inside the caller's
/// open transaction (`reserve_order_walk`: lock one at a time, skip what
/// others hold, re-check what no constraint guards, try each insert in a
/// savepoint; all of the order's machines or none, R13). Public so that
/// tests can force a collision on a chosen list.
pub async fn walk_candidates(
    tx: &mut PgConnection,
    org_id: i64,
    req: &ReserveRequest,
    candidates: &[i64],
    walk: &mut WalkStats,
) -> Result<Walked, sqlx::Error> {
    let rows: Vec<ReserveRow> = sqlx::query_as(sqlx::AssertSqlSafe(WALK.as_str()))
        .bind(org_id)
        .bind(&req.actor)
        .bind(sqlx::types::Json(req))
        .bind(candidates)
        .fetch_all(tx)
        .await?;
    *walk = rows.first().map(ReserveRow::walk).unwrap_or_default();
    ReserveRow::walked(rows)
}
