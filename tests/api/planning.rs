//! R21: each pool's history per UTC day (src/planning.rs,
//! sql/planning.sql), written once per pool and day by the sweep's holder,
//! fenced; the past rebuilt by the same job agrees with the days written as
//! they closed; and the forecast read from it.

use std::sync::Arc;
use std::time::Duration;

use chrono::NaiveDate;
use tokio::sync::Barrier;

use poolkeeper::db::Db;
use poolkeeper::lease::{self, Claim, Mandate, SWEEP_KEY};
use poolkeeper::planning::{self, Written};

use crate::helpers::{create_org, migrated_db};

const POOLS: [(&str, &str); 4] = [
    ("par1", "epyc-64"),
    ("par1", "xeon-32"),
    ("ams9", "epyc-64"),
    ("ams9", "xeon-32"),
];

async fn mandate(pool: &Db, replica: &str) -> Mandate {
    match lease::claim(pool, SWEEP_KEY, replica, Duration::from_secs(300))
        .await
        .expect("claim the sweep lease")
    {
        Claim::Acquired(m) => m,
        Claim::HeldByOther => panic!("the sweep lease is taken"),
    }
}

async fn today(pool: &Db) -> NaiveDate {
    sqlx::query_scalar("SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date")
        .fetch_one(pool)
        .await
        .expect("today")
}

async fn set_cursor(pool: &Db, through: NaiveDate) {
    sqlx::query("UPDATE pool_days_written SET through = $1")
        .bind(through)
        .execute(pool)
        .await
        .expect("move the cursor");
}

/// Every row of pool_days without who wrote it, as text, in key order.
async fn days_as_text(pool: &Db) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT (org_id, site, profile, day, total, sellable, held, sold, not_ready, created,
                 converted, expired, cancelled, refused_unavailable, refused_contended,
                 refused_reserved, refused_customer_limit, substituted_in, substituted_out,
                 added, retired, demand)::text
           FROM pool_days ORDER BY org_id, site, profile, day",
    )
    .fetch_all(pool)
    .await
    .expect("read pool_days")
}

/// The instant `hour` hours (and `minute` minutes) into the UTC day `ago`
/// days before today, as SQL.
fn at(ago: i64, hour: i64, minute: i64) -> String {
    format!(
        "((((clock_timestamp() AT TIME ZONE 'UTC')::date - {ago})::timestamp
           + make_interval(hours => {hour}, mins => {minute})) AT TIME ZONE 'UTC')"
    )
}

/// A deterministic history: machines added, moved, out of and back in
/// service, retired; holds created, converted, expired, cancelled (some
/// ending days later), some served by a substitute; service links ended;
/// refusals of every code. Each day's events happen in that day, in order.
struct History {
    pool: Db,
    org: i64,
    seed: u64,
    orders: u64,
}

impl History {
    fn next(&mut self, below: u64) -> u64 {
        // xorshift64: the same history every run.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed % below
    }

