//! R21: when each pool runs out. The rate of true demand is fitted to the
//! pool's last `WINDOW_DAYS` closed days of history (`pool_days.demand`,
//! src/planning.rs) by least squares of a straight line; the rate is the
//! line's value on the last closed day, its band twice the standard error
//! of that value (from the residuals). The run-out date is when the
//! available stock (R17's `available`, now) at that rate reaches zero;
//! the band's dates come from the band's rates. docs/rules.md (R21) says
//! the method and its limits.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use chrono::{DateTime, Duration, NaiveDate, Utc};
use serde::Serialize;
use sqlx::PgExecutor;

use crate::domain::{Profile, Site};

/// The days of history the rate is fitted to.
pub const WINDOW_DAYS: i32 = 28;

/// The band is this many standard errors either side of the rate (about
/// 95% for residuals roughly normal).
pub const BAND_SE: f64 = 2.0;

/// R21: a site's procurement lead time when staff set none.
pub const DEFAULT_LEAD_TIME_DAYS: i32 = 30;

/// Dates further than this are not told: the stock outlasts any plan.
pub const HORIZON_DAYS: f64 = 36_500.0;

/// The rate fitted to a series of daily demand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// machines a day, never negative
    pub rate: f64,
    /// the band's rates: `low` may be 0 (the stock may never run out)
    pub low: f64,
    pub high: f64,
}

/// Least squares of `y = a + b x` over the days `x = 0 .. n-1` (oldest
/// first), valued at the last day. `None` for no days; one day is its own
/// rate with no band. The band is `BAND_SE` standard errors of the fitted
/// value, `s * sqrt(1/n + (x - mean)^2 / Sxx)` with `s` the residuals'
/// standard deviation (`n - 2` degrees of freedom; 0 for two days).
pub fn fit(demand: &[f64]) -> Option<Fit> {
    let n = demand.len();
    if n == 0 {
        return None;
    }
    if n == 1 {
        let rate = demand[0].max(0.0);
        return Some(Fit {
            rate,
            low: rate,
            high: rate,
        });
    }
    let nf = n as f64;
    let mean_x = (nf - 1.0) / 2.0;
    let mean_y = demand.iter().sum::<f64>() / nf;
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for (i, y) in demand.iter().enumerate() {
        let dx = i as f64 - mean_x;
        sxx += dx * dx;
        sxy += dx * (y - mean_y);
    }
    let slope = sxy / sxx;
    let intercept = mean_y - slope * mean_x;
    let last = nf - 1.0;
    let value = intercept + slope * last;
    let ssr: f64 = demand
        .iter()
        .enumerate()
        .map(|(i, y)| {
            let r = y - (intercept + slope * i as f64);
            r * r
        })
        .sum();
    let s = if n > 2 {
        (ssr / (nf - 2.0)).sqrt()
    } else {
        0.0
    };
    let se = s * (1.0 / nf + (last - mean_x).powi(2) / sxx).sqrt();
    let rate = value.max(0.0);
    Some(Fit {
        rate,
        low: (value - BAND_SE * se).max(0.0),
        high: (value + BAND_SE * se).max(0.0),
    })
}

/// When a pool runs out, told from `today`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Projection {
    /// days until the stock at the rate reaches zero; `None` without demand
    pub days_left: Option<f64>,
    pub run_out: Option<NaiveDate>,
    /// the band: the soonest (at the band's high rate) and the latest (at
    /// its low rate; `None` when that rate is 0)
    pub run_out_low: Option<NaiveDate>,
    pub run_out_high: Option<NaiveDate>,
    /// the run-out date less the lead time: when hardware must be ordered
    pub order_by: Option<NaiveDate>,
    /// the run-out falls within the lead time
    pub flagged: bool,
}

fn days_at(available: i64, rate: f64) -> Option<f64> {
    (rate > 0.0).then(|| available.max(0) as f64 / rate)
}

fn date_after(today: NaiveDate, days: Option<f64>) -> Option<NaiveDate> {
    let days = days.filter(|d| *d <= HORIZON_DAYS)?;
    today.checked_add_signed(Duration::days(days.floor() as i64))
}

