//! Lost demand on the dashboard: `/demand` lists the specs most
//! refused, each with a link to why-not; the overview's part (per site and
//! profile, with a chart per hour) is built here too, so that the overview
//! only includes it.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde_json::Value;

use super::csv;
use super::error::DashError;
use super::session::Staff;
use super::view::{Chrome, fmt_time, page, url_with};
use crate::allocator::Exclusion;
use crate::demand::{self, CHART_HOURS, SiteProfileDemand};

/// Rows of `/demand`.
const DEMAND_ROWS: i64 = 100;
/// Rows of the overview's part.
const OVERVIEW_ROWS: usize = 50;

pub struct RefusedSpecView {
    pub site: String,
    pub profile: String,
    pub vendor: String,
    pub unavailable_24h: i64,
    pub unavailable_7d: i64,
    pub contended_7d: i64,
    pub last_at: String,
    /// The latest `unavailable` refusal's excluded counts, as "held 3, not_ready 1".
    pub last_excluded: String,
    pub why_not: String,
}

/// "held 3, not_ready 1": the non-zero counts, in the allocator's order.
fn excluded_summary(excluded: Option<&Value>) -> String {
    let Some(Value::Object(map)) = excluded else {
        return String::new();
    };
    let parts: Vec<String> = Exclusion::KEYS
        .iter()
        .filter_map(|k| {
            let n = map.get(*k).and_then(Value::as_i64).unwrap_or(0);
            (n > 0).then(|| format!("{k} {n}"))
        })
        .collect();
    if parts.is_empty() {
        "no machines at all".to_owned()
    } else {
        parts.join(", ")
    }
}

#[derive(Template)]
#[template(path = "demand.html")]
struct DemandPage {
    chrome: Chrome,
    specs: Vec<RefusedSpecView>,
}

/// What `/demand` lists (and its CSV holds).
async fn refused_specs(pool: &Db, org_id: i64) -> Result<Vec<RefusedSpecView>, DashError> {
    Ok(demand::most_refused(pool, org_id, DEMAND_ROWS)
        .await?
        .into_iter()
        .map(|s| {
            let vendor = s.vendor.clone().unwrap_or_default();
            RefusedSpecView {
                why_not: url_with(
                    "/why-not",
                    &[
                        ("site", &s.site),
                        ("profile", &s.profile),
                        ("vendor", &vendor),
                    ],
                ),
                last_excluded: excluded_summary(s.last_excluded.as_ref().map(|j| &j.0)),
                last_at: fmt_time(&s.last_at),
                site: s.site,
                profile: s.profile,
                vendor,
                unavailable_24h: s.unavailable_24h,
                unavailable_7d: s.unavailable_7d,
                contended_7d: s.contended_7d,
            }
        })
        .collect())
}

pub(crate) async fn demand(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
) -> Result<HttpResponse, DashError> {
    let specs = refused_specs(&pool, staff.org_id).await?;
    page(&DemandPage {
        chrome: Chrome::new(&req, &staff, "Lost demand", "demand"),
        specs,
    })
}

/// `/demand.csv`: the rows of `/demand`, one per refused spec.
pub(crate) async fn export(staff: Staff, pool: web::Data<Db>) -> Result<HttpResponse, DashError> {
    let specs = refused_specs(&pool, staff.org_id).await?;
    let body = csv::render(
        &[
            "site",
            "profile",
            "vendor",
            "unavailable_24h",
            "unavailable_7d",
            "contended_7d",
            "last_refused",
            "excluded_at_last_unavailable",
        ],
        specs.into_iter().map(|s| {
            vec![
                s.site,
                s.profile,
                s.vendor,
                s.unavailable_24h.to_string(),
                s.unavailable_7d.to_string(),
                s.contended_7d.to_string(),
                s.last_at,
                s.last_excluded,
            ]
        }),
    );
    Ok(csv::response("demand.csv", body))
}

// ---------------------------------------------------------------------------
// The overview's part (templates/_demand_overview.html)
// ---------------------------------------------------------------------------