    async fn exec(&self, sql: String) {
        sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    async fn ids(&self, sql: String) -> Vec<i64> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
            .bind(self.org)
            .fetch_all(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn day(&mut self, ago: i64) {
        let org = self.org;
        // Machines added to a pool.
        let (site, profile) = POOLS[self.next(4) as usize];
        let added = self.next(3) + u64::from(ago > 85) * 4;
        for _ in 0..added {
            self.exec(format!(
                "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status, created_at, updated_at)
                 VALUES ({org}, 'M-' || gen_random_uuid(), '{site}', 'dell', '{profile}', 'ready', {t}, {t})",
                t = at(ago, 1, 0)
            ))
            .await;
        }
        // Open holds end, or stay open.
        let held = self
            .ids(
                "SELECT id FROM reservations WHERE org_id = $1 AND state = 'held' ORDER BY id"
                    .into(),
            )
            .await;
        for id in held {
            let end = match self.next(4) {
                0 => continue,
                1 => "converted",
                2 => "expired",
                _ => "cancelled",
            };
            let t = at(ago, 2, 0);
            self.exec(format!(
                "UPDATE reservations SET state = '{end}', ended_at = {t}, ended_by = 'test' WHERE id = {id}"
            ))
            .await;
            if end == "converted" {
                self.exec(format!(
                    "INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at)
                     SELECT org_id, machine_id, id, 'SRV-' || id, {t} FROM reservations WHERE id = {id}"
                ))
                .await;
            }
        }
        self.holds(ago).await;
        // Service links end.
        let links = self
            .ids(
                "SELECT id FROM service_links WHERE org_id = $1 AND ended_at IS NULL ORDER BY id"
                    .into(),
            )
            .await;
        for id in links {
            if self.next(6) == 0 {
                self.exec(format!(
                    "UPDATE service_links SET ended_at = {t}, ended_by = 'test' WHERE id = {id}",
                    t = at(ago, 4, 0)
                ))
                .await;
            }
        }
        self.statuses(ago).await;
        self.refusals(ago).await;
    }

    /// New holds on free ready machines, a quarter served as a substitute.
    async fn holds(&mut self, ago: i64) {
        let org = self.org;
        let free = self
            .ids(
                "SELECT m.id FROM machines m
                  WHERE m.org_id = $1 AND m.status = 'ready' AND NOT m.in_service
                    AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.machine_id = m.id AND r.state = 'held')
                  ORDER BY m.id"
                    .into(),
            )
            .await;
        let n = self.next(5) as usize;
        for i in 0..n.min(free.len()) {
            let machine = free[self.next(free.len() as u64) as usize];
            let asked = if self.next(4) == 0 {
                "CASE WHEN m.profile = 'epyc-64' THEN 'xeon-32' ELSE 'epyc-64' END"
            } else {
                "NULL"
            };
            self.orders += 1;
            let t = at(ago, 3, i as i64);
            self.exec(format!(
                "INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason,
                                           hold_seconds, created_at, expires_at, profile_asked)
                 SELECT {org}, 'gen-{o}', m.id, '{{}}', '{{}}', 'generated', 3600, {t},
                        {t} + interval '3 days', {asked}
                   FROM machines m
                  WHERE m.id = {machine}
                    AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.machine_id = m.id AND r.state = 'held')",
                o = self.orders
            ))
            .await;
        }
    }

    /// A free machine out of service, back, retired or moved to another
    /// profile; never one under a hold (healing would move the hold).
    async fn statuses(&mut self, ago: i64) {
        let free = self
            .ids(
                "SELECT m.id FROM machines m
                  WHERE m.org_id = $1 AND m.status <> 'retired' AND NOT m.in_service
                    AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.machine_id = m.id AND r.state = 'held')
                  ORDER BY m.id"
                    .into(),
            )
            .await;
        if free.is_empty() {
            return;
        }
        for _ in 0..2 {
            let id = free[self.next(free.len() as u64) as usize];
            let set = match self.next(10) {
                0 => "status = 'retired'".to_owned(),
                1 => "profile = CASE WHEN profile = 'epyc-64' THEN 'xeon-32' ELSE 'epyc-64' END"
                    .to_owned(),
                2..=5 => "status = 'maintenance'".to_owned(),
                _ => "status = 'ready'".to_owned(),
            };
            self.exec(format!(
                "UPDATE machines SET {set}, updated_at = {t} WHERE id = {id}",
                t = at(ago, 5, 0)
            ))
            .await;
        }
    }

    async fn refusals(&mut self, ago: i64) {
        let org = self.org;
        for i in 0..self.next(4) {
            let (site, profile) = POOLS[self.next(4) as usize];
            let reason = [
                "unavailable",
                "contended",
                "reserved",
                "customer_limit",
                "substituted",
            ][self.next(5) as usize];
            let served = if reason == "substituted" {
                format!(
                    "'{}'",
                    if profile == "epyc-64" {
                        "xeon-32"
                    } else {
                        "epyc-64"
                    }
                )
            } else {
                "NULL".to_owned()
            };
            let q = 1 + self.next(3);
            self.exec(format!(
                "INSERT INTO reservation_refusals (org_id, at, reason, site, profile, excluded, quantity, profile_served)
                 VALUES ({org}, {t}, '{reason}', '{site}', '{profile}', '{{}}', {q}, {served})",
                t = at(ago, 6, i as i64),
            ))
            .await;
        }
    }
}

/// The history written day by day, each day right after its events, equals
/// the same 90 days rebuilt at the end from the rows as they are then (holds
/// ended, links ended, machines changed since), pool by pool and day by day;
/// and the last day's counts are the pools' live counts.
#[tokio::test]
async fn rebuilt_history_equals_the_days_written_as_they_closed() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "planning-gen", true).await;
    let m = mandate(&pool, "history-writer").await;
    let today = today(&pool).await;
    set_cursor(&pool, today - chrono::Duration::days(91)).await;
    let mut history = History {
        pool: pool.clone(),
        org: org.id,
        seed: 0x9E37_79B9_7F4A_7C15,
        orders: 0,
    };
    for ago in (1..=90).rev() {
        history.day(ago).await;
        let wrote = planning::write_next_day(&pool, &m.holder, m.fence)
            .await
            .expect("write the day");
        match wrote {
            Some(Written::Day(day, _)) => assert_eq!(day, today - chrono::Duration::days(ago)),
            other => panic!("day {ago} ago: {other:?}"),
        }
    }
    let up_to_date = planning::write_next_day(&pool, &m.holder, m.fence).await;
    assert!(
        matches!(up_to_date, Ok(Some(Written::UpToDate))),
        "{up_to_date:?}"
    );
    let day_by_day = days_as_text(&pool).await;

    // Every kind of flow happened, so the agreement below is about them all.
    let sums: Vec<i64> = sqlx::query_scalar(
        "SELECT unnest(ARRAY[sum(created), sum(converted), sum(expired), sum(cancelled),
                sum(refused_unavailable), sum(refused_contended), sum(refused_reserved),
                sum(refused_customer_limit), sum(substituted_in), sum(substituted_out),
                sum(added), sum(retired), sum(demand), sum(held), sum(sold), sum(not_ready)])::bigint
           FROM pool_days",
    )
    .fetch_all(&pool)
    .await
    .expect("sums");
    assert!(sums.iter().all(|s| *s > 0), "{sums:?}");

    // Rebuilt by the same job from the rows as they are now.
    planning::rewrite_from(&pool, today - chrono::Duration::days(90))
        .await
        .expect("rewrite");
    assert_eq!(days_as_text(&pool).await.len(), 0);
    let mut days = 0;
    while let Some(Written::Day(..)) = planning::write_next_day(&pool, &m.holder, m.fence)
        .await
        .expect("rebuild a day")
    {
        days += 1;
    }
    assert_eq!(days, 90);
    let rebuilt = days_as_text(&pool).await;
    assert_eq!(rebuilt.len(), day_by_day.len());
    for (a, b) in day_by_day.iter().zip(&rebuilt) {
        assert_eq!(a, b, "written as the day closed vs rebuilt");
    }

    // Yesterday's end is now as far as machines go: the counts that do not
    // depend on a hold's deadline equal R17's live counts.
    let drift: Vec<String> = sqlx::query_scalar(
        "WITH live AS (SELECT site, profile, total, sold, sellable + held AS free
                         FROM capacity_pools($1, NULL, NULL, NULL, NULL)),
              kept AS (SELECT site, profile, total, sold, sellable + held AS free FROM pool_days
                        WHERE org_id = $1 AND day = (clock_timestamp() AT TIME ZONE 'UTC')::date - 1
                          AND total > 0)
         SELECT concat_ws(' ', site, profile, l.total, k.total, l.sold, k.sold, l.free, k.free)
           FROM live l FULL JOIN kept k USING (site, profile)
          WHERE (l.total, l.sold, l.free) IS DISTINCT FROM (k.total, k.sold, k.free)",
    )
    .bind(org.id)
    .fetch_all(&pool)
    .await
    .expect("compare with the live counts");
    assert_eq!(drift, Vec::<String>::new());
}

