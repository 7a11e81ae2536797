//! `/machines`: the pool, filtered, keyset-paginated by asset tag; with an
//! order spec, each machine's verdict comes from `allocator::explain` (the
//! allocator's own rules, not a copy). `/machines/{asset_tag}`: one
//! machine's reservations and services over time.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use futures_util::TryFutureExt;
use serde::Deserialize;

use super::csv;
use super::error::DashError;
use super::session::Staff;
use super::view::{
    Chrome, Select, fmt_opt_time, fmt_remaining, fmt_time, non_blank, page, url_with,
};
use crate::allocator::{self, OrderSpec};
use crate::domain::{MachineStatus, Profile, Segment, Site, Vendor};
use crate::inventory::{self, Facets, MachineFilter, PoolState, PooledMachine};

pub const PAGE_SIZE: i64 = 100;

#[derive(Debug, Default, Deserialize)]
pub struct MachinesQuery {
    pub site: Option<String>,
    pub vendor: Option<String>,
    pub profile: Option<String>,
    pub status: Option<String>,
    /// `inventory::PoolState` key: sellable, held, sold, not_ready.
    pub state: Option<String>,
    pub spec_site: Option<String>,
    pub spec_profile: Option<String>,
    pub spec_vendor: Option<String>,
    /// R18: the segment of the order checked (empty: none).
    pub spec_segment: Option<String>,
    /// R20: "allowed" also says which pool would serve the order when its
    /// declared substitutes may.
    pub spec_substitutes: Option<String>,
    pub after: Option<String>,
}

fn parse_opt<T>(
    v: &Option<String>,
    parse: impl Fn(&str) -> Result<T, crate::domain::ParseError>,
) -> Result<Option<T>, DashError> {
    non_blank(v)
        .map(parse)
        .transpose()
        .map_err(|e| DashError::bad_request(e.to_string()))
}

pub fn parse_filter(q: &MachinesQuery) -> Result<MachineFilter, DashError> {
    Ok(MachineFilter {
        site: parse_opt(&q.site, Site::parse)?,
        vendor: parse_opt(&q.vendor, Vendor::parse)?,
        profile: parse_opt(&q.profile, Profile::parse)?,
        status: parse_opt(&q.status, MachineStatus::parse)?,
        state: parse_opt(&q.state, PoolState::parse)?,
    })
}

/// An order spec needs a site and a profile; the vendor is optional.
pub fn parse_spec(
    site: &Option<String>,
    profile: &Option<String>,
    vendor: &Option<String>,
) -> Result<Option<OrderSpec>, DashError> {
    let site = parse_opt(site, Site::parse)?;
    let profile = parse_opt(profile, Profile::parse)?;
    let vendor = parse_opt(vendor, Vendor::parse)?;
    match (site, profile) {
        (Some(site), Some(profile)) => Ok(Some(OrderSpec {
            site,
            profile,
            vendor,
        })),
        (None, None) if vendor.is_none() => Ok(None),
        _ => Err(DashError::bad_request(
            "An order spec needs both a site and a profile (the vendor is optional).",
        )),
    }
}

pub struct MachineView {
    pub asset_tag: String,
    pub site: String,
    pub vendor: String,
    pub profile: String,
    pub status: String,
    /// With a spec: `Some(None)` is a candidate, `Some(Some(reason))` is not.
    pub verdict: Option<Option<VerdictView>>,
    /// What it is doing in the pool; `None` where the page does not say
    /// (why-not's lists).
    pub pool: Option<PoolView>,
}

/// A machine's `PoolState` as the list shows it.
pub struct PoolView {
    pub key: &'static str,
    pub label: &'static str,
    /// Held: the reservation, its order, the time left in words.
    pub held_by: Option<i64>,
    pub held_for: String,
    pub remaining: i64,
    pub remaining_text: String,
    pub overdue: bool,
    /// Sold: the service and the reservation it came from.
    pub service_ref: String,
    pub sold_by: Option<i64>,
}

