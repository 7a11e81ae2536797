//! `/`: the pool per site at a glance. Per site: a bar (sellable, held,
//! sold, not ready) whose numbers are in the table below it, not repeated;
//! a table by hardware profile (what the datacenter team buys by); and a
//! server-rendered SVG of the last 24 hours (created, converted, expired,
//! cancelled per hour). No JavaScript.
//!
//! The page is a list of sections; a later section (e.g. refusals) is
//! appended after the per-site ones in `overview.html`.

use std::collections::BTreeMap;

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use chrono::{DateTime, Duration, Timelike, Utc};
use futures_util::TryFutureExt;

use super::error::DashError;
use super::session::Staff;
use super::view::{Chrome, page};
use crate::{activity, capacity};

/// One row of a site's table: a profile, or the site's total.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub sellable: i64,
    pub held: i64,
    pub sold: i64,
    pub not_ready: i64,
}

impl Counts {
    pub fn total(&self) -> i64 {
        self.sellable + self.held + self.sold + self.not_ready
    }

    fn add(&mut self, o: &Counts) {
        self.sellable += o.sellable;
        self.held += o.held;
        self.sold += o.sold;
        self.not_ready += o.not_ready;
    }
}

pub struct Segment {
    pub label: &'static str,
    pub class: &'static str,
    pub count: i64,
    pub x: f64,
    pub width: f64,
}

/// One bar of the 24-hour chart.
pub struct HourBar {
    pub class: &'static str,
    pub label: &'static str,
    pub hour: String,
    pub count: i64,
    pub x: f64,
    pub y: f64,
    pub height: f64,
}

pub struct Tick {
    pub x: f64,
    pub text: String,
}

/// R17, R18: a profile's headroom at a site and what is left to orders
/// without a segment, from `capacity_pools` (sql/capacity.sql).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headroom {
    /// (segment, machines kept for it), by segment.
    pub kept: Vec<(String, i64)>,
    /// What an order without a segment could take now.
    pub available: i64,
}

