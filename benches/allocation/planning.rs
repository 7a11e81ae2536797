//! Item 18: planning (R21) at 1,000 pools (by default 50 sites x 20
//! profiles of one organization, 20 machines each).
//!
//! The daily job: a year of activity before the measured days (ended holds,
//! sales with their service links, refusals, machines in and out of
//! maintenance: what makes `pool_day_rows` read more than one day's rows),
//! then day by day a day's activity (holds created, converted, expired,
//! cancelled, some held over midnight, some served by a substitute;
//! refusals of every code; service links ended; machines added, retired,
//! into and out of maintenance), each dated in its day, then one call of
//! `planning::write_next_day` for that day under the sweep's lease, as the
//! sweep's holder makes it. Its duration (sent to answer read, commit
//! included) is how long it holds the cursor row (FOR UPDATE) and the lease
//! row (FOR SHARE): both are taken as the statement starts and kept to its
//! commit. The same locks are measured from the other side: two probes on
//! their own connections, one locking the lease row as a heartbeat's
//! UPDATE does (FOR NO KEY UPDATE), one the cursor row as a second run of
//! the job does (FOR UPDATE), each in a transaction rolled back at once,
//! again and again (2 ms apart) while the job runs; the longest a probe
//! waited is how long a writer of that row was held off. A probe that
//! takes the row just before the job makes the job wait for its rollback
//! (well under a millisecond), so the job's figure includes that.
//! Reservation events are not written (the job does not read them).
//!
//! The pages: `pool_days` replaced by 365 days of every pool, inserted
//! directly (the pages read `pool_days` and the live counts only), demand
//! varying per pool and day (a trend and a weekly swing) so that the fit
//! works on real series, some pools running out within days; then
//! `/planning`, one pool's `/planning/pool` and `GET /api/v1/forecast`,
//! each read by one client, nothing else running (p50 alone).
//!
//! The reserve path is not measured here: no reserve writes history.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use chrono::NaiveDate;
use poolkeeper::lease::{self, Claim, SWEEP_KEY};
use poolkeeper::planning::{self, Written};
use sqlx::{Connection, PgConnection};

use crate::setup::{Cluster, Config, Db};
use crate::stats::{Latency, median};
use crate::{pages, server, setup};