/// Four replicas run the job at once under the live mandate: each closed
/// day is written once (two due days: two runs write one each, two find
/// nothing), equal to a fresh computation; a holder that lost the lease
/// writes nothing and leaves the cursor.
#[tokio::test]
async fn four_replicas_write_each_pool_day_once_and_a_lost_holder_nothing() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "planning-race", true).await;
    for (i, (site, profile)) in POOLS.iter().enumerate() {
        for ago in [2, 1] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status, created_at, updated_at)
                 SELECT $1, 'R-' || $2 || '-' || $5 || '-' || g, $3, 'dell', $4, 'ready', {t}, {t}
                   FROM generate_series(1, $2 + 1) g",
                t = at(ago, 3, 0)
            )))
            .bind(org.id)
            .bind(i as i32)
            .bind(site)
            .bind(profile)
            .bind(ago as i32)
            .execute(&pool)
            .await
            .expect("machines");
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO reservation_refusals (org_id, at, reason, site, profile, excluded, quantity)
                 VALUES ($1, {t}, 'unavailable', $2, $3, '{{}}', 2)",
                t = at(ago, 4, 0)
            )))
            .bind(org.id)
            .bind(site)
            .bind(profile)
            .execute(&pool)
            .await
            .expect("refusal");
        }
    }
    let today = today(&pool).await;
    set_cursor(&pool, today - chrono::Duration::days(3)).await;

    // A holder that lost the lease: released, then claimed by another.
    let old = mandate(&pool, "replica-old").await;
    lease::release(&pool, &old).await.expect("release");
    let m = mandate(&pool, "replica-new").await;
    let lost = planning::write_next_day(&pool, &old.holder, old.fence).await;
    assert!(matches!(lost, Ok(None)), "{lost:?}");
    assert_eq!(days_as_text(&pool).await.len(), 0);

    let barrier = Arc::new(Barrier::new(4));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (pool, barrier, m) = (pool.clone(), barrier.clone(), m.clone());
        tasks.push(tokio::spawn(async move {
            // Its own connection, as another replica's.
            let mut conn = pool.acquire().await.expect("connection");
            barrier.wait().await;
            planning::write_next_day(&mut *conn, &m.holder, m.fence).await
        }));
    }
    let mut written = Vec::new();
    for t in tasks {
        match tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("a run must not hang")
            .expect("task")
            .expect("run")
        {
            Some(Written::Day(day, pools)) => written.push((day, pools)),
            Some(Written::UpToDate) => {}
            None => panic!("the live mandate was refused"),
        }
    }
    written.sort();
    assert_eq!(
        written,
        vec![
            (today - chrono::Duration::days(2), 4),
            (today - chrono::Duration::days(1), 4)
        ]
    );
    // Each pool's day once, as a fresh computation says, refusals not doubled.
    let wrong: Vec<String> = sqlx::query_scalar(
        "SELECT concat_ws(' ', k.site, k.profile, k.day)
           FROM (SELECT d.day, r.* FROM generate_series(1, 2) g,
                        LATERAL (SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date - g AS day) d,
                        LATERAL pool_day_rows(d.day) r) k
           FULL JOIN pool_days p USING (org_id, site, profile, day)
          WHERE (k.total, k.refused_unavailable, k.demand, k.added)
                IS DISTINCT FROM (p.total, p.refused_unavailable, p.demand, p.added)",
    )
    .fetch_all(&pool)
    .await
    .expect("compare");
    assert_eq!(wrong, Vec::<String>::new());
    let per_day: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT count(*), sum(refused_unavailable)::bigint, sum(added)::bigint
           FROM pool_days GROUP BY day ORDER BY day",
    )
    .fetch_all(&pool)
    .await
    .expect("per day");
    // 1 + 2 + 3 + 4 machines added each day, 2 machines refused per pool.
    assert_eq!(per_day, vec![(4, 8, 10), (4, 8, 10)]);
    let through: NaiveDate = sqlx::query_scalar("SELECT through FROM pool_days_written")
        .fetch_one(&pool)
        .await
        .expect("cursor");
    assert_eq!(through, today - chrono::Duration::days(1));
}

