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
use crate::allocator::ExclusionKey;
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
    pub reserved_7d: i64,
    pub customer_limit_7d: i64,
    /// R20: orders of this spec served by a declared substitute.
    pub substituted_7d: i64,
    pub last_at: String,
    /// `last_at`'s day and time of day, each kept on one line on the page.
    pub last_day: String,
    pub last_clock: String,
    /// The latest `unavailable` refusal's excluded counts, as "held 3, not_ready 1".
    pub last_excluded: String,
    pub why_not: String,
}

/// "held 3, not_ready 1": the non-zero counts, in the allocator's order.
fn excluded_summary(excluded: Option<&Value>) -> String {
    let Some(Value::Object(map)) = excluded else {
        return String::new();
    };
    let parts: Vec<String> = ExclusionKey::ALL
        .iter()
        .filter_map(|k| {
            let n = map.get(k.as_str()).and_then(Value::as_i64).unwrap_or(0);
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
                last_day: s.last_at.format("%Y-%m-%d").to_string(),
                last_clock: s.last_at.format("%H:%M:%S UTC").to_string(),
                last_at: fmt_time(&s.last_at),
                site: s.site,
                profile: s.profile,
                vendor,
                unavailable_24h: s.unavailable_24h,
                unavailable_7d: s.unavailable_7d,
                contended_7d: s.contended_7d,
                reserved_7d: s.reserved_7d,
                customer_limit_7d: s.customer_limit_7d,
                substituted_7d: s.substituted_7d,
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
            "reserved_7d",
            "customer_limit_7d",
            "contended_7d",
            "substituted_7d",
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
                s.reserved_7d.to_string(),
                s.customer_limit_7d.to_string(),
                s.contended_7d.to_string(),
                s.substituted_7d.to_string(),
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
    /// `unavailable`, `reserved` or `customer_limit`: the bar's CSS class
    /// is `spark-<kind>`.
    pub kind: &'static str,
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
    pub reserved_7d: i64,
    pub customer_limit_7d: i64,
    /// R20: orders of this pool served by a declared substitute in 7 days.
    pub substituted_7d: i64,
    pub bars: Vec<HourBar>,
    pub summary: String,
    pub why_not: String,
}

/// What the overview includes: per site and profile, sellable stock beside
/// `unavailable` refusals and, apart from them, `reserved` (R18) and
/// `customer_limit` (R19) ones, with one stacked bar per hour of the last 7
/// days.
pub struct OverviewDemand {
    pub rows: Vec<DemandRowView>,
    pub chart_width: i32,
}

/// The words of one series in a bar's title.
fn series_words(kind: &str) -> &'static str {
    match kind {
        "reserved" => "kept for another segment",
        "customer_limit" => "customer at its cap",
        _ => "unavailable",
    }
}

fn row_view(d: SiteProfileDemand) -> DemandRowView {
    let series: [(&'static str, &[i64]); 3] = [
        ("unavailable", &d.per_hour),
        ("reserved", &d.reserved_per_hour),
        ("customer_limit", &d.customer_limit_per_hour),
    ];
    // Stacked per hour (unavailable at the bottom), scaled to the busiest
    // hour of the three together.
    let total_at = |h: usize| series.iter().map(|(_, s)| s[h]).sum::<i64>();
    let peak = (0..d.per_hour.len()).map(total_at).max().unwrap_or(0);
    let mut bars = Vec::new();
    for hours_ago in 0..d.per_hour.len() {
        let mut top = CHART_HEIGHT;
        for (kind, counts) in series {
            let n = counts[hours_ago];
            if n == 0 {
                continue;
            }
            let height = CHART_HEIGHT * n as f64 / peak.max(1) as f64;
            top -= height;
            let words = series_words(kind);
            bars.push(HourBar {
                kind,
                x: (CHART_HOURS - 1 - hours_ago as i32) * HOUR_WIDTH,
                y: top,
                height,
                label: if hours_ago == 0 {
                    format!("{n} {words} in the last hour")
                } else {
                    format!(
                        "{n} {words} between {} and {hours_ago} hours ago",
                        hours_ago + 1
                    )
                },
            });
        }
    }
    DemandRowView {
        summary: format!(
            "{} {}: {} sellable now; {} orders refused as unavailable in the last 24 hours, {} in 7 days; \
             in 7 days, {} refused as kept for another segment and {} as their customer at its cap \
             (at most {peak} in one hour)",
            d.site,
            d.profile,
            d.sellable,
            d.unavailable_24h(),
            d.unavailable_7d(),
            d.reserved_7d(),
            d.customer_limit_7d(),
        ),
        why_not: url_with("/why-not", &[("site", &d.site), ("profile", &d.profile)]),
        unavailable_24h: d.unavailable_24h(),
        unavailable_7d: d.unavailable_7d(),
        reserved_7d: d.reserved_7d(),
        customer_limit_7d: d.customer_limit_7d(),
        substituted_7d: d.substituted_7d,
        sellable: d.sellable,
        bars,
        site: d.site,
        profile: d.profile,
    }
}

/// The overview's hook; `stock` is the sellable machines per site and
/// profile, from the overview's own reading of the pools.
pub async fn overview_part(
    pool: &Db,
    org_id: i64,
    stock: Vec<(String, String, i64)>,
) -> Result<OverviewDemand, DashError> {
    let rows = demand::by_site_and_profile(pool, org_id, stock, OVERVIEW_ROWS).await?;
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
            per_hour,
            ..SiteProfileDemand::empty("par1".into(), "epyc".into(), 0)
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

    #[test]
    fn reserved_and_customer_limit_stack_on_unavailable_with_their_own_class() {
        let mut d = SiteProfileDemand::empty("par1".into(), "epyc".into(), 2);
        d.per_hour[0] = 1;
        d.reserved_per_hour[0] = 2;
        d.customer_limit_per_hour[0] = 1;
        d.reserved_per_hour[5] = 1;
        let v = row_view(d);
        let kinds: Vec<&str> = v.bars.iter().map(|b| b.kind).collect();
        assert_eq!(
            kinds,
            ["unavailable", "reserved", "customer_limit", "reserved"]
        );
        assert_eq!(v.bars[0].y, CHART_HEIGHT * 3.0 / 4.0, "at the bottom");
        assert_eq!(v.bars[1].y, CHART_HEIGHT / 4.0);
        assert_eq!(v.bars[2].y, 0.0, "the busiest hour fills the chart");
        assert!(v.bars[1].label.contains("2 kept for another segment"));
        assert_eq!((v.reserved_7d, v.customer_limit_7d), (3, 1));
        assert!(v.summary.contains("3 refused as kept for another segment"));
    }
}
