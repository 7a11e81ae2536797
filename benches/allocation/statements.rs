//! Item 15: item 1's reserve+cancel cycle at 8 clients, statement by
//! statement. `pg_stat_statements.track` is set to `all` for one run of its
//! own (so that the statements inside the PL/pgSQL functions are counted),
//! then set back: the counting costs CPU, so the measured runs of item 1
//! are never the counted one. Per statement: calls and executor time per
//! completed cycle, top-level or nested. The time is the executor's, CPU
//! waits included (8 clients on the machine's cores), so a row's share of
//! the cycle is what it says, its milliseconds are not CPU time.

use std::time::Duration;

use anyhow::bail;

use crate::cpu::Meter;
use crate::setup::{Config, Db, Org};
use crate::throughput;

pub const CLIENTS: usize = 8;

/// Rows under this many calls per cycle are the background workers' (the
/// sweep, the leases, the webhook worker) or one-off plans, not the cycle.
const MIN_CALLS_PER_CYCLE: f64 = 0.005;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// The statement, whitespace collapsed, cut to its first 110 characters.
    pub statement: String,
    pub toplevel: bool,
    pub calls_per_cycle: f64,
    pub ms_per_cycle: f64,
    /// Shared buffers hit and read per cycle.
    pub buffers_per_cycle: f64,
    /// WAL bytes per cycle written by the statement (its own, not its
    /// callees').
    pub wal_bytes_per_cycle: f64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Table {
    /// Which pools: "no headroom" or "headroom".
    pub pools: String,
    pub cycles: u64,
    pub cycles_per_s: f64,
    pub rows: Vec<Row>,
}

pub(crate) async fn set_track(db: &Db, value: &str) -> anyhow::Result<()> {
    db.exec(&format!(
        "ALTER SYSTEM SET pg_stat_statements.track = '{value}'"
    ))
    .await?;
    db.exec("SELECT pg_reload_conf()").await?;
    // The postmaster signals every backend; a new session shows that it
    // has read the file. Bounded: a server that never takes it is an error.
    for _ in 0..200 {
        let mut conn = db.connection().await?;
        let now: String = sqlx::query_scalar("SHOW pg_stat_statements.track")
            .fetch_one(&mut conn)
            .await?;
        if now == value {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("pg_stat_statements.track did not become {value}")
}

async fn read(db: &Db, cycles: u64) -> anyhow::Result<Vec<Row>> {
    let rows: Vec<(String, bool, i64, f64, i64, f64)> = sqlx::query_as(
        "SELECT regexp_replace(query, '\\s+', ' ', 'g'), toplevel, calls, total_exec_time,
                shared_blks_hit + shared_blks_read, wal_bytes::float8
           FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND query NOT ILIKE '%pg_stat_statements%' AND query NOT ILIKE '%pg_database%'",
    )
    .fetch_all(&db.setup)
    .await?;
    let n = cycles.max(1) as f64;
    let mut out: Vec<Row> = rows
        .into_iter()
        .map(|(q, toplevel, calls, ms, buffers, wal)| Row {
            statement: q.trim().chars().take(110).collect(),
            toplevel,
            calls_per_cycle: calls as f64 / n,
            ms_per_cycle: ms / n,
            buffers_per_cycle: buffers as f64 / n,
            wal_bytes_per_cycle: wal / n,
        })
        .filter(|r| r.calls_per_cycle >= MIN_CALLS_PER_CYCLE)
        .collect();
    out.sort_by(|a, b| b.ms_per_cycle.total_cmp(&a.ms_per_cycle));
    Ok(out)
}

/// One counted run of `ask` on the pools as they are, labelled `pools`.
pub(crate) async fn counted(
    cfg: &Config,
    db: &Db,
    org: &Org,
    base: &str,
    meter: &Meter,
    pools: &str,
    ask: &throughput::Ask,
) -> anyhow::Result<Table> {
    // Plans made and functions compiled under `all` before the reset.
    let tag: String = pools
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    throughput::http_asks_run(
        meter,
        base,
        &org.token,
        cfg.sites,
        CLIENTS,
        1.0,
        &format!("sw-{tag}"),
        ask,
    )
    .await?;
    crate::roundtrips::reset(db).await?;
    let run = throughput::http_asks_run(
        meter,
        base,
        &org.token,
        cfg.sites,
        CLIENTS,
        cfg.run_seconds,
        &format!("s-{tag}"),
        ask,
    )
    .await?;
    let rows = read(db, run.cycles).await?;
    eprintln!(
        "  statements ({pools}): {} cycles, {:.0}/s; {} statements over {MIN_CALLS_PER_CYCLE} calls per cycle",
        run.cycles,
        run.cycles_per_s,
        rows.len()
    );
    for r in rows.iter().take(12) {
        eprintln!(
            "    {} {:.2} calls {:.3} ms  {}",
            if r.toplevel { "top " } else { "  in" },
            r.calls_per_cycle,
            r.ms_per_cycle,
            r.statement
        );
    }
    Ok(Table {
        pools: pools.to_owned(),
        cycles: run.cycles,
        cycles_per_s: run.cycles_per_s,
        rows,
    })
}

/// The table on pools keeping no headroom, then on pools keeping one
/// machine for a segment the orders do not name (item 13's).
pub async fn run(
    cfg: &Config,
    db: &Db,
    org: &Org,
    base: &str,
    meter: &Meter,
) -> anyhow::Result<Vec<Table>> {
    set_track(db, "all").await?;
    let outcome = async {
        let ask = throughput::Ask::default();
        let mut tables = vec![counted(cfg, db, org, base, meter, "no headroom", &ask).await?];
        crate::headroom::keep(db, org, cfg.sites, true).await?;
        let with = counted(cfg, db, org, base, meter, "headroom", &ask).await;
        crate::headroom::keep(db, org, cfg.sites, false).await?;
        tables.push(with?);
        Ok::<_, anyhow::Error>(tables)
    }
    .await;
    set_track(db, "top").await?;
    outcome
}
