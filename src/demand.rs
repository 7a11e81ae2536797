//! Lost demand: the refusals of the reserve API, recorded for the
//! people who act on them. `unavailable` means "buy hardware" and
//! `contended` means "capacity exists but is hot" (R7: two messages, two
//! buttons); `reserved` means "the machines left are kept for another
//! segment" (R18) and `customer_limit` "this customer holds its cap"
//! (R19). All four are kept apart here as they are in the API. Beside
//! them, `substituted` (R20) is an order the asked pool could not fill
//! that a declared substitute served: not lost, but demand of the asked
//! pool, shown in its own column.
//!
//! Writing: one row per refusal, in the transaction that read the counts.
//! Reading: the overview's per site and profile figures and `/demand`'s most
//! refused specs. Counting: `poolkeeper_reservations_refused_total` with
//! labels bounded by the inventory. Purging: the sweep worker, under its
//! lease (`sweep::purge_refusals_batch`).

use crate::db::Db;
use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::allocator::{OrderSpec, ReserveOutcome};
use crate::metrics::Metrics;

/// Why a reserve was refused: the two 409s that mean "no machine for you".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// Nothing matches: more hardware is needed.
    Unavailable,
    /// Machines match but faster orders are taking them.
    Contended,
    /// Machines match, but the sellable ones left are kept for other
    /// segments (R18).
    Reserved,
    /// The customer already holds the organization's cap (R19).
    CustomerLimit,
}

impl RefusalReason {
    /// The `reason` column (its CHECK names these) and the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Unavailable => "unavailable",
            RefusalReason::Contended => "contended",
            RefusalReason::Reserved => "reserved",
            RefusalReason::CustomerLimit => "customer_limit",
        }
    }
}

// Recording: the allocator's `reserve_order_request` (sql/allocator.sql, through
// `record_refusal`) inserts the refusal row in the statement that read the
// counts: `excluded` holds docs/api.md's counts for `unavailable`,
// `{"candidates": N}` for `contended`, the counts with what is kept for
// which segment for `reserved`, `{"limit", "holds"}` for `customer_limit`.

// ---------------------------------------------------------------------------
// Counting (the labels are the metrics' own: `metrics::RefusalLabels`)
// ---------------------------------------------------------------------------

/// Counts a refused reserve in `poolkeeper_reservations_refused_total`;
/// other outcomes are not refusals and count nothing here.
pub async fn count_refusal(
    metrics: &Metrics,
    pool: &Db,
    outcome: &ReserveOutcome,
    spec: &OrderSpec,
) {
    let reason = match outcome {
        ReserveOutcome::Unavailable { .. } => RefusalReason::Unavailable,
        ReserveOutcome::Contended { .. } => RefusalReason::Contended,
        ReserveOutcome::Reserved { .. } => RefusalReason::Reserved,
        ReserveOutcome::CustomerLimit { .. } => RefusalReason::CustomerLimit,
        ReserveOutcome::Created { .. } | ReserveOutcome::Existing { .. } => return,
    };
    let Some(org_id) = outcome.refused_org() else {
        return;
    };
    let (org, site, profile) = metrics
        .refusal_labels
        .labels(pool, org_id, spec.site.as_str(), spec.profile.as_str())
        .await;
    metrics
        .reservations_refused
        .with_label_values(&[reason.as_str(), &org, &site, &profile])
        .inc();
}

/// R20: counts a new order in `poolkeeper_orders_served_total` by the
/// pool asked and the pool that served it; a replay or a refusal counts
/// nothing here.
pub async fn count_served(metrics: &Metrics, pool: &Db, outcome: &ReserveOutcome) {
    let ReserveOutcome::Created { reservation, .. } = outcome else {
        return;
    };
    let (org, site, asked) = metrics
        .refusal_labels
        .labels(
            pool,
            reservation.org_id,
            &reservation.machine.site,
            &reservation.profile_asked,
        )
        .await;
    let (_, _, served) = metrics
        .refusal_labels
        .labels(
            pool,
            reservation.org_id,
            &reservation.machine.site,
            &reservation.machine.profile,
        )
        .await;
    let substituted = if reservation.substituted {
        "true"
    } else {
        "false"
    };
    metrics
        .orders_served
        .with_label_values(&[&org, &site, &asked, &served, substituted])
        .inc();
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

/// Hours in the overview's chart: the last 7 days, one bar per hour.
pub const CHART_HOURS: i32 = 7 * 24;

/// A spec that was refused in the last 7 days, for `/demand`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RefusedSpec {
    pub site: String,
    pub profile: String,
    pub vendor: Option<String>,
    pub unavailable_24h: i64,
    pub unavailable_7d: i64,
    pub contended_7d: i64,
    /// R18: refused because what was left was kept for another segment.
    pub reserved_7d: i64,
    /// R19: refused because the order's customer held the cap.
    pub customer_limit_7d: i64,
    /// R20: not lost, served by a declared substitute: what this pool
    /// would have sold.
    pub substituted_7d: i64,
    pub last_at: DateTime<Utc>,
    /// The `excluded` counts of the latest `unavailable` refusal, if any.
    pub last_excluded: Option<sqlx::types::Json<Value>>,
}

