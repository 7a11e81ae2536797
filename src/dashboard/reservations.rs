//! `/reservations`: held reservations with a countdown computed by the
//! database, compact rows, 100 a page, filtered by site and deadline; the detail page with its timeline and the one-sentence answer;
//! cancel, convert and extend (R14) through a GET confirmation page and a
//! POST form. A reservation of an order of several machines (R13) is shown
//! with its order's other machines, and every action on it acts on the
//! whole order.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::csrf;
use super::csv;
use super::error::DashError;
use super::gate;
use super::outcome;
use super::session::{Staff, audit_on};
use super::view::{
    Chrome, Select, fmt_opt_time, fmt_remaining, fmt_time, non_blank, page, see_other, url_with,
};
use crate::domain::{ServiceRef, Site};
use crate::inventory;
use crate::reservations::{self, Named, OrderAction, TransitionError};
use crate::settings::Settings;

#[derive(sqlx::FromRow)]
struct LiveRow {
    id: i64,
    order_ref: String,
    asset_tag: String,
    site: String,
    fence: i64,
    expires_at: DateTime<Utc>,
    remaining: i64,
    quantity: i16,
    slot: i16,
    /// R15: the machine the hold last left, and when.
    replaced_tag: Option<String>,
    replaced_at: Option<DateTime<Utc>>,
}

/// One compact row: the frozen reason is on the reservation's own page.
pub struct LiveView {
    pub id: i64,
    pub order_ref: String,
    pub asset_tag: String,
    pub site: String,
    pub fence: i64,
    /// R13: this is machine `slot` of an order of `quantity`.
    pub quantity: i16,
    pub slot: i16,
    pub remaining: i64,
    pub remaining_text: String,
    pub overdue: bool,
    /// Under `SOON_SECONDS` left: said in words, not only in colour.
    pub soon: bool,
    /// R15: "PK-00011, 14:02:11 UTC" when the hold moved off that machine.
    pub replaced: Option<(String, String)>,
}

/// A hold with less than this left is flagged "expires soon" in text.
pub const SOON_SECONDS: i64 = 120;
/// Rows per page of `/reservations`.
pub const LIVE_PAGE: i64 = 100;
/// How often the page refreshes its list in the browser (app.js), seconds.
pub const REFRESH_SECONDS: u32 = 30;
/// The choices of the "expiring within" filter, in minutes (any whole
/// number of minutes up to a day is accepted in the URL).
pub const WITHIN_CHOICES: [i32; 5] = [2, 5, 15, 60, 240];

#[derive(Debug, Default, Deserialize)]
pub struct LiveQuery {
    pub site: Option<String>,
    /// Only holds whose deadline is within this many minutes (overdue too).
    pub within: Option<String>,
    /// Keyset cursors, `<deadline in µs since the epoch>_<id>`.
    pub after: Option<String>,
    pub before: Option<String>,
}

/// A position in the deadline order: (expires_at, id), unique.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub expires_at: DateTime<Utc>,
    pub id: i64,
}

impl Cursor {
    pub fn encode(&self) -> String {
        format!("{}_{}", self.expires_at.timestamp_micros(), self.id)
    }

    pub fn parse(s: &str) -> Option<Cursor> {
        let (micros, id) = s.trim().split_once('_')?;
        Some(Cursor {
            expires_at: DateTime::from_timestamp_micros(micros.parse().ok()?)?,
            id: id.parse().ok()?,
        })
    }
}

#[derive(Template)]
#[template(path = "reservations.html")]
struct ReservationsPage {
    chrome: Chrome,
    can_act: bool,
    site: String,
    site_select: Select,
    csv: String,
    within: Option<i32>,
    within_choices: [i32; 5],
    rows: Vec<LiveView>,
    total: i64,
    refreshed_at: String,
    refresh_seconds: u32,
    next: Option<String>,
    prev: Option<String>,
}

fn bad_cursor() -> DashError {
    DashError::bad_request("The page link is not valid; start again from the first page.")
}

/// The filters of `/reservations` (and its CSV), parsed.
struct LiveFilter {
    site: Option<Site>,
    within: Option<i32>,
}

