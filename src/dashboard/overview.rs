//! `/`: the pool per site at a glance, with a server-rendered SVG bar.

use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use sqlx::PgPool;

use super::error::DashError;
use super::session::Staff;
use super::view::{Chrome, page};

#[derive(sqlx::FromRow)]
struct SiteCounts {
    site: String,
    total: i64,
    sellable: i64,
    held: i64,
    sold: i64,
    not_ready: i64,
    expired_24h: i64,
    cancelled_24h: i64,
}

pub struct Segment {
    pub label: &'static str,
    pub class: &'static str,
    pub count: i64,
    pub x: f64,
    pub width: f64,
}

pub struct SiteView {
    pub site: String,
    pub total: i64,
    pub sellable: i64,
    pub held: i64,
    pub sold: i64,
    pub not_ready: i64,
    pub expired_24h: i64,
    pub cancelled_24h: i64,
    pub segments: Vec<Segment>,
    pub summary: String,
}

/// Width of the SVG bar, in user units (the viewBox scales it).
const BAR: f64 = 600.0;

fn segments(c: &SiteCounts) -> Vec<Segment> {
    let parts = [
        ("sellable", "seg-sellable", c.sellable),
        ("held", "seg-held", c.held),
        ("sold", "seg-sold", c.sold),
        ("not ready", "seg-notready", c.not_ready),
    ];
    let mut x = 0.0;
    let mut out = Vec::new();
    for (label, class, count) in parts {
        let width = if c.total > 0 {
            BAR * count as f64 / c.total as f64
        } else {
            0.0
        };
        out.push(Segment {
            label,
            class,
            count,
            x,
            width,
        });
        x += width;
    }
    out
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    chrome: Chrome,
    sites: Vec<SiteView>,
    demand: super::demand::OverviewDemand,
}

pub(crate) async fn overview(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<PgPool>,
) -> Result<HttpResponse, DashError> {
    // The four categories are disjoint: a live service link wins, then a
    // held reservation; what is left is sellable when ready, not ready
    // otherwise. Held/sold are derived, never stored (schema comment).
    let rows: Vec<SiteCounts> = sqlx::query_as(
        "WITH pool AS (
            SELECT m.site,
                   (s.machine_id IS NOT NULL) AS sold,
                   (s.machine_id IS NULL AND r.machine_id IS NOT NULL) AS held,
                   (s.machine_id IS NULL AND r.machine_id IS NULL AND m.status = 'ready') AS sellable,
                   (s.machine_id IS NULL AND r.machine_id IS NULL AND m.status <> 'ready') AS not_ready
              FROM machines m
              LEFT JOIN reservations r ON r.machine_id = m.id AND r.state = 'held'
              LEFT JOIN service_links s ON s.machine_id = m.id AND s.ended_at IS NULL
             WHERE m.org_id = $1
         ), ended AS (
            SELECT m.site,
                   count(*) FILTER (WHERE r.state = 'expired') AS expired_24h,
                   count(*) FILTER (WHERE r.state = 'cancelled') AS cancelled_24h
              FROM reservations r JOIN machines m ON m.id = r.machine_id
             WHERE r.org_id = $1 AND r.ended_at IS NOT NULL
               AND r.ended_at > clock_timestamp() - interval '24 hours'
             GROUP BY m.site
         )
         SELECT p.site, count(*) AS total,
                count(*) FILTER (WHERE p.sellable) AS sellable,
                count(*) FILTER (WHERE p.held) AS held,
                count(*) FILTER (WHERE p.sold) AS sold,
                count(*) FILTER (WHERE p.not_ready) AS not_ready,
                coalesce(max(e.expired_24h), 0) AS expired_24h,
                coalesce(max(e.cancelled_24h), 0) AS cancelled_24h
           FROM pool p LEFT JOIN ended e ON e.site = p.site
          GROUP BY p.site ORDER BY p.site",
    )
    .bind(staff.org_id)
    .fetch_all(pool.get_ref())
    .await?;
    let sites = rows
        .into_iter()
        .map(|c| SiteView {
            summary: format!(
                "{}: {} machines, {} sellable now, {} held, {} sold, {} not ready",
                c.site, c.total, c.sellable, c.held, c.sold, c.not_ready
            ),
            segments: segments(&c),
            site: c.site,
            total: c.total,
            sellable: c.sellable,
            held: c.held,
            sold: c.sold,
            not_ready: c.not_ready,
            expired_24h: c.expired_24h,
            cancelled_24h: c.cancelled_24h,
        })
        .collect();
    page(&OverviewPage {
        chrome: Chrome::new(&req, &staff, "Overview", "overview"),
        sites,
        demand: super::demand::overview_part(pool.get_ref(), staff.org_id).await?,
    })
}