/// R21: the run-out of `available` machines at the fitted rate, and the
/// flag against the site's lead time. No fit (no history) or no demand:
/// no run-out date, never "0 days".
pub fn project(
    available: i64,
    fit: Option<Fit>,
    today: NaiveDate,
    lead_time_days: i32,
) -> Projection {
    let days_left = fit.and_then(|f| days_at(available, f.rate));
    let run_out = date_after(today, days_left);
    let lead = Duration::days(i64::from(lead_time_days));
    let order_by = run_out.and_then(|d| d.checked_sub_signed(lead));
    Projection {
        days_left,
        run_out,
        run_out_low: date_after(today, fit.and_then(|f| days_at(available, f.high))),
        run_out_high: date_after(today, fit.and_then(|f| days_at(available, f.low))),
        order_by,
        flagged: order_by.is_some_and(|d| d <= today),
    }
}

/// One pool's forecast (the API's answer, the planning page's row).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = ForecastPool)]
pub struct PoolForecast {
    pub site: String,
    pub profile: String,
    /// what an order without a segment could take now (R17)
    #[schema(minimum = 0)]
    pub available: i64,
    /// the fitted rate of true demand, machines a day; null without history
    pub demand_per_day: Option<f64>,
    /// null when the pool has no demand
    pub days_left: Option<f64>,
    #[schema(value_type = Option<String>, format = Date)]
    pub run_out: Option<NaiveDate>,
    #[schema(value_type = Option<String>, format = Date)]
    pub run_out_low: Option<NaiveDate>,
    #[schema(value_type = Option<String>, format = Date)]
    pub run_out_high: Option<NaiveDate>,
    #[schema(minimum = 1)]
    pub lead_time_days: i32,
    /// the run-out date less the lead time
    #[schema(value_type = Option<String>, format = Date)]
    pub order_by: Option<NaiveDate>,
    /// the run-out falls within the site's lead time
    pub flagged: bool,
    /// closed days of history in the window (0: none yet)
    #[serde(skip)]
    #[schema(ignore)]
    pub history_days: usize,
}

/// Every pool's forecast at one instant.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = Forecast)]
pub struct Forecast {
    pub as_of: DateTime<Utc>,
    /// soonest run-out first; pools without a run-out last
    pub pools: Vec<PoolForecast>,
    #[serde(skip)]
    #[schema(ignore)]
    pub today: NaiveDate,
}

/// The demand series of one pool over the window ending yesterday: from
/// the window's start when the pool has days before it, else from its first
/// day; a day without a row had no demand.
fn series(today: NaiveDate, earlier: bool, days: &[NaiveDate], demand: &[i64]) -> Vec<f64> {
    let window_start = today - Duration::days(i64::from(WINDOW_DAYS));
    let start = if earlier {
        window_start
    } else {
        match days.iter().min() {
            Some(d) => *d,
            None => return Vec::new(),
        }
    };
    let n = (today - start).num_days().max(0) as usize;
    let mut out = vec![0.0; n];
    for (d, y) in days.iter().zip(demand) {
        let i = (*d - start).num_days();
        if let Some(slot) = usize::try_from(i).ok().and_then(|i| out.get_mut(i)) {
            *slot = *y as f64;
        }
    }
    out
}

/// What `read` keeps of one organization's history: each pool's fitted
/// rate and days of history, as of one day and one generation of
/// `pool_days` (`pool_days_written.generation`, moved on by every write of
/// the table). The history changes once a day (the daily job), so every
/// read of that day reuses it; the stock is read at every call.
struct Fitted {
    today: NaiveDate,
    generation: i64,
    /// Per pool: the fit, its days of history, whether it has days in
    /// the window (a pool with no machine now is told only then).
    pools: HashMap<(String, String), (Option<Fit>, usize, bool)>,
}

/// Per database and organization; a process serves one database, tests
/// many (hence the database's name in the key).
type FittedByOrg = HashMap<(String, i64), Arc<Fitted>>;
static FITTED: LazyLock<Mutex<FittedByOrg>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The stock of one pool now (NULL pool: none), with the instant, the
/// day, the database and the history's generation on every row.
type StockRow = (
    DateTime<Utc>,
    NaiveDate,
    String,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i32>,
);

/// One pool's window of history: its days and demand, and whether it has
/// days before the window.
type HistoryRow = (String, String, bool, Vec<NaiveDate>, Vec<i64>);