fn live_filter(q: &LiveQuery) -> Result<LiveFilter, DashError> {
    let site = non_blank(&q.site)
        .map(Site::parse)
        .transpose()
        .map_err(|e| DashError::bad_request(e.to_string()))?;
    let within = non_blank(&q.within)
        .map(|w| {
            w.parse::<i32>()
                .ok()
                .filter(|m| (1..=1440).contains(m))
                .ok_or_else(|| {
                    DashError::bad_request(
                        "“Expiring within” is a whole number of minutes from 1 to 1440.",
                    )
                })
        })
        .transpose()?;
    Ok(LiveFilter { site, within })
}

/// Held reservations matching `f`, in deadline order from `cursor`
/// (backwards: before it, newest first), at most `limit`.
async fn held_rows(
    pool: &Db,
    org_id: i64,
    f: &LiveFilter,
    cursor: Option<Cursor>,
    backwards: bool,
    limit: i64,
) -> Result<Vec<LiveRow>, sqlx::Error> {
    // The remaining seconds come from the database clock (clock_timestamp),
    // the same clock that judges expiry; the browser only counts down from
    // it, never reads its own wall clock. Keyset paging on (expires_at, id)
    // walks reservations_held_by_deadline_idx (the sweep's index) in order,
    // forwards or backwards, and stops after a page: no OFFSET, no per-row
    // query. The redundant `expires_at >=`/`<=` lets the index bound the walk,
    // and `expires_at IS NOT NULL` (always true) matches the index's
    // predicate, which says so to keep the allocator's probes off it.
    let sql = format!(
        "SELECT r.id, r.order_ref, m.asset_tag, m.site, r.fence, r.expires_at,
                floor(extract(epoch FROM r.expires_at - clock_timestamp()))::bigint AS remaining,
                r.quantity, r.slot, x.replaced_tag, x.replaced_at
           FROM reservations r JOIN machines m ON m.id = r.machine_id
           -- R15: the last move of this hold, by its events' index.
           LEFT JOIN LATERAL (
                SELECT old.asset_tag AS replaced_tag, e.at AS replaced_at
                  FROM reservation_events e JOIN machines old ON old.id = e.replaced_machine_id
                 WHERE e.reservation_id = r.id AND e.kind = 'machine_replaced'
                 ORDER BY e.id DESC LIMIT 1) x ON true
          WHERE r.org_id = $1 AND r.state = 'held' AND r.expires_at IS NOT NULL
            AND ($2::text IS NULL OR m.site = $2::text)
            AND ($3::int IS NULL OR r.expires_at <= clock_timestamp() + make_interval(mins => $3::int))
            AND ($4::timestamptz IS NULL OR (r.expires_at {cmp}= $4 AND (r.expires_at, r.id) {cmp} ($4, $5)))
          ORDER BY r.expires_at {dir}, r.id {dir}
          LIMIT $6",
        cmp = if backwards { "<" } else { ">" },
        dir = if backwards { "DESC" } else { "ASC" },
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .bind(f.site.as_ref().map(Site::as_str))
        .bind(f.within)
        .bind(cursor.map(|c| c.expires_at))
        .bind(cursor.map_or(0, |c| c.id))
        .bind(limit)
        .fetch_all(pool)
        .await
}

pub(crate) async fn list(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    q: web::Query<LiveQuery>,
) -> Result<HttpResponse, DashError> {
    let q = q.into_inner();
    let f = live_filter(&q)?;
    let (site, within) = (&f.site, f.within);
    let after = non_blank(&q.after)
        .map(|c| Cursor::parse(c).ok_or_else(bad_cursor))
        .transpose()?;
    let before = non_blank(&q.before)
        .map(|c| Cursor::parse(c).ok_or_else(bad_cursor))
        .transpose()?;
    let backwards = before.is_some() && after.is_none();
    let cursor = if backwards { before } else { after };
    let mut rows = held_rows(&pool, staff.org_id, &f, cursor, backwards, LIVE_PAGE + 1).await?;
    let more = rows.len() as i64 > LIVE_PAGE;
    rows.truncate(LIVE_PAGE as usize);
    if backwards {
        rows.reverse();
    }
    // The count walks the same partial index; a site is checked per held
    // row by the machine's primary key (a join let the planner hash every
    // machine of the pool: 5 ms at 50,000 machines against 1 ms).
    let (total, refreshed_at): (i64, DateTime<Utc>) = sqlx::query_as(
        "SELECT count(*), clock_timestamp()
           FROM reservations r
          WHERE r.org_id = $1 AND r.state = 'held' AND r.expires_at IS NOT NULL
            AND ($2::text IS NULL OR (SELECT m.site FROM machines m WHERE m.id = r.machine_id) = $2::text)
            AND ($3::int IS NULL OR r.expires_at <= clock_timestamp() + make_interval(mins => $3::int))",
    )
    .bind(staff.org_id)
    .bind(site.as_ref().map(Site::as_str))
    .bind(within)
    .fetch_one(pool.get_ref())
    .await?;
    let (has_next, has_prev) = if backwards {
        (true, more)
    } else {
        (more, after.is_some())
    };
    let within_text = within.map(|w| w.to_string()).unwrap_or_default();
    let sites = inventory::facets(&pool, staff.org_id).await?.sites;
    let site_text = site.as_ref().map_or("", |s| s.as_str());
    let link = |key: &str, c: &LiveRow| {
        let c = Cursor {
            expires_at: c.expires_at,
            id: c.id,
        }
        .encode();
        url_with(
            "/reservations",
            &[("site", site_text), ("within", &within_text), (key, &c)],
        )
    };
    let next = rows.last().filter(|_| has_next).map(|r| link("after", r));
    let prev = rows.first().filter(|_| has_prev).map(|r| link("before", r));
    let rows: Vec<LiveView> = rows
        .into_iter()
        .map(|r| LiveView {
            id: r.id,
            order_ref: r.order_ref,
            asset_tag: r.asset_tag,
            site: r.site,
            fence: r.fence,
            quantity: r.quantity,
            slot: r.slot,
            remaining: r.remaining.max(0),
            remaining_text: fmt_remaining(r.remaining),
            overdue: r.remaining <= 0,
            soon: r.remaining > 0 && r.remaining < SOON_SECONDS,
            replaced: r.replaced_tag.zip(r.replaced_at.as_ref().map(fmt_time)),
        })
        .collect();
    page(&ReservationsPage {
        chrome: Chrome::new(&req, &staff, "Live reservations", "reservations"),
        can_act: staff.can_act(),
        site: site_text.to_owned(),
        site_select: Select::of("l-site", "site", "Site", &sites, Some(site_text)),
        csv: url_with(
            "/reservations.csv",
            &[("site", site_text), ("within", &within_text)],
        ),
        within,
        within_choices: WITHIN_CHOICES,
        rows,
        total,
        refreshed_at: refreshed_at.format("%H:%M:%S UTC").to_string(),
        refresh_seconds: REFRESH_SECONDS,
        next,
        prev,
    })
}

/// `/reservations.csv`: every held reservation the filters select (not only
/// the page), soonest deadline first.
pub(crate) async fn export(
    staff: Staff,
    pool: web::Data<Db>,
    q: web::Query<LiveQuery>,
) -> Result<HttpResponse, DashError> {
    let f = live_filter(&q)?;
    let rows = held_rows(&pool, staff.org_id, &f, None, false, csv::MAX_ROWS).await?;
    let body = csv::render(
        &[
            "reservation",
            "order_ref",
            "asset_tag",
            "site",
            "expires_at",
            "seconds_left",
        ],
        rows.into_iter().map(|r| {
            vec![
                r.id.to_string(),
                r.order_ref,
                r.asset_tag,
                r.site,
                fmt_time(&r.expires_at),
                r.remaining.max(0).to_string(),
            ]
        }),
    );
    Ok(csv::response("reservations.csv", body))
}

/// What the detail and confirmation pages need beyond the reservation row.
#[derive(sqlx::FromRow)]
struct Extra {
    asset_tag: String,
    site: String,
    vendor: String,
    profile: String,
    remaining: i64,
    service_ref: Option<String>,
}

async fn extra(pool: &Db, org_id: i64, id: i64) -> Result<Option<Extra>, sqlx::Error> {
    sqlx::query_as(
        "SELECT m.asset_tag, m.site, m.vendor, m.profile,
                floor(extract(epoch FROM r.expires_at - clock_timestamp()))::bigint AS remaining,
                s.service_ref
           FROM reservations r
           JOIN machines m ON m.id = r.machine_id
           LEFT JOIN service_links s ON s.reservation_id = r.id
          WHERE r.id = $1 AND r.org_id = $2",
    )
    .bind(id)
    .bind(org_id)
    .fetch_optional(pool)
    .await
}

/// One machine of a reservation's order (R13), for the detail and
/// confirmation pages.
#[derive(sqlx::FromRow)]
pub struct OrderLine {
    pub id: i64,
    pub fence: i64,
    pub slot: i16,
    pub state: String,
    pub asset_tag: String,
    pub site: String,
}

/// Every reservation of the order of `r` (itself included), in slot order.
async fn order_lines(
    pool: &Db,
    org_id: i64,
    r: &reservations::Reservation,
) -> Result<Vec<OrderLine>, sqlx::Error> {
    if r.quantity <= 1 {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        "SELECT r.id, r.fence, r.slot, r.state, m.asset_tag, m.site
           FROM reservations r JOIN machines m ON m.id = r.machine_id
          WHERE r.org_id = $1 AND r.order_ref = $2
          ORDER BY r.slot",
    )
    .bind(org_id)
    .bind(&r.order_ref)
    .fetch_all(pool)
    .await
}

pub struct EventView {
    pub at: String,
    pub kind: String,
    pub from_state: String,
    pub to_state: String,
    pub actor: String,
    pub detail: String,
    pub replica: String,
}

#[derive(Template)]
#[template(path = "reservation.html")]
struct ReservationPage {
    chrome: Chrome,
    r: reservations::Reservation,
    m: Extra,
    sentence: String,
    created_at: String,
    expires_at: String,
    ended_at: String,
    remaining_text: String,
    held: bool,
    overdue: bool,
    can_act: bool,
    events: Vec<EventView>,
    order: Vec<OrderLine>,
    /// R15: the last time the hold moved to another machine (when, by whom,
    /// the event's words: from which machine and why).
    replaced: Option<(String, String, String)>,
}

async fn load(
    pool: &Db,
    staff: &Staff,
    id: i64,
) -> Result<(reservations::Reservation, Extra), DashError> {
    // Another organization's reservation is absent: 404, never 403.
    let r = reservations::get(pool, staff.org_id, id)
        .await?
        .ok_or(DashError::NotFound("reservation"))?;
    let m = extra(pool, staff.org_id, id)
        .await?
        .ok_or(DashError::NotFound("reservation"))?;
    Ok((r, m))
}

pub(crate) async fn detail(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    id: web::Path<i64>,
) -> Result<HttpResponse, DashError> {
    let id = id.into_inner();
    let (r, m) = load(&pool, &staff, id).await?;
    let events = reservations::events(&pool, staff.org_id, id).await?;
    let sentence = outcome::sentence(&r, &events, m.service_ref.as_deref(), m.remaining);
    let order = order_lines(&pool, staff.org_id, &r).await?;
    page(&ReservationPage {
        order,
        chrome: Chrome::new(&req, &staff, format!("Reservation {id}"), "reservations"),
        sentence,
        created_at: fmt_time(&r.created_at),
        expires_at: fmt_time(&r.expires_at),
        ended_at: fmt_opt_time(&r.ended_at),
        remaining_text: fmt_remaining(m.remaining),
        held: r.state == "held",
        overdue: r.state == "held" && m.remaining <= 0,
        can_act: staff.can_act(),
        replaced: events
            .iter()
            .rev()
            .find(|e| e.kind == "machine_replaced")
            .map(|e| {
                (
                    fmt_time(&e.at),
                    e.actor.clone(),
                    e.detail.clone().unwrap_or_default(),
                )
            }),
        events: events
            .into_iter()
            .map(|e| EventView {
                at: fmt_time(&e.at),
                kind: e.kind,
                from_state: e.from_state.unwrap_or_default(),
                to_state: e.to_state,
                actor: e.actor,
                detail: e.detail.unwrap_or_default(),
                replica: match (e.replica, e.lease_fence) {
                    (Some(rep), Some(f)) => format!("{rep} (lease fence {f})"),
                    (Some(rep), None) => rep,
                    _ => String::new(),
                },
            })
            .collect(),
        r,
        m,
    })
}

#[derive(Debug, Deserialize)]
pub struct FenceQuery {
    pub fence: Option<i64>,
}

#[derive(Template)]
#[template(path = "confirm.html")]
struct ConfirmPage {
    chrome: Chrome,
    action: &'static str,
    r: reservations::Reservation,
    m: Extra,
    fence: i64,
    remaining_text: String,
    overdue: bool,
    /// R13: the order's machines when it has several (the action is on all
    /// of them); empty for an order of one.
    order: Vec<OrderLine>,
    /// The extension's choices, in minutes from now, within the cap.
    extend_choices: Vec<u32>,
    /// R14's cap, in words.
    cap_text: String,
}

/// The extension's choices offered on the page, in minutes from now (any
/// whole number of seconds up to the cap is accepted).
pub const EXTEND_CHOICES: [u32; 5] = [5, 10, 15, 30, 60];

async fn confirm(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    id: i64,
    fence: Option<i64>,
    action: &'static str,
) -> Result<HttpResponse, DashError> {
    staff.require_actor()?;
    gate::datacenter(&settings, &staff)?;
    let (r, m) = load(&pool, &staff, id).await?;
    if r.state != "held" {
        return Err(not_held(id, &r.state));
    }
    let order = order_lines(&pool, staff.org_id, &r).await?;
    page(&ConfirmPage {
        order,
        extend_choices: EXTEND_CHOICES
            .into_iter()
            .filter(|m| m * 60 <= settings.hold_max_seconds)
            .collect(),
        cap_text: fmt_duration(settings.hold_max_seconds),
        chrome: Chrome::new(
            &req,
            &staff,
            if r.quantity > 1 {
                format!("Confirm: {action} order {}", r.order_ref)
            } else {
                format!("Confirm: {action} reservation {id}")
            },
            "reservations",
        ),
        action,
        // The fence the page that linked here showed: acting on it later
        // fails cleanly if the reservation changed in between.
        fence: fence.unwrap_or(r.fence),
        remaining_text: fmt_remaining(m.remaining),
        overdue: m.remaining <= 0,
        r,
        m,
    })
}

pub(crate) async fn confirm_cancel(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    id: web::Path<i64>,
    q: web::Query<FenceQuery>,
) -> Result<HttpResponse, DashError> {
    confirm(
        req,
        staff,
        settings,
        pool,
        id.into_inner(),
        q.fence,
        "cancel",
    )
    .await
}

pub(crate) async fn confirm_extend(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    id: web::Path<i64>,
    q: web::Query<FenceQuery>,
) -> Result<HttpResponse, DashError> {
    confirm(
        req,
        staff,
        settings,
        pool,
        id.into_inner(),
        q.fence,
        "extend",
    )
    .await
}

pub(crate) async fn confirm_convert(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    id: web::Path<i64>,
    q: web::Query<FenceQuery>,
) -> Result<HttpResponse, DashError> {
    confirm(
        req,
        staff,
        settings,
        pool,
        id.into_inner(),
        q.fence,
        "convert",
    )
    .await
}

/// Fields are strings with defaults so that a missing CSRF token is a 403,
/// checked first, not a 400 from the form parser.
#[derive(Debug, Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    pub csrf: String,
    #[serde(default)]
    pub fence: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub service_ref: String,
    /// An extension's length, in minutes from now.
    #[serde(default)]
    pub minutes: String,
    /// For an order of several (R13): `fence_<id>` and, to convert,
    /// `service_ref_<id>` for each of its reservations.
    #[serde(flatten)]
    pub order: std::collections::HashMap<String, String>,
}

