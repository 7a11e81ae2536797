//! The overview's 24-hour chart: reservations created, converted, expired
//! and cancelled per hour and site, counted as time passes. Counting the
//! last day's reservations at every view cost what they number (1.7 s at
//! 300,000: BENCHMARKS.md, item 5); instead the sweep's holder adds what
//! happened since the last count to `activity_hours`, a minute behind the
//! clock so that the transactions that wrote it have committed, and the
//! overview reads 24 hours of rows and says up to when they count.
//!
//! A reservation is counted once for its creation (at `created_at`) and once
//! for its end (at `ended_at`, as its final state), in the hour each falls
//! in, under its machine's site when counted. A write whose transaction
//! commits more than a minute after its own timestamp is not counted (no
//! writer of reservations holds a transaction open that long: statements
//! are bounded by the pool's statement timeout); the reservation itself is
//! unaffected, only the chart.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::db::Db;
use crate::lease::{LIVE_LEASE, SWEEP_KEY};

/// How far behind the clock the count stays.
pub const LAG: &str = "1 minute";

/// The statement that counts `[since, until)` into `activity_hours`, where
/// `w` (since, until) is defined before it; `$org` narrows it to one
/// organization (NULL: all of them). Each organization's rows are one range
/// of `reservations_recent_activity_idx` (its key, the later of creation and
/// end, is at or after `since` exactly when one of them is), each row's
/// site one probe of its machine by key.
fn counted_sql(org: &str) -> String {
    format!(
        "SELECT r.org_id, date_trunc('hour', e.at) AS hour,
                (SELECT m.site FROM machines m WHERE m.id = r.machine_id) AS site,
                e.kind, count(*) AS n
           FROM w, organizations o
           JOIN reservations r ON r.org_id = o.id
          CROSS JOIN LATERAL (VALUES ('created', r.created_at), (r.state, r.ended_at)) e (kind, at)
          WHERE ({org}::bigint IS NULL OR o.id = {org}::bigint)
            AND coalesce(r.ended_at, r.created_at) >= w.since
            AND e.at >= w.since AND e.at < w.until
          GROUP BY 1, 2, 3, 4"
    )
}

/// One count under the sweep's mandate (`replica`, `fence`): everything
/// from `counted_until` to a minute ago added to the hours, `counted_until`
/// moved there, hours older than two days dropped. Returns how many hour
/// rows it wrote, or `None` (and nothing written) when the mandate is not
/// live.
pub async fn count<'c>(
    db: impl PgExecutor<'c>,
    replica: &str,
    fence: i64,
) -> Result<Option<u64>, sqlx::Error> {
    let sql = format!(
        "WITH {LIVE_LEASE},
         w AS MATERIALIZED (
             SELECT c.counted_until AS since, clock_timestamp() - interval '{LAG}' AS until
               FROM activity_counted c
              WHERE EXISTS (SELECT 1 FROM lease)
                FOR UPDATE OF c
         ),
         counted AS ({counted}),
         added AS (
             INSERT INTO activity_hours AS h (org_id, hour, site, kind, n)
             SELECT org_id, hour, site, kind, n FROM counted
             ON CONFLICT (org_id, hour, site, kind) DO UPDATE SET n = h.n + excluded.n
             RETURNING 1
         ),
         moved AS (
             UPDATE activity_counted c SET counted_until = w.until FROM w WHERE w.until > w.since
         ),
         dropped AS (
             DELETE FROM activity_hours
              WHERE hour < date_trunc('hour', clock_timestamp()) - interval '2 days'
                AND EXISTS (SELECT 1 FROM lease)
         )
         SELECT (SELECT count(*) FROM lease) AS live, (SELECT count(*) FROM added) AS added",
        counted = counted_sql("NULL"),
    );
    let (live, added): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(SWEEP_KEY)
        .bind(replica)
        .bind(fence)
        .fetch_one(db)
        .await?;
    Ok((live > 0).then_some(added as u64))
}

/// Counts organization `org_id`'s last two days again, up to
/// `counted_until`, from its reservations: for a writer that dates rows in
/// the past (the demo's history), which the count, a minute behind the
/// clock, has already passed. One transaction, which waits for a count in
/// progress (the row of `activity_counted`) so that none is lost or doubled.
pub async fn recount(db: &Db, org_id: i64) -> Result<(), sqlx::Error> {
    let mut tx = db.begin().await?;
    sqlx::query("SELECT 1 FROM activity_counted FOR UPDATE")
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM activity_hours WHERE org_id = $1")
        .bind(org_id)
        .execute(&mut *tx)
        .await?;
    let sql = format!(
        "WITH w AS (
             SELECT date_trunc('hour', clock_timestamp()) - interval '2 days' AS since,
                    counted_until AS until
               FROM activity_counted
         )
         INSERT INTO activity_hours (org_id, hour, site, kind, n)
         SELECT org_id, hour, site, kind, n FROM ({counted}) c",
        counted = counted_sql("$1"),
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// (site, kind, hour, count) of organization `org_id` in an hour.
pub type HourCount = (String, String, DateTime<Utc>, i64);

/// The last `hours` whole hours by the database clock (the current one
/// included), each as counted so far: the first hour, the counts of
/// organization `org_id` since then, and the instant up to which they
/// count. One statement, so that the hours and the instant are one reading.
pub async fn last_hours(
    db: &Db,
    org_id: i64,
    hours: i32,
) -> Result<(DateTime<Utc>, Vec<HourCount>, DateTime<Utc>), sqlx::Error> {
    type Row = (
        DateTime<Utc>,
        DateTime<Utc>,
        Option<String>,
        Option<String>,
        Option<DateTime<Utc>>,
        Option<i64>,
    );
    // The window's row comes back alone when no hour has counts yet.
    let rows: Vec<Row> = sqlx::query_as(
        "WITH w AS (
             SELECT date_trunc('hour', clock_timestamp()) - ($2 - 1) * interval '1 hour' AS first,
                    (SELECT counted_until FROM activity_counted) AS until
         )
         SELECT w.first, w.until, h.site, h.kind, h.hour, h.n
           FROM w LEFT JOIN activity_hours h ON h.org_id = $1 AND h.hour >= w.first",
    )
    .bind(org_id)
    .bind(hours)
    .fetch_all(db)
    .await?;
    let Some(&(first, until, ..)) = rows.first() else {
        return Err(sqlx::Error::Protocol(
            "activity::last_hours answered no row".to_owned(),
        ));
    };
    let counts = rows
        .into_iter()
        .filter_map(|(_, _, site, kind, hour, n)| Some((site?, kind?, hour?, n?)))
        .collect();
    Ok((first, counts, until))
}