/// Profiles per site; the sites are `pools / PROFILES`.
pub const PROFILES: i64 = 20;
pub const MACHINES_PER_POOL: i64 = 20;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Day {
    pub day: NaiveDate,
    /// Pools written by the day's statement.
    pub pools: u64,
    /// The statement, sent to answer read (commit included).
    pub ms: f64,
    /// The longest wait of a probe of the lease row and of the cursor row
    /// while it ran.
    pub lease_wait_ms: f64,
    pub cursor_wait_ms: f64,
    /// The day's activity: holds created, refusal rows, machines changed.
    pub created: i64,
    pub refusals: i64,
    pub machine_changes: i64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Read {
    pub name: String,
    pub path: String,
    pub bytes: usize,
    /// Median over the runs of each run's summary.
    pub alone: Latency,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Result {
    pub pools: i64,
    pub machines: i64,
    /// Days of activity before the measured days, and what they wrote.
    pub history_days: i64,
    pub history_reservations: i64,
    pub history_refusals: i64,
    pub days: Vec<Day>,
    pub job_p50_ms: f64,
    pub job_max_ms: f64,
    /// The pages' history: days per pool, rows of `pool_days`.
    pub page_days: i64,
    pub page_rows: i64,
    /// Pools the forecast flags (run-out within the lead time).
    pub flagged: i64,
    pub reads: Vec<Read>,
}

/// The day's activity is fixed by hashes of ids and the day's number
/// (`dn`), so that a run is the same every time: SQL literals of a day
/// the bench chose (never input).
fn day_sql(day: NaiveDate) -> (String, String) {
    (
        format!("(date '{day}'::timestamp AT TIME ZONE 'UTC')"),
        format!("(date '{day}' - date '2000-01-01')"),
    )
}

/// The pools as SQL rows (site, profile, k): `sites` sites of `PROFILES`
/// profiles.
fn pools_sql(sites: i64) -> String {
    format!(
        "SELECT 's' || lpad(si::text, 2, '0') AS site, 'profile-' || lpad(pi::text, 2, '0') AS profile,
                si * 31 + pi AS k
           FROM generate_series(1, {sites}) si, generate_series(0, {PROFILES} - 1) pi"
    )
}

pub async fn run(cluster: &Cluster, cfg: &Config) -> anyhow::Result<Result> {
    let name = "bench_planning";
    let db = cluster.database(name).await?;
    let outcome = measure(cluster, cfg, &db).await;
    db.setup.close().await;
    crate::drop_database(cluster, name).await?;
    outcome
}

async fn measure(cluster: &Cluster, cfg: &Config, db: &Db) -> anyhow::Result<Result> {
    let started = Instant::now();
    let sites = (cfg.planning_pools / PROFILES).max(1);
    let pools = sites * PROFILES;
    let org = setup::org(db, "planning").await?;
    let today: NaiveDate =
        sqlx::query_scalar("SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date")
            .fetch_one(&db.setup)
            .await?;
    let first = today - chrono::Duration::days(cfg.planning_days);
    let (history_reservations, history_refusals) =
        load(db, org.id, sites, first, cfg.planning_history_days).await?;
    let machines = db
        .scalar_i64(&format!(
            "SELECT count(*) FROM machines WHERE org_id = {}",
            org.id
        ))
        .await?;
    // The cursor: every day before the measured ones is written.
    sqlx::query("UPDATE pool_days_written SET through = $1")
        .bind(first - chrono::Duration::days(1))
        .execute(&db.setup)
        .await?;
    db.exec("VACUUM ANALYZE").await?;
    db.exec("CHECKPOINT").await?;
    eprintln!(
        "planning: {pools} pools, {machines} machines, {} days of history ({history_reservations} reservations, {history_refusals} refusals): loaded in {:.0} s",
        cfg.planning_history_days,
        started.elapsed().as_secs_f64()
    );
    let days = job_days(db, org.id, sites, first, cfg.planning_days).await?;
    let ms: Vec<f64> = days.iter().map(|d| d.ms).collect();
    let job_p50_ms = median(&ms);
    let job_max_ms = ms.iter().copied().fold(0.0, f64::max);

    let page_rows = page_history(db, org.id, sites, today, cfg.planning_page_days).await?;
    pages::create_viewer(db, org.id).await?;
    let app = db.app_pool(2).await?;
    poolkeeper::capacity::fold_figures(&app).await?;
    let flagged = poolkeeper::forecast::read_from(&app, org.id, None, None)
        .await?
        .pools
        .iter()
        .filter(|p| p.flagged)
        .count() as i64;
    app.close().await;
    db.exec("VACUUM ANALYZE").await?;
    db.exec("CHECKPOINT").await?;
    let server = server::Server::start(&db.url, &cluster.dir, &cfg.server_log).await?;
    let reads = read_pages(cfg, &server.base, &org.token).await;
    server.stop().await;
    Ok(Result {
        pools,
        machines,
        history_days: cfg.planning_history_days,
        history_reservations,
        history_refusals,
        days,
        job_p50_ms,
        job_max_ms,
        page_days: cfg.planning_page_days,
        page_rows,
        flagged,
        reads: reads?,
    })
}

/// The machines, created before the history, and `history_days` days of
/// activity before `first` in bulk: 2 holds per pool and day, all ended
/// (a third each converted, expired, cancelled; each sale's link ended
/// within a week, before `first`), 0 to 2 refusal rows per pool and day,
/// and 1 machine in 200 a day into maintenance and back two days later.
/// Returns the reservations and refusals written.
async fn load(
    db: &Db,
    org_id: i64,
    sites: i64,
    first: NaiveDate,
    history_days: i64,
) -> anyhow::Result<(i64, i64)> {
    let pools = pools_sql(sites);
    let (born, _) = day_sql(first - chrono::Duration::days(history_days + 2));
    let (start_of, _) = day_sql(first);
    db.exec(&format!(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status, created_at, updated_at)
         SELECT {org_id}, 'pl-' || p.site || '-' || p.profile || '-' || lpad(g::text, 3, '0'), p.site,
                CASE WHEN g % 2 = 0 THEN 'dell' ELSE 'hpe' END, p.profile, 'ready', {born}, {born}
           FROM ({pools}) p, generate_series(1, {MACHINES_PER_POOL}) g"
    ))
    .await?;
    let reservations = history_days * sites * PROFILES * 2;
    const BATCH: i64 = 100_000;
    let mut start = 1;
    while start <= reservations {
        let end = (start + BATCH - 1).min(reservations);
        sqlx::query(
            "WITH ms AS (SELECT array_agg(id ORDER BY id) AS ids FROM machines WHERE org_id = $1),
             src AS (
                SELECT g, ms.ids[1 + (g * 7919) % cardinality(ms.ids)] AS machine_id,
                       (ARRAY['converted', 'expired', 'cancelled'])[1 + g % 3] AS state,
                       $2::timestamptz + (g - 1) * (($3::timestamptz - $2::timestamptz) / $6) AS created_at
                  FROM generate_series($4::bigint, $5::bigint) g, ms
             ),
             ins AS (
                INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot, reason,
                                          hold_seconds, created_at, expires_at, ended_at, ended_by, end_reason)
                SELECT $1, 'hist-' || g, s.machine_id, s.state,
                       jsonb_build_object('site', m.site, 'profile', m.profile, 'hold_seconds', 900),
                       jsonb_build_object('asset_tag', m.asset_tag, 'site', m.site, 'profile', m.profile),
                       'bench history', 900, s.created_at, s.created_at + interval '900 seconds',
                       s.created_at + CASE s.state WHEN 'converted' THEN interval '300 seconds'
                                                   WHEN 'expired' THEN interval '900 seconds'
                                                   ELSE interval '120 seconds' END,
                       'bench', 'bench history'
                  FROM src s JOIN machines m ON m.id = s.machine_id
                RETURNING id, machine_id, state, ended_at
             )
             INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at, ended_at, ended_by)
             SELECT $1, machine_id, id, 'SRV-' || id, ended_at,
                    least(ended_at + interval '7 days', $3::timestamptz - interval '1 hour'), 'bench'
               FROM ins WHERE state = 'converted'",
        )
        .bind(org_id)
        .bind(day_start(first - chrono::Duration::days(history_days)))
        .bind(day_start(first))
        .bind(start)
        .bind(end)
        .bind(reservations as f64)
        .execute(&db.setup)
        .await?;
        start = end + 1;
    }
    let refusals = db
        .exec(&format!(
            "INSERT INTO reservation_refusals (org_id, at, reason, site, profile, excluded, quantity)
             SELECT {org_id}, {start_of} - d * interval '1 day'
                              + make_interval(hours => 6 + p.k % 12 + i * 5, mins => (p.k * d) % 60),
                    (ARRAY['unavailable', 'contended', 'reserved', 'customer_limit'])[1 + (p.k + d + i) % 4],
                    p.site, p.profile, '{{}}', 1 + (p.k + d) % 3
               FROM ({pools}) p, generate_series(1, {history_days}) d, generate_series(0, 1) i
              WHERE i < (p.k + d) % 3"
        ))
        .await? as i64;
    // Straight into the log of changes (the triggers date a change at its
    // `updated_at`; these are past ones that end where the machine is now).
    db.exec(&format!(
        "INSERT INTO machine_changes (machine_id, org_id, at, site, profile, status)
         SELECT m.id, m.org_id, {start_of} - d * interval '1 day' + x.after, m.site, m.profile, x.status
           FROM machines m, generate_series(3, {history_days}) d,
                (VALUES (interval '2 hours', 'maintenance'), (interval '50 hours', 'ready')) x(after, status)
          WHERE m.org_id = {org_id} AND ((m.id % 1000003) * 7919 + d * 104729) % 200 = 0"
    ))
    .await?;
    Ok((reservations, refusals))
}