fn not_held(id: i64, state: &str) -> DashError {
    DashError::Stale {
        heading: format!("This reservation is already {state}"),
        message: format!(
            "Reservation {id} had already ended ({state}) before your request, so nothing was changed. \
             Its page shows what happened and who did it."
        ),
        link: Some((
            format!("/reservations/{id}"),
            format!("Open reservation {id}"),
        )),
    }
}

/// A stale page gets a page saying what happened, never a 500.
fn refused(id: i64, e: TransitionError) -> DashError {
    let link = Some((
        format!("/reservations/{id}"),
        format!("Open reservation {id}"),
    ));
    match e {
        TransitionError::NotFound => DashError::NotFound("reservation"),
        TransitionError::StaleFence => DashError::Stale {
            heading: "This reservation changed since your page was loaded".into(),
            message: format!(
                "The form carried an old fence for reservation {id}: someone or something changed it \
                 after you opened the page. Nothing was changed. Open it again to see its current state."
            ),
            link,
        },
        TransitionError::NotHeld { state } => not_held(id, &state),
        TransitionError::Expired { expires_at } => DashError::Stale {
            heading: "This reservation had already expired".into(),
            message: format!(
                "Reservation {id} expired at {} before your request reached it; it is now marked expired \
                 and nothing else was changed.",
                fmt_time(&expires_at)
            ),
            link,
        },
        TransitionError::PartOfOrder {
            order_ref,
            quantity,
            ..
        } => DashError::Stale {
            heading: "This reservation is part of an order".into(),
            message: format!(
                "Reservation {id} is one of the {quantity} machines of order {order_ref}, which are \
                 cancelled, converted and extended together. Nothing was changed."
            ),
            link,
        },
        TransitionError::Mismatch { .. } => DashError::Stale {
            heading: "This order changed since your page was loaded".into(),
            message: format!(
                "The form did not name every reservation of the order of reservation {id}. \
                 Nothing was changed. Open it again to see the order as it is."
            ),
            link,
        },
        TransitionError::HoldCap {
            cap_seconds,
            latest,
        } => DashError::Stale {
            heading: "The hold cannot be extended that far".into(),
            message: format!(
                "A hold may last at most {} from its creation: reservation {id} can be held until {} \
                 at the latest. Nothing was changed.",
                fmt_duration(cap_seconds),
                fmt_time(&latest)
            ),
            link,
        },
        TransitionError::MachineNotReady { asset_tag, .. } => DashError::Stale {
            heading: "The machine is not ready".into(),
            message: format!(
                "Machine {asset_tag} under reservation {id} is no longer ready, so it cannot be sold. \
                 Nothing was changed."
            ),
            link,
        },
        TransitionError::Database(e) => e.into(),
    }
}