/// Sells `n` machines of a pool on the day `ago` days back: holds created
/// and converted that day on the pool's lowest machines never reserved.
async fn sell(pool: &Db, org: i64, (site, profile): (&str, &str), ago: i64, n: i64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH m AS (
             SELECT id FROM machines
              WHERE org_id = $1 AND site = $2 AND profile = $3
                AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.machine_id = machines.id)
              ORDER BY id LIMIT $4
         ), r AS (
             INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot,
                                       reason, hold_seconds, created_at, expires_at, ended_at, ended_by)
             SELECT $1, 'sold-' || m.id, m.id, 'converted', '{{}}', '{{}}', 'generated', 3600,
                    {c}, {c} + interval '1 hour', {e}, 'test'
               FROM m
             RETURNING id, machine_id, ended_at
         )
         INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at)
         SELECT $1, machine_id, id, 'S-' || id, ended_at FROM r",
        c = at(ago, 10, 0),
        e = at(ago, 11, 0)
    )))
    .bind(org)
    .bind(site)
    .bind(profile)
    .bind(n)
    .execute(pool)
    .await
    .expect("sell");
}

async fn add_machines(pool: &Db, org: i64, (site, profile): (&str, &str), ago: i64, n: i64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status, created_at, updated_at)
         SELECT $1, 'G-' || gen_random_uuid(), $2, 'dell', $3, 'ready', {t}, {t}
           FROM generate_series(1, $4)",
        t = at(ago, 1, 0)
    )))
    .bind(org)
    .bind(site)
    .bind(profile)
    .bind(n)
    .execute(pool)
    .await
    .expect("machines");
}