fn day_start(day: NaiveDate) -> chrono::DateTime<chrono::Utc> {
    day.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc()
}

/// One day's activity, dated in `day`, in a few set-based statements.
/// Returns holds created, refusal rows and machine changes of the day.
async fn activity(
    db: &Db,
    org_id: i64,
    sites: i64,
    day: NaiveDate,
) -> anyhow::Result<(i64, i64, i64)> {
    let pools = pools_sql(sites);
    let (ds, dn) = day_sql(day);
    let statements: [(&str, String); 6] = [
        // Machines added to a pool: 1 in 10 pools a day.
        (
            "added",
            format!(
                "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status, created_at, updated_at)
                 SELECT {org_id}, 'pl-add-{day}-' || p.k, p.site, 'dell', p.profile, 'ready',
                        {ds} + interval '1 hour', {ds} + interval '1 hour'
                   FROM ({pools}) p WHERE (p.k + {dn}) % 10 = 0"
            ),
        ),
        // The holds left open over midnight end: half sold, half cancelled.
        (
            "ended",
            format!(
                "WITH ended AS (
                    UPDATE reservations r
                       SET state = CASE WHEN r.id % 2 = 0 THEN 'converted' ELSE 'cancelled' END,
                           ended_at = {ds} + make_interval(mins => 10 + (r.id % 50)::int),
                           ended_by = 'bench', end_reason = 'bench'
                     WHERE r.org_id = {org_id} AND r.state = 'held'
                    RETURNING r.id, r.machine_id, r.state, r.ended_at)
                 INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at)
                 SELECT {org_id}, machine_id, id, 'SRV-' || id, ended_at FROM ended WHERE state = 'converted'"
            ),
        ),
        // One live service in six ends.
        (
            "links",
            format!(
                "UPDATE service_links SET ended_at = {ds} + interval '1 hour 15 minutes', ended_by = 'bench'
                  WHERE org_id = {org_id} AND ended_at IS NULL AND created_at < {ds} AND (id + {dn}) % 6 = 0"
            ),
        ),
        // Free machines: 1 in 400 ready ones into maintenance or retired,
        // a third of those in maintenance back.
        (
            "statuses",
            format!(
                "UPDATE machines m
                    SET status = CASE WHEN m.status = 'maintenance' THEN 'ready'
                                      WHEN (m.id + {dn}) % 3 = 0 THEN 'retired' ELSE 'maintenance' END,
                        updated_at = {ds} + interval '1 hour 30 minutes'
                  WHERE m.org_id = {org_id} AND NOT m.in_service
                    AND ((m.status = 'maintenance' AND (m.id + {dn}) % 3 = 0)
                         OR (m.status = 'ready' AND ((m.id % 1000003) * 7919 + {dn} * 104729) % 400 = 0))
                    AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.machine_id = m.id AND r.state = 'held')"
            ),
        ),
        // New holds: 0 to 4 per pool (2 on average) on free ready
        // machines; 35% sold, 20% expired, 25% cancelled within the hour,
        // 20% still held at midnight; one order in eight asked another
        // profile and was served by this one (a substitute), told as a
        // refusal row `substituted` of the asked pool, as the allocator
        // records it.
        (
            "holds",
            format!(
                "WITH free AS (
                    SELECT m.*, row_number() OVER (PARTITION BY m.site, m.profile
                                                   ORDER BY ((m.id % 1000003) * 2654435761 + {dn}) % 1000003) AS rank
                      FROM machines m
                     WHERE m.org_id = {org_id} AND m.status = 'ready' AND NOT m.in_service
                       AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.machine_id = m.id AND r.state = 'held')
                 ), chosen AS (
                    SELECT f.*, CASE WHEN ((f.id % 1000003) * 31 + {dn}) % 20 < 7 THEN 'converted'
                                     WHEN ((f.id % 1000003) * 31 + {dn}) % 20 < 11 THEN 'expired'
                                     WHEN ((f.id % 1000003) * 31 + {dn}) % 20 < 16 THEN 'cancelled'
                                     ELSE 'held' END AS outcome,
                           CASE WHEN (f.id + {dn}) % 8 = 0
                                THEN 'profile-' || lpad(((substr(f.profile, 9)::int + 1) % {PROFILES})::text, 2, '0')
                           END AS asked
                      FROM free f JOIN ({pools}) p ON p.site = f.site AND p.profile = f.profile
                     WHERE f.rank <= (p.k * 7 + {dn}) % 5
                 ), timed AS (
                    SELECT c.*, CASE WHEN c.outcome = 'held'
                                     THEN {ds} + interval '22 hours' + make_interval(mins => (c.id % 100)::int)
                                     ELSE {ds} + make_interval(hours => (3 + c.rank * 4 + c.id % 5)::int,
                                                               mins => (c.id % 60)::int) END AS at
                      FROM chosen c
                 ), ins AS (
                    INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot, reason,
                                              hold_seconds, created_at, expires_at, ended_at, ended_by, end_reason,
                                              profile_asked)
                    SELECT {org_id}, 'day-{day}-' || t.id, t.id, t.outcome,
                           jsonb_build_object('site', t.site, 'profile', coalesce(t.asked, t.profile)),
                           jsonb_build_object('asset_tag', t.asset_tag, 'site', t.site, 'profile', t.profile),
                           'bench day', CASE WHEN t.outcome = 'held' THEN 14400 ELSE 900 END, t.at,
                           t.at + CASE WHEN t.outcome = 'held' THEN interval '4 hours' ELSE interval '15 minutes' END,
                           t.at + CASE t.outcome WHEN 'converted' THEN interval '5 minutes'
                                                 WHEN 'expired' THEN interval '15 minutes'
                                                 WHEN 'cancelled' THEN interval '2 minutes' END,
                           CASE WHEN t.outcome <> 'held' THEN 'bench' END,
                           CASE WHEN t.outcome <> 'held' THEN 'bench' END,
                           t.asked
                      FROM timed t
                    RETURNING id, machine_id, state, created_at, ended_at, profile_asked, spec, machine_snapshot
                 ), links AS (
                    INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at)
                    SELECT {org_id}, machine_id, id, 'SRV-' || id, ended_at FROM ins WHERE state = 'converted'
                 )
                 INSERT INTO reservation_refusals (org_id, at, reason, site, profile, excluded, quantity,
                                                   profile_served)
                 SELECT {org_id}, created_at, 'substituted', spec->>'site', profile_asked, '{{}}', 1,
                        machine_snapshot->>'profile'
                   FROM ins WHERE profile_asked IS NOT NULL"
            ),
        ),
        // Refusals: 0 to 2 rows per pool, every code, 1 to 3 machines.
        (
            "refusals",
            format!(
                "INSERT INTO reservation_refusals (org_id, at, reason, site, profile, excluded, quantity)
                 SELECT {org_id}, {ds} + make_interval(hours => (6 + i * 5)::int, mins => (p.k % 60)::int),
                        (ARRAY['unavailable', 'contended', 'reserved', 'customer_limit'])[1 + (p.k + i + {dn}) % 4],
                        p.site, p.profile, '{{}}', 1 + (p.k + i) % 3
                   FROM ({pools}) p, generate_series(0, 1) i
                  WHERE i < (p.k + {dn}) % 3"
            ),
        ),
    ];
    for (what, sql) in &statements {
        if let Err(e) = db.exec(sql).await {
            bail!("planning: the day's {what} statement: {e:#}");
        }
    }
    let counts: (i64, i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT (SELECT count(*) FROM reservations WHERE org_id = {org_id}
                   AND created_at >= {ds} AND created_at < {ds} + interval '1 day'),
                (SELECT count(*) FROM reservation_refusals WHERE org_id = {org_id}
                   AND at >= {ds} AND at < {ds} + interval '1 day'),
                (SELECT count(*) FROM machine_changes WHERE org_id = {org_id}
                   AND at >= {ds} AND at < {ds} + interval '1 day')"
    )))
    .fetch_one(&db.setup)
    .await?;
    Ok(counts)
}

