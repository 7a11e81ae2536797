//! R21 on the dashboard: `/planning` ranks the pools by days left, soonest
//! first, each with a sparkline of its last 90 days; `/planning/pool` draws
//! one pool's stock by state and its demand over 90 days with the fitted
//! rate and the projection to run-out, as server-side SVG with the same
//! numbers in a table beside it; `/planning.csv` is the history.

use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use chrono::{Duration, NaiveDate};
use serde::Deserialize;

use super::csv;
use super::error::{DashError, Written, commit};
use super::session::{Staff, audit_on};
use super::view::{Chrome, Select, fmt_time, page, see_other, url_with};
use crate::db::Db;
use crate::domain::{Profile, Site};
use crate::forecast::{self, PoolForecast};
use crate::planning::{self, PoolDay};

/// The days a chart and the CSV cover.
pub const CHART_DAYS: i32 = 90;
/// A sparkline's width per day and height, in SVG user units.
const SPARK_DAY: f64 = 2.0;
const SPARK_HEIGHT: f64 = 30.0;
/// The pool chart: width per day, the stock's and the demand's heights.
const DAY_WIDTH: f64 = 6.0;
const STOCK_HEIGHT: f64 = 160.0;
const DEMAND_HEIGHT: f64 = 60.0;
/// The projection drawn past today, in days at most.
const PROJECTION_DAYS: i64 = 60;

/// Pools per page of `/planning`: the ranking is over every pool, the
/// sparklines are read and drawn for the page's pools only.
pub const PAGE_POOLS: usize = 50;

#[derive(Debug, Default, Deserialize)]
pub struct PlanningQuery {
    #[serde(default)]
    site: String,
    #[serde(default)]
    profile: String,
    /// 1-based page of the ranking (absent: the first).
    page: Option<usize>,
}

fn filters(q: &PlanningQuery) -> Result<(Option<Site>, Option<Profile>), DashError> {
    let site = match q.site.trim() {
        "" => None,
        s => Some(Site::parse(s).map_err(|e| DashError::bad_request(e.to_string()))?),
    };
    let profile = match q.profile.trim() {
        "" => None,
        s => Some(Profile::parse(s).map_err(|e| DashError::bad_request(e.to_string()))?),
    };
    Ok((site, profile))
}

/// One pool's row on `/planning`.
pub struct PoolRow {
    pub f: PoolForecast,
    pub demand: String,
    pub days_left: String,
    pub run_out: String,
    pub band: String,
    pub order_by: String,
    pub link: String,
    pub spark: String,
    pub spark_label: String,
}

fn date_or(d: Option<NaiveDate>, none: &str) -> String {
    d.map_or_else(|| none.to_owned(), |d| d.to_string())
}

/// The words of a forecast, shared by both pages.
fn words(f: &PoolForecast) -> (String, String, String, String, String) {
    let demand = match f.demand_per_day {
        None => "no history yet".to_owned(),
        Some(r) => format!("{r:.1} a day"),
    };
    let days_left = match (f.demand_per_day, f.days_left) {
        (None, _) => "no history yet".to_owned(),
        (_, None) => "no demand".to_owned(),
        (_, Some(d)) => format!("{d:.1}"),
    };
    let band = match (f.run_out_low, f.run_out_high) {
        (Some(lo), Some(hi)) => format!("{lo} to {hi}"),
        (Some(lo), None) => format!("{lo} or never"),
        _ => String::new(),
    };
    let order_by = date_or(f.order_by, "");
    (
        demand,
        days_left,
        date_or(f.run_out, "none"),
        band,
        order_by,
    )
}