/// The issue's golden cases end to end, through the daily job and `GET
/// /api/v1/forecast`: 30 available and 3 a day run out 10 days ahead; a
/// restock of 50 on day 15 of a steady 3 a day leaves the rate at 3; a pool
/// sold out for the last 7 days with 3 machines refused a day keeps its
/// rate of 3; a pool created today has no history, no rate and no date.
/// The lead time moves the flag and the order-by date.
#[tokio::test]
async fn the_forecast_tells_the_golden_cases() {
    let app = crate::helpers::spawn_app().await;
    let (pool, org) = (app.pool.clone(), app.org.id);
    let steady = ("par1", "epyc-64");
    let sold_out = ("par1", "xeon-32");
    let restocked = ("ams9", "epyc-64");
    let fresh = ("ams9", "xeon-32");
    add_machines(&pool, org, steady, 40, 84 + 30).await;
    add_machines(&pool, org, sold_out, 40, 63).await;
    add_machines(&pool, org, restocked, 40, 45).await;
    add_machines(&pool, org, restocked, 14, 50).await;
    for ago in (1..=28).rev() {
        sell(&pool, org, steady, ago, 3).await;
        sell(&pool, org, restocked, ago, 3).await;
        if ago > 7 {
            sell(&pool, org, sold_out, ago, 3).await;
        } else {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO reservation_refusals (org_id, at, reason, site, profile, excluded, quantity)
                 VALUES ($1, {t}, 'unavailable', $2, $3, '{{}}', 2),
                        ($1, {t}, 'reserved', $2, $3, '{{}}', 1),
                        ($1, {t}, 'contended', $2, $3, '{{}}', 5)",
                t = at(ago, 12, 0)
            )))
            .bind(org)
            .bind(sold_out.0)
            .bind(sold_out.1)
            .execute(&pool)
            .await
            .expect("refusals");
        }
    }
    let today = today(&pool).await;
    set_cursor(&pool, today - chrono::Duration::days(41)).await;
    let m = mandate(&pool, "forecaster").await;
    while let Some(Written::Day(..)) = planning::write_next_day(&pool, &m.holder, m.fence)
        .await
        .expect("write")
    {}
    // Created today, after the last closed day.
    add_machines(&pool, org, fresh, 0, 5).await;

    let get = |q: &'static str| {
        let (http, url, token) = (app.http.clone(), app.url(q), app.org.token.clone());
        async move {
            let r = http.get(url).bearer_auth(token).send().await.expect("get");
            assert_eq!(r.status(), reqwest::StatusCode::OK);
            r.json::<serde_json::Value>().await.expect("json")
        }
    };
    let d = |n: i64| (today + chrono::Duration::days(n)).to_string();
    let answer = get("/api/v1/forecast").await;
    let pools = answer["pools"].as_array().expect("pools");
    let rows: Vec<String> = pools
        .iter()
        .map(|p| {
            format!(
                "{}/{} available {} rate {} days {} run-out {} band {}..{} order by {} flagged {}",
                p["site"].as_str().unwrap_or("?"),
                p["profile"].as_str().unwrap_or("?"),
                p["available"],
                p["demand_per_day"],
                p["days_left"],
                p["run_out"].as_str().unwrap_or("none"),
                p["run_out_low"].as_str().unwrap_or("none"),
                p["run_out_high"].as_str().unwrap_or("none"),
                p["order_by"].as_str().unwrap_or("none"),
                p["flagged"],
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            format!(
                "par1/xeon-32 available 0 rate 3.0 days 0.0 run-out {t} band {t}..{t} order by {o} flagged true",
                t = d(0),
                o = d(-30)
            ),
            format!(
                "ams9/epyc-64 available 11 rate 3.0 days 3.6666666666666665 run-out {t} band {t}..{t} order by {o} flagged true",
                t = d(3),
                o = d(-27)
            ),
            format!(
                "par1/epyc-64 available 30 rate 3.0 days 10.0 run-out {t} band {t}..{t} order by {o} flagged true",
                t = d(10),
                o = d(-20)
            ),
            "ams9/xeon-32 available 5 rate null days null run-out none band none..none order by none flagged false"
                .to_owned(),
        ]
    );
    assert_eq!(answer["pools"][3]["lead_time_days"], 30);

    // A lead time of 9 days at par1: ordering for its steady pool is due
    // tomorrow, not yet flagged; ams9 keeps the default.
    let site = poolkeeper::domain::Site::parse("par1").expect("site");
    let mut conn = pool.acquire().await.expect("connection");
    let before = planning::set_lead_time(&mut conn, org, &site, 9, "test")
        .await
        .expect("lead time");
    assert_eq!(before, 30, "the default");
    drop(conn);
    let answer = get("/api/v1/forecast?site=par1&profile=epyc-64").await;
    assert_eq!(answer["pools"].as_array().map(Vec::len), Some(1));
    assert_eq!(answer["pools"][0]["lead_time_days"], 9);
    assert_eq!(answer["pools"][0]["order_by"], d(1));
    assert_eq!(answer["pools"][0]["flagged"], false);

    // The sold-out pool's history: its last week sold nothing and refused
    // 3 machines for want of stock a day (contended is not demand).
    let history = get("/api/v1/pools/history?site=par1&profile=xeon-32&days=7").await;
    let days = history["days"].as_array().expect("days");
    assert_eq!(days.len(), 7);
    for day in days {
        assert_eq!(
            (
                &day["converted"],
                &day["refused"]["unavailable"],
                &day["refused"]["contended"],
                &day["demand"],
                &day["sold"],
                &day["sellable"]
            ),
            (
                &serde_json::json!(0),
                &serde_json::json!(2),
                &serde_json::json!(5),
                &serde_json::json!(3),
                &serde_json::json!(63),
                &serde_json::json!(0)
            ),
            "{day}"
        );
    }
    // The restock: 50 added on its day, and nothing else moved the rate.
    let history = get("/api/v1/pools/history?site=ams9&profile=epyc-64&days=14").await;
    let added: Vec<i64> = history["days"]
        .as_array()
        .expect("days")
        .iter()
        .map(|d| d["added"].as_i64().unwrap_or(-1))
        .collect();
    assert_eq!(added.first(), Some(&50));
    assert_eq!(added.iter().sum::<i64>(), 50);

    // The planning page: ranked soonest first, the flag in words, a
    // sparkline per pool; the pool's page: the chart with its projection
    // and the table of its days; the CSV; the overview's link.
    let viewer = app.staff("planner@example.com", "viewer").await;
    let (status, html) = viewer.page("/planning").await;
    assert_eq!(status, 200, "{html}");
    let order: Vec<usize> = [
        "par1/xeon-32",
        "ams9/epyc-64",
        "par1/epyc-64",
        "ams9/xeon-32",
    ]
    .iter()
    .map(|p| {
        let (site, profile) = p.split_once('/').unwrap_or_default();
        html.find(&format!("data-site=\"{site}\" data-profile=\"{profile}\""))
            .unwrap_or_else(|| panic!("{p} on the page"))
    })
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    assert!(html.contains("no history yet"), "{html}");
    assert!(html.contains("<strong>Flagged</strong>"), "{html}");
    assert_eq!(html.matches("class=\"spark-stock\"").count(), 3, "{html}");
    let (status, html) = viewer
        .page("/planning/pool?site=par1&profile=epyc-64")
        .await;
    assert_eq!(status, 200, "{html}");
    assert!(
        html.contains(&format!("projected run-out: {}", d(10))),
        "{html}"
    );
    assert!(
        html.contains("fitted demand over the last 28 days: 3.0 a day"),
        "{html}"
    );
    assert_eq!(html.matches("<tr data-day=").count(), 40, "{html}");
    let (status, _) = viewer.page("/planning/pool?site=par1").await;
    assert_eq!(status, 400);
    let csv = viewer
        .get("/planning.csv?site=par1&profile=xeon-32")
        .await
        .text()
        .await
        .expect("csv");
    assert_eq!(csv.lines().count(), 1 + 40, "{csv}");
    assert!(csv.starts_with("site,profile,day,total,"), "{csv}");
    let (_, overview) = viewer.page("/").await;
    assert!(
        overview.contains("/planning/pool?site=par1&amp;profile=epyc-64"),
        "{overview}"
    );
}