/// The fitted rates of every pool of organization `org_id` with history,
/// from the window ending yesterday. The arrays are aggregated unordered
/// (no sort of the window's rows): `series` places each day by its date.
async fn fit_history(
    db: impl PgExecutor<'_>,
    org_id: i64,
    today: NaiveDate,
    generation: i64,
) -> Result<Fitted, sqlx::Error> {
    let rows: Vec<HistoryRow> = sqlx::query_as(
        "WITH hist AS (
             SELECT d.site, d.profile, array_agg(d.day) AS days, array_agg(d.demand::bigint) AS demand
               FROM pool_days d
              WHERE d.org_id = $1 AND d.day >= $2::date - $3 AND d.day < $2::date
              GROUP BY d.site, d.profile
         ), earlier AS (
             SELECT DISTINCT ON (d.site, d.profile) d.site, d.profile
               FROM pool_days d
              WHERE d.org_id = $1 AND d.day < $2::date - $3
         )
         SELECT coalesce(h.site, e.site), coalesce(h.profile, e.profile), e.site IS NOT NULL,
                coalesce(h.days, '{}'), coalesce(h.demand, '{}')
           FROM hist h FULL JOIN earlier e USING (site, profile)",
    )
    .bind(org_id)
    .bind(today)
    .bind(WINDOW_DAYS)
    .fetch_all(db)
    .await?;
    let pools = rows
        .into_iter()
        .map(|(site, profile, earlier, days, demand)| {
            let series = series(today, earlier, &days, &demand);
            let in_window = !days.is_empty();
            ((site, profile), (fit(&series), series.len(), in_window))
        })
        .collect();
    Ok(Fitted {
        today,
        generation,
        pools,
    })
}

/// The fitted rates of organization `org_id` as of `today` and the
/// history's `generation`: those kept when they are of that day and
/// generation, else computed (`fit_history`) and kept.
async fn fitted(
    db: &mut sqlx::PgConnection,
    database: String,
    org_id: i64,
    today: NaiveDate,
    generation: i64,
) -> Result<Arc<Fitted>, sqlx::Error> {
    let key = (database, org_id);
    let kept = FITTED
        .lock()
        .ok()
        .and_then(|m| m.get(&key).cloned())
        .filter(|f| f.today == today && f.generation == generation);
    if let Some(f) = kept {
        return Ok(f);
    }
    let f = Arc::new(fit_history(db, org_id, today, generation).await?);
    if let Ok(mut m) = FITTED.lock() {
        m.insert(key, f.clone());
    }
    Ok(f)
}

/// `read` on a connection of `db`'s.
pub async fn read_from(
    db: &crate::db::Db,
    org_id: i64,
    site: Option<&Site>,
    profile: Option<&Profile>,
) -> Result<Forecast, sqlx::Error> {
    let mut conn = db.acquire().await?;
    let answer = read(&mut conn, org_id, site, profile).await;
    if let Err(e) = &answer {
        conn.failed(e);
    }
    answer
}

/// R21 for organization `org_id` (filters `None`: any): every pool that
/// has machines or history, with its rate, run-out and flag, soonest
/// run-out first. The stock and the lead times are one statement at every
/// call; the fitted rates are computed once per day and generation of the
/// history (`Fitted`), by a second statement when they are not kept yet.
pub async fn read(
    db: &mut sqlx::PgConnection,
    org_id: i64,
    site: Option<&Site>,
    profile: Option<&Profile>,
) -> Result<Forecast, sqlx::Error> {
    // The LEFT JOIN from `t` keeps one row (its pool NULL) without pools.
    let rows: Vec<StockRow> = sqlx::query_as(
        "WITH t AS (SELECT clock_timestamp() AS as_of,
                           (clock_timestamp() AT TIME ZONE 'UTC')::date AS today,
                           current_database()::text AS db,
                           (SELECT w.generation FROM pool_days_written w) AS generation),
         pool_rows AS (
             SELECT c.site, c.profile, c.available::bigint AS available,
                    coalesce(l.lead_time_days, $4)::integer AS lead
               FROM capacity_pools($1, $2, $3, NULL, NULL) c
               LEFT JOIN site_lead_times l ON l.org_id = $1 AND l.site = c.site
         )
         SELECT t.as_of, t.today, t.db, coalesce(t.generation, 0), r.site, r.profile, r.available, r.lead
           FROM t LEFT JOIN pool_rows r ON true",
    )
    .bind(org_id)
    .bind(site.map(Site::as_str))
    .bind(profile.map(Profile::as_str))
    .bind(DEFAULT_LEAD_TIME_DAYS)
    .fetch_all(&mut *db)
    .await?;
    let Some((as_of, today, database, generation)) =
        rows.first().map(|r| (r.0, r.1, r.2.clone(), r.3))
    else {
        return Err(sqlx::Error::RowNotFound);
    };
    let fitted = fitted(&mut *db, database, org_id, today, generation).await?;
    let wanted = |s: &str, p: &str| {
        site.is_none_or(|x| x.as_str() == s) && profile.is_none_or(|x| x.as_str() == p)
    };
    let mut stock: HashMap<(String, String), (i64, i32)> = HashMap::new();
    for (_, _, _, _, site, profile, available, lead) in rows {
        if let (Some(s), Some(p)) = (site, profile) {
            stock.insert(
                (s, p),
                (
                    available.unwrap_or(0),
                    lead.unwrap_or(DEFAULT_LEAD_TIME_DAYS),
                ),
            );
        }
    }
    // Pools with history in the window but no machine now keep their
    // site's lead time.
    let missing: Vec<&(String, String)> = fitted
        .pools
        .iter()
        .filter(|((s, p), (_, _, in_window))| {
            *in_window && wanted(s, p) && !stock.contains_key(&(s.clone(), p.clone()))
        })
        .map(|(k, _)| k)
        .collect();
    let leads: HashMap<String, i32> = if missing.is_empty() {
        HashMap::new()
    } else {
        sqlx::query_as("SELECT site, lead_time_days FROM site_lead_times WHERE org_id = $1")
            .bind(org_id)
            .fetch_all(&mut *db)
            .await?
            .into_iter()
            .collect()
    };
    for (s, p) in missing {
        let lead = leads.get(s).copied().unwrap_or(DEFAULT_LEAD_TIME_DAYS);
        stock.insert((s.clone(), p.clone()), (0, lead));
    }
    Ok(Forecast {
        as_of,
        pools: ranked(stock, &fitted, today),
        today,
    })
}