/// The sellable stock of the last `CHART_DAYS` days as a polyline's
/// points, scaled to the highest day; a day without a row is left out.
fn sparkline(today: NaiveDate, days: &[(NaiveDate, i64)]) -> (String, String) {
    let start = today - Duration::days(i64::from(CHART_DAYS));
    let peak = days.iter().map(|d| d.1).max().unwrap_or(0).max(1) as f64;
    let points: Vec<String> = days
        .iter()
        .map(|(day, sellable)| {
            let x = (*day - start).num_days() as f64 * SPARK_DAY;
            let y = SPARK_HEIGHT - (SPARK_HEIGHT - 2.0) * *sellable as f64 / peak;
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let label = match (days.first(), days.last()) {
        (Some(first), Some(last)) => format!(
            "sellable at the day's end: {} on {}, {} on {}, at most {}",
            first.1, first.0, last.1, last.0, peak as i64
        ),
        _ => "no history yet".to_owned(),
    };
    (points.join(" "), label)
}

#[derive(Template)]
#[template(path = "planning.html")]
struct PlanningPage {
    chrome: Chrome,
    as_of: String,
    rows: Vec<PoolRow>,
    /// Every pool of the filters, and how many of them are flagged.
    pools: usize,
    flagged: usize,
    /// The page's first and last pool (1-based), and the pager's links.
    first_shown: usize,
    last_shown: usize,
    previous: Option<String>,
    next: Option<String>,
    sites: Select,
    profiles: Select,
    csv: String,
    spark_width: f64,
}

/// The page `asked` (1-based, absent: the first) of `pools` pools, and
/// how many pages there are; a page that does not exist is a 400.
fn page_at(asked: Option<usize>, pools: usize) -> Result<(usize, usize), DashError> {
    let pages = pools.div_ceil(PAGE_POOLS).max(1);
    let at = asked.unwrap_or(1);
    if at == 0 || at > pages {
        return Err(DashError::bad_request(format!(
            "page {at} does not exist: the pools of these filters fill pages 1 to {pages}"
        )));
    }
    Ok((at, pages))
}

pub(crate) async fn list(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    q: web::Query<PlanningQuery>,
) -> Result<HttpResponse, DashError> {
    let (site, profile) = filters(&q)?;
    let fc = forecast::read_from(
        pool.get_ref(),
        staff.org_id,
        site.as_ref(),
        profile.as_ref(),
    )
    .await?;
    let page_of = |n: usize| {
        url_with(
            "/planning",
            &[
                ("site", &q.site),
                ("profile", &q.profile),
                ("page", &n.to_string()),
            ],
        )
    };
    let (at, pages) = page_at(q.page, fc.pools.len())?;
    let shown = &fc.pools[(at - 1) * PAGE_POOLS..(at * PAGE_POOLS).min(fc.pools.len())];
    let keys: Vec<(&str, &str)> = shown
        .iter()
        .map(|f| (f.site.as_str(), f.profile.as_str()))
        .collect();
    let stock = planning::sellable_days(pool.get_ref(), staff.org_id, &keys, CHART_DAYS).await?;
    let mut by_pool: BTreeMap<(&str, &str), Vec<(NaiveDate, i64)>> = BTreeMap::new();
    for (site, profile, day, sellable) in &stock {
        by_pool
            .entry((site.as_str(), profile.as_str()))
            .or_default()
            .push((*day, *sellable));
    }
    let (mut sites, mut profiles): (Vec<String>, Vec<String>) = fc
        .pools
        .iter()
        .map(|p| (p.site.clone(), p.profile.clone()))
        .unzip();
    sites.sort();
    sites.dedup();
    profiles.sort();
    profiles.dedup();
    let rows = shown
        .iter()
        .map(|f| {
            let days = by_pool
                .get(&(f.site.as_str(), f.profile.as_str()))
                .map_or(&[][..], Vec::as_slice);
            let (spark, spark_label) = sparkline(fc.today, days);
            let (demand, days_left, run_out, band, order_by) = words(f);
            PoolRow {
                link: url_with(
                    "/planning/pool",
                    &[("site", &f.site), ("profile", &f.profile)],
                ),
                f: f.clone(),
                demand,
                days_left,
                run_out,
                band,
                order_by,
                spark,
                spark_label,
            }
        })
        .collect();
    page(&PlanningPage {
        chrome: Chrome::new(&req, &staff, "Planning", "planning"),
        as_of: fmt_time(&fc.as_of),
        rows,
        pools: fc.pools.len(),
        flagged: fc.pools.iter().filter(|f| f.flagged).count(),
        first_shown: (at - 1) * PAGE_POOLS + 1,
        last_shown: (at - 1) * PAGE_POOLS + shown.len(),
        previous: (at > 1).then(|| page_of(at - 1)),
        next: (at < pages).then(|| page_of(at + 1)),
        sites: Select::of("planning-site", "site", "Site", &sites, Some(&q.site)),
        profiles: Select::of(
            "planning-profile",
            "profile",
            "Profile",
            &profiles,
            Some(&q.profile),
        ),
        csv: url_with(
            "/planning.csv",
            &[("site", &q.site), ("profile", &q.profile)],
        ),
        spark_width: f64::from(CHART_DAYS) * SPARK_DAY,
    })
}

/// `/planning.csv`: the history of the pools filtered, `CHART_DAYS` days.
pub(crate) async fn export(
    staff: Staff,
    pool: web::Data<Db>,
    q: web::Query<PlanningQuery>,
) -> Result<HttpResponse, DashError> {
    let (site, profile) = filters(&q)?;
    let days = planning::history(
        pool.get_ref(),
        staff.org_id,
        site.as_ref(),
        profile.as_ref(),
        CHART_DAYS,
    )
    .await?;
    let body = csv::render(
        &[
            "site",
            "profile",
            "day",
            "total",
            "sellable",
            "held",
            "sold",
            "not_ready",
            "created",
            "converted",
            "expired",
            "cancelled",
            "refused_unavailable",
            "refused_contended",
            "refused_reserved",
            "refused_customer_limit",
            "substituted_in",
            "substituted_out",
            "added",
            "retired",
            "demand",
        ],
        days.into_iter().map(|d| {
            let n = [
                d.total,
                d.sellable,
                d.held,
                d.sold,
                d.not_ready,
                d.created,
                d.converted,
                d.expired,
                d.cancelled,
                d.refused.unavailable,
                d.refused.contended,
                d.refused.reserved,
                d.refused.customer_limit,
                d.substituted_in,
                d.substituted_out,
                d.added,
                d.retired,
                d.demand,
            ];
            [d.site, d.profile, d.day.to_string()]
                .into_iter()
                .chain(n.iter().map(i64::to_string))
                .collect()
        }),
    );
    Ok(csv::response("planning.csv", body))
}

/// A bar of the pool chart.
pub struct Bar {
    pub class: &'static str,
    pub x: f64,
    pub y: f64,
    pub height: f64,
    pub label: String,
}

/// A line of the pool chart.
pub struct Line {
    pub class: &'static str,
    pub x1: f64,
    pub y1: f64,
    pub x2: f64,
    pub y2: f64,
    pub label: String,
}

/// One day of the pool's table.
pub struct DayRow {
    pub d: PoolDay,
    pub served: i64,
    pub refused: i64,
}

/// The pool chart: stock by state stacked per day on top, demand by kind
/// stacked per day below, the fitted rate over the window and the
/// projection from today's available stock to its run-out.
pub struct Chart {
    pub days: i32,
    pub width: f64,
    pub height: f64,
    pub demand_top: f64,
    pub today_x: f64,
    pub bars: Vec<Bar>,
    pub lines: Vec<Line>,
    pub summary: String,
}

fn stack(
    bars: &mut Vec<Bar>,
    x: f64,
    bottom: f64,
    scale: f64,
    day: NaiveDate,
    parts: &[(&'static str, &str, i64)],
) {
    let mut top = bottom;
    for (class, words, n) in parts {
        if *n <= 0 {
            continue;
        }
        let height = *n as f64 * scale;
        top -= height;
        bars.push(Bar {
            class,
            x,
            y: top,
            height,
            label: format!("{day}: {n} {words}"),
        });
    }
}

fn day_parts(d: &PoolDay) -> (i64, i64) {
    let refused = d.refused.unavailable + d.refused.reserved + d.refused.customer_limit;
    (d.demand - refused - d.substituted_out, refused)
}

fn chart(today: NaiveDate, days: &[DayRow], f: &PoolForecast) -> Chart {
    let start = today - Duration::days(i64::from(CHART_DAYS));
    let width = f64::from(CHART_DAYS) * DAY_WIDTH + PROJECTION_DAYS as f64 * DAY_WIDTH;
    let today_x = f64::from(CHART_DAYS) * DAY_WIDTH;
    let peak_stock = days
        .iter()
        .map(|r| r.d.total)
        .chain([f.available])
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let peak_demand = days
        .iter()
        .map(|r| r.d.demand)
        .max()
        .unwrap_or(0)
        .max(f.demand_per_day.map_or(0, |r| r.ceil() as i64))
        .max(1) as f64;
    let stock_scale = STOCK_HEIGHT / peak_stock;
    let demand_scale = DEMAND_HEIGHT / peak_demand;
    let demand_top = STOCK_HEIGHT + 20.0;
    let demand_bottom = demand_top + DEMAND_HEIGHT;
    let mut bars = Vec::new();
    for r in days {
        let x = (r.d.day - start).num_days() as f64 * DAY_WIDTH;
        let d = &r.d;
        stack(
            &mut bars,
            x,
            STOCK_HEIGHT,
            stock_scale,
            d.day,
            &[
                ("st-sellable", "sellable", d.sellable),
                ("st-held", "held", d.held),
                ("st-sold", "sold", d.sold),
                ("st-not_ready", "not ready", d.not_ready),
            ],
        );
        stack(
            &mut bars,
            x,
            demand_bottom,
            demand_scale,
            d.day,
            &[
                ("dm-served", "sold as asked", r.served),
                (
                    "dm-substituted",
                    "served by a substitute",
                    d.substituted_out,
                ),
                ("dm-refused", "refused for want of stock", r.refused),
            ],
        );
    }
    let lines = projection(f, today, today_x, stock_scale, demand_bottom, demand_scale);
    let (demand, days_left, run_out, band, _) = words(f);
    Chart {
        days: CHART_DAYS,
        width,
        height: demand_bottom + 4.0,
        demand_top,
        today_x,
        bars,
        lines,
        summary: format!(
            "{} {}: stock by state per day over {CHART_DAYS} days and demand per day below it; \
             fitted demand {demand}; {} available now; days left {days_left}; run-out {run_out}{}",
            f.site,
            f.profile,
            f.available,
            if band.is_empty() {
                String::new()
            } else {
                format!(" (band {band})")
            }
        ),
    }
}

/// The fitted rate across the window, and from today the available stock
/// falling at the rate (and at the band's rates) to zero.
fn projection(
    f: &PoolForecast,
    today: NaiveDate,
    today_x: f64,
    stock_scale: f64,
    demand_bottom: f64,
    demand_scale: f64,
) -> Vec<Line> {
    let mut lines = Vec::new();
    let Some(rate) = f.demand_per_day else {
        return lines;
    };
    let y = demand_bottom - rate * demand_scale;
    lines.push(Line {
        class: "fit",
        x1: today_x - f64::from(forecast::WINDOW_DAYS) * DAY_WIDTH,
        y1: y,
        x2: today_x,
        y2: y,
        label: format!(
            "fitted demand over the last {} days: {rate:.1} a day",
            forecast::WINDOW_DAYS
        ),
    });
    let top = STOCK_HEIGHT - f.available as f64 * stock_scale;
    for (class, date, words) in [
        ("proj", f.run_out, "projected run-out"),
        ("proj-band", f.run_out_low, "soonest run-out of the band"),
        ("proj-band", f.run_out_high, "latest run-out of the band"),
    ] {
        let Some(date) = date else { continue };
        let days = (date - today).num_days().clamp(0, PROJECTION_DAYS);
        lines.push(Line {
            class,
            x1: today_x,
            y1: top,
            x2: today_x + days as f64 * DAY_WIDTH,
            y2: if (date - today).num_days() <= PROJECTION_DAYS {
                STOCK_HEIGHT
            } else {
                top + (STOCK_HEIGHT - top) * PROJECTION_DAYS as f64
                    / (date - today).num_days() as f64
            },
            label: format!("{words}: {date}"),
        });
    }
    lines
}

#[derive(Template)]
#[template(path = "planning_pool.html")]
struct PoolPage {
    chrome: Chrome,
    as_of: String,
    f: PoolForecast,
    demand: String,
    days_left: String,
    run_out: String,
    band: String,
    order_by: String,
    chart: Chart,
    days: Vec<DayRow>,
    csv: String,
}

pub(crate) async fn pool_page(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    q: web::Query<PlanningQuery>,
) -> Result<HttpResponse, DashError> {
    let (Some(site), Some(profile)) = filters(&q)? else {
        return Err(DashError::bad_request(
            "A pool is a site and a profile: give both (site=…&profile=…).",
        ));
    };
    let fc = forecast::read_from(pool.get_ref(), staff.org_id, Some(&site), Some(&profile)).await?;
    let Some(f) = fc.pools.into_iter().next() else {
        return Err(DashError::NotFound("pool"));
    };
    let days: Vec<DayRow> = planning::history(
        pool.get_ref(),
        staff.org_id,
        Some(&site),
        Some(&profile),
        CHART_DAYS,
    )
    .await?
    .into_iter()
    .map(|d| {
        let (served, refused) = day_parts(&d);
        DayRow { d, served, refused }
    })
    .collect();
    let chart = chart(fc.today, &days, &f);
    let (demand, days_left, run_out, band, order_by) = words(&f);
    page(&PoolPage {
        chrome: Chrome::new(
            &req,
            &staff,
            format!("Planning: {} {}", f.site, f.profile),
            "planning",
        ),
        as_of: fmt_time(&fc.as_of),
        csv: url_with(
            "/planning.csv",
            &[("site", &f.site), ("profile", &f.profile)],
        ),
        f,
        demand,
        days_left,
        run_out,
        band,
        order_by,
        chart,
        days,
    })
}

/// Each of `sites`' lead time, and whether staff set it (else the
/// default), for the settings page.
pub async fn lead_times_of_sites(
    pool: &Db,
    org_id: i64,
    sites: &[String],
) -> Result<Vec<(String, i32, bool)>, DashError> {
    let set: BTreeMap<String, i32> = planning::lead_times(pool, org_id)
        .await?
        .into_iter()
        .collect();
    let mut all: Vec<String> = sites.iter().chain(set.keys()).cloned().collect();
    all.sort();
    all.dedup();
    Ok(all
        .into_iter()
        .map(|site| match set.get(&site) {
            Some(d) => (site, *d, true),
            None => (site, planning::DEFAULT_LEAD_TIME_DAYS, false),
        })
        .collect())
}

#[derive(Debug, Deserialize)]
pub struct LeadTimeForm {
    #[serde(default)]
    site: String,
    #[serde(default)]
    days: String,
}

/// `POST /settings/lead-time` (admin): R21's lead time of a site, with its
/// audit row in the same transaction.
pub(crate) async fn save_lead_time(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    form: web::Form<LeadTimeForm>,
) -> Result<HttpResponse, DashError> {
    let bad = |what: String| DashError::bad_request(format!("{what}; nothing was changed."));
    let site = Site::parse(form.site.trim()).map_err(|e| bad(e.to_string()))?;
    let days = super::input::whole_number::<i64>(form.days.trim())
        .and_then(|d| planning::lead_time_days(d).ok())
        .ok_or_else(|| {
            bad(format!(
                "“Lead time” is a whole number of days from 1 to {}",
                planning::MAX_LEAD_TIME_DAYS
            ))
        })?;
    let mut tx = pool.begin().await?;
    let before = planning::set_lead_time(&mut tx, staff.org_id, &site, days, &staff.email).await?;
    audit_on(
        &mut tx,
        &req,
        &staff,
        crate::audit::AuditAction::SiteLeadTimeSet,
        &format!("site:{site}"),
        Some(&format!("{before} -> {days} days")),
    )
    .await?;
    commit(
        tx,
        Written::new(
            "the lead time of the site",
            "The settings page lists the lead times in force now; save it again if it is not the one you chose.",
            ("/settings#lead-times", "Open the settings"),
        ),
    )
    .await?;
    Ok(see_other(&format!(
        "{}#lead-times",
        super::layout::Flash::LeadTimeSaved.after("/settings")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap_or_default()
    }

    fn forecast(available: i64, rate: Option<f64>, run_out: Option<&str>) -> PoolForecast {
        PoolForecast {
            site: "par1".into(),
            profile: "epyc".into(),
            available,
            demand_per_day: rate,
            days_left: rate.map(|r| available as f64 / r),
            run_out: run_out.map(day),
            run_out_low: run_out.map(day),
            run_out_high: None,
            lead_time_days: 30,
            order_by: None,
            flagged: false,
            history_days: 28,
        }
    }

    #[test]
    fn the_projection_falls_from_today_to_zero_at_the_run_out() {
        let f = forecast(30, Some(3.0), Some("2026-12-11"));
        let lines = projection(&f, day("2026-12-01"), 540.0, 1.0, 240.0, 10.0);
        let fit = &lines[0];
        assert_eq!((fit.class, fit.y1, fit.y2), ("fit", 210.0, 210.0));
        assert_eq!(fit.x1, 540.0 - 28.0 * DAY_WIDTH);
        let proj = &lines[1];
        assert_eq!(proj.class, "proj");
        assert_eq!((proj.x1, proj.y1), (540.0, STOCK_HEIGHT - 30.0));
        assert_eq!((proj.x2, proj.y2), (540.0 + 10.0 * DAY_WIDTH, STOCK_HEIGHT));
        // No late date in the band: no line for it.
        assert_eq!(lines.len(), 3);
    }

    #[test]
    fn a_pool_without_history_says_so() {
        let f = forecast(5, None, None);
        let (demand, days_left, run_out, band, order_by) = words(&f);
        assert_eq!(demand, "no history yet");
        assert_eq!(days_left, "no history yet");
        assert_eq!(run_out, "none");
        assert!(band.is_empty() && order_by.is_empty());
        assert!(projection(&f, day("2026-12-01"), 540.0, 1.0, 240.0, 10.0).is_empty());
        let f = PoolForecast {
            demand_per_day: Some(0.0),
            days_left: None,
            ..forecast(5, None, None)
        };
        assert_eq!(words(&f).1, "no demand");
    }
}
