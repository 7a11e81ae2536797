//! Item 3: reserve latency as the history of ended reservations grows, and
//! in a shop that has sold most of its pool. History is inserted in bulk
//! (converted ones with their ended service links, every one with its
//! `created` and ending events), then VACUUM ANALYZE, as autovacuum would
//! do after a bulk insert; measuring then does not race autovacuum.

use std::time::{Duration, Instant};

use poolkeeper::allocator::{HoldSeconds, OrderSpec, ReserveOutcome, ReserveRequest};
use poolkeeper::domain::{OrderRef, Profile, Site};

use crate::setup::{self, Db, PROFILE};
use crate::stats::Latency;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub history: i64,
    /// Machines in service, the lowest ids of every pool (none but in the
    /// sold step).
    pub sold: i64,
    pub reserve: Latency,
    pub runs: Vec<Latency>,
    pub load_seconds: f64,
}

/// Ended reservations number `from + 1 ..= to`, 100,000 per statement;
/// machines round-robin over the organization's pool. Ends with VACUUM
/// ANALYZE.
pub async fn add_history(db: &Db, org_id: i64, from: i64, to: i64) -> anyhow::Result<()> {
    let mut start = from + 1;
    while start <= to {
        let end = (start + 99_999).min(to);
        sqlx::query(
            "WITH ms AS (SELECT array_agg(id ORDER BY id) AS ids FROM machines WHERE org_id = $1),
             src AS (
                SELECT g, ms.ids[1 + (g % cardinality(ms.ids))] AS machine_id,
                       (ARRAY['converted', 'expired', 'cancelled'])[1 + g % 3] AS state,
                       clock_timestamp() - interval '400 days' + g * interval '30 seconds' AS created_at
                  FROM generate_series($2::bigint, $3::bigint) g, ms
             ),
             ins AS (
                INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot, reason,
                                          hold_seconds, created_at, expires_at, ended_at, ended_by, end_reason)
                SELECT $1, 'hist-' || g, s.machine_id, s.state,
                       jsonb_build_object('site', m.site, 'profile', m.profile, 'vendor', NULL, 'hold_seconds', 900),
                       jsonb_build_object('asset_tag', m.asset_tag, 'site', m.site, 'vendor', m.vendor,
                                          'profile', m.profile, 'status', 'ready', 'updated_at', m.updated_at),
                       m.asset_tag || ' (' || m.site || ', ' || m.vendor || ', ' || m.profile
                           || ', ready) matched site ' || m.site || ', profile ' || m.profile
                           || ', any vendor: candidate 1 of 25 in pass one; held for 900 s',
                       900, s.created_at, s.created_at + interval '900 seconds',
                       s.created_at + CASE s.state WHEN 'converted' THEN interval '300 seconds'
                                                   WHEN 'expired' THEN interval '901 seconds'
                                                   ELSE interval '120 seconds' END,
                       CASE s.state WHEN 'converted' THEN 'conversion' WHEN 'expired' THEN 'sweep'
                                    ELSE 'checkout' END,
                       CASE s.state WHEN 'converted' THEN 'payment confirmed'
                                    WHEN 'expired' THEN 'hold deadline passed'
                                    ELSE 'customer abandoned the basket' END
                  FROM src s JOIN machines m ON m.id = s.machine_id
                RETURNING id, machine_id, state, created_at, ended_at, ended_by, end_reason
             ),
             links AS (
                INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at, ended_at, ended_by)
                SELECT $1, machine_id, id, 'SRV-' || id, ended_at, ended_at + interval '7 days', 'bench'
                  FROM ins WHERE state = 'converted'
             ),
             created AS (
                INSERT INTO reservation_events (reservation_id, at, kind, from_state, to_state, actor, detail)
                SELECT id, created_at, 'created', NULL, 'held', 'checkout', 'order hist-' || id FROM ins
             )
             INSERT INTO reservation_events (reservation_id, at, kind, from_state, to_state, actor, detail)
             SELECT id, ended_at, state, 'held', state, ended_by, end_reason FROM ins",
        )
        .bind(org_id)
        .bind(start)
        .bind(end)
        .execute(&db.setup)
        .await?;
        start = end + 1;
    }
    db.exec("VACUUM ANALYZE").await?;
    Ok(())
}