/// R21's lead time on /settings: listed per site (the default marked),
/// set by an admin with its audit row, a bad value refused with nothing
/// written; the planning page flags against it.
#[tokio::test]
async fn the_settings_page_sets_a_sites_lead_time() {
    let app = crate::helpers::spawn_app().await;
    add_machines(&app.pool, app.org.id, ("par1", "epyc-64"), 3, 2).await;
    let admin = app.staff("admin@example.com", "admin").await;
    let (status, html) = admin.page("/settings").await;
    assert_eq!(status, 200);
    assert!(
        html.contains("<th scope=\"row\">par1</th><td class=\"num\">30 (default)</td>"),
        "{html}"
    );
    let csrf = admin.csrf().await;
    for bad in ["0", "731", "ten", ""] {
        let r = admin
            .post_form(
                "/settings/lead-time",
                &[("csrf", &csrf), ("site", "par1"), ("days", bad)],
            )
            .await;
        assert_eq!(r.status().as_u16(), 400, "{bad}");
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM site_lead_times")
        .fetch_one(&app.pool)
        .await
        .expect("count");
    assert_eq!(rows, 0, "a refused value writes nothing");
    let r = admin
        .post_form(
            "/settings/lead-time",
            &[("csrf", &csrf), ("site", "par1"), ("days", "45")],
        )
        .await;
    assert_eq!(r.status().as_u16(), 303);
    let (_, html) = admin.page("/settings").await;
    assert!(
        html.contains("<th scope=\"row\">par1</th><td class=\"num\">45</td>"),
        "{html}"
    );
    let audited: Vec<String> = sqlx::query_scalar(
        "SELECT actor || ' ' || action || ' ' || object || ' ' || detail FROM audit_log
          WHERE action = 'site.lead_time_set'",
    )
    .fetch_all(&app.pool)
    .await
    .expect("audit");
    assert_eq!(
        audited,
        vec!["admin@example.com site.lead_time_set site:par1 30 -> 45 days"]
    );
    let (_, html) = admin.page("/planning").await;
    assert!(
        html.contains("<td class=\"num\" data-k=\"lead_time\">45</td>"),
        "{html}"
    );
}

/// The sweep worker itself: its holder writes the closed days after the
/// upgrade's cursor, `DAYS_PER_PERIOD` a period, up to yesterday, each
/// under its fence (the rows carry the worker's replica and mandate), and
/// then writes nothing more until a day closes.
#[tokio::test]
async fn the_sweeps_holder_rebuilds_the_past_over_periods() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "planning-worker", true).await;
    add_machines(&pool, org.id, ("par1", "epyc-64"), 45, 3).await;
    let today = today(&pool).await;
    set_cursor(&pool, today - chrono::Duration::days(46)).await;
    let mut settings = crate::helpers::test_settings();
    settings.sweep_period = Duration::from_millis(200);
    settings.lease_duration = Duration::from_secs(3);
    let metrics = poolkeeper::metrics::Metrics::new();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let worker = {
        let (pool, settings, metrics) = (pool.clone(), settings.clone(), metrics.clone());
        tokio::spawn(
            async move { poolkeeper::sweep::run(&pool, &settings, metrics, stopped).await },
        )
    };
    let yesterday = today - chrono::Duration::days(1);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let through: NaiveDate = sqlx::query_scalar("SELECT through FROM pool_days_written")
            .fetch_one(&pool)
            .await
            .expect("cursor");
        if through == yesterday {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the worker wrote through {through}, not yesterday"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(15), worker)
        .await
        .expect("the worker stops")
        .expect("worker task");
    // 46 closed days from the cursor on: the machines' day first, then a
    // row per day, each written by the worker's replica under a fence of
    // the sweep's lease.
    let (days, first, replicas, unfenced): (i64, NaiveDate, i64, i64) = sqlx::query_as(
        "SELECT count(*), min(day), count(DISTINCT replica),
                count(*) FILTER (WHERE lease_fence NOT IN (SELECT fence FROM leases WHERE key = 'sweep'))
           FROM pool_days WHERE org_id = $1",
    )
    .bind(org.id)
    .fetch_one(&pool)
    .await
    .expect("days");
    assert_eq!((days, first), (45, today - chrono::Duration::days(45)));
    assert_eq!((replicas, unfenced), (1, 0));
    let replica: String = sqlx::query_scalar("SELECT DISTINCT replica FROM pool_days")
        .fetch_one(&pool)
        .await
        .expect("replica");
    assert_eq!(replica, settings.replica);
}