/// The specs of `org_id` refused in the last 7 days, most refused as
/// `unavailable` first (then `reserved`, `customer_limit`, `contended`), at
/// most `limit`.
pub async fn most_refused(
    pool: &Db,
    org_id: i64,
    limit: i64,
) -> Result<Vec<RefusedSpec>, sqlx::Error> {
    // A range scan of reservation_refusals_by_org_at_idx: the cut-offs are
    // computed once (InitPlans), since a volatile clock_timestamp() in the
    // WHERE clause cannot bound an index scan. The latest `unavailable`
    // counts are then fetched for the returned specs only (one probe each)
    // instead of aggregating every row's jsonb.
    sqlx::query_as(
        "WITH g AS (
             SELECT site, profile, vendor,
                    count(*) FILTER (WHERE reason = 'unavailable'
                                       AND at > (SELECT clock_timestamp() - interval '24 hours'))
                        AS unavailable_24h,
                    count(*) FILTER (WHERE reason = 'unavailable') AS unavailable_7d,
                    count(*) FILTER (WHERE reason = 'contended') AS contended_7d,
                    count(*) FILTER (WHERE reason = 'reserved') AS reserved_7d,
                    count(*) FILTER (WHERE reason = 'customer_limit') AS customer_limit_7d,
                    count(*) FILTER (WHERE reason = 'substituted') AS substituted_7d,
                    max(at) AS last_at,
                    max(at) FILTER (WHERE reason = 'unavailable') AS last_unavailable_at
               FROM reservation_refusals
              WHERE org_id = $1 AND at > (SELECT clock_timestamp() - interval '7 days')
              GROUP BY site, profile, vendor
              ORDER BY unavailable_7d DESC, reserved_7d DESC, customer_limit_7d DESC, contended_7d DESC,
                       last_at DESC, site, profile, vendor
              LIMIT $2
         )
         SELECT g.site, g.profile, g.vendor, g.unavailable_24h, g.unavailable_7d, g.contended_7d,
                g.reserved_7d, g.customer_limit_7d, g.substituted_7d, g.last_at,
                (SELECT l.excluded FROM reservation_refusals l
                  WHERE l.org_id = $1 AND l.at = g.last_unavailable_at AND l.reason = 'unavailable'
                    AND l.site = g.site AND l.profile = g.profile
                    AND l.vendor IS NOT DISTINCT FROM g.vendor
                  ORDER BY l.id DESC LIMIT 1) AS last_excluded
           FROM g
          ORDER BY g.unavailable_7d DESC, g.reserved_7d DESC, g.customer_limit_7d DESC, g.contended_7d DESC,
                   g.last_at DESC, g.site, g.profile, g.vendor",
    )
    .bind(org_id)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Per site and profile of `org_id`: what is sellable now and how many
/// orders were refused as `unavailable`, and apart from them as `reserved`
/// (R18) and `customer_limit` (R19), per hour of the last 7 days.
#[derive(Debug, Clone, Default)]
pub struct SiteProfileDemand {
    pub site: String,
    pub profile: String,
    /// Ready, with no held reservation and no live service (the overview's
    /// "sellable now").
    pub sellable: i64,
    /// `unavailable` refusals per hour: index 0 is the hour ending now,
    /// index `CHART_HOURS - 1` the one that began 7 days ago.
    pub per_hour: Vec<i64>,
    /// `reserved` refusals per hour, indexed as `per_hour`.
    pub reserved_per_hour: Vec<i64>,
    /// `customer_limit` refusals per hour, indexed as `per_hour`.
    pub customer_limit_per_hour: Vec<i64>,
    /// R20: orders of this pool served by a declared substitute in 7 days
    /// (not lost, not charted: what the pool would have sold).
    pub substituted_7d: i64,
}