impl PoolView {
    pub fn of(p: &PooledMachine) -> PoolView {
        let state = PoolState::parse(&p.pool_state).unwrap_or(PoolState::NotReady);
        let remaining = p.remaining.unwrap_or(0);
        PoolView {
            key: state.as_str(),
            label: state.label(),
            held_by: p.held_by,
            held_for: p.held_for.clone().unwrap_or_default(),
            remaining: remaining.max(0),
            remaining_text: fmt_remaining(remaining),
            overdue: p.held_by.is_some() && remaining <= 0,
            service_ref: p.service_ref.clone().unwrap_or_default(),
            sold_by: p.sold_by,
        }
    }
}

pub struct VerdictView {
    pub key: &'static str,
    /// The reason in words (`reasons::label`), the same on every page;
    /// R18's names the segments (`kept for enterprise`).
    pub label: String,
    pub reason: String,
}

impl VerdictView {
    pub fn of(e: crate::allocator::Exclusion) -> VerdictView {
        VerdictView {
            key: e.key().as_str(),
            label: e.key().words().to_owned(),
            reason: e.describe(),
        }
    }
}

/// The optional segment of an order checked on a page (R18).
pub fn parse_segment(v: &Option<String>) -> Result<Option<Segment>, DashError> {
    parse_opt(v, Segment::parse)
}

/// R18 for an order checked against its pool: the headroom the pool (site,
/// profile) keeps for segments other than the order's, and what the order
/// could take now, read from `capacity_pools` (sql/capacity.sql), the same
/// numbers the capacity API gives and the rule a reserve applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptForOthers {
    /// (segment, machines), by segment; never the order's own.
    pub segments: Vec<(String, i64)>,
    /// What an order of this segment (and vendor) could take now.
    pub available: i64,
    /// The sellable machines the order matches.
    pub sellable: i64,
}

impl KeptForOthers {
    /// "enterprise", "enterprise and repairs", "a, b and c".
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.segments.iter().map(|(s, _)| s.as_str()).collect();
        match names.split_last() {
            None => String::new(),
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        }
    }

    /// The sellable machines left do not exceed what is kept for others:
    /// none of them is this order's to take.
    pub fn takes_every_candidate(&self) -> bool {
        !self.segments.is_empty() && self.available == 0
    }

    /// The verdict of a machine the allocator would offer but headroom keeps.
    pub fn verdict(&self) -> VerdictView {
        let kept: i64 = self.segments.iter().map(|(_, n)| n).sum();
        VerdictView {
            key: "reserved",
            label: format!("kept for {}", self.names()),
            reason: format!(
                "R18: this pool keeps {kept} sellable machine{} for {} and has {} left that this order \
                 matches, so an order outside {} cannot take one; an order of {} can.",
                if kept == 1 { "" } else { "s" },
                self.names(),
                self.sellable,
                if self.segments.len() == 1 {
                    "that segment"
                } else {
                    "those segments"
                },
                if self.segments.len() == 1 {
                    "it"
                } else {
                    "one of them"
                },
            ),
        }
    }

    /// Marks the candidates of `spec`'s pool among `views` as kept, when the
    /// headroom keeps every one of them.
    pub fn apply(&self, spec: &OrderSpec, views: &mut [MachineView]) {
        if !self.takes_every_candidate() {
            return;
        }
        for v in views {
            if matches!(v.verdict, Some(None))
                && v.site == spec.site.as_str()
                && v.profile == spec.profile.as_str()
            {
                v.verdict = Some(Some(self.verdict()));
            }
        }
    }
}

/// `capacity_pools`' `reserved`: machines kept per segment.
pub type KeptJson = sqlx::types::Json<std::collections::BTreeMap<String, i64>>;