impl Headroom {
    /// "2 for enterprise, 1 for repairs"; empty when nothing is kept.
    pub fn words(&self) -> String {
        self.kept
            .iter()
            .map(|(segment, n)| format!("{n} for {segment}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

pub struct ProfileView {
    pub profile: String,
    pub counts: Counts,
    pub headroom: Headroom,
}

pub struct SiteView {
    pub site: String,
    pub profiles: Vec<ProfileView>,
    pub total: Counts,
    pub segments: Vec<Segment>,
    pub summary: String,
    pub bars: Vec<HourBar>,
    pub ticks: Vec<Tick>,
    pub day_summary: String,
    /// Totals of the last 24 hours: created, converted, expired, cancelled.
    pub day: [i64; 4],
}

/// Width of the SVG bar, in user units (the viewBox scales it).
const BAR: f64 = 600.0;
/// The chart's drawing area, in user units.
const CHART_W: f64 = 600.0;
const CHART_H: f64 = 100.0;
const HOURS: usize = 24;
/// The four series, in the order of `SiteView::day`.
pub const SERIES: [(&str, &str); 4] = [
    ("created", "created"),
    ("converted", "converted"),
    ("expired", "expired"),
    ("cancelled", "cancelled"),
];

fn segments(c: &Counts) -> Vec<Segment> {
    let parts = [
        ("sellable", "seg-sellable", c.sellable),
        ("held", "seg-held", c.held),
        ("sold", "seg-sold", c.sold),
        ("not ready", "seg-notready", c.not_ready),
    ];
    let total = c.total();
    let mut x = 0.0;
    let mut out = Vec::new();
    for (label, class, count) in parts {
        let width = if total > 0 {
            BAR * count as f64 / total as f64
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

/// `per_hour[h][s]`: events of series `s` in hour `h` (0 the oldest of the
/// 24, 23 the current one), drawn as four thin bars per hour on one scale.
pub fn hour_bars(per_hour: &[[i64; 4]; HOURS], first_hour: DateTime<Utc>) -> Vec<HourBar> {
    let max = per_hour.iter().flatten().copied().max().unwrap_or(0).max(1);
    let slot = CHART_W / HOURS as f64;
    let width = slot / 5.0;
    let mut bars = Vec::new();
    for (h, counts) in per_hour.iter().enumerate() {
        let hour = (first_hour + Duration::hours(h as i64))
            .format("%H:00")
            .to_string();
        for (s, &count) in counts.iter().enumerate() {
            if count == 0 {
                continue;
            }
            let height = CHART_H * count as f64 / max as f64;
            bars.push(HourBar {
                class: SERIES[s].1,
                label: SERIES[s].0,
                hour: hour.clone(),
                count,
                x: h as f64 * slot + width * (s as f64 + 0.5),
                y: CHART_H - height,
                height,
            });
        }
    }
    bars
}

fn ticks(first_hour: DateTime<Utc>) -> Vec<Tick> {
    let slot = CHART_W / HOURS as f64;
    (0..HOURS)
        .step_by(6)
        .map(|h| Tick {
            x: h as f64 * slot,
            text: (first_hour + Duration::hours(h as i64))
                .format("%H:00")
                .to_string(),
        })
        .collect()
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    chrome: Chrome,
    sites: Vec<SiteView>,
    series: [(&'static str, &'static str); 4],
    /// Up to when the chart counts (UTC, to the minute).
    counted_until: String,
    /// When the pools were counted (the capacity snapshot's `as_of`).
    counted_at: String,
    demand: super::demand::OverviewDemand,
}

/// Each site's events per hour and series, from `first_hour` on.
fn hours_per_site(
    events: Vec<activity::HourCount>,
    first_hour: DateTime<Utc>,
) -> BTreeMap<String, [[i64; 4]; HOURS]> {
    let mut hours: BTreeMap<String, [[i64; 4]; HOURS]> = BTreeMap::new();
    for (site, kind, hour, count) in events {
        let (Some(s), Ok(h)) = (
            SERIES.iter().position(|(k, _)| *k == kind),
            usize::try_from((hour - first_hour).num_hours()),
        ) else {
            continue;
        };
        if h < HOURS {
            hours.entry(site).or_insert([[0; 4]; HOURS])[h][s] += count;
        }
    }
    hours
}

/// The pools' counts and headroom, per site then profile.
fn profiles_by_site(pools: Vec<capacity::Pool>) -> BTreeMap<String, Vec<ProfileView>> {
    let mut by_site: BTreeMap<String, Vec<ProfileView>> = BTreeMap::new();
    for r in pools {
        let counts = Counts {
            sellable: r.sellable,
            held: r.held,
            sold: r.sold,
            not_ready: r.not_ready,
        };
        let headroom = Headroom {
            kept: r.reserved.into_iter().collect(),
            available: r.available,
        };
        by_site.entry(r.site).or_default().push(ProfileView {
            profile: r.profile,
            counts,
            headroom,
        });
    }
    by_site
}

/// One site's table and chart, with their summaries in words.
fn site_view(
    site: String,
    profiles: Vec<ProfileView>,
    per_hour: &[[i64; 4]; HOURS],
    first_hour: DateTime<Utc>,
) -> SiteView {
    let mut total = Counts::default();
    for p in &profiles {
        total.add(&p.counts);
    }
    let mut day = [0i64; 4];
    for h in per_hour {
        for (s, n) in h.iter().enumerate() {
            day[s] += n;
        }
    }
    SiteView {
        summary: format!(
            "{site}: {}, {} sellable now, {} held, {} sold, {} not ready",
            crate::domain::count_of(total.total(), "machine", "machines"),
            total.sellable,
            total.held,
            total.sold,
            total.not_ready
        ),
        day_summary: format!(
            "{site}, last 24 hours, per hour: {} created, {} converted, {} expired, {} cancelled in all",
            day[0], day[1], day[2], day[3]
        ),
        segments: segments(&total),
        bars: hour_bars(per_hour, first_hour),
        ticks: ticks(first_hour),
        day,
        site,
        profiles,
        total,
    }
}

pub(crate) async fn overview(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    cache: web::Data<capacity::Cache>,
) -> Result<HttpResponse, DashError> {
    // One reading of the pools, the capacity API's own (R17's counts, the
    // same snapshot, kept POOLKEEPER_CAPACITY_CACHE_MS per process): the
    // site tables, the headroom and the demand's stock. Counting every
    // machine of the organization is the page's largest statement (10 ms
    // at 50,000 machines); staff reading the overview share it with the
    // shop front, and the page says when it was read.
    let snapshot = cache
        .read(pool.get_ref(), staff.org_id, &capacity::Filter::default())
        .await?;
    let pools = snapshot
        .pool_rows()
        .map_err(|e| DashError::Internal(anyhow::Error::new(e).context("a capacity snapshot")))?;
    let stock = pools
        .iter()
        .map(|p| (p.site.clone(), p.profile.clone(), p.sellable))
        .collect();
    // The last 24 hours by the database clock, in whole hours: the 23 past
    // hours and the current one, as the sweep's holder counted them
    // (crate::activity), up to `counted_until`. Read beside the demand
    // table: two independent reads, the page waits for the slower only.
    let ((first, events, counted_until), demand) = tokio::try_join!(
        activity::last_hours(pool.get_ref(), staff.org_id, HOURS as i32).err_into(),
        super::demand::overview_part(pool.get_ref(), staff.org_id, stock),
    )?;
    let first_hour = first.with_minute(0).unwrap_or(first);
    let mut hours = hours_per_site(events, first_hour);
    let sites = profiles_by_site(pools)
        .into_iter()
        .map(|(site, profiles)| {
            let per_hour = hours.remove(&site).unwrap_or([[0; 4]; HOURS]);
            site_view(site, profiles, &per_hour, first_hour)
        })
        .collect();
    page(&OverviewPage {
        chrome: Chrome::new(&req, &staff, "Overview", "overview"),
        sites,
        series: SERIES,
        counted_until: counted_until.format("%Y-%m-%d %H:%M UTC").to_string(),
        counted_at: snapshot.as_of.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        demand,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tallest_hour_fills_the_chart_and_empty_hours_draw_nothing() {
        let mut per_hour = [[0i64; 4]; HOURS];
        per_hour[23][0] = 4;
        per_hour[0][3] = 2;
        let bars = hour_bars(&per_hour, DateTime::UNIX_EPOCH);
        assert_eq!(bars.len(), 2);
        let created = bars.iter().find(|b| b.label == "created").expect("bar");
        assert_eq!((created.height, created.y), (CHART_H, 0.0));
        assert_eq!(created.hour, "23:00");
        let cancelled = bars.iter().find(|b| b.label == "cancelled").expect("bar");
        assert_eq!(cancelled.height, CHART_H / 2.0);
        assert!(cancelled.x < created.x);
    }

    #[test]
    fn headroom_is_said_per_segment() {
        let h = Headroom {
            kept: vec![("enterprise".into(), 2), ("repairs".into(), 1)],
            available: 0,
        };
        assert_eq!(h.words(), "2 for enterprise, 1 for repairs");
        assert_eq!(Headroom::default().words(), "");
    }
}
