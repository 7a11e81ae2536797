//! `/machines`: the pool, filtered, keyset-paginated by asset tag; with an
//! order spec, each machine's verdict comes from `allocator::explain` (the
//! allocator's own rules, not a copy). `/machines/{asset_tag}`: one
//! machine's reservations and services over time.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::error::DashError;
use super::gate;
use super::session::Staff;
use super::view::{Chrome, fmt_opt_time, fmt_time, non_blank, page, url_with};
use crate::allocator::{self, OrderSpec};
use crate::domain::{MachineStatus, Profile, Site, Vendor};
use crate::inventory::{self, MachineFilter};
use crate::settings::Settings;

pub const PAGE_SIZE: i64 = 100;

#[derive(Debug, Default, Deserialize)]
pub struct MachinesQuery {
    pub site: Option<String>,
    pub vendor: Option<String>,
    pub profile: Option<String>,
    pub status: Option<String>,
    pub spec_site: Option<String>,
    pub spec_profile: Option<String>,
    pub spec_vendor: Option<String>,
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
}

pub struct VerdictView {
    pub key: &'static str,
    /// The reason in words (`reasons::label`), the same on every page.
    pub label: &'static str,
    pub reason: String,
}

impl VerdictView {
    pub fn of(e: crate::allocator::Exclusion) -> VerdictView {
        VerdictView {
            key: e.key(),
            label: super::reasons::label(e.key()),
            reason: e.describe(),
        }
    }
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
        }
    }
}

#[derive(Template)]
#[template(path = "machines.html")]
struct MachinesPage {
    chrome: Chrome,
    q: MachinesQuery,
    statuses: Vec<&'static str>,
    has_spec: bool,
    machines: Vec<MachineView>,
    next: Option<String>,
    first: Option<String>,
}

pub(crate) async fn list(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    q: web::Query<MachinesQuery>,
) -> Result<HttpResponse, DashError> {
    gate::datacenter(&settings, &staff)?;
    let q = q.into_inner();
    let filter = parse_filter(&q)?;
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
    let after = non_blank(&q.after);
    // One more than a page tells whether a "next" link is needed.
    let mut machines: Vec<MachineView> = match &spec {
        Some(spec) => allocator::explain(&pool, staff.org_id, spec, &filter, after, PAGE_SIZE + 1)
            .await?
            .into_iter()
            .map(MachineView::of_verdict)
            .collect(),
        None => inventory::list(&pool, staff.org_id, &filter, after, PAGE_SIZE + 1)
            .await?
            .into_iter()
            .map(|m| MachineView {
                asset_tag: m.asset_tag,
                site: m.site,
                vendor: m.vendor,
                profile: m.profile,
                status: m.status,
                verdict: None,
            })
            .collect(),
    };
    let more = machines.len() as i64 > PAGE_SIZE;
    machines.truncate(PAGE_SIZE as usize);
    let pairs = |after: &str| -> String {
        url_with(
            "/machines",
            &[
                ("site", non_blank(&q.site).unwrap_or("")),
                ("vendor", non_blank(&q.vendor).unwrap_or("")),
                ("profile", non_blank(&q.profile).unwrap_or("")),
                ("status", non_blank(&q.status).unwrap_or("")),
                ("spec_site", non_blank(&q.spec_site).unwrap_or("")),
                ("spec_profile", non_blank(&q.spec_profile).unwrap_or("")),
                ("spec_vendor", non_blank(&q.spec_vendor).unwrap_or("")),
                ("after", after),
            ],
        )
    };
    let next = if more {
        machines.last().map(|m| pairs(&m.asset_tag))
    } else {
        None
    };
    let first = after.map(|_| pairs(""));
    page(&MachinesPage {
        chrome: Chrome::new(&req, &staff, "Machines", "machines"),
        statuses: MachineStatus::ALL.iter().map(|s| s.as_str()).collect(),
        has_spec: spec.is_some(),
        q,
        machines,
        next,
        first,
    })
}

pub struct ReservationLine {
    pub id: i64,
    pub order_ref: String,
    pub state: String,
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

#[derive(Template)]
#[template(path = "machine.html")]
struct MachinePage {
    chrome: Chrome,
    machine: inventory::Machine,
    created_at: String,
    updated_at: String,
    reservations: Vec<ReservationLine>,
    services: Vec<ServiceLine>,
}

#[derive(sqlx::FromRow)]
struct ResRow {
    id: i64,
    order_ref: String,
    state: String,
    created_at: chrono::DateTime<chrono::Utc>,
    expires_at: chrono::DateTime<chrono::Utc>,
    ended_at: Option<chrono::DateTime<chrono::Utc>>,
    ended_by: Option<String>,
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
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    tag: web::Path<String>,
) -> Result<HttpResponse, DashError> {
    gate::datacenter(&settings, &staff)?;
    // Another organization's machine is simply absent: 404.
    let machine = inventory::by_tag(&pool, staff.org_id, &tag)
        .await?
        .ok_or(DashError::NotFound("machine"))?;
    let reservations: Vec<ResRow> = sqlx::query_as(
        "SELECT id, order_ref, state, created_at, expires_at, ended_at, ended_by
           FROM reservations WHERE machine_id = $1 AND org_id = $2
          ORDER BY created_at DESC LIMIT 200",
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
