//! R21: each pool's history per UTC day, written by the sweep's holder.
//!
//! A day is written once it has closed (by the database's clock, a minute
//! behind it so that the transactions of its last moments have committed),
//! one statement per day: `pool_day_rows` (sql/planning.sql) computes every
//! pool's row from the rows kept anyway, by their own times, and the same
//! statement moves `pool_days_written.through` past it. The cursor row is
//! locked by the statement, so two runs at once (two replicas, a restart)
//! write successive days, never one day twice; the lease is checked in the
//! same statement (the lease row FOR SHARE), so a holder that lost it
//! writes nothing. After the upgrade the cursor starts the day before the
//! oldest row kept: the first holder rebuilds the past with this same job,
//! so a rebuilt day is what the day's own run would have written.

use chrono::NaiveDate;
use serde::Serialize;
use sqlx::PgExecutor;

use crate::db::Db;
use crate::domain::{Profile, Site};
use crate::lease::{LIVE_LEASE, SWEEP_KEY};

/// How far behind the clock a day must have ended before it is written.
pub const LAG: &str = "1 minute";

/// Days written per sweep period at most: a rebuild of two years is spread
/// over periods, each statement one day.
pub const DAYS_PER_PERIOD: u32 = 31;

/// The longest history the API answers, in days.
pub const MAX_HISTORY_DAYS: i32 = 730;

/// What one run of `write_next_day` did under a live mandate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// No closed day was left to write.
    UpToDate,
    /// The day was written, with this many pools.
    Day(NaiveDate, u64),
}

/// Writes the next closed day not yet written, under the sweep's mandate
/// (`replica`, `fence`). `None` (and nothing written) when the mandate is
/// not live.
pub async fn write_next_day<'c>(
    db: impl PgExecutor<'c>,
    replica: &str,
    fence: i64,
) -> Result<Option<Written>, sqlx::Error> {
    // FOR UPDATE of the cursor: a second run waits for the first, then
    // reads the moved cursor (READ COMMITTED re-reads the locked row) and
    // takes the day after, if it has closed. ON CONFLICT DO NOTHING only
    // guards the key; the cursor is what keeps a day from being computed
    // twice.
    let sql = format!(
        "WITH {LIVE_LEASE},
         next AS MATERIALIZED (
             SELECT c.through + 1 AS day FROM pool_days_written c
              WHERE EXISTS (SELECT 1 FROM lease)
                AND ((c.through + 2)::timestamp AT TIME ZONE 'UTC') <= clock_timestamp() - interval '{LAG}'
                FOR UPDATE OF c
         ),
         written AS (
             INSERT INTO pool_days (org_id, site, profile, day, total, sellable, held, sold, not_ready,
                    created, converted, expired, cancelled, refused_unavailable, refused_contended,
                    refused_reserved, refused_customer_limit, substituted_in, substituted_out,
                    added, retired, demand, replica, lease_fence)
             SELECT r.org_id, r.site, r.profile, next.day, r.total, r.sellable, r.held, r.sold,
                    r.not_ready, r.created, r.converted, r.expired, r.cancelled,
                    r.refused_unavailable, r.refused_contended, r.refused_reserved,
                    r.refused_customer_limit, r.substituted_in, r.substituted_out, r.added,
                    r.retired, r.demand, $2, l.fence
               FROM next CROSS JOIN lease l CROSS JOIN LATERAL pool_day_rows(next.day) r
               JOIN organizations o ON o.id = r.org_id
             ON CONFLICT (org_id, site, profile, day) DO NOTHING
             RETURNING 1
         ),
         moved AS (
             UPDATE pool_days_written c SET through = next.day FROM next RETURNING c.through
         )
         SELECT (SELECT count(*) FROM lease) AS live,
                (SELECT through FROM moved) AS day,
                (SELECT count(*) FROM written) AS pools"
    );
    let (live, day, pools): (i64, Option<NaiveDate>, i64) =
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(SWEEP_KEY)
            .bind(replica)
            .bind(fence)
            .fetch_one(db)
            .await?;
    if live == 0 {
        return Ok(None);
    }
    Ok(Some(match day {
        Some(day) => Written::Day(day, pools as u64),
        None => Written::UpToDate,
    }))
}