/// A probe of one row's lock: `sql` (a locking SELECT) in a transaction
/// rolled back at once, again and again, 2 ms apart, until `stop`; the
/// longest any one waited.
async fn probe(
    mut conn: PgConnection,
    sql: &'static str,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<(PgConnection, f64)> {
    let mut longest = Duration::ZERO;
    while !stop.load(Ordering::Relaxed) {
        let mut tx = conn.begin().await?;
        let t = Instant::now();
        sqlx::query(sql).bind(SWEEP_KEY).execute(&mut *tx).await?;
        longest = longest.max(t.elapsed());
        tx.rollback().await?;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok((conn, crate::stats::ms(longest)))
}

const LEASE_PROBE: &str = "SELECT 1 FROM leases WHERE key = $1 FOR NO KEY UPDATE";
const CURSOR_PROBE: &str = "SELECT 1 FROM pool_days_written WHERE $1::text IS NOT NULL FOR UPDATE";

/// The measured days: each day's activity, then the job for it, timed, the
/// probes running meanwhile.
async fn job_days(
    db: &Db,
    org_id: i64,
    sites: i64,
    first: NaiveDate,
    days: i64,
) -> anyhow::Result<Vec<Day>> {
    let replica = "planning-bench";
    let mandate =
        match lease::claim(&db.setup, SWEEP_KEY, replica, Duration::from_secs(3600)).await? {
            Claim::Acquired(m) => m,
            Claim::HeldByOther => bail!("planning: the sweep lease is held by another replica"),
        };
    // The job runs on a connection as the application's (its session
    // settings); the probes wait 30 s at most rather than hang.
    let app = db.app_pool(1).await?;
    let mut lease_conn = db.connection().await?;
    let mut cursor_conn = db.connection().await?;
    for c in [&mut lease_conn, &mut cursor_conn] {
        sqlx::query("SET lock_timeout = '30s'")
            .execute(&mut *c)
            .await?;
    }
    let mut out = Vec::new();
    for i in 0..days {
        let day = first + chrono::Duration::days(i);
        let (created, refusals, machine_changes) = activity(db, org_id, sites, day).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let lease_task = tokio::spawn(probe(lease_conn, LEASE_PROBE, stop.clone()));
        let cursor_task = tokio::spawn(probe(cursor_conn, CURSOR_PROBE, stop.clone()));
        let t = Instant::now();
        let wrote = planning::write_next_day(&app, replica, mandate.fence).await;
        let ms = crate::stats::ms(t.elapsed());
        stop.store(true, Ordering::Relaxed);
        let (lc, lease_wait_ms) = lease_task.await??;
        let (cc, cursor_wait_ms) = cursor_task.await??;
        (lease_conn, cursor_conn) = (lc, cc);
        let pools = match wrote? {
            Some(Written::Day(d, pools)) if d == day => pools,
            other => bail!("planning: the job for {day} answered {other:?}"),
        };
        eprintln!(
            "  {day}: {pools} pools in {ms:.0} ms (probes waited at most: lease row {lease_wait_ms:.0} ms, cursor row {cursor_wait_ms:.0} ms); the day: {created} holds, {refusals} refusal rows, {machine_changes} machine changes"
        );
        out.push(Day {
            day,
            pools,
            ms,
            lease_wait_ms,
            cursor_wait_ms,
            created,
            refusals,
            machine_changes,
        });
    }
    lease::release(&db.setup, &mandate).await.ok();
    app.close().await;
    Ok(out)
}

/// `pool_days` replaced by `days` days of every pool up to yesterday:
/// stock and flows adding up as the table's checks ask, demand per pool
/// from 0 (one pool in ten) to about 4 a day, with a trend and a swing.
/// Returns the rows.
async fn page_history(
    db: &Db,
    org_id: i64,
    sites: i64,
    today: NaiveDate,
    days: i64,
) -> anyhow::Result<i64> {
    db.exec("DELETE FROM pool_days").await?;
    let pools = pools_sql(sites);
    let rows = db
        .exec(&format!(
            "WITH series AS (
                SELECT p.site, p.profile, p.k, d, date '{today}' - d AS day,
                       CASE WHEN p.k % 10 = 0 THEN 0
                            ELSE greatest(0, round((p.k % 7) * 0.6 * (1 + (400 - d) / 800.0)
                                                   + 1.5 * sin((d + p.k) * 0.9) + ((d * p.k) % 5 - 2) * 0.4))
                       END::bigint AS demand
                  FROM ({pools}) p, generate_series(1, {days}) d
             ), stock AS (
                SELECT s.*, 20 + (s.k % 4) * 5 AS total, (s.k + s.d) % 3 AS held, (s.k + s.d) % 2 AS not_ready,
                       10 + (s.k + s.d) % 8 AS sold
                  FROM series s
             )
             INSERT INTO pool_days (org_id, site, profile, day, total, sellable, held, sold, not_ready,
                                    created, converted, expired, cancelled, refused_unavailable,
                                    refused_contended, refused_reserved, refused_customer_limit,
                                    substituted_in, substituted_out, added, retired, demand, replica,
                                    lease_fence)
             SELECT {org_id}, site, profile, day, total, total - held - not_ready - sold, held, sold, not_ready,
                    demand + held, demand - demand / 3 - demand / 5, held, 0, demand / 3, (k + d) % 2, 0, 0,
                    0, demand / 5, CASE WHEN d % 30 = 0 THEN 5 ELSE 0 END, 0, demand, 'bench', 0
               FROM stock"
        ))
        .await?;
    Ok(rows as i64)
}

