//! The allocator (R3-R9): pass one explains every machine, pass two locks
//! one candidate at a time.
//!
//! Why a machine is or is not a candidate is written once, in SQL
//! (`classified`): the dashboard's explanation, the `unavailable` counts, the
//! candidate query of pass one and the re-check of pass two all read it, so
//! the reasons staff see are the allocator's by construction.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{Connection, PgConnection, PgPool};

use crate::domain::{MachineStatus, OrderRef, ParseError, Profile, Site, Vendor};
use crate::inventory::{Machine, MachineFilter};
use crate::reservations::{self, RESERVATION_COLUMNS, Reservation};

/// R4: at most this many candidates are scanned by one reserve.
pub const MAX_SCANNED: usize = 25;
/// R4: at most this many insert attempts (each a savepoint, R5) per reserve.
pub const MAX_ATTEMPTS: usize = 5;
/// What `contended` tells the caller to wait before retrying, in seconds.
pub const RETRY_AFTER_SECONDS: u32 = 1;
/// Who expires an overdue reservation found at the point of use (R11).
pub const ENDED_BY_ALLOCATOR: &str = "allocator";

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

    /// Every key, in the order the allocator checks them.
    pub const KEYS: [&'static str; 6] = [
        "wrong_site",
        "wrong_vendor",
        "wrong_profile",
        "not_ready",
        "in_service",
        "held",
    ];

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

/// R7, the one definition: every machine of org `$1` selected by `scope`,
/// with why it is not a candidate for site `$2`, profile `$3` and vendor
/// `$4` (NULL: any), checked in the order of `Exclusion`. An overdue held
/// reservation does not exclude (R11: it expires at the point of use).
///
/// The two lookups are single-row probes of the partial unique indexes
/// `service_links_one_live_per_machine` and
/// `reservations_one_holder_per_machine`: ended history is never read.
/// (`LIMIT 1` changes nothing, the indexes allow one row, but it keeps each
/// lookup a per-machine probe instead of a join the planner may turn into a
/// walk over every held reservation.)
fn classified(scope: &str) -> String {
    format!(
        "SELECT m.id, m.asset_tag, m.site, m.vendor, m.profile, m.status, m.created_at, m.updated_at,
                CASE WHEN m.site <> $2 THEN 'wrong_site'
                     WHEN $4::text IS NOT NULL AND m.vendor <> $4::text THEN 'wrong_vendor'
                     WHEN m.profile <> $3 THEN 'wrong_profile'
                     WHEN m.status <> 'ready' THEN 'not_ready'
                     WHEN live.service_ref IS NOT NULL THEN 'in_service'
                     WHEN hold.id IS NOT NULL THEN 'held'
                END AS exclusion,
                live.service_ref AS service_ref,
                hold.id AS held_by,
                hold.expires_at AS held_until
           FROM machines m
           LEFT JOIN LATERAL (
                SELECT s.service_ref FROM service_links s
                 WHERE s.machine_id = m.id AND s.ended_at IS NULL LIMIT 1) live ON true
           LEFT JOIN LATERAL (
                SELECT r.id, r.expires_at FROM reservations r
                 WHERE r.machine_id = m.id AND r.state = 'held'
                   AND r.expires_at > clock_timestamp() LIMIT 1) hold ON true
          WHERE m.org_id = $1 AND ({scope})"
    )
}

/// Pass one's candidate query: `$5` candidates of the spec, in id order.
///
/// The scope repeats what `exclusion IS NULL` implies (site, profile, vendor,
/// ready) only so that the planner walks `machines_candidates_idx`; the
/// verdict itself is `classified`'s.
pub fn candidate_query() -> String {
    format!(
        "SELECT c.* FROM ({}) c WHERE c.exclusion IS NULL ORDER BY c.id LIMIT $5",
        classified(
            "m.site = $2 AND m.profile = $3 AND ($4::text IS NULL OR m.vendor = $4::text) AND m.status = 'ready'"
        )
    )
}

/// A row of `classified`.
#[derive(Debug, sqlx::FromRow)]
struct Classified {
    #[sqlx(flatten)]
    machine: Machine,
    exclusion: Option<String>,
    service_ref: Option<String>,
    held_by: Option<i64>,
    held_until: Option<DateTime<Utc>>,
}

