//! `cargo bench --bench allocation`: how fast poolkeeper does its job on this
//! machine, beside its targets, in one run. Starts a private PostgreSQL
//! (durable, as PostgreSQL ships: fsync, synchronous_commit and
//! full_page_writes on), runs `poolkeeper serve` as a separate process
//! against it, and writes its figures to target/bench/results.json, then
//! the generated sections of BENCHMARKS.md from that JSON (`report`); the
//! analysis in BENCHMARKS.md is hand-edited text that a run leaves alone.
//! `BENCH_QUICK=1` runs small sizes and writes under target/bench/ only;
//! `BENCH_ONLY=throughput BENCH_CLIENTS=8` runs one item at one client count
//! (a partial run also writes under target/bench/ only);
//! `BENCH_REPORT=target/bench/results.json` writes the sections again from a
//! run's JSON without measuring. See `setup::Config` for the other knobs.
//!
//! Adding an item: a module with a `run` that takes the cluster (or a
//! database of it) and returns its figures, a field of `Results`, a
//! `cfg.runs_item("name")` block in `run_items`, and its rows in
//! `report::results_section` (from the data only: what a figure means goes
//! in BENCHMARKS.md's hand-edited analysis). `measure_throughput` measures the API against the
//! ceiling at one client count on any database and server (e.g. a primary
//! with a synchronous standby), with the per-cycle WAL counters.

mod capacity;
mod cpu;
mod fill;
mod fleet;
mod growth;
mod ha;
#[path = "../../tests/ha/cluster.rs"]
mod ha_cluster;
mod headroom;
mod healing;
mod pages;
mod planning;
mod pooler;
mod race;
mod report;
mod roundtrips;
mod server;
mod setup;
mod statements;
mod stats;
mod substitutes;
mod sweep;
mod throughput;
mod traced;
mod verdicts;
mod wal;
#[path = "../../tests/fixtures/webhook_history.rs"]
mod webhook_history;
mod webhooks;

use std::time::Instant;

use setup::{Cluster, Config, PROFILE};
use stats::{Latency, median};

fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: cannot start a runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Medians over runs, for one client count.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Throughput {
    pub clients: usize,
    pub http_cycles_per_s: f64,
    pub http_reserve: Latency,
    pub http_cancel: Latency,
    pub http_contended: u64,
    pub db_cycles_per_s: f64,
    pub db_reserve: Latency,
    pub db_contended: u64,
    pub http_cpu: cpu::CpuPerCycle,
    pub db_cpu: cpu::CpuPerCycle,
    /// HTTP over the database's ceiling.
    pub ratio: f64,
    pub http_runs: Vec<throughput::Run>,
    pub db_runs: Vec<throughput::Run>,
    /// Per cycle: WAL, syncs, commits, lock waits (medians; waits summed).
    pub http_wal: wal::PerCycle,
    pub db_wal: wal::PerCycle,
    pub http_wal_runs: Vec<wal::PerCycle>,
    pub db_wal_runs: Vec<wal::PerCycle>,
    /// At 8 clients: the ceiling paced to each HTTP run's rate.
    pub paced_runs: Vec<throughput::Run>,
}