/// Width of one hour in the chart, in SVG user units.
pub const HOUR_WIDTH: i32 = 3;
/// Height of the chart's bars area.
pub const CHART_HEIGHT: f64 = 32.0;

pub struct HourBar {
    pub x: i32,
    pub y: f64,
    pub height: f64,
    pub label: String,
}

pub struct DemandRowView {
    pub site: String,
    pub profile: String,
    pub sellable: i64,
    pub unavailable_24h: i64,
    pub unavailable_7d: i64,
    pub bars: Vec<HourBar>,
    pub summary: String,
    pub why_not: String,
}

/// What the overview includes: per site and profile, sellable stock beside
/// `unavailable` refusals, with one bar per hour of the last 7 days.
pub struct OverviewDemand {
    pub rows: Vec<DemandRowView>,
    pub chart_width: i32,
}

fn row_view(d: SiteProfileDemand) -> DemandRowView {
    let peak = d.per_hour.iter().copied().max().unwrap_or(0);
    // Oldest hour on the left, the hour ending now on the right.
    let bars = d
        .per_hour
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(hours_ago, &n)| {
            let height = CHART_HEIGHT * n as f64 / peak.max(1) as f64;
            HourBar {
                x: (CHART_HOURS - 1 - hours_ago as i32) * HOUR_WIDTH,
                y: CHART_HEIGHT - height,
                height,
                label: if hours_ago == 0 {
                    format!("{n} in the last hour")
                } else {
                    format!("{n} between {} and {hours_ago} hours ago", hours_ago + 1)
                },
            }
        })
        .collect();
    DemandRowView {
        summary: format!(
            "{} {}: {} sellable now; {} orders refused as unavailable in the last 24 hours, {} in 7 days (at most {peak} in one hour)",
            d.site,
            d.profile,
            d.sellable,
            d.unavailable_24h(),
            d.unavailable_7d()
        ),
        why_not: url_with("/why-not", &[("site", &d.site), ("profile", &d.profile)]),
        unavailable_24h: d.unavailable_24h(),
        unavailable_7d: d.unavailable_7d(),
        sellable: d.sellable,
        bars,
        site: d.site,
        profile: d.profile,
    }
}

/// The overview's hook.
pub async fn overview_part(pool: &Db, org_id: i64) -> Result<OverviewDemand, DashError> {
    let rows = demand::by_site_and_profile(pool, org_id, OVERVIEW_ROWS).await?;
    Ok(OverviewDemand {
        rows: rows.into_iter().map(row_view).collect(),
        chart_width: CHART_HOURS * HOUR_WIDTH,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_non_zero_counts_in_the_allocators_order() {
        let v = serde_json::json!({"wrong_site": 0, "held": 3, "not_ready": 1, "in_service": 0});
        assert_eq!(excluded_summary(Some(&v)), "not_ready 1, held 3");
        let none = serde_json::json!({"wrong_site": 0, "held": 0});
        assert_eq!(excluded_summary(Some(&none)), "no machines at all");
        assert_eq!(excluded_summary(None), "");
    }

    #[test]
    fn bars_put_the_last_hour_on_the_right_scaled_to_the_peak() {
        let mut per_hour = vec![0; CHART_HOURS as usize];
        per_hour[0] = 4;
        per_hour[CHART_HOURS as usize - 1] = 2;
        let v = row_view(SiteProfileDemand {
            site: "par1".into(),
            profile: "epyc".into(),
            sellable: 0,
            per_hour,
        });
        assert_eq!(v.bars.len(), 2);
        assert_eq!(
            v.bars[0].x,
            (CHART_HOURS - 1) * HOUR_WIDTH,
            "now is on the right"
        );
        assert_eq!(v.bars[0].height, CHART_HEIGHT);
        assert_eq!(v.bars[1].x, 0, "7 days ago is on the left");
        assert_eq!(v.bars[1].height, CHART_HEIGHT / 2.0);
        assert_eq!(v.bars[1].y, CHART_HEIGHT / 2.0);
        assert_eq!(v.unavailable_24h, 4);
        assert_eq!(v.unavailable_7d, 6);
    }
}