/// Each pool of `stock` (available, lead time) with its fitted rate
/// projected, soonest run-out first.
fn ranked(
    stock: HashMap<(String, String), (i64, i32)>,
    fitted: &Fitted,
    today: NaiveDate,
) -> Vec<PoolForecast> {
    let mut pools: Vec<PoolForecast> = stock
        .into_iter()
        .map(|((site, profile), (available, lead))| {
            let (fitted, history_days, _) = fitted
                .pools
                .get(&(site.clone(), profile.clone()))
                .copied()
                .unwrap_or((None, 0, false));
            let p = project(available, fitted, today, lead);
            PoolForecast {
                site,
                profile,
                available,
                demand_per_day: fitted.map(|f| f.rate),
                days_left: p.days_left,
                run_out: p.run_out,
                run_out_low: p.run_out_low,
                run_out_high: p.run_out_high,
                lead_time_days: lead,
                order_by: p.order_by,
                flagged: p.flagged,
                history_days,
            }
        })
        .collect();
    pools.sort_by(|a, b| {
        let key = |p: &PoolForecast| p.days_left.unwrap_or(f64::INFINITY);
        key(a)
            .total_cmp(&key(b))
            .then_with(|| (&a.site, &a.profile).cmp(&(&b.site, &b.profile)))
    });
    pools
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap_or_default()
    }

    const TODAY: &str = "2026-12-01";

    #[test]
    fn thirty_available_at_three_a_day_run_out_ten_days_ahead() {
        let f = fit(&[3.0; 28]);
        assert_eq!(
            f,
            Some(Fit {
                rate: 3.0,
                low: 3.0,
                high: 3.0
            })
        );
        let p = project(30, f, day(TODAY), 30);
        assert_eq!(p.days_left, Some(10.0));
        assert_eq!(p.run_out, Some(day("2026-12-11")));
        assert_eq!(p.run_out_low, Some(day("2026-12-11")));
        assert_eq!(p.run_out_high, Some(day("2026-12-11")));
        // 10 days left against 30 of lead time: ordering was due 20 days ago.
        assert_eq!(p.order_by, Some(day("2026-11-11")));
        assert!(p.flagged);
        // With a lead time of 9 days it is not flagged yet: order by the 2nd.
        let p = project(30, f, day(TODAY), 9);
        assert_eq!(p.order_by, Some(day("2026-12-02")));
        assert!(!p.flagged);
    }

    #[test]
    fn a_restock_leaves_the_rate() {
        // A steady 3 a day over 28 days with 50 machines added on day 15:
        // the stock jumps, the demand series (sales + refusals) does not,
        // so the series the fit sees is the steady one. The series comes
        // from the history rows, whose demand never counts stock.
        let days: Vec<NaiveDate> = (1..=28).map(|i| day(TODAY) - Duration::days(i)).collect();
        let demand = vec![3; 28];
        let s = series(day(TODAY), false, &days, &demand);
        assert_eq!(s, vec![3.0; 28]);
        assert_eq!(fit(&s).map(|f| f.rate), Some(3.0));
    }

    #[test]
    fn sold_out_days_keep_their_refused_demand() {
        // 21 days of 3 sales, then 7 sold-out days of 0 sales and 3
        // machines refused: demand 3 every day, rate 3, no band.
        let sales = [[3.0; 21].as_slice(), [0.0; 7].as_slice()].concat();
        let refused = [[0.0; 21].as_slice(), [3.0; 7].as_slice()].concat();
        let demand: Vec<f64> = sales.iter().zip(&refused).map(|(a, b)| a + b).collect();
        let f = fit(&demand).map(|f| (f.rate, f.low, f.high));
        assert_eq!(f, Some((3.0, 3.0, 3.0)));
        // Fitted to sales alone, the last week would pull the rate down.
        let sales_only = fit(&sales).map(|f| f.rate).unwrap_or(3.0);
        assert!(sales_only < 1.0, "{sales_only}");
    }

    #[test]
    fn an_empty_pool_without_demand_has_no_run_out() {
        let p = project(0, fit(&[0.0; 28]), day(TODAY), 30);
        assert_eq!(p.days_left, None);
        assert_eq!(p.run_out, None);
        assert_eq!(p.order_by, None);
        assert!(!p.flagged);
        // No history at all (a pool created today): no rate, no date.
        assert_eq!(fit(&[]), None);
        let p = project(0, None, day(TODAY), 30);
        assert_eq!((p.days_left, p.run_out), (None, None));
        // An empty pool with demand runs out today.
        let p = project(0, fit(&[2.0; 5]), day(TODAY), 30);
        assert_eq!((p.days_left, p.run_out), (Some(0.0), Some(day(TODAY))));
    }

    #[test]
    fn the_line_and_its_band_by_hand() {
        // y = 1, 2, 4, 5 at x = 0..3: mean x 1.5, mean y 3, Sxx 5,
        // Sxy = (-1.5)(-2) + (-0.5)(-1) + (0.5)(1) + (1.5)(2) = 7, slope
        // 1.4, intercept 0.9, value at x = 3: 5.1. Residuals 0.1, -0.3,
        // 0.3, -0.1: SSR 0.2, s = sqrt(0.2 / 2) = 0.316228; se = s *
        // sqrt(1/4 + 1.5^2/5) = s * sqrt(0.7) = 0.264575; band 5.1 -+
        // 0.529150.
        let f = fit(&[1.0, 2.0, 4.0, 5.0]).unwrap_or(Fit {
            rate: 0.0,
            low: 0.0,
            high: 0.0,
        });
        assert!((f.rate - 5.1).abs() < 1e-9, "{f:?}");
        assert!((f.low - (5.1 - 0.529150)).abs() < 1e-5, "{f:?}");
        assert!((f.high - (5.1 + 0.529150)).abs() < 1e-5, "{f:?}");
        // 52 available: 52 / 5.1 = 10.2 days (10 whole days), 52 /
        // 5.629150 = 9.24 (9) at the band's high rate, 52 / 4.570850 =
        // 11.38 (11) at its low one.
        let p = project(52, Some(f), day(TODAY), 30);
        assert_eq!(p.run_out, Some(day("2026-12-11")));
        assert_eq!(p.run_out_low, Some(day("2026-12-10")));
        assert_eq!(p.run_out_high, Some(day("2026-12-12")));
    }

    #[test]
    fn a_falling_demand_never_goes_negative() {
        let f = fit(&[6.0, 4.0, 2.0, 0.0, 0.0, 0.0]).map(|f| f.rate);
        assert_eq!(f.map(|r| r >= 0.0), Some(true));
        let p = project(10, fit(&[4.0, 0.0]), day(TODAY), 30);
        assert_eq!(p.run_out, None);
    }

    #[test]
    fn missing_days_are_days_without_demand() {
        let t = day(TODAY);
        // A pool whose first row is 3 days ago, with nothing the day after.
        let s = series(
            t,
            false,
            &[t - Duration::days(3), t - Duration::days(1)],
            &[2, 4],
        );
        assert_eq!(s, vec![2.0, 0.0, 4.0]);
        // A pool with days before the window starts at the window.
        let s = series(t, true, &[t - Duration::days(1)], &[5]);
        assert_eq!(s.len(), WINDOW_DAYS as usize);
        assert_eq!(s.last(), Some(&5.0));
    }
}
