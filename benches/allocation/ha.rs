//! Item 10: what durable, replicated commits cost. The 8-client
//! reserve+cancel cycle of item 8 (the API handlers' own calls, one pool of
//! 8) through HAProxy to a Patroni leader whose every commit waits for its
//! synchronous standby (`synchronous_mode_strict`), beside the database's
//! ceiling (item 1's PL/pgSQL functions, 8 connections) on the same
//! cluster, runs alternating; the ratio is the application's share. The
//! cluster is the failover test's (`tests/ha/cluster.rs`: Patroni 3.0.2,
//! etcd 3.4, HAProxy 2.6, PostgreSQL 15, two nodes here: a leader and its
//! synchronous standby), with fsync off on both nodes, as the failover
//! test runs it (unlike the other items' durable cluster): the cost
//! measured is the standby's round trip, not a disk's.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{Connection, PgConnection};

use crate::ha_cluster::HaCluster;
use crate::setup::{self, Config, Db, PROFILE};
use crate::stats::{Latency, median};

pub const CLIENTS: usize = 8;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Result {
    pub clients: usize,
    pub cycles_per_s: f64,
    pub reserve: Latency,
    pub cancel: Latency,
    pub ceiling_cycles_per_s: f64,
    pub ceiling_reserve: Latency,
    /// The application's rate over the ceiling's, both on this cluster.
    pub ratio: f64,
    pub runs: Vec<f64>,
    pub ceiling_runs: Vec<f64>,
}

/// Why item 10 cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    crate::ha_cluster::binaries()
        .err()
        .map(|e| format!("9: {e}"))
}

pub async fn run(cfg: &Config) -> anyhow::Result<Result> {
    let cluster = HaCluster::start(2).await;
    let name = "bench_ha";
    let mut admin = PgConnection::connect_with(&cluster.options("postgres")).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    let options = cluster.options(name);
    poolkeeper::db::migrate(&options).await?;
    let db = Db {
        name: name.to_owned(),
        url: cluster.url(name),
        setup: poolkeeper::db::connect(options.clone(), 4).await?,
        options,
    };
    // As items 1 and 8: their machines, a history, fresh statistics.
    let org = setup::org(&db, "ha").await?;
    setup::machines(&db, org.id, "m", cfg.machines, cfg.sites, PROFILE, "ready").await?;
    crate::growth::add_history(&db, org.id, 0, cfg.api_history).await?;
    crate::throughput::create_ceiling_functions(&db).await?;
    db.exec("VACUUM ANALYZE").await?;

    let pool = poolkeeper::db::connect_with_acquire_timeout(
        db.options.clone(),
        CLIENTS as u32,
        Duration::from_secs(10),
    )
    .await?;
    let hash = Arc::new(poolkeeper::tokens::digest(&org.token));
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&db.setup)
        .await?;
    let meter = crate::cpu::Meter::new(None, backend);
    // Warm-up: connections opened, plans cached, on both sides.
    crate::pooler::timed(&pool, &hash, "ha-w", 0.5).await?;
    crate::throughput::db_run(&meter, &db, org.id, cfg.sites, CLIENTS, 0.5, "ha-cw", None).await?;
    let (mut rates, mut reserves, mut cancels) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ceiling, mut ceiling_reserves) = (Vec::new(), Vec::new());
    for run in 0..cfg.runs {
        let (rate, reserve, cancel) =
            crate::pooler::timed(&pool, &hash, &format!("ha-r{run}"), cfg.run_seconds).await?;
        let c = crate::throughput::db_run(
            &meter,
            &db,
            org.id,
            cfg.sites,
            CLIENTS,
            cfg.run_seconds,
            &format!("ha-c{run}"),
            None,
        )
        .await?;
        eprintln!(
            "  through HAProxy to the Patroni leader: {rate:.0}/s, reserve p50 {:.2} ms p99 {:.2} ms; ceiling {:.0}/s",
            reserve.p50_ms, reserve.p99_ms, c.cycles_per_s
        );
        rates.push(rate);
        reserves.push(reserve);
        cancels.push(cancel);
        ceiling.push(c.cycles_per_s);
        ceiling_reserves.push(c.reserve);
    }
    pool.close().await;
    db.setup.close().await;
    drop(cluster);
    let (app, top) = (median(&rates), median(&ceiling));
    Ok(Result {
        clients: CLIENTS,
        cycles_per_s: app,
        reserve: Latency::median_of(&reserves),
        cancel: Latency::median_of(&cancels),
        ceiling_cycles_per_s: top,
        ceiling_reserve: Latency::median_of(&ceiling_reserves),
        ratio: if top > 0.0 { app / top } else { 0.0 },
        runs: rates,
        ceiling_runs: ceiling,
    })
}

/// Item 10's row of BENCHMARKS.md.
pub fn row(r: &Result) -> String {
    let runs = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}/s"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "| 10 | {} clients, the API's reserve then cancel calls through HAProxy to a Patroni leader with one synchronous standby (strict), beside the ceiling on the same cluster | {:.0}/s against {:.0}/s: ×{:.2}; reserve p50 {:.2} ms, p99 {:.2} ms (ceiling {:.2} / {:.2} ms); cancel p50 {:.2} ms, p99 {:.2} ms (runs: {}; ceiling: {}) | | |",
        r.clients,
        r.cycles_per_s,
        r.ceiling_cycles_per_s,
        r.ratio,
        r.reserve.p50_ms,
        r.reserve.p99_ms,
        r.ceiling_reserve.p50_ms,
        r.ceiling_reserve.p99_ms,
        r.cancel.p50_ms,
        r.cancel.p99_ms,
        runs(&r.runs),
        runs(&r.ceiling_runs),
    )
}
