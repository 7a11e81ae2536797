//! `/reservations` and `/reservations.csv`: the live list of held
//! reservations, soonest deadline first, and every row of it as CSV.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::super::csv;
use super::super::error::DashError;
use super::super::session::Staff;
use super::super::view::{Chrome, Select, fmt_remaining, fmt_time, non_blank, page, url_with};
use crate::domain::{CustomerRef, Site};
use crate::holds::{self, Cursor, HeldLine, LiveFilter};
use crate::inventory;

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
    /// R19, R18: the end customer and the segment the order named (empty: none).
    pub customer_ref: String,
    pub segment: String,
    /// R20: (served, asked) when a declared substitute serves the order.
    pub substituted: Option<(String, String)>,
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
    /// R19: one end customer's holds.
    pub customer: Option<String>,
}

#[derive(Template)]
#[template(path = "reservations.html")]
struct ReservationsPage {
    chrome: Chrome,
    can_act: bool,
    site: String,
    site_select: Select,
    customer: String,
    /// With a customer: its live holds against the organization's cap.
    against_cap: Option<String>,
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

/// One row of the list as the page shows it.
fn live_view(line: HeldLine) -> LiveView {
    let r = line.reservation;
    LiveView {
        id: r.id,
        order_ref: r.order_ref,
        asset_tag: line.asset_tag,
        site: line.site,
        fence: r.fence,
        quantity: r.quantity,
        slot: r.slot,
        remaining: line.remaining.max(0),
        remaining_text: fmt_remaining(line.remaining),
        overdue: line.remaining <= 0,
        soon: line.remaining > 0 && line.remaining < SOON_SECONDS,
        replaced: line
            .replaced_tag
            .zip(line.replaced_at.as_ref().map(fmt_time)),
        customer_ref: r.customer_ref.unwrap_or_default(),
        segment: r.segment.unwrap_or_default(),
        substituted: r
            .substituted
            .then(|| (r.machine.profile.clone(), r.profile_asked.clone())),
    }
}

/// R19 in words: where a customer stands against the organization's cap.
fn cap_words(customer: &str, live: i64, cap: i32) -> String {
    let holds = crate::domain::count_of(live, "live machine", "live machines");
    match i64::from(cap) {
        0 => format!("Customer {customer} holds {holds}; the organization caps no customer."),
        cap if live >= cap => format!(
            "Customer {customer} holds {holds} of the {cap} the organization allows one customer: at the cap, a new order of theirs is refused."
        ),
        cap => format!(
            "Customer {customer} holds {holds} of the {cap} the organization allows one customer."
        ),
    }
}

/// The filters of `/reservations` (and its CSV), parsed.
fn live_filter(q: &LiveQuery) -> Result<LiveFilter, DashError> {
    let site = non_blank(&q.site)
        .map(Site::parse)
        .transpose()
        .map_err(|e| DashError::bad_request(e.to_string()))?;
    let within = non_blank(&q.within)
        .map(|w| {
            crate::dashboard::input::whole_number::<i32>(w)
                .filter(|m| (1..=1440).contains(m))
                .ok_or_else(|| {
                    DashError::bad_request(
                        "“Expiring within” is a whole number of minutes from 1 to 1440.",
                    )
                })
        })
        .transpose()?;
    let customer = non_blank(&q.customer)
        .map(CustomerRef::parse)
        .transpose()
        .map_err(|e| DashError::bad_request(e.to_string()))?;
    Ok(LiveFilter {
        site,
        within,
        customer,
    })
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
    // Independent reads, run together (see `machines::list`).
    let against_cap = async {
        match &f.customer {
            Some(c) => holds::customer_against_cap(&pool, staff.org_id, c)
                .await
                .map(Some),
            None => Ok(None),
        }
    };
    let (mut rows, (total, refreshed_at), facets, against_cap) = tokio::try_join!(
        holds::held_page(&pool, staff.org_id, &f, cursor, backwards, LIVE_PAGE + 1),
        holds::count_held(&pool, staff.org_id, &f),
        inventory::facets(&pool, staff.org_id),
        against_cap,
    )?;
    let more = rows.len() as i64 > LIVE_PAGE;
    rows.truncate(LIVE_PAGE as usize);
    if backwards {
        rows.reverse();
    }
    let (has_next, has_prev) = if backwards {
        (true, more)
    } else {
        (more, after.is_some())
    };
    let within_text = within.map(|w| w.to_string()).unwrap_or_default();
    let sites = facets.sites;
    let site_text = site.as_ref().map_or("", |s| s.as_str());
    let customer_text = f.customer.as_ref().map_or("", |c| c.as_str());
    let link = |key: &str, c: &HeldLine| {
        let c = Cursor {
            expires_at: c.reservation.expires_at,
            id: c.reservation.id,
        }
        .encode();
        url_with(
            "/reservations",
            &[
                ("site", site_text),
                ("within", &within_text),
                ("customer", customer_text),
                (key, &c),
            ],
        )
    };
    let next = rows.last().filter(|_| has_next).map(|r| link("after", r));
    let prev = rows.first().filter(|_| has_prev).map(|r| link("before", r));
    let rows: Vec<LiveView> = rows.into_iter().map(live_view).collect();
    page(&ReservationsPage {
        chrome: Chrome::new(&req, &staff, "Live reservations", "reservations"),
        can_act: staff.can_act(),
        site: site_text.to_owned(),
        site_select: Select::of("l-site", "site", "Site", &sites, Some(site_text)),
        customer: customer_text.to_owned(),
        against_cap: against_cap.map(|(live, cap)| cap_words(customer_text, live, cap)),
        csv: url_with(
            "/reservations.csv",
            &[
                ("site", site_text),
                ("within", &within_text),
                ("customer", customer_text),
            ],
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
    let rows = holds::held_page(&pool, staff.org_id, &f, None, false, csv::MAX_ROWS).await?;
    let body = csv::render(
        &[
            "reservation",
            "order_ref",
            "asset_tag",
            "site",
            "expires_at",
            "seconds_left",
            "customer_ref",
            "segment",
            "profile",
            "profile_asked",
        ],
        rows.into_iter().map(|line| {
            let r = line.reservation;
            vec![
                r.id.to_string(),
                r.order_ref,
                line.asset_tag,
                line.site,
                fmt_time(&r.expires_at),
                line.remaining.max(0).to_string(),
                r.customer_ref.unwrap_or_default(),
                r.segment.unwrap_or_default(),
                r.machine.profile,
                r.profile_asked,
            ]
        }),
    );
    Ok(csv::response("reservations.csv", body))
}