/// `/planning` ranks every pool and shows them 50 a page, reading and
/// drawing the sparklines of the page's pools only; a page that does not
/// exist is a 400 that says which do.
#[tokio::test]
async fn the_planning_page_ranks_every_pool_and_shows_them_fifty_a_page() {
    let app = crate::helpers::spawn_app().await;
    let (pool, org) = (app.pool.clone(), app.org.id);
    // 60 pools of one machine: s1..s6 x p0..p9, none with demand, so the
    // ranking is by site and profile and s6/p9 comes last.
    sqlx::query(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
         SELECT $1, 'PG-' || s || '-' || p, 's' || s, 'dell', 'p' || p, 'ready'
           FROM generate_series(1, 6) s, generate_series(0, 9) p",
    )
    .bind(org)
    .execute(&pool)
    .await
    .expect("machines");
    // One closed day of history for the last pool only: its sparkline.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "{INSERT_POOL_DAYS}
         VALUES ($1, 's6', 'p9', (clock_timestamp() AT TIME ZONE 'UTC')::date - 1, 1, 1, 0, 0, 0,
                 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 'test', 0)"
    )))
    .bind(org)
    .execute(&pool)
    .await
    .expect("a day");
    let viewer = app.staff("planner@example.com", "viewer").await;
    let pools_on = |html: &str| -> Vec<String> {
        html.match_indices("data-site=\"")
            .map(|(i, _)| {
                let rest = &html[i + 11..];
                let site = rest.split('"').next().unwrap_or_default();
                let profile = rest
                    .split("data-profile=\"")
                    .nth(1)
                    .and_then(|p| p.split('"').next())
                    .unwrap_or_default();
                format!("{site}/{profile}")
            })
            .collect()
    };
    let (status, first) = viewer.page("/planning").await;
    assert_eq!(status, 200, "{first}");
    assert!(
        first.contains("60 pools, 0 flagged; pools 1 to 50"),
        "{first}"
    );
    assert_eq!(pools_on(&first).len(), 50, "{first}");
    assert_eq!(first.matches("class=\"spark-stock\"").count(), 0, "{first}");
    assert!(!first.contains("rel=\"prev\""), "{first}");
    // Follow the page's own link to the next.
    let next = first
        .split("rel=\"next\"")
        .next()
        .and_then(|head| head.rsplit("href=\"").next())
        .and_then(|href| href.split('"').next())
        .expect("a link to the next pools")
        .replace("&amp;", "&");
    let (status, second) = viewer.page(&next).await;
    assert_eq!(status, 200, "{second}");
    assert!(second.contains("pools 51 to 60"), "{second}");
    let shown = pools_on(&second);
    assert_eq!(shown.len(), 10, "{second}");
    assert_eq!(shown.last().map(String::as_str), Some("s6/p9"), "{second}");
    assert_eq!(
        second.matches("class=\"spark-stock\"").count(),
        1,
        "{second}"
    );
    assert!(second.contains("rel=\"prev\""), "{second}");
    assert!(!second.contains("rel=\"next\""), "{second}");
    let mut all = pools_on(&first);
    all.extend(shown);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 60, "every pool once: {all:?}");
    for bad in ["/planning?page=3", "/planning?page=0", "/planning?page=two"] {
        let (status, html) = viewer.page(bad).await;
        assert_eq!(status, 400, "{bad}: {html}");
    }
    let (_, html) = viewer.page("/planning?page=3").await;
    assert!(html.contains("pages 1 to 2"), "{html}");
}

/// The forecast's fitted rate of par1/epyc-64, as the API tells it.
async fn epyc_64_rate(app: &crate::helpers::TestApp) -> serde_json::Value {
    let r = app
        .http
        .get(app.url("/api/v1/forecast?site=par1&profile=epyc-64"))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    let body: serde_json::Value = r.json().await.expect("json");
    body["pools"][0]["demand_per_day"].clone()
}

/// The fitted rates are kept between reads and computed again as soon as
/// the history changes: every write of pool_days (the daily job, a
/// rewrite, any other statement) moves its generation on.
#[tokio::test]
async fn the_forecast_keeps_its_rates_until_the_history_changes() {
    let app = crate::helpers::spawn_app().await;
    let (pool, org) = (app.pool.clone(), app.org.id);
    add_machines(&pool, org, ("par1", "epyc-64"), 3, 30).await;
    let rate = || epyc_64_rate(&app);
    let generation = || async {
        sqlx::query_scalar::<_, i64>("SELECT generation FROM pool_days_written")
            .fetch_one(&pool)
            .await
            .expect("generation")
    };
    assert_eq!(rate().await, serde_json::Value::Null, "no history yet");
    assert_eq!(rate().await, serde_json::Value::Null, "read again, kept");
    let before = generation().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "{INSERT_POOL_DAYS}
         VALUES ($1, 'par1', 'epyc-64', (clock_timestamp() AT TIME ZONE 'UTC')::date - 1, 30, 30, 0,
                 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 3, 'test', 0)"
    )))
    .bind(org)
    .execute(&pool)
    .await
    .expect("a day");
    let inserted = generation().await;
    assert!(inserted > before, "{inserted} after {before}");
    assert_eq!(rate().await, serde_json::json!(3.0), "the new day is read");
    sqlx::query("UPDATE pool_days SET demand = 5, refused_unavailable = 5")
        .execute(&pool)
        .await
        .expect("rewrite the day");
    assert_eq!(
        rate().await,
        serde_json::json!(5.0),
        "the rewritten day is read"
    );
    sqlx::query("DELETE FROM pool_days")
        .execute(&pool)
        .await
        .expect("drop the day");
    assert_eq!(rate().await, serde_json::Value::Null, "no history again");
    assert!(generation().await > inserted);
}