impl SiteProfileDemand {
    pub fn unavailable_24h(&self) -> i64 {
        self.per_hour.iter().take(24).sum()
    }

    pub fn unavailable_7d(&self) -> i64 {
        self.per_hour.iter().sum()
    }

    pub fn reserved_7d(&self) -> i64 {
        self.reserved_per_hour.iter().sum()
    }

    pub fn customer_limit_7d(&self) -> i64 {
        self.customer_limit_per_hour.iter().sum()
    }

    /// An empty row of `site` and `profile`.
    pub fn empty(site: String, profile: String, sellable: i64) -> SiteProfileDemand {
        let hours = vec![0; CHART_HOURS as usize];
        SiteProfileDemand {
            site,
            profile,
            sellable,
            per_hour: hours.clone(),
            reserved_per_hour: hours.clone(),
            customer_limit_per_hour: hours,
            substituted_7d: 0,
        }
    }
}

/// Every site and profile of the inventory (`stock`: site, profile and
/// sellable machines, read by the caller), and every one refused in the
/// last 7 days (a profile never stocked is the plainest "buy hardware"),
/// most refused first, at most `limit`.
pub async fn by_site_and_profile(
    pool: &Db,
    org_id: i64,
    stock: Vec<(String, String, i64)>,
    limit: usize,
) -> Result<Vec<SiteProfileDemand>, sqlx::Error> {
    // One reading of the clock: hour 0 ends now. A range scan of
    // reservation_refusals_by_org_at_idx.
    // `contended` is not charted here: capacity exists, it is only hot.
    let hours: Vec<(String, String, String, i32, i64)> = sqlx::query_as(
        "WITH t AS (SELECT clock_timestamp() AS now)
         SELECT f.site, f.profile, f.reason,
                least(greatest(floor(extract(epoch FROM t.now - f.at) / 3600), 0), $2 - 1)::int AS hours_ago,
                count(*)
           FROM reservation_refusals f, t
          WHERE f.org_id = $1 AND f.reason IN ('unavailable', 'reserved', 'customer_limit', 'substituted')
            AND f.at > t.now - make_interval(hours => $2)
          GROUP BY 1, 2, 3, 4",
    )
    .bind(org_id)
    .bind(CHART_HOURS)
    .fetch_all(pool)
    .await?;
    let mut rows: Vec<SiteProfileDemand> = stock
        .into_iter()
        .map(|(site, profile, sellable)| SiteProfileDemand::empty(site, profile, sellable))
        .collect();
    let mut index: std::collections::HashMap<(String, String), usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.site.clone(), r.profile.clone()), i))
        .collect();
    for (site, profile, reason, hours_ago, n) in hours {
        let key = (site, profile);
        let i = match index.get(&key) {
            Some(&i) => i,
            None => {
                rows.push(SiteProfileDemand::empty(key.0.clone(), key.1.clone(), 0));
                index.insert(key, rows.len() - 1);
                rows.len() - 1
            }
        };
        let row = &mut rows[i];
        if reason == "substituted" {
            row.substituted_7d += n;
            continue;
        }
        let series = match reason.as_str() {
            "reserved" => &mut row.reserved_per_hour,
            "customer_limit" => &mut row.customer_limit_per_hour,
            _ => &mut row.per_hour,
        };
        if let Some(slot) = usize::try_from(hours_ago)
            .ok()
            .and_then(|h| series.get_mut(h))
        {
            *slot += n;
        }
    }
    rows.sort_by(|a, b| {
        b.unavailable_7d()
            .cmp(&a.unavailable_7d())
            .then_with(|| {
                (b.reserved_7d() + b.customer_limit_7d())
                    .cmp(&(a.reserved_7d() + a.customer_limit_7d()))
            })
            .then_with(|| (&a.site, &a.profile).cmp(&(&b.site, &b.profile)))
    });
    rows.truncate(limit);
    Ok(rows)
}