/// Has the days from `from` on written again: for a writer that dates rows
/// in the past (the demo's history), which the job has already passed.
/// One transaction that waits for a run in progress (the cursor row): the
/// rows from `from` are dropped and the cursor moved back, so the holder's
/// next runs write them again.
pub async fn rewrite_from(db: &Db, from: NaiveDate) -> Result<(), sqlx::Error> {
    let mut tx = db.begin().await?;
    let through: NaiveDate = sqlx::query_scalar("SELECT through FROM pool_days_written FOR UPDATE")
        .fetch_one(&mut *tx)
        .await?;
    let back = from.pred_opt().unwrap_or(from);
    if back < through {
        sqlx::query("DELETE FROM pool_days WHERE day >= $1")
            .bind(from)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE pool_days_written SET through = $1")
            .bind(back)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await
}

/// One pool's day as kept in `pool_days`.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(as = PoolDay)]
pub struct PoolDay {
    pub site: String,
    pub profile: String,
    /// the UTC day
    #[schema(value_type = String, format = Date)]
    pub day: NaiveDate,
    /// machines at the day's end: sellable + held + sold + not_ready
    #[schema(minimum = 0)]
    pub total: i64,
    #[schema(minimum = 0)]
    pub sellable: i64,
    #[schema(minimum = 0)]
    pub held: i64,
    #[schema(minimum = 0)]
    pub sold: i64,
    #[schema(minimum = 0)]
    pub not_ready: i64,
    /// holds created in the day
    #[schema(minimum = 0)]
    pub created: i64,
    /// holds converted (sales)
    #[schema(minimum = 0)]
    pub converted: i64,
    #[schema(minimum = 0)]
    pub expired: i64,
    #[schema(minimum = 0)]
    pub cancelled: i64,
    /// machines refused, by code
    #[sqlx(skip)]
    pub refused: Refused,
    /// machines of this pool that served an order asking another profile
    #[schema(minimum = 0)]
    pub substituted_in: i64,
    /// machines asked of this pool and served by a substitute
    #[schema(minimum = 0)]
    pub substituted_out: i64,
    /// machines that joined the pool
    #[schema(minimum = 0)]
    pub added: i64,
    /// machines that left it (retired, deleted or moved)
    #[schema(minimum = 0)]
    pub retired: i64,
    /// R21's true demand: sales of what was asked + refusals for want of
    /// stock (unavailable, reserved, customer_limit) + substituted_out
    #[schema(minimum = 0)]
    pub demand: i64,
    #[serde(skip)]
    #[schema(ignore)]
    refused_unavailable: i64,
    #[serde(skip)]
    #[schema(ignore)]
    refused_contended: i64,
    #[serde(skip)]
    #[schema(ignore)]
    refused_reserved: i64,
    #[serde(skip)]
    #[schema(ignore)]
    refused_customer_limit: i64,
}

/// The machines refused in a day, by the refusal's code.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct Refused {
    #[schema(minimum = 0)]
    pub unavailable: i64,
    #[schema(minimum = 0)]
    pub contended: i64,
    #[schema(minimum = 0)]
    pub reserved: i64,
    #[schema(minimum = 0)]
    pub customer_limit: i64,
}

/// The pools' days of organization `org_id`, the last `days` closed days
/// (today excluded: it has not closed), by site, profile and day, and the
/// day up to which history is written. A pool without a row has no history
/// yet (created today, or nothing happened to it).
pub async fn history(
    db: impl PgExecutor<'_>,
    org_id: i64,
    site: Option<&Site>,
    profile: Option<&Profile>,
    days: i32,
) -> Result<Vec<PoolDay>, sqlx::Error> {
    let mut rows: Vec<PoolDay> = sqlx::query_as(
        "SELECT d.site, d.profile, d.day, d.total, d.sellable, d.held, d.sold, d.not_ready,
                d.created, d.converted, d.expired, d.cancelled, d.refused_unavailable,
                d.refused_contended, d.refused_reserved, d.refused_customer_limit,
                d.substituted_in, d.substituted_out, d.added, d.retired, d.demand
           FROM pool_days d
          WHERE d.org_id = $1
            AND d.day >= (clock_timestamp() AT TIME ZONE 'UTC')::date - $4
            AND ($2::text IS NULL OR d.site = $2) AND ($3::text IS NULL OR d.profile = $3)
          ORDER BY d.site, d.profile, d.day",
    )
    .bind(org_id)
    .bind(site.map(Site::as_str))
    .bind(profile.map(Profile::as_str))
    .bind(days.clamp(1, MAX_HISTORY_DAYS))
    .fetch_all(db)
    .await?;
    for r in &mut rows {
        r.refused = Refused {
            unavailable: r.refused_unavailable,
            contended: r.refused_contended,
            reserved: r.refused_reserved,
            customer_limit: r.refused_customer_limit,
        };
    }
    Ok(rows)
}