/// A number of seconds in words, for the extension's pages.
fn fmt_duration(seconds: u32) -> String {
    match seconds {
        s if s % 3600 == 0 => format!("{} h", s / 3600),
        s if s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// The order of checks: session (extractor), CSRF, role, module switch
/// (R12), then the input. Nothing is written before all of them pass.
fn precheck(staff: &Staff, settings: &Settings, form: &ActionForm) -> Result<i64, DashError> {
    csrf::check(staff, &form.csrf)?;
    staff.require_actor()?;
    gate::datacenter(settings, staff)?;
    form.fence.trim().parse::<i64>().map_err(|_| {
        DashError::bad_request("The form's fence is missing or not a number; reload the page.")
    })
}

/// A reservation's order when it has several machines (R13): what the form
/// names of each (its fence and, for a conversion, its service), read
/// against the order as it is now. `None` for an order of one.
async fn order_named(
    pool: &Db,
    staff: &Staff,
    id: i64,
    form: &ActionForm,
) -> Result<Option<(String, Vec<Named>)>, DashError> {
    let (r, _) = load(pool, staff, id).await?;
    if r.quantity <= 1 {
        return Ok(None);
    }
    let order = reservations::order_of(pool, staff.org_id, &r.order_ref).await?;
    let named = order
        .iter()
        .map(|o| {
            form.order
                .get(&format!("fence_{}", o.id))
                .and_then(|f| f.trim().parse::<i64>().ok())
                .map(|fence| Named { id: o.id, fence })
                .ok_or_else(|| {
                    DashError::bad_request(
                        "The form does not name every machine of the order; reload the page.",
                    )
                })
        })
        .collect::<Result<Vec<Named>, DashError>>()?;
    Ok(Some((r.order_ref, named)))
}

/// Ends a staff action's transaction (F3). The commit is the one moment
/// its outcome can be unknown: before it, a lost connection left nothing
/// written (`503 unavailable`, as `From` says); at it, the page says the
/// change may or may not have been made and offers the same action again
/// (`action`: the path's last segment), whose answer then tells. An expiry
/// found at the point of use commits with the refusal (R11), as `settle`.
async fn settle_action<T>(
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    outcome: Result<T, TransitionError>,
    id: i64,
    action: &str,
) -> Result<T, DashError> {
    let commit = async |tx: sqlx::Transaction<'static, sqlx::Postgres>| {
        tx.commit().await.map_err(|e| {
            if crate::db::is_outcome_unknown(&e) {
                DashError::OutcomeUnknown {
                    again: (
                        format!("/reservations/{id}/{action}"),
                        "Do the same again".to_owned(),
                    ),
                    source: e.into(),
                }
            } else {
                e.into()
            }
        })
    };
    match outcome {
        Ok(value) => {
            commit(tx).await?;
            Ok(value)
        }
        Err(e @ TransitionError::Expired { .. }) => {
            commit(tx).await?;
            Err(refused(id, e))
        }
        // Nothing to keep: dropping the transaction rolls it back (and a
        // connection that broke has nothing committed either).
        Err(e) => {
            drop(tx);
            Err(refused(id, e))
        }
    }
}

/// Audits and settles an order action; the audit row commits with it, and
/// only when the action changed something.
#[allow(clippy::too_many_arguments)]
async fn act_on_order(
    req: &HttpRequest,
    staff: &Staff,
    pool: &Db,
    id: i64,
    order_ref: &str,
    named: &[Named],
    what: OrderAction<'_>,
    audit: (&str, &str),
) -> Result<(), DashError> {
    let mut tx = pool.begin().await?;
    let outcome = reservations::order_transition_changed_on(
        &mut tx,
        staff.org_id,
        Some(order_ref),
        named,
        &staff.email,
        what,
    )
    .await;
    if let Ok((_, true)) = outcome {
        let object = format!("order:{order_ref}");
        audit_on(&mut tx, req, staff, audit.0, &object, Some(audit.1)).await?;
    }
    let action = audit.0.trim_start_matches("order.");
    settle_action(tx, outcome, id, action).await?;
    Ok(())
}

pub(crate) async fn cancel(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    id: web::Path<i64>,
    form: web::Form<ActionForm>,
) -> Result<HttpResponse, DashError> {
    let id = id.into_inner();
    let fence = precheck(&staff, &settings, &form)?;
    // A browser sends a textarea's line breaks as CRLF; the rule (shared
    // with the API) knows LF.
    let typed = form.reason.replace("\r\n", "\n");
    let reason = reservations::check_reason(&typed).map_err(|problem| {
        let mut sentence = problem.to_owned();
        sentence[..1].make_ascii_uppercase();
        DashError::bad_request(format!(
            "{sentence} to cancel a reservation; nothing was changed."
        ))
    })?;
    // R13: a reservation of an order of several cancels the whole order.
    if let Some((order_ref, named)) = order_named(&pool, &staff, id, &form).await? {
        act_on_order(
            &req,
            &staff,
            &pool,
            id,
            &order_ref,
            &named,
            OrderAction::Cancel { reason },
            ("order.cancel", reason),
        )
        .await?;
        return Ok(see_other(&format!("/reservations/{id}?flash=cancelled")));
    }
    // The audit row commits with the cancellation, or not at all.
    let mut tx = pool.begin().await?;
    let outcome =
        reservations::cancel_on(&mut tx, staff.org_id, id, fence, &staff.email, reason).await;
    if outcome.is_ok() {
        let object = format!("reservation:{id}");
        audit_on(
            &mut tx,
            &req,
            &staff,
            "reservation.cancel",
            &object,
            Some(reason),
        )
        .await?;
    }
    settle_action(tx, outcome, id, "cancel").await?;
    Ok(see_other(&format!("/reservations/{id}?flash=cancelled")))
}

pub(crate) async fn convert(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    id: web::Path<i64>,
    form: web::Form<ActionForm>,
) -> Result<HttpResponse, DashError> {
    let id = id.into_inner();
    let fence = precheck(&staff, &settings, &form)?;
    let bad_ref = |e: crate::domain::ParseError| {
        DashError::bad_request(format!(
            "The service reference is not valid: {e}. Nothing was changed."
        ))
    };
    // R13: a reservation of an order of several converts the whole order,
    // one service reference per machine.
    if let Some((order_ref, named)) = order_named(&pool, &staff, id, &form).await? {
        let refs = named
            .iter()
            .map(|n| {
                let text = form
                    .order
                    .get(&format!("service_ref_{}", n.id))
                    .map(|s| s.trim())
                    .unwrap_or_default();
                ServiceRef::parse(text).map_err(bad_ref)
            })
            .collect::<Result<Vec<ServiceRef>, DashError>>()?;
        let listed = refs
            .iter()
            .map(ServiceRef::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        act_on_order(
            &req,
            &staff,
            &pool,
            id,
            &order_ref,
            &named,
            OrderAction::Convert {
                service_refs: &refs,
            },
            ("order.convert", &listed),
        )
        .await?;
        return Ok(see_other(&format!("/reservations/{id}?flash=converted")));
    }
    let service_ref = ServiceRef::parse(form.service_ref.trim()).map_err(bad_ref)?;
    let mut tx = pool.begin().await?;
    let outcome =
        reservations::convert_on(&mut tx, staff.org_id, id, fence, &staff.email, &service_ref)
            .await;
    if outcome.is_ok() {
        let object = format!("reservation:{id}");
        audit_on(
            &mut tx,
            &req,
            &staff,
            "reservation.convert",
            &object,
            Some(service_ref.as_str()),
        )
        .await?;
    }
    settle_action(tx, outcome, id, "convert").await?;
    Ok(see_other(&format!("/reservations/{id}?flash=converted")))
}

/// R14: extend a hold (or its whole order) by the minutes chosen, from the
/// database's clock, with a reason; support and admin only; an audit row
/// commits with it.
pub(crate) async fn extend(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    id: web::Path<i64>,
    form: web::Form<ActionForm>,
) -> Result<HttpResponse, DashError> {
    let id = id.into_inner();
    let fence = precheck(&staff, &settings, &form)?;
    let seconds = form
        .minutes
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|m| (1..=1440).contains(m))
        .map(|m| m * 60)
        .ok_or_else(|| {
            DashError::bad_request(
                "Choose how many minutes to extend the hold by (1 to 1440); nothing was changed.",
            )
        })?;
    let reason = reservations::check_reason(&form.reason).map_err(|problem| {
        let mut sentence = problem.to_owned();
        sentence[..1].make_ascii_uppercase();
        DashError::bad_request(format!("{sentence} to extend a hold; nothing was changed."))
    })?;
    let what = OrderAction::Extend {
        seconds,
        until: None,
        cap_seconds: settings.hold_max_seconds,
        reason: Some(reason),
    };
    let detail = format!("{} min: {reason}", seconds / 60);
    match order_named(&pool, &staff, id, &form).await? {
        Some((order_ref, named)) => {
            act_on_order(
                &req,
                &staff,
                &pool,
                id,
                &order_ref,
                &named,
                what,
                ("order.extend", &detail),
            )
            .await?
        }
        None => {
            let mut tx = pool.begin().await?;
            let outcome = reservations::order_transition_changed_on(
                &mut tx,
                staff.org_id,
                None,
                &[Named { id, fence }],
                &staff.email,
                what,
            )
            .await;
            // Only what changed is audited: an extension that asked for
            // no later deadline wrote nothing.
            if let Ok((_, true)) = outcome {
                let object = format!("reservation:{id}");
                audit_on(
                    &mut tx,
                    &req,
                    &staff,
                    "reservation.extend",
                    &object,
                    Some(&detail),
                )
                .await?;
            }
            settle_action(tx, outcome, id, "extend").await?;
        }
    }
    Ok(see_other(&format!("/reservations/{id}?flash=extended")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_survives_its_link() {
        let c = Cursor {
            expires_at: DateTime::from_timestamp_micros(1_796_000_000_123_456).expect("time"),
            id: 42,
        };
        assert_eq!(Cursor::parse(&c.encode()), Some(c));
        assert_eq!(Cursor::parse("12_x"), None);
        assert_eq!(Cursor::parse("nonsense"), None);
    }
}