/// The headroom `spec`'s pool keeps for segments other than `segment`;
/// `None` when it keeps none for others.
pub async fn kept_for_others(
    pool: &Db,
    org_id: i64,
    spec: &OrderSpec,
    segment: Option<&Segment>,
) -> Result<Option<KeptForOthers>, sqlx::Error> {
    // Most pools keep nothing: one probe of the headroom table's key, and
    // the pool is not counted at all (the page's cost without headroom).
    let keeps: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM headroom
                         WHERE org_id = $1 AND site = $2 AND profile = $3 AND segment IS DISTINCT FROM $4)",
    )
    .bind(org_id)
    .bind(spec.site.as_str())
    .bind(spec.profile.as_str())
    .bind(segment.map(Segment::as_str))
    .fetch_one(pool)
    .await?;
    if !keeps {
        return Ok(None);
    }
    let row: Option<(KeptJson, i64, i64)> = sqlx::query_as(
        "SELECT reserved, available, sellable FROM capacity_pools($1, $2, $3, $4, $5)",
    )
    .bind(org_id)
    .bind(spec.site.as_str())
    .bind(spec.profile.as_str())
    .bind(spec.vendor.as_ref().map(Vendor::as_str))
    .bind(segment.map(Segment::as_str))
    .fetch_optional(pool)
    .await?;
    let Some((reserved, available, sellable)) = row else {
        return Ok(None);
    };
    let own = segment.map(Segment::as_str);
    let segments: Vec<(String, i64)> = reserved
        .0
        .into_iter()
        .filter(|(s, _)| Some(s.as_str()) != own)
        .collect();
    Ok((!segments.is_empty()).then_some(KeptForOthers {
        segments,
        available,
        sellable,
    }))
}

impl MachineView {
    pub fn of_verdict(v: crate::allocator::Verdict) -> MachineView {
        MachineView {
            verdict: Some(v.exclusion.map(VerdictView::of)),
            asset_tag: v.machine.asset_tag,
            site: v.machine.site,
            vendor: v.machine.vendor,
            profile: v.machine.profile,
            status: v.machine.status,
            pool: None,
        }
    }

    fn of_pooled(p: PooledMachine) -> MachineView {
        MachineView {
            pool: Some(PoolView::of(&p)),
            asset_tag: p.machine.asset_tag,
            site: p.machine.site,
            vendor: p.machine.vendor,
            profile: p.machine.profile,
            status: p.machine.status,
            verdict: None,
        }
    }
}

/// One count above the table: a state, its number, the link that filters on it.
pub struct StateCount {
    pub key: &'static str,
    pub label: &'static str,
    pub count: i64,
    pub link: String,
    pub current: bool,
}

#[derive(Template)]
#[template(path = "machines.html")]
struct MachinesPage {
    chrome: Chrome,
    filters: Vec<Select>,
    spec_filters: Vec<Select>,
    /// The order's segment as typed (R18).
    spec_segment: String,
    filtered: bool,
    states: Vec<StateCount>,
    has_spec: bool,
    machines: Vec<MachineView>,
    next: Option<String>,
    first: Option<String>,
    csv: String,
    can_act: bool,
    /// R20: the order checked with substitutes allowed.
    spec_substitutes: bool,
    /// R20: with substitutes, which pool would serve the order, in words.
    substitutes_note: Option<String>,
}

/// What a request asks of the list: the filter, the order it is checked
/// against (if any), and the query pairs that say so in a link.
struct Asked {
    filter: MachineFilter,
    spec: Option<OrderSpec>,
    segment: Option<Segment>,
}

fn asked(q: &MachinesQuery) -> Result<Asked, DashError> {
    let filter = parse_filter(q)?;
    // The order spec has its own fields, so that machines of other sites,
    // vendors and profiles can be shown with their reasons; without them, a
    // filter naming a site and a profile is taken as the order.
    let spec = match parse_spec(&q.spec_site, &q.spec_profile, &q.spec_vendor)? {
        Some(spec) => Some(spec),
        None => filter
            .site
            .clone()
            .zip(filter.profile.clone())
            .map(|(site, profile)| OrderSpec {
                site,
                profile,
                vendor: filter.vendor.clone(),
            }),
    };
    Ok(Asked {
        filter,
        spec,
        segment: parse_segment(&q.spec_segment)?,
    })
}

/// `path?filters...` with `state` and `after` as given.
fn link(path: &str, q: &MachinesQuery, state: &str, after: &str) -> String {
    url_with(
        path,
        &[
            ("site", non_blank(&q.site).unwrap_or("")),
            ("vendor", non_blank(&q.vendor).unwrap_or("")),
            ("profile", non_blank(&q.profile).unwrap_or("")),
            ("status", non_blank(&q.status).unwrap_or("")),
            ("state", state),
            ("spec_site", non_blank(&q.spec_site).unwrap_or("")),
            ("spec_profile", non_blank(&q.spec_profile).unwrap_or("")),
            ("spec_vendor", non_blank(&q.spec_vendor).unwrap_or("")),
            ("spec_segment", non_blank(&q.spec_segment).unwrap_or("")),
            (
                "spec_substitutes",
                non_blank(&q.spec_substitutes).unwrap_or(""),
            ),
            ("after", after),
        ],
    )
}