impl Throughput {
    fn of(
        clients: usize,
        http_runs: Vec<throughput::Run>,
        db_runs: Vec<throughput::Run>,
        http_wal_runs: Vec<wal::PerCycle>,
        db_wal_runs: Vec<wal::PerCycle>,
        paced_runs: Vec<throughput::Run>,
    ) -> Throughput {
        let (http, db) = (median_rate(&http_runs), median_rate(&db_runs));
        Throughput {
            clients,
            http_cycles_per_s: http,
            http_reserve: Latency::median_of(
                &http_runs.iter().map(|r| r.reserve).collect::<Vec<_>>(),
            ),
            http_cancel: Latency::median_of(
                &http_runs.iter().map(|r| r.cancel).collect::<Vec<_>>(),
            ),
            http_contended: http_runs.iter().map(|r| r.contended).sum(),
            db_cycles_per_s: db,
            db_reserve: Latency::median_of(&db_runs.iter().map(|r| r.reserve).collect::<Vec<_>>()),
            db_contended: db_runs.iter().map(|r| r.contended).sum(),
            http_cpu: median_cpu(&http_runs),
            db_cpu: median_cpu(&db_runs),
            ratio: http / db,
            http_runs,
            db_runs,
            http_wal: wal::PerCycle::median_of(&http_wal_runs),
            db_wal: wal::PerCycle::median_of(&db_wal_runs),
            http_wal_runs,
            db_wal_runs,
            paced_runs,
        }
    }

    /// The paced ceiling's rate and CPU per cycle (medians), if it ran.
    pub fn paced(&self) -> Option<(f64, cpu::CpuPerCycle)> {
        if self.paced_runs.is_empty() {
            return None;
        }
        Some((median_rate(&self.paced_runs), median_cpu(&self.paced_runs)))
    }
}

/// The median rate of runs, in cycles per second.
fn median_rate(runs: &[throughput::Run]) -> f64 {
    median(&runs.iter().map(|r| r.cycles_per_s).collect::<Vec<_>>())
}