impl Classified {
    fn exclusion(&self) -> Option<Exclusion> {
        let kind = self.exclusion.as_deref()?;
        Some(match kind {
            "wrong_site" => Exclusion::WrongSite,
            "wrong_vendor" => Exclusion::WrongVendor,
            "wrong_profile" => Exclusion::WrongProfile,
            // The schema's CHECK keeps status to the known values.
            "not_ready" => Exclusion::NotReady {
                status: MachineStatus::parse(&self.machine.status).unwrap_or(MachineStatus::Broken),
            },
            "in_service" => Exclusion::InService {
                service_ref: self.service_ref.clone().unwrap_or_default(),
            },
            _ => Exclusion::Held {
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

/// Pass one, callable on its own: the machines of `org_id` matching
/// `filter`, ordered by asset tag after `after`, at most `limit`, each with
/// its exclusion for `spec` (the same rules reserve applies).
pub async fn explain(
    pool: &PgPool,
    org_id: i64,
    spec: &OrderSpec,
    filter: &MachineFilter,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<Verdict>, sqlx::Error> {
    let sql = format!(
        "{} ORDER BY m.asset_tag LIMIT $10",
        classified(
            "($5::text IS NULL OR m.site = $5::text) AND ($6::text IS NULL OR m.vendor = $6::text)
             AND ($7::text IS NULL OR m.profile = $7::text) AND ($8::text IS NULL OR m.status = $8::text)
             AND ($9::text IS NULL OR m.asset_tag > $9::text)"
        )
    );
    let rows: Vec<Classified> = bind_spec(sqlx::query_as(sqlx::AssertSqlSafe(sql)), org_id, spec)
        .bind(filter.site.as_ref().map(Site::as_str))
        .bind(filter.vendor.as_ref().map(Vendor::as_str))
        .bind(filter.profile.as_ref().map(Profile::as_str))
        .bind(filter.status.map(MachineStatus::as_str))
        .bind(after)
        .bind(limit)
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

/// The verdict on one machine, read now (a fresh READ COMMITTED snapshot).
async fn classify_one(
    conn: &mut PgConnection,
    org_id: i64,
    spec: &OrderSpec,
    machine_id: i64,
) -> Result<Option<(Machine, Option<Exclusion>)>, sqlx::Error> {
    let row: Option<Classified> = bind_spec(
        sqlx::query_as(sqlx::AssertSqlSafe(classified("m.id = $5"))),
        org_id,
        spec,
    )
    .bind(machine_id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|r| {
        let exclusion = r.exclusion();
        (r.machine, exclusion)
    }))
}

/// API.md's `excluded` counts: how many machines of the organization are
/// excluded for each reason, plus how many are candidates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExcludedCounts {
    pub wrong_site: i64,
    pub wrong_vendor: i64,
    pub wrong_profile: i64,
    pub not_ready: i64,
    pub in_service: i64,
    pub held: i64,
    #[serde(skip)]
    pub candidates: i64,
}

/// Every machine of the organization, counted by verdict.
pub async fn excluded_counts(
    conn: &mut PgConnection,
    org_id: i64,
    spec: &OrderSpec,
) -> Result<ExcludedCounts, sqlx::Error> {
    let sql = format!(
        "SELECT c.exclusion, count(*) FROM ({}) c GROUP BY c.exclusion",
        classified("true")
    );
    let rows: Vec<(Option<String>, i64)> =
        bind_spec(sqlx::query_as(sqlx::AssertSqlSafe(sql)), org_id, spec)
            .fetch_all(conn)
            .await?;
    let by_kind: BTreeMap<Option<String>, i64> = rows.into_iter().collect();
    let n = |k: &str| by_kind.get(&Some(k.to_owned())).copied().unwrap_or(0);
    Ok(ExcludedCounts {
        wrong_site: n("wrong_site"),
        wrong_vendor: n("wrong_vendor"),
        wrong_profile: n("wrong_profile"),
        not_ready: n("not_ready"),
        in_service: n("in_service"),
        held: n("held"),
        candidates: by_kind.get(&None).copied().unwrap_or(0),
    })
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
    pool: &PgPool,
    org_id: i64,
    spec: &OrderSpec,
) -> Result<PassTwo, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let mut out = PassTwo::default();
    for machine in candidates(&mut tx, org_id, spec, MAX_SCANNED).await? {
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// A reserve request.
#[derive(Debug, Clone)]
pub struct ReserveRequest {
    pub order_ref: OrderRef,
    pub spec: OrderSpec,
    pub hold: HoldSeconds,
    /// Who asked: a token name or a staff email (the `created` event's actor).
    pub actor: String,
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

#[derive(Debug, Clone)]
pub enum ReserveOutcome {
    /// A new reservation (201).
    Created {
        reservation: Reservation,
        walk: WalkStats,
    },
    /// The order already had this reservation, whatever its state (200).
    Existing(Reservation),
    /// Something matched but someone was faster, or the walk hit its bound:
    /// retry in a moment (409 with Retry-After).
    Contended { walk: WalkStats, candidates: i64 },
    /// Nothing matches: buy hardware (409, no Retry-After).
    Unavailable { excluded: ExcludedCounts },
}

impl ReserveOutcome {
    /// The metric label of this outcome.
    pub fn label(&self) -> &'static str {
        match self {
            ReserveOutcome::Created { .. } => "created",
            ReserveOutcome::Existing(_) => "existing",
            ReserveOutcome::Contended { .. } => "contended",
            ReserveOutcome::Unavailable { .. } => "unavailable",
        }
    }
}

/// What the walk over a candidate list ended with.
#[derive(Debug)]
pub enum Walked {
    Created(Reservation),
    Existing(Reservation),
    /// No insert succeeded; the caller decides between contended and unavailable.
    Nothing,
}

/// Reserves a machine for `req.order_ref` in `org_id` (R3-R9).
pub async fn reserve(
    pool: &PgPool,
    org_id: i64,
    req: &ReserveRequest,
) -> Result<ReserveOutcome, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    reserve_on(&mut conn, org_id, req).await
}

/// `reserve` on a given connection (tests run many of these on separate
/// connections).
pub async fn reserve_on(
    conn: &mut PgConnection,
    org_id: i64,
    req: &ReserveRequest,
) -> Result<ReserveOutcome, sqlx::Error> {
    let mut tx = conn.begin().await?;
    // R9, first ask: a replay gets its reservation back.
    if let Some(existing) =
        reservations::by_order_ref(&mut tx, org_id, req.order_ref.as_str()).await?
    {
        tx.commit().await?;
        return Ok(ReserveOutcome::Existing(existing));
    }
    // R7, pass one: the candidates (the walk never looks beyond MAX_SCANNED).
    let list = candidates(&mut tx, org_id, &req.spec, MAX_SCANNED).await?;
    let mut walk = WalkStats::default();
    if !list.is_empty() {
        let ids: Vec<i64> = list.iter().map(|m| m.id).collect();
        match walk_candidates(&mut tx, org_id, req, &ids, &mut walk).await? {
            Walked::Created(reservation) => {
                tx.commit().await?;
                return Ok(ReserveOutcome::Created { reservation, walk });
            }
            Walked::Existing(existing) => {
                tx.commit().await?;
                return Ok(ReserveOutcome::Existing(existing));
            }
            Walked::Nothing => {}
        }
    }
    // R9, second ask, right before refusing: a neighbour with the same key
    // may have committed since the first (each statement sees a fresh snapshot).
    if let Some(existing) =
        reservations::by_order_ref(&mut tx, org_id, req.order_ref.as_str()).await?
    {
        tx.commit().await?;
        return Ok(ReserveOutcome::Existing(existing));
    }
    // R7: "someone was faster" and "nothing available" are two answers. The
    // counts are read now, so a machine that a neighbour just took counts as
    // held, and a candidate still being fought over makes it `contended`.
    let excluded = excluded_counts(&mut tx, org_id, &req.spec).await?;
    // Issue 15: the refusal is recorded in the transaction that read it.
    let outcome_kind = crate::demand::RefusalReason::of(&excluded);
    crate::demand::record_refusal_on(&mut tx, org_id, &req.spec, &outcome_kind, &excluded).await?;
    tx.commit().await?;
    if excluded.candidates == 0 {
        Ok(ReserveOutcome::Unavailable { excluded })
    } else {
        Ok(ReserveOutcome::Contended {
            walk,
            candidates: excluded.candidates,
        })
    }
}

/// Pass two over `candidates` (machine ids, in order), inside the caller's
/// open transaction: lock one at a time, skip what others hold, re-check
/// what no constraint guards, and try the insert in a savepoint. Public so
/// that tests can force a collision on a chosen list.
pub async fn walk_candidates(
    tx: &mut PgConnection,
    org_id: i64,
    req: &ReserveRequest,
    candidates: &[i64],
    walk: &mut WalkStats,
) -> Result<Walked, sqlx::Error> {
    let total = candidates.len();
    for (position, &machine_id) in candidates.iter().take(MAX_SCANNED).enumerate() {
        if walk.attempts >= MAX_ATTEMPTS {
            break;
        }
        walk.scanned += 1;
        // R3/R4: locked by someone else is skipped, not an attempt.
        if !lock_machine(tx, machine_id).await? {
            walk.locked_by_others += 1;
            continue;
        }
        // With the row lock held, a fresh statement sees every conversion
        // that committed before we got it, and none can start until we end
        // (convert locks the machine first). A live service link has no
        // constraint against a held reservation: this check is its guard
        // (R10). `held` is left to the arbiter index (R1): a holder that
        // committed since pass one costs an attempt, never a second holder.
        let Some((machine, exclusion)) = classify_one(tx, org_id, &req.spec, machine_id).await?
        else {
            walk.gone += 1;
            continue;
        };
        if matches!(&exclusion, Some(e) if !matches!(e, Exclusion::Held { .. })) {
            walk.gone += 1;
            continue;
        }
        walk.attempts += 1;
        // R5: a unique violation aborts the transaction; inside a savepoint
        // only the savepoint is lost.
        let mut attempt = tx.begin().await?;
        match try_insert(&mut attempt, org_id, req, &machine, position, total, walk).await {
            Ok(reservation) => {
                attempt.commit().await?;
                return Ok(Walked::Created(reservation));
            }
            Err(e) => {
                let constraint = crate::db::violated_unique(&e).map(str::to_owned);
                attempt.rollback().await?;
                match constraint.as_deref() {
                    // R6: this machine is taken: next candidate.
                    Some("reservations_one_holder_per_machine") => continue,
                    // R6: this order already has a reservation: here it is.
                    Some("reservations_order_ref_unique_per_org") => {
                        return match reservations::by_order_ref(tx, org_id, req.order_ref.as_str())
                            .await?
                        {
                            Some(existing) => Ok(Walked::Existing(existing)),
                            None => Err(e),
                        };
                    }
                    _ => return Err(e),
                }
            }
        }
    }
    Ok(Walked::Nothing)
}

/// One insert attempt on a locked machine: expire an overdue holder at the
/// point of use (R11), then insert the reservation with its frozen reason
/// (R8) and its `created` event.
async fn try_insert(
    conn: &mut PgConnection,
    org_id: i64,
    req: &ReserveRequest,
    machine: &Machine,
    position: usize,
    total: usize,
    walk: &WalkStats,
) -> Result<Reservation, sqlx::Error> {
    let detail = format!(
        "its deadline had passed; expired at the point of use by order {}",
        req.order_ref
    );
    let expired =
        reservations::expire_overdue_on_machine(conn, machine.id, ENDED_BY_ALLOCATOR, &detail)
            .await?;
    let reason = frozen_reason(req, machine, position, total, walk, expired);
    let spec = serde_json::json!({
        "site": req.spec.site.as_str(),
        "profile": req.spec.profile.as_str(),
        "vendor": req.spec.vendor.as_ref().map(Vendor::as_str),
        "hold_seconds": req.hold.get(),
    });
    // Created and expires_at come from one reading of the database's clock.
    let sql = format!(
        "WITH t AS (SELECT clock_timestamp() AS at)
         INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason,
                                   hold_seconds, created_at, expires_at)
         SELECT $1, $2, m.id, $3,
                jsonb_build_object('asset_tag', m.asset_tag, 'site', m.site, 'vendor', m.vendor,
                                   'profile', m.profile, 'status', m.status, 'updated_at', m.updated_at),
                $4, $5, t.at, t.at + make_interval(secs => $5)
           FROM machines m, t
          WHERE m.id = $6 AND m.org_id = $1
         RETURNING {RESERVATION_COLUMNS}"
    );
    let reservation: Reservation = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(req.order_ref.as_str())
        .bind(sqlx::types::Json(spec))
        .bind(&reason)
        .bind(req.hold.get() as i32)
        .bind(machine.id)
        .fetch_one(&mut *conn)
        .await?;
    reservations::record_event(
        conn,
        reservation.id,
        "created",
        None,
        "held",
        &req.actor,
        Some(&format!("order {} on {}", req.order_ref, machine.asset_tag)),
    )
    .await?;
    Ok(reservation)
}

/// R8: why this machine, in words that stay true after it changes.
fn frozen_reason(
    req: &ReserveRequest,
    machine: &Machine,
    position: usize,
    total: usize,
    walk: &WalkStats,
    expired: Option<i64>,
) -> String {
    let vendor = match &req.spec.vendor {
        Some(v) => format!("vendor {v}"),
        None => "any vendor".to_owned(),
    };
    let mut reason = format!(
        "{} ({}, {}, {}, {}) matched site {}, profile {}, {vendor}: candidate {} of {total} in pass one",
        machine.asset_tag,
        machine.site,
        machine.vendor,
        machine.profile,
        machine.status,
        req.spec.site,
        req.spec.profile,
        position + 1,
    );
    if walk.locked_by_others > 0 || walk.attempts > 1 || walk.gone > 0 {
        reason.push_str(&format!(
            "; before it, {} locked by other orders, {} taken by a faster order, {} no longer eligible",
            walk.locked_by_others,
            walk.attempts.saturating_sub(1),
            walk.gone
        ));
    }
    if let Some(id) = expired {
        reason.push_str(&format!(
            "; its previous reservation {id} was overdue and expired at the point of use"
        ));
    }
    reason.push_str(&format!("; held for {} s", req.hold.get()));
    reason
}