/// The sellable stock at each day's end of the pools `pools` (site,
/// profile) of organization `org_id`, the last `days` closed days, by
/// pool (in the order of `pools`) and day: what `/planning`'s sparklines
/// draw, read by the table's key for the pools of one page only.
pub async fn sellable_days(
    db: impl PgExecutor<'_>,
    org_id: i64,
    pools: &[(&str, &str)],
    days: i32,
) -> Result<Vec<(String, String, NaiveDate, i64)>, sqlx::Error> {
    let (sites, profiles): (Vec<&str>, Vec<&str>) = pools.iter().copied().unzip();
    sqlx::query_as(
        // One range of the primary key per pool (the LATERAL with its
        // ORDER BY stays a loop; the first day is computed once, so it is
        // an index bound): a join let the planner hash every row of the
        // table, 40 ms at 1,000 pools of a year.
        "SELECT p.site, p.profile, d.day, d.sellable::bigint
           FROM unnest($2::text[], $3::text[]) AS p(site, profile)
           CROSS JOIN LATERAL (
               SELECT d.day, d.sellable FROM pool_days d
                WHERE d.org_id = $1 AND d.site = p.site AND d.profile = p.profile
                  AND d.day >= (SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date - $4)
                ORDER BY d.day) d",
    )
    .bind(org_id)
    .bind(&sites)
    .bind(&profiles)
    .bind(days.clamp(1, MAX_HISTORY_DAYS))
    .fetch_all(db)
    .await
}

pub use crate::forecast::DEFAULT_LEAD_TIME_DAYS;

/// The longest lead time staff may set, in days.
pub const MAX_LEAD_TIME_DAYS: i32 = 730;

/// The lead times staff set for organization `org_id`, by site.
pub async fn lead_times(
    db: impl PgExecutor<'_>,
    org_id: i64,
) -> Result<Vec<(String, i32)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT site, lead_time_days FROM site_lead_times WHERE org_id = $1 ORDER BY site",
    )
    .bind(org_id)
    .fetch_all(db)
    .await
}

/// A lead time out of range (1 to `MAX_LEAD_TIME_DAYS`).
#[derive(Debug, thiserror::Error)]
#[error("a lead time is 1 to {MAX_LEAD_TIME_DAYS} days, not {0}")]
pub struct BadLeadTime(pub i64);

/// A lead time in days, checked.
pub fn lead_time_days(days: i64) -> Result<i32, BadLeadTime> {
    i32::try_from(days)
        .ok()
        .filter(|d| (1..=MAX_LEAD_TIME_DAYS).contains(d))
        .ok_or(BadLeadTime(days))
}

/// Sets `site`'s lead time for organization `org_id`, as `actor` said, in
/// the caller's transaction (which writes the audit row beside it);
/// returns the previous one (the default when none was set).
pub async fn set_lead_time(
    conn: &mut sqlx::PgConnection,
    org_id: i64,
    site: &Site,
    days: i32,
    actor: &str,
) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar(
        "WITH before AS (
             SELECT lead_time_days FROM site_lead_times WHERE org_id = $1 AND site = $2 FOR UPDATE
         ), set AS (
             INSERT INTO site_lead_times (org_id, site, lead_time_days, updated_by)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (org_id, site) DO UPDATE
                SET lead_time_days = EXCLUDED.lead_time_days, updated_at = clock_timestamp(),
                    updated_by = EXCLUDED.updated_by
         )
         SELECT coalesce((SELECT lead_time_days FROM before), $5)",
    )
    .bind(org_id)
    .bind(site.as_str())
    .bind(days)
    .bind(actor)
    .bind(DEFAULT_LEAD_TIME_DAYS)
    .fetch_one(conn)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lead_times_are_checked() {
        assert_eq!(lead_time_days(30).ok(), Some(30));
        assert_eq!(lead_time_days(1).ok(), Some(1));
        assert_eq!(lead_time_days(730).ok(), Some(730));
        assert!(lead_time_days(0).is_err());
        assert!(lead_time_days(731).is_err());
        assert!(lead_time_days(-3).is_err());
        assert!(lead_time_days(i64::MAX).is_err());
    }
}