/// The median CPU per cycle of runs, field by field.
fn median_cpu(runs: &[throughput::Run]) -> cpu::CpuPerCycle {
    cpu::CpuPerCycle::median_of(&runs.iter().map(|r| r.cpu).collect::<Vec<_>>())
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PagesResult {
    pub machines_in_org: i64,
    pub held: i64,
    /// Machines in service (a live service link) among them.
    pub sold: i64,
    pub readers: usize,
    /// Per page: label, path, size of the HTML in bytes, median over runs of
    /// the run's latency summary.
    pub pages: Vec<(String, String, usize, Latency)>,
    /// The same pages, one reader, no allocation load: the page's own time.
    pub alone: Vec<Latency>,
    /// The 8-client allocation load that ran meanwhile (median rate).
    pub load_cycles_per_s: f64,
    pub load_reserve: Latency,
}

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Results {
    pub throughput: Vec<Throughput>,
    pub race: Option<(race::Tally, race::Tally)>,
    pub growth: Vec<growth::Step>,
    pub sweep: Vec<sweep::Run>,
    pub pages: Option<PagesResult>,
    /// Item 6: a fresh deployment filling up, one entry per run.
    pub fill: Vec<fill::Run>,
    /// Item 7: round trips per API call.
    pub round_trips: Vec<roundtrips::Count>,
    /// Item 8: the hot path direct and through PgBouncer.
    pub pooler: Option<pooler::Result>,
    /// Item 9: reserve+cancel cycles of orders of 3 machines (R13), 8 clients.
    pub orders_of_three: Vec<throughput::Run>,
    /// Item 10: the hot path through HAProxy to a Patroni leader with a
    /// synchronous standby, beside the ceiling on that cluster.
    pub ha: Option<ha::Result>,
    /// Item 11: a rack of holds healed in one status change (R15).
    pub healing: Vec<healing::Run>,
    /// Item 12: item 1 at 8 clients, tracing off and on at a 1% sampler.
    pub tracing: Option<traced::Result>,
    /// Item 13: item 1 at 8 clients on pools keeping headroom and not (R18).
    pub headroom: Option<headroom::Result>,
    /// Item 14: readers of one pool's capacity beside item 1's load (R17).
    pub capacity: Option<capacity::Result>,
    /// Item 15: item 1's cycle statement by statement, without and with
    /// headroom.
    pub statements: Vec<statements::Table>,
    /// Item 16: every page and read at fleet size beside a small pool.
    pub fleet: Option<fleet::Result>,
    /// Item 17: item 1's cycle with substitute lists declared and served
    /// by a substitute, beside plain (R20).
    pub substitutes: Option<substitutes::Result>,
    /// Item 18: R21's daily job and planning pages at 1,000 pools.
    pub planning: Option<planning::Result>,
    /// Item 19: the webhook worker draining a small and a large backlog.
    pub webhooks: Option<webhooks::Result>,
    /// Why an item was left out.
    pub skipped: Vec<String>,
    /// The cluster's settings that shape the figures (machine table).
    pub pg_settings: Vec<(String, String)>,
}

async fn run() -> anyhow::Result<()> {
    // BENCHMARKS.md's generated sections again from a run's JSON, without
    // measuring (after a change of the report's layout or of the
    // hand-edited text).
    if let Some(json) = std::env::var_os("BENCH_REPORT") {
        let md = report::write_markdown(std::path::Path::new(&json))?;
        eprintln!(
            "bench: wrote {} from {}",
            md.display(),
            std::path::Path::new(&json).display()
        );
        return Ok(());
    }
    let cfg = Config::from_env();
    let started = Instant::now();
    let load_before = report::loadavg();
    let cpu_before = report::cpu_check();
    eprintln!("bench: {cfg:?}");
    if report::autogroup() == Some(true) {
        eprintln!(
            "bench: kernel.sched_autogroup_enabled is 1: every backend is a scheduling group of \
             its own, as on no database host (docs/production.md); \
             `sysctl kernel.sched_autogroup_enabled=0` before a run whose figures are quoted"
        );
    }
    let cluster = Cluster::start(&cfg).await?;
    let external = cluster.external();
    let outcome = run_items(&cfg, &cluster).await;
    let pg_version = outcome
        .as_ref()
        .ok()
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    cluster.stop();
    let (results, _) = outcome?;
    let machine = report::Machine::read(
        pg_version,
        external,
        load_before,
        report::loadavg(),
        cpu_before,
        report::cpu_check(),
    );
    let paths = report::write(&cfg, &machine, results, started.elapsed())?;
    eprintln!(
        "bench: done in {:.0} s; wrote {}",
        started.elapsed().as_secs_f64(),
        paths.join(" and ")
    );
    Ok(())
}

async fn run_items(cfg: &Config, cluster: &Cluster) -> anyhow::Result<(Results, String)> {
    let mut results = Results::default();
    let mut pg_version = String::new();

    if [
        "throughput",
        "statements",
        "pages",
        "headroom",
        "capacity",
        "substitutes",
    ]
    .iter()
    .any(|item| cfg.runs_item(item))
    {
        let db = cluster.database("bench_api").await?;
        pg_version = sqlx::query_scalar("SELECT current_setting('server_version')")
            .fetch_one(&db.setup)
            .await?;
        results.pg_settings = wal::settings(&db).await?;
        let org = setup::org(&db, "bench").await?;
        setup::machines(&db, org.id, "m", cfg.machines, cfg.sites, PROFILE, "ready").await?;
        throughput::create_ceiling_functions(&db).await?;
        // A history, as a database in service has: with an empty
        // reservations table the planner's statistics say "empty", and the
        // generic plans the server's connections cache for the whole run
        // scan the table (seen with auto_explain: a Seq Scan under the
        // allocator's held probe, costlier with every reservation written).
        growth::add_history(&db, org.id, 0, cfg.api_history).await?;
        // Profiling: plans of slow statements into the server log (kept with BENCH_KEEP=1).
        if let Ok(ms) = std::env::var("BENCH_AUTO_EXPLAIN_MS") {
            let ms: u32 = ms.parse()?;
            db.exec(&format!(
                "ALTER DATABASE {0} SET session_preload_libraries = 'auto_explain';
                 ALTER DATABASE {0} SET auto_explain.log_min_duration = {ms};
                 ALTER DATABASE {0} SET auto_explain.log_analyze = on;
                 ALTER DATABASE {0} SET auto_explain.log_buffers = on;
                 ALTER DATABASE {0} SET auto_explain.log_nested_statements = on;",
                db.name
            ))
            .await?;
        }
        db.exec("VACUUM ANALYZE").await?;
        // The bulk load above wrote hundreds of megabytes of WAL: its
        // checkpoint runs now, not during the measured runs.
        db.exec("CHECKPOINT").await?;
        let server = server::Server::start(&db.url, &cluster.dir, &cfg.server_log).await?;
        // Profiling: a change of sql/ measured against the code before it
        // without a second build. The files' definitions replace the ones
        // the server applied at start; its connections read them on their
        // next call.
        apply_sql_files(&db).await?;
        let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&db.setup)
            .await?;
        let meter = cpu::Meter::new(server.pid(), backend);
        let probe = wal::Probe::new(cluster.log.clone(), cfg.settle_seconds);
        let outcome = api_items(cfg, &db, &org, &server.base, &meter, &probe, &mut results).await;
        server.stop().await;
        outcome?;
        db.setup.close().await;
        drop_database(cluster, &db.name).await?;
    }

    if cfg.runs_item("fill") {
        eprintln!(
            "fill: {} cycles on a database analyzed empty",
            cfg.fill_cycles
        );
        results.fill = fill::run(cluster, cfg).await?;
    }

    if cfg.runs_item("race") {
        eprintln!(
            "race: 8 orders on 3 machines, {} rounds per version",
            cfg.race_rounds
        );
        let db = cluster.database("bench_race").await?;
        let (first, ours) = race::run(&db, cfg.race_rounds).await?;
        eprintln!(
            "  first version lost {} of {}; ours lost {} of {}",
            first.lost, first.possible, ours.lost, ours.possible
        );
        results.race = Some((first, ours));
        db.setup.close().await;
        drop_database(cluster, &db.name).await?;
    }

    if cfg.runs_item("fleet") {
        eprintln!("fleet: sizes {:?}", cfg.fleet_sizes);
        results.fleet = Some(fleet::run(cluster, cfg).await?);
    }

    if cfg.runs_item("planning") {
        eprintln!(
            "planning: {} pools, {} days written by the daily job, pages over {} days",
            cfg.planning_pools, cfg.planning_days, cfg.planning_page_days
        );
        results.planning = Some(planning::run(cluster, cfg).await?);
    }

    if cfg.runs_item("growth") {
        eprintln!("growth: history steps {:?}", cfg.history_steps);
        results.growth = growth::run(cluster, cfg).await?;
    }

    if cfg.runs_item("pooler") {
        if let Some(why) = pooler::unavailable() {
            results.skipped.push(why);
        } else {
            eprintln!(
                "pooler: {} clients, direct and through PgBouncer",
                pooler::CLIENTS
            );
            let db = cluster.database("bench_pooler").await?;
            let org = setup::org(&db, "pooler").await?;
            // As item 1's database: its machines, and a history, so that
            // the plans cached at the start are those of a database in
            // service (item 1 says why).
            setup::machines(&db, org.id, "m", cfg.machines, cfg.sites, PROFILE, "ready").await?;
            growth::add_history(&db, org.id, 0, cfg.api_history).await?;
            db.exec("VACUUM ANALYZE").await?;
            results.pooler = Some(pooler::run(cfg, &db, &cluster.dir, &org).await?);
            db.setup.close().await;
            drop_database(cluster, &db.name).await?;
        }
    }

    if cfg.runs_item("ha") {
        if let Some(why) = ha::unavailable() {
            results.skipped.push(why);
        } else {
            eprintln!(
                "ha: {} clients through HAProxy to a Patroni leader with a synchronous standby",
                ha::CLIENTS
            );
            results.ha = Some(ha::run(cfg).await?);
        }
    }

    if cfg.runs_item("tracing") {
        eprintln!(
            "tracing: {} clients, off and on at a 1% sampler, {} runs each",
            traced::CLIENTS,
            cfg.runs
        );
        results.tracing = Some(traced::run(cluster, cfg).await?);
    }

    if cfg.runs_item("healing") {
        eprintln!(
            "healing: a rack of {} held machines into maintenance",
            cfg.heal_holds
        );
        let db = cluster.database("bench_healing").await?;
        results.healing = healing::run(&db, cfg).await?;
        db.setup.close().await;
        drop_database(cluster, &db.name).await?;
    }

    if cfg.runs_item("webhooks") {
        eprintln!(
            "webhooks: the first {} of backlogs of {:?} delivered",
            webhooks::DRAINED,
            webhooks::BACKLOGS
        );
        let db = cluster.database("bench_webhooks").await?;
        results.webhooks = Some(webhooks::run(&db, cfg).await?);
        db.setup.close().await;
        drop_database(cluster, &db.name).await?;
    }

    if cfg.runs_item("sweep") {
        eprintln!("sweep: {} overdue reservations", cfg.sweep_reservations);
        let db = cluster.database("bench_sweep").await?;
        results.sweep = sweep::run(&db, cfg).await?;
        db.setup.close().await;
        drop_database(cluster, &db.name).await?;
    }
    Ok((results, pg_version))
}