/// The oldest `share` of every pool in service: the lowest ids, so that in
/// id order every sold machine comes before the first sellable one. Ends
/// with VACUUM ANALYZE.
async fn sell_oldest(db: &Db, org_id: i64, share: f64) -> anyhow::Result<i64> {
    let sold = setup::sold(
        db,
        org_id,
        &format!(
            "SELECT id, asset_tag FROM (
                 SELECT m.id, m.asset_tag,
                        percent_rank() OVER (PARTITION BY m.site, m.profile ORDER BY m.id) AS rank
                   FROM machines m WHERE m.org_id = $1) r
              WHERE rank < {share}"
        ),
    )
    .await?;
    db.exec("VACUUM ANALYZE").await?;
    Ok(sold)
}

/// `n` reserve calls on one connection, one at a time, each cancelled
/// after (the cancel is not timed); the latency of reserve only.
async fn measure(db: &Db, org_id: i64, sites: i64, n: usize, tag: &str) -> anyhow::Result<Latency> {
    let pool = db.app_pool(2).await?;
    let mut samples: Vec<Duration> = Vec::with_capacity(n);
    for i in 0..n {
        let req = ReserveRequest {
            order_ref: OrderRef::parse(&format!("{tag}-{i}"))?,
            spec: OrderSpec {
                site: Site::parse(&setup::site(i as i64 % sites))?,
                profile: Profile::parse(PROFILE)?,
                vendor: None,
            },
            hold: HoldSeconds::new(900)?,
            quantity: poolkeeper::allocator::Quantity::ONE,
            actor: "bench".to_owned(),
            segment: None,
            customer_ref: None,
            substitutes: Default::default(),
        };
        let t = Instant::now();
        let outcome = poolkeeper::allocator::reserve(&pool, org_id, &req).await?;
        samples.push(t.elapsed());
        let ReserveOutcome::Created { reservation, .. } = outcome else {
            anyhow::bail!("growth reserve {tag}-{i}: {}", outcome.label());
        };
        poolkeeper::reservations::cancel(
            &pool,
            org_id,
            reservation.id,
            reservation.fence,
            "bench",
            "bench cycle",
        )
        .await
        .map_err(|e| anyhow::anyhow!("cancel: {e}"))?;
    }
    pool.close().await;
    Ok(Latency::of(&mut samples))
}

/// One database per step, loaded up front; then the runs alternate between
/// the steps (run 1 of every step, then run 2 of every step, ...), so that
/// a change in the machine's load during the bench hits every step alike.
/// The last step has no history and 9 in 10 of every pool sold, the lowest
/// ids: pass one's walk must go straight to the sellable ones.
pub async fn run(
    cluster: &crate::setup::Cluster,
    cfg: &crate::setup::Config,
) -> anyhow::Result<Vec<Step>> {
    let mut dbs = Vec::new();
    let steps = cfg.history_steps.iter().map(|&h| (h, false));
    for (target, sold) in steps.chain([(0, true)]) {
        let name = if sold {
            "bench_growth_sold".to_owned()
        } else {
            format!("bench_growth_{target}")
        };
        let db = cluster.database(&name).await?;
        let org = setup::org(&db, "growth").await?;
        setup::machines(&db, org.id, "m", cfg.machines, cfg.sites, PROFILE, "ready").await?;
        let t = Instant::now();
        add_history(&db, org.id, 0, target).await?;
        let sold = if sold {
            sell_oldest(&db, org.id, 0.9).await?
        } else {
            0
        };
        let load_seconds = t.elapsed().as_secs_f64();
        eprintln!("  history {target}, {sold} sold: loaded in {load_seconds:.1} s");
        crate::apply_sql_files(&db).await?;
        // Warm-up: plans cached, pages in memory.
        measure(&db, org.id, cfg.sites, 50, "warm").await?;
        dbs.push((target, sold, db, org.id, load_seconds, Vec::new()));
    }
    for r in 0..cfg.runs {
        for (target, sold, db, org_id, _, runs) in dbs.iter_mut() {
            runs.push(
                measure(
                    db,
                    *org_id,
                    cfg.sites,
                    cfg.growth_reserves,
                    &format!("g{target}-{sold}-{r}"),
                )
                .await?,
            );
        }
    }
    let mut steps = Vec::new();
    for (target, sold, db, _, load_seconds, runs) in dbs {
        let reserve = Latency::median_of(&runs);
        eprintln!(
            "  history {target}, {sold} sold: reserve p50 {:.2} ms p99 {:.2} ms",
            reserve.p50_ms, reserve.p99_ms
        );
        steps.push(Step {
            history: target,
            sold,
            reserve,
            runs,
            load_seconds,
        });
        db.setup.close().await;
        crate::drop_database(cluster, &db.name).await?;
    }
    Ok(steps)
}