/// F5 for the kept rates: a restore sets the history and its generation
/// back; the first write after it must not repeat a generation a running
/// process keeps rates under (it would serve the replaced history's rates
/// until the day changes). The restore is played in place: the history,
/// the generation's row and its sequence set back to the restored point,
/// then the restore declared as an operator does (the fingerprint sees a
/// real one by itself).
#[tokio::test]
async fn a_restored_history_is_never_read_through_the_rates_kept_before_it() {
    let app = crate::helpers::spawn_app().await;
    let (pool, org) = (app.pool.clone(), app.org.id);
    add_machines(&pool, org, ("par1", "epyc-64"), 3, 30).await;
    let rate = || epyc_64_rate(&app);
    let write_demand = |demand: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "{INSERT_POOL_DAYS}
                 VALUES ($1, 'par1', 'epyc-64', (clock_timestamp() AT TIME ZONE 'UTC')::date - 1, 30, 30, 0,
                         0, 0, 0, 0, 0, 0, $2, 0, 0, 0, 0, 0, 0, 0, $2, 'test', 0)
                 ON CONFLICT (org_id, site, profile, day)
                 DO UPDATE SET demand = excluded.demand, refused_unavailable = excluded.refused_unavailable"
            )))
            .bind(org)
            .bind(demand)
            .execute(&pool)
            .await
            .expect("a day");
        }
    };
    write_demand(3).await;
    let restored_point: i64 = sqlx::query_scalar("SELECT generation FROM pool_days_written")
        .fetch_one(&pool)
        .await
        .expect("generation");
    assert_eq!(rate().await, serde_json::json!(3.0));
    // After the backup: the day rewritten, and its rate kept by the server.
    write_demand(5).await;
    assert_eq!(rate().await, serde_json::json!(5.0));
    // The restore: the day, the row and the sequence as at the backup.
    write_demand(3).await;
    sqlx::query("UPDATE pool_days_written SET generation = $1")
        .bind(restored_point)
        .execute(&pool)
        .await
        .expect("the row restored");
    sqlx::query("SELECT setval('pool_days_generation_seq', $1)")
        .bind(restored_point)
        .execute(&pool)
        .await
        .expect("the sequence restored");
    sqlx::query("SELECT incarnation_declare_restored()")
        .execute(&pool)
        .await
        .expect("declare");
    assert_eq!(
        poolkeeper::db::incarnation::verify(&pool)
            .await
            .expect("verify"),
        poolkeeper::db::incarnation::Incarnation::Same,
        "the declaring connection's own check advanced the sequences"
    );
    // The restored database's first write of history: a new number, so
    // the server fits again and tells the history as it is.
    write_demand(7).await;
    assert_eq!(rate().await, serde_json::json!(7.0));
}

/// The sparklines of a page of `/planning` are read by the primary key of
/// `pool_days`, one range per pool, never by a scan of the table: the
/// history of every pool grows by a row a day.
#[tokio::test]
async fn a_pages_sparklines_read_their_pools_by_key() {
    let app = crate::helpers::spawn_app().await;
    let (pool, org) = (app.pool.clone(), app.org.id);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "{INSERT_POOL_DAYS}
         SELECT $1, 's' || s, 'p' || p, (clock_timestamp() AT TIME ZONE 'UTC')::date - d, 2, 2, 0, 0, 0,
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 'test', 0
           FROM generate_series(1, 50) s, generate_series(1, 20) p, generate_series(1, 365) d"
    )))
    .bind(org)
    .execute(&pool)
    .await
    .expect("1,000 pools of a year");
    sqlx::query("ANALYZE pool_days")
        .execute(&pool)
        .await
        .expect("analyze");
    // A page's worth of pools, as /planning asks.
    let names: Vec<(String, String)> = (1..=50)
        .map(|i| (format!("s{i}"), format!("p{}", 1 + i % 20)))
        .collect();
    let keys: Vec<(&str, &str)> = names
        .iter()
        .map(|(s, p)| (s.as_str(), p.as_str()))
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    let rows = poolkeeper::planning::sellable_days(&mut *tx, org, &keys, 90)
        .await
        .expect("sparklines");
    assert_eq!(rows.len(), 50 * 90, "90 closed days of each pool");
    let (scans, read): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(seq_scan), 0)::bigint,
                coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0)::bigint
           FROM pg_stat_xact_user_tables WHERE relname = 'pool_days'",
    )
    .fetch_one(&mut *tx)
    .await
    .expect("reads");
    assert_eq!(scans, 0, "the sparklines scanned pool_days");
    assert!(
        read <= rows.len() as i64,
        "the sparklines read {read} rows of pool_days for {} days",
        rows.len()
    );
}

/// The head of an INSERT of pool_days rows written by hand (every column
/// the table requires, in its order).
const INSERT_POOL_DAYS: &str = "INSERT INTO pool_days (org_id, site, profile, day, total, sellable,
        held, sold, not_ready, created, converted, expired, cancelled, refused_unavailable,
        refused_contended, refused_reserved, refused_customer_limit, substituted_in,
        substituted_out, added, retired, demand, replica, lease_fence)";