/// Drops a bench database, unless `BENCH_KEEP=1` on an external server
/// (to look at it afterwards).
pub async fn drop_database(cluster: &Cluster, name: &str) -> anyhow::Result<()> {
    use sqlx::Connection;
    if cluster.external() && std::env::var("BENCH_KEEP").is_ok_and(|v| v == "1") {
        return Ok(());
    }
    let mut admin = cluster.admin().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await?;
    admin.close().await?;
    Ok(())
}

/// Item 1 at `clients` clients: `cfg.runs` HTTP runs against `base` and as
/// many ceiling runs on `db`, alternating, each followed by its per-cycle
/// counters (after the statistics settle).
pub async fn measure_throughput(
    cfg: &Config,
    meter: &cpu::Meter,
    probe: &wal::Probe,
    db: &setup::Db,
    org: &setup::Org,
    base: &str,
    clients: usize,
) -> anyhow::Result<Throughput> {
    let (mut http_runs, mut db_runs) = (Vec::new(), Vec::new());
    let (mut http_wal, mut db_wal) = (Vec::new(), Vec::new());
    let mut paced_runs = Vec::new();
    // The warm-up's counters settle before the first mark.
    tokio::time::sleep(std::time::Duration::from_secs_f64(cfg.settle_seconds)).await;
    let ceiling = async |rate: Option<f64>, tag: String| {
        throughput::db_run(
            meter,
            db,
            org.id,
            cfg.sites,
            clients,
            cfg.run_seconds,
            &tag,
            rate,
        )
        .await
    };
    // HTTP and ceiling runs alternate, so that a noisy neighbour hits both.
    for r in 0..cfg.runs {
        let mark = probe.start(db).await?;
        let h = throughput::http_run(
            meter,
            base,
            &org.token,
            cfg.sites,
            clients,
            cfg.run_seconds,
            &format!("h{clients}-{r}"),
        )
        .await?;
        let hw = probe.end(db, &mark, h.cycles).await?;
        // BENCH_CEILING=0 (profiling only) repeats the HTTP run instead.
        let (d, dw) = if std::env::var("BENCH_CEILING").is_ok_and(|v| v == "0") {
            (h, hw.clone())
        } else {
            let mark = probe.start(db).await?;
            let d = ceiling(None, format!("d{clients}-{r}")).await?;
            let dw = probe.end(db, &mark, d.cycles).await?;
            (d, dw)
        };
        eprintln!(
            "  {clients} clients run {r}: http {:.0}/s p50 {:.2} p99 {:.2} max {:.1} ms (cpu/cycle ms: server {:.2} client {:.2} pg {:.2}; machine {:.0}% busy; per cycle: {:.1} WAL records, {:.0} B, {:.2} FPI, {:.2} syncs, {:.2} commits, {} lock waits); ceiling {:.0}/s p50 {:.2} p99 {:.2} max {:.1} ms (cpu/cycle: client {:.2} pg {:.2}; per cycle: {:.1} WAL records, {:.0} B, {:.2} FPI, {:.2} syncs, {:.2} commits, {} lock waits)",
            h.cycles_per_s,
            h.reserve.p50_ms,
            h.reserve.p99_ms,
            h.reserve.max_ms,
            h.cpu.server_ms,
            h.cpu.client_ms,
            h.cpu.postgres_ms,
            h.cpu.machine_busy * 100.0,
            hw.records,
            hw.bytes,
            hw.fpi,
            hw.syncs,
            hw.commits,
            hw.lock_waits,
            d.cycles_per_s,
            d.reserve.p50_ms,
            d.reserve.p99_ms,
            d.reserve.max_ms,
            d.cpu.client_ms,
            d.cpu.postgres_ms,
            dw.records,
            dw.bytes,
            dw.fpi,
            dw.syncs,
            dw.commits,
            dw.lock_waits,
        );
        for e in hw.lock_wait_examples.iter().chain(&dw.lock_wait_examples) {
            eprintln!("    lock wait: {e}");
        }
        // At 8 clients (the goal's count), the ceiling again at this HTTP
        // run's rate: the same work at the same pace.
        if clients == 8 && std::env::var("BENCH_CEILING").map_or(true, |v| v != "0") {
            let p = ceiling(Some(h.cycles_per_s), format!("p{clients}-{r}")).await?;
            eprintln!(
                "  {clients} clients run {r}: ceiling paced to {:.0}/s: {:.0}/s (cpu/cycle: client {:.2} pg {:.2}; machine {:.0}% busy)",
                h.cycles_per_s,
                p.cycles_per_s,
                p.cpu.client_ms,
                p.cpu.postgres_ms,
                p.cpu.machine_busy * 100.0,
            );
            paced_runs.push(p);
        }
        http_runs.push(h);
        db_runs.push(d);
        http_wal.push(hw);
        db_wal.push(dw);
    }
    Ok(Throughput::of(
        clients, http_runs, db_runs, http_wal, db_wal, paced_runs,
    ))
}