/// The pages and the API's forecast, each read alone, `cfg.runs` runs.
async fn read_pages(cfg: &Config, base: &str, token: &str) -> anyhow::Result<Vec<Read>> {
    let staff = pages::login(base).await?;
    let api = reqwest::Client::builder()
        .default_headers(reqwest::header::HeaderMap::from_iter([(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse()?,
        )]))
        .build()?;
    // The pool soonest out: the first of the forecast.
    let forecast: serde_json::Value = api
        .get(format!("{base}/api/v1/forecast"))
        .send()
        .await?
        .json()
        .await?;
    let (site, profile) = forecast
        .get("pools")
        .and_then(|p| p.get(0))
        .and_then(|p| Some((p.get("site")?.as_str()?, p.get("profile")?.as_str()?)))
        .map(|(s, p)| (s.to_owned(), p.to_owned()))
        .ok_or_else(|| anyhow::anyhow!("planning: the forecast names no pool: {forecast}"))?;
    let list: [(&str, String, bool); 3] = [
        (
            "the planning page (`/planning`, every pool)",
            "/planning".to_owned(),
            true,
        ),
        (
            "one pool's page (`/planning/pool`, the pool soonest out)",
            format!("/planning/pool?site={site}&profile={profile}"),
            true,
        ),
        (
            "`GET /api/v1/forecast` (every pool)",
            "/api/v1/forecast".to_owned(),
            false,
        ),
    ];
    let client = |page: bool| if page { &staff } else { &api };
    let mut sizes = Vec::new();
    for (_, path, page) in &list {
        let r = client(*page).get(format!("{base}{path}")).send().await?;
        if r.status() != 200 {
            bail!("planning: {path} answered {}", r.status());
        }
        sizes.push(r.bytes().await?.len());
    }
    let mut runs: Vec<Vec<Latency>> = Vec::new();
    for _ in 0..cfg.runs {
        let mut run = Vec::new();
        for (_, path, page) in &list {
            run.push(
                crate::fleet::read_for(
                    client(*page),
                    &format!("{base}{path}"),
                    cfg.run_seconds / 2.0,
                )
                .await?,
            );
        }
        runs.push(run);
    }
    let mut out = Vec::new();
    for (i, (name, path, _)) in list.iter().enumerate() {
        let alone = Latency::median_of(&runs.iter().map(|r| r[i]).collect::<Vec<_>>());
        eprintln!(
            "  {name}: {} bytes, alone p50 {:.1} ms, p99 {:.1} ms",
            sizes[i], alone.p50_ms, alone.p99_ms
        );
        out.push(Read {
            name: (*name).to_owned(),
            path: path.clone(),
            bytes: sizes[i],
            alone,
        });
    }
    Ok(out)
}