/// At most `limit` machines after `after`, each with what it is doing and,
/// with a spec, the allocator's verdict: one statement without a spec; with
/// one, `explain` (the allocator's rules) and one statement for the page's
/// states, never one per row.
async fn rows(
    pool: &Db,
    org_id: i64,
    asked: &Asked,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<MachineView>, DashError> {
    let Some(spec) = &asked.spec else {
        return Ok(
            inventory::list_pooled(pool, org_id, &asked.filter, after, limit)
                .await?
                .into_iter()
                .map(MachineView::of_pooled)
                .collect(),
        );
    };
    // The headroom kept for others does not depend on the page: read beside it.
    let page = async {
        let verdicts = allocator::explain(pool, org_id, spec, &asked.filter, after, limit).await?;
        let ids: Vec<i64> = verdicts.iter().map(|v| v.machine.id).collect();
        let states = inventory::pooled_by_ids(pool, org_id, &ids).await?;
        Ok::<_, DashError>((verdicts, states))
    };
    let ((verdicts, states), kept) = tokio::try_join!(
        page,
        kept_for_others(pool, org_id, spec, asked.segment.as_ref()).err_into()
    )?;
    let mut states: std::collections::HashMap<i64, PooledMachine> =
        states.into_iter().map(|p| (p.machine.id, p)).collect();
    let mut views: Vec<MachineView> = verdicts
        .into_iter()
        .map(|v| {
            let pool_view = states.remove(&v.machine.id).map(|p| PoolView::of(&p));
            let mut view = MachineView::of_verdict(v);
            view.pool = pool_view;
            view
        })
        .collect();
    if let Some(kept) = kept {
        kept.apply(spec, &mut views);
    }
    Ok(views)
}

pub(crate) async fn list(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    q: web::Query<MachinesQuery>,
) -> Result<HttpResponse, DashError> {
    let q = q.into_inner();
    let asked = asked(&q)?;
    let after = non_blank(&q.after);
    // The page, its counts and the filters' values are independent reads,
    // each a snapshot of its own as they would be one after the other: run
    // together, the page waits for the slowest instead of for their sum
    // (three turns for a CPU on a busy machine, not one each in line).
    // One more than a page tells whether a "next" link is needed.
    // The counts cover the whole filter (its state aside), not the page.
    let (mut machines, counts, facets) = tokio::try_join!(
        rows(&pool, staff.org_id, &asked, after, PAGE_SIZE + 1),
        inventory::count_by_state(&pool, staff.org_id, &asked.filter).err_into(),
        inventory::facets(&pool, staff.org_id).err_into(),
    )?;
    let more = machines.len() as i64 > PAGE_SIZE;
    machines.truncate(PAGE_SIZE as usize);
    let state = non_blank(&q.state).unwrap_or("");
    let next = if more {
        machines
            .last()
            .map(|m| link("/machines", &q, state, &m.asset_tag))
    } else {
        None
    };
    let first = after.map(|_| link("/machines", &q, state, ""));
    let states = counts
        .into_iter()
        .map(|(st, count)| StateCount {
            key: st.as_str(),
            label: st.label(),
            count,
            link: link("/machines", &q, st.as_str(), ""),
            current: asked.filter.state == Some(st),
        })
        .collect();
    let (filters, spec_filters) = selects(&facets, &q);
    let spec_substitutes = q.spec_substitutes.as_deref() == Some("allowed");
    let substitutes_note = match (&asked.spec, spec_substitutes) {
        (Some(spec), true) => {
            let (available, subs) = crate::capacity::could_serve(
                pool.get_ref(),
                staff.org_id,
                &spec.site,
                &spec.profile,
                spec.vendor.as_ref(),
                asked.segment.as_ref(),
            )
            .await?;
            Some(crate::capacity::substitutes_words(
                spec.profile.as_str(),
                1,
                available,
                &subs,
            ))
        }
        _ => None,
    };
    let f = &asked.filter;
    page(&MachinesPage {
        spec_substitutes,
        substitutes_note,
        chrome: Chrome::new(&req, &staff, "Machines", "machines"),
        filters,
        spec_filters,
        spec_segment: asked
            .segment
            .as_ref()
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default(),
        filtered: f.site.is_some()
            || f.vendor.is_some()
            || f.profile.is_some()
            || f.status.is_some(),
        states,
        has_spec: asked.spec.is_some(),
        csv: link("/machines.csv", &q, state, ""),
        can_act: staff.can_act(),
        machines,
        next,
        first,
    })
}

/// The filters' selects, filled from the organization's inventory; then the
/// order's.
fn selects(facets: &Facets, q: &MachinesQuery) -> (Vec<Select>, Vec<Select>) {
    let statuses = MachineStatus::ALL.map(|s| (s.as_str(), s.as_str()));
    let states = PoolState::ALL.map(|s| (s.as_str(), s.label()));
    (
        vec![
            Select::of("f-site", "site", "Site", &facets.sites, q.site.as_deref()),
            Select::of(
                "f-vendor",
                "vendor",
                "Vendor",
                &facets.vendors,
                q.vendor.as_deref(),
            ),
            Select::of(
                "f-profile",
                "profile",
                "Profile",
                &facets.profiles,
                q.profile.as_deref(),
            ),
            Select::new(
                "f-status",
                "status",
                "Status",
                statuses,
                q.status.as_deref(),
            ),
            Select::new(
                "f-state",
                "state",
                "In the pool",
                states,
                q.state.as_deref(),
            ),
        ],
        vec![
            Select::of(
                "s-site",
                "spec_site",
                "Order site",
                &facets.sites,
                q.spec_site.as_deref(),
            ),
            Select::of(
                "s-profile",
                "spec_profile",
                "Order profile",
                &facets.profiles,
                q.spec_profile.as_deref(),
            ),
            Select::of(
                "s-vendor",
                "spec_vendor",
                "Order vendor",
                &facets.vendors,
                q.spec_vendor.as_deref(),
            ),
        ],
    )
}

/// `/machines.csv`: every machine the page's filters select (not only the
/// page), with what it is doing and, with an order, its verdict.
pub(crate) async fn export(
    staff: Staff,
    pool: web::Data<Db>,
    q: web::Query<MachinesQuery>,
) -> Result<HttpResponse, DashError> {
    let asked = asked(&q)?;
    let machines = rows(&pool, staff.org_id, &asked, None, csv::MAX_ROWS).await?;
    let mut columns = vec![
        "asset_tag",
        "site",
        "vendor",
        "profile",
        "status",
        "state",
        "reservation",
        "order_ref",
        "seconds_left",
        "service_ref",
    ];
    if asked.spec.is_some() {
        columns.extend(["for_this_order", "why"]);
    }
    let body = csv::render(
        &columns,
        machines.into_iter().map(|m| {
            let p = m.pool.as_ref();
            let mut row = vec![
                m.asset_tag.clone(),
                m.site.clone(),
                m.vendor.clone(),
                m.profile.clone(),
                m.status.clone(),
                p.map_or("", |p| p.key).to_owned(),
                p.and_then(|p| p.held_by.or(p.sold_by))
                    .map(|id| id.to_string())
                    .unwrap_or_default(),
                p.map(|p| p.held_for.clone()).unwrap_or_default(),
                p.filter(|p| p.held_by.is_some())
                    .map(|p| p.remaining.to_string())
                    .unwrap_or_default(),
                p.map(|p| p.service_ref.clone()).unwrap_or_default(),
            ];
            if let Some(verdict) = &m.verdict {
                match verdict {
                    None => row.extend(["candidate".to_owned(), String::new()]),
                    Some(v) => row.extend([v.key.to_owned(), v.reason.clone()]),
                }
            }
            row
        }),
    );
    Ok(csv::response("machines.csv", body))
}

pub struct ReservationLine {
    pub id: i64,
    pub order_ref: String,
    pub state: crate::domain::ReservationState,
    pub created_at: String,
    pub expires_at: String,
    pub ended_at: String,
    pub ended_by: String,
}

pub struct ServiceLine {
    pub service_ref: String,
    pub reservation_id: i64,
    pub created_at: String,
    pub ended_at: String,
    pub ended_by: String,
}

/// R15: a hold that left this machine for an equivalent one.
pub struct MovedLine {
    pub reservation_id: i64,
    pub order_ref: String,
    pub at: String,
    pub to: String,
    pub actor: String,
}

#[derive(Template)]
#[template(path = "machine.html")]
struct MachinePage {
    chrome: Chrome,
    machine: inventory::Machine,
    created_at: String,
    updated_at: String,
    reservations: Vec<ReservationLine>,
    moved_away: Vec<MovedLine>,
    services: Vec<ServiceLine>,
    can_act: bool,
    statuses: Vec<&'static str>,
}

#[derive(sqlx::FromRow)]
struct MovedRow {
    reservation_id: i64,
    order_ref: String,
    at: chrono::DateTime<chrono::Utc>,
    to_tag: String,
    actor: String,
}

#[derive(sqlx::FromRow)]
struct SvcRow {
    service_ref: String,
    reservation_id: i64,
    created_at: chrono::DateTime<chrono::Utc>,
    ended_at: Option<chrono::DateTime<chrono::Utc>>,
    ended_by: Option<String>,
}

pub(crate) async fn detail(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    tag: web::Path<String>,
) -> Result<HttpResponse, DashError> {
    // Another organization's machine is simply absent: 404.
    let machine = inventory::by_tag(&pool, staff.org_id, &tag)
        .await?
        .ok_or(DashError::NotFound("machine"))?;
    let reservations =
        crate::reservations::of_machine(pool.get_ref(), staff.org_id, machine.id, 200).await?;
    // Holds that moved away keep their reservation row on the new machine;
    // the event names this one (partial index on replaced_machine_id).
    let moved_away: Vec<MovedRow> = sqlx::query_as(
        "SELECT e.reservation_id, r.order_ref, e.at, m.asset_tag AS to_tag, e.actor
           FROM reservation_events e
           JOIN reservations r ON r.id = e.reservation_id
           JOIN machines m ON m.id = r.machine_id
          WHERE e.replaced_machine_id = $1 AND r.org_id = $2
          ORDER BY e.id DESC LIMIT 200",
    )
    .bind(machine.id)
    .bind(staff.org_id)
    .fetch_all(pool.get_ref())
    .await?;
    let services: Vec<SvcRow> = sqlx::query_as(
        "SELECT service_ref, reservation_id, created_at, ended_at, ended_by
           FROM service_links WHERE machine_id = $1 AND org_id = $2
          ORDER BY created_at DESC LIMIT 200",
    )
    .bind(machine.id)
    .bind(staff.org_id)
    .fetch_all(pool.get_ref())
    .await?;
    page(&MachinePage {
        chrome: Chrome::new(
            &req,
            &staff,
            format!("Machine {}", machine.asset_tag),
            "machines",
        ),
        created_at: fmt_time(&machine.created_at),
        updated_at: fmt_time(&machine.updated_at),
        machine,
        reservations: reservations
            .into_iter()
            .map(|r| ReservationLine {
                id: r.id,
                order_ref: r.order_ref,
                state: r.state,
                created_at: fmt_time(&r.created_at),
                expires_at: fmt_time(&r.expires_at),
                ended_at: fmt_opt_time(&r.ended_at),
                ended_by: r.ended_by.unwrap_or_default(),
            })
            .collect(),
        moved_away: moved_away
            .into_iter()
            .map(|m| MovedLine {
                reservation_id: m.reservation_id,
                order_ref: m.order_ref,
                at: fmt_time(&m.at),
                to: m.to_tag,
                actor: m.actor,
            })
            .collect(),
        can_act: staff.can_act(),
        statuses: MachineStatus::ALL.iter().map(|s| s.as_str()).collect(),
        services: services
            .into_iter()
            .map(|s| ServiceLine {
                service_ref: s.service_ref,
                reservation_id: s.reservation_id,
                created_at: fmt_time(&s.created_at),
                ended_at: fmt_opt_time(&s.ended_at),
                ended_by: s.ended_by.unwrap_or_default(),
            })
            .collect(),
    })
}