/// Items 1 and 5, against one running server.
async fn api_items(
    cfg: &Config,
    db: &setup::Db,
    org: &setup::Org,
    base: &str,
    meter: &cpu::Meter,
    probe: &wal::Probe,
    results: &mut Results,
) -> anyhow::Result<()> {
    let warm = cfg.run_seconds.min(2.0);
    if cfg.runs_item("throughput") {
        // Warm-up: connections, plans, caches; not measured.
        if std::env::var("BENCH_NO_WARMUP").is_err() {
            throughput::http_run(meter, base, &org.token, cfg.sites, 8, warm, "warm-h").await?;
            throughput::db_run(meter, db, org.id, cfg.sites, 8, warm, "warm-d", None).await?;
        }
        for &clients in &cfg.clients {
            let t = measure_throughput(cfg, meter, probe, db, org, base, clients).await?;
            results.throughput.push(t);
        }
    }

    if cfg.runs_item("statements") {
        if roundtrips::available(db).await {
            eprintln!(
                "statements: item 1's cycle at {} clients, pg_stat_statements.track = all",
                statements::CLIENTS
            );
            results.statements = statements::run(cfg, db, org, base, meter).await?;
        } else {
            results
                .skipped
                .push("15 (statements): the server does not preload pg_stat_statements".to_owned());
        }
    }

    if cfg.runs_item("headroom") {
        eprintln!(
            "headroom: {} clients, pools keeping 1 machine for a segment and none, {} runs each",
            headroom::CLIENTS,
            cfg.runs
        );
        results.headroom = Some(headroom::run(cfg, db, org, base, meter).await?);
    }

    if cfg.runs_item("substitutes") {
        eprintln!(
            "substitutes: {} clients, plain, a list declared, served by the substitute, {} runs each",
            substitutes::CLIENTS,
            cfg.runs
        );
        results.substitutes = Some(substitutes::run(cfg, db, org, base, meter).await?);
    }

    if cfg.runs_item("throughput") {
        // Item 9: orders of three machines, all or nothing, 8 clients.
        for r in 0..cfg.runs {
            let o = throughput::http_orders_run(
                meter,
                base,
                &org.token,
                cfg.sites,
                8,
                cfg.run_seconds,
                &format!("o3-{r}"),
                3,
            )
            .await?;
            eprintln!(
                "  orders of 3, 8 clients, run {r}: {:.0} orders/s ({:.0} machines/s) p50 {:.2} p99 {:.2} ms, cancel p50 {:.2} ms, {} contended",
                o.cycles_per_s,
                3.0 * o.cycles_per_s,
                o.reserve.p50_ms,
                o.reserve.p99_ms,
                o.cancel.p50_ms,
                o.contended
            );
            results.orders_of_three.push(o);
        }
    }

    if cfg.runs_item("throughput") {
        if roundtrips::available(db).await {
            results.round_trips = roundtrips::run(db, base, &org.token).await?;
            for c in &results.round_trips {
                eprintln!("  round trips: {}: {:.2}", c.call, c.statements_per_call);
            }
        } else {
            results
                .skipped
                .push("7 (round trips): the server does not preload pg_stat_statements".to_owned());
        }
    }

    if cfg.runs_item("pages") || cfg.runs_item("capacity") {
        let login_page = reqwest::get(format!("{base}/login")).await?.status();
        if login_page != 200 {
            results.skipped.push(format!(
                "5 (dashboard pages): the dashboard has not landed in this build (GET /login answered {login_page})"
            ));
            return Ok(());
        }
        // The organization grows to `page_machines`: another profile, most
        // ready, some in maintenance; `page_held` of them held for an hour,
        // and `page_sold` others in service, as in a shop that has sold
        // most of its pool.
        let extra = (cfg.page_machines - cfg.machines).max(0);
        let ready = extra * 4 / 5;
        setup::machines(db, org.id, "x", ready, cfg.sites, "xeon-6430-128g", "ready").await?;
        setup::machines(
            db,
            org.id,
            "y",
            extra - ready,
            cfg.sites,
            "xeon-6430-128g",
            "maintenance",
        )
        .await?;
        sqlx::query(
            "INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason, hold_seconds,
                                       created_at, expires_at)
             SELECT $1, 'live-' || m.id, m.id, '{\"site\": \"s01\"}', jsonb_build_object('asset_tag', m.asset_tag),
                    m.asset_tag || ' matched site ' || m.site || ', profile ' || m.profile
                        || ', any vendor: candidate 1 of 25 in pass one; held for 3600 s',
                    3600, clock_timestamp(), clock_timestamp() + (3000 + m.id % 600) * interval '1 second'
               FROM (SELECT * FROM machines WHERE org_id = $1 AND asset_tag LIKE 'x-%' ORDER BY id LIMIT $2) m",
        )
        .bind(org.id)
        .bind(cfg.page_held)
        .execute(&db.setup)
        .await?;
        setup::sold(
            db,
            org.id,
            &format!(
                "SELECT id, asset_tag FROM machines WHERE org_id = $1 AND asset_tag LIKE 'x-%'
                  ORDER BY id OFFSET {} LIMIT {}",
                cfg.page_held, cfg.page_sold
            ),
        )
        .await?;
        db.exec("VACUUM ANALYZE").await?;
        let machines_in_org = db
            .scalar_i64(&format!(
                "SELECT count(*) FROM machines WHERE org_id = {}",
                org.id
            ))
            .await?;
        if cfg.runs_item("capacity") {
            eprintln!(
                "capacity: {} readers of one pool's capacity among {machines_in_org} machines, beside item 1's load",
                cfg.page_readers
            );
            results.capacity = Some(capacity::run(cfg, meter, base, org, machines_in_org).await?);
        }
        if !cfg.runs_item("pages") {
            return Ok(());
        }
        pages::create_viewer(db, org.id).await?;
        let http = pages::login(base).await?;
        let pages = pages::pages(&setup::site(2), PROFILE);
        // Warm-up, and the size of each page.
        pages::read_run(&http, base, &pages, cfg.page_readers, warm).await?;
        let mut sizes = Vec::new();
        for (_, path) in &pages {
            sizes.push(
                http.get(format!("{base}{path}"))
                    .send()
                    .await?
                    .bytes()
                    .await?
                    .len(),
            );
        }
        let mut alone_runs: Vec<Vec<Latency>> = Vec::new();
        for _ in 0..cfg.runs {
            alone_runs.push(pages::read_run(&http, base, &pages, 1, cfg.run_seconds / 2.0).await?);
        }
        let mut page_runs: Vec<Vec<Latency>> = Vec::new();
        let mut load_runs = Vec::new();
        for r in 0..cfg.runs {
            let tag = format!("p{r}");
            let load =
                throughput::http_run(meter, base, &org.token, cfg.sites, 8, cfg.run_seconds, &tag);
            let reads = pages::read_run(&http, base, &pages, cfg.page_readers, cfg.run_seconds);
            let (load, reads) = tokio::join!(load, reads);
            let (load, reads) = (load?, reads?);
            eprintln!(
                "  pages run {r}: {} ; load {:.0}/s",
                reads
                    .iter()
                    .zip(&pages)
                    .map(|(l, (name, _))| format!(
                        "{name}: p50 {:.1} p99 {:.1} ms",
                        l.p50_ms, l.p99_ms
                    ))
                    .collect::<Vec<_>>()
                    .join("; "),
                load.cycles_per_s
            );
            page_runs.push(reads);
            load_runs.push(load);
        }
        results.pages = Some(PagesResult {
            machines_in_org,
            held: cfg.page_held,
            sold: cfg.page_sold,
            readers: cfg.page_readers,
            pages: pages
                .iter()
                .enumerate()
                .map(|(i, (name, path))| {
                    let runs: Vec<Latency> = page_runs.iter().map(|r| r[i]).collect();
                    (
                        name.to_string(),
                        path.clone(),
                        sizes[i],
                        Latency::median_of(&runs),
                    )
                })
                .collect(),
            alone: (0..pages.len())
                .map(|i| Latency::median_of(&alone_runs.iter().map(|r| r[i]).collect::<Vec<_>>()))
                .collect(),
            load_cycles_per_s: median(
                &load_runs.iter().map(|r| r.cycles_per_s).collect::<Vec<_>>(),
            ),
            load_reserve: Latency::median_of(
                &load_runs.iter().map(|r| r.reserve).collect::<Vec<_>>(),
            ),
        });
    }
    Ok(())
}

/// Profiling: `BENCH_SQL_FILES` (`a.sql;b.sql`) applied over the
/// definitions of `db`, for a change of sql/ measured against the code
/// before it without a second build (the API's database and item 3's).
pub(crate) async fn apply_sql_files(db: &setup::Db) -> anyhow::Result<()> {
    if let Ok(files) = std::env::var("BENCH_SQL_FILES") {
        for path in files.split(';').filter(|p| !p.is_empty()) {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("BENCH_SQL_FILES: {path}: {e}"))?;
            db.exec(&text).await?;
            eprintln!("bench: applied {path} over the definitions of {}", db.name);
        }
    }
    Ok(())
}
