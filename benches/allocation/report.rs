//! BENCHMARKS.md and results.json: the table, the machine it ran on, and the
//! command that reproduces it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::setup::Config;
use crate::stats::median;
use crate::{Results, Throughput};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Machine {
    pub nproc: usize,
    pub memory: String,
    pub cpu: String,
    pub postgres: String,
    /// Ran against BENCH_DATABASE_URL rather than the private cluster.
    pub external_postgres: bool,
    pub date: String,
    pub load_before: String,
    pub load_after: String,
    /// `cpu_check` before and after the run, ms.
    pub cpu_before: f64,
    pub cpu_after: f64,
    /// `kernel.sched_autogroup_enabled` (None: not Linux, or unreadable).
    /// On, every PostgreSQL backend is a scheduling group of its own
    /// (docs/production.md), and the figures are not a database host's.
    #[serde(default)]
    pub autogroup: Option<bool>,
}

/// `kernel.sched_autogroup_enabled`, when this kernel has it.
pub fn autogroup() -> Option<bool> {
    std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .ok()
        .map(|s| s.trim() != "0")
}

/// A fixed single-threaded loop, timed: the median of 5, in ms. The same
/// work on every run and every commit, so that two BENCHMARKS.md can be
/// compared for the speed of the machine they ran on (a shared virtual
/// machine here was measured 1.6 times slower within the hour).
pub fn cpu_check() -> f64 {
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            let mut acc: u64 = 0;
            for _ in 0..50_000_000u32 {
                // xorshift64: a dependency chain the compiler cannot fold.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                acc = acc.wrapping_add(x);
            }
            std::hint::black_box(acc);
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[2]
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

impl Machine {
    pub fn read(
        postgres: String,
        external_postgres: bool,
        load_before: String,
        load_after: String,
        cpu_before: f64,
        cpu_after: f64,
    ) -> Machine {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| {
                        l.split_whitespace()
                            .nth(1)
                            .and_then(|kb| kb.parse::<f64>().ok())
                    })
            })
            .map(|kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0))
            .unwrap_or_else(|| "unknown".to_owned());
        Machine {
            nproc: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            memory,
            cpu,
            postgres: if postgres.is_empty() {
                "unknown".to_owned()
            } else {
                postgres
            },
            external_postgres,
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            load_before,
            load_after,
            cpu_before,
            cpu_after,
            autogroup: autogroup(),
        }
    }
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "**missed**" }
}

/// The reproducing command for this configuration.
fn command(cfg: &Config) -> String {
    let mut vars = Vec::new();
    for name in [
        "BENCH_QUICK",
        "BENCH_ONLY",
        "BENCH_SECONDS",
        "BENCH_RUNS",
        "BENCH_CLIENTS",
        "BENCH_MACHINES",
        "BENCH_SITES",
        "BENCH_HISTORY",
        "BENCH_SWEEP",
        "BENCH_RACE_ROUNDS",
        "BENCH_GROWTH_RESERVES",
        "BENCH_PAGE_MACHINES",
        "BENCH_PAGE_HELD",
        "BENCH_PAGE_SOLD",
        "BENCH_PAGE_READERS",
        "BENCH_FLEET",
        "BENCH_PLANNING",
        "BENCH_PLANNING_DAYS",
        "BENCH_PLANNING_HISTORY",
        "BENCH_PLANNING_PAGE_DAYS",
        "BENCH_SERVER_LOG",
        "BENCH_DURABLE",
        "BENCH_PG_SET",
        "BENCH_SETTLE",
        "BENCH_SQL_FILES",
        "POOLKEEPER_DB_MAX_CONNECTIONS",
    ] {
        if let Ok(v) = std::env::var(name) {
            vars.push(format!("{name}={v}"));
        }
    }
    let _ = cfg;
    vars.push("cargo bench --bench allocation".to_owned());
    vars.join(" ")
}

fn is_full(cfg: &Config) -> bool {
    !cfg.quick
        && cfg.durable
        && cfg.pg_set.is_empty()
        && std::env::var("POOLKEEPER_DB_MAX_CONNECTIONS").is_err()
        && std::env::var("BENCH_SQL_FILES").is_err()
        && ["throughput", "race", "growth", "sweep", "pages"]
            .iter()
            .all(|i| cfg.runs_item(i))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// What a run measured, as data: the figures of target/bench/results.json,
/// from which every table of BENCHMARKS.md is rendered (`render`), so that
/// the tables can be written again from a run's JSON without measuring
/// (`BENCH_REPORT`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The command that reproduces the run.
    pub command: String,
    /// A full run (BENCHMARKS.md) rather than a quick or partial one
    /// (target/bench/BENCHMARKS-partial.md).
    #[serde(default)]
    pub full: bool,
    /// The server's pool of connections (`POOLKEEPER_DB_MAX_CONNECTIONS`).
    #[serde(default = "default_pool")]
    pub server_pool: String,
    /// How the server was built: the release build a run measures, or a
    /// debug build (`cargo bench --profile dev`, to try the bench itself).
    #[serde(default = "default_build")]
    pub server_build: String,
    pub machine: Machine,
    pub config: Config,
    pub seconds: f64,
    pub results: Results,
}

fn default_pool() -> String {
    "20".to_owned()
}

fn default_build() -> String {
    "release build".to_owned()
}

/// Writes the run's JSON, then BENCHMARKS.md's generated sections rendered
/// from that JSON as read back; a quick or partial run writes under
/// target/bench/ only, so that BENCHMARKS.md always holds a full run.
pub fn write(
    cfg: &Config,
    machine: &Machine,
    results: Results,
    took: Duration,
) -> anyhow::Result<Vec<String>> {
    let report = Report {
        command: command(cfg),
        full: is_full(cfg),
        server_pool: std::env::var("POOLKEEPER_DB_MAX_CONNECTIONS")
            .unwrap_or_else(|_| default_pool()),
        // The server binary is built with the bench's profile.
        server_build: if cfg!(debug_assertions) {
            "debug build: not a measurement of the product".to_owned()
        } else {
            default_build()
        },
        machine: machine.clone(),
        config: cfg.clone(),
        seconds: took.as_secs_f64(),
        results,
    };
    let dir = target_dir().join("bench");
    std::fs::create_dir_all(&dir)?;
    let json_path = dir.join(if report.full {
        "results.json"
    } else {
        "results-partial.json"
    });
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)?;
    let md_path = write_markdown(&json_path)?;
    Ok(vec![
        json_path.display().to_string(),
        md_path.display().to_string(),
    ])
}

/// Renders the generated sections of BENCHMARKS.md from a run's JSON and
/// writes them into BENCHMARKS.md (a full run) or a copy of it under
/// target/bench/ (a quick or partial run), the hand-edited text unchanged.
pub fn write_markdown(json_path: &Path) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(json_path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", json_path.display()))?;
    let report: Report = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: not a run's results: {e}", json_path.display()))?;
    let benchmarks = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("BENCHMARKS.md");
    let template = std::fs::read_to_string(&benchmarks)
        .map_err(|e| anyhow::anyhow!("{}: {e}", benchmarks.display()))?;
    let md = splice(&template, &render(&report))?;
    let md_path = if report.full {
        benchmarks
    } else {
        target_dir().join("bench").join("BENCHMARKS-partial.md")
    };
    std::fs::write(&md_path, md)?;
    Ok(md_path)
}

/// The generated sections, by name: the machine, the tables, and this
/// run's figures beside its targets.
pub fn render(report: &Report) -> Vec<(&'static str, String)> {
    vec![
        ("machine", machine_section(report)),
        ("results", results_section(report)),
        ("verdicts", crate::verdicts::verdicts(&report.results)),
    ]
}

/// `template` with the text between `<!-- generated:begin NAME -->` and
/// `<!-- generated:end NAME -->` replaced by the section NAME, everything
/// else as it was. Every section must have its markers, once, and every
/// marker a section: a missing or stray marker is an error, not a file
/// written half.
pub fn splice(template: &str, sections: &[(&str, String)]) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut rest = template;
    let mut seen = Vec::new();
    while let Some(at) = rest.find("<!-- generated:begin ") {
        let head = &rest[at + "<!-- generated:begin ".len()..];
        let name = head
            .split_once(" -->")
            .map(|(n, _)| n.trim())
            .ok_or_else(|| anyhow::anyhow!("BENCHMARKS.md: an unclosed generated:begin marker"))?;
        let body = sections
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| b)
            .ok_or_else(|| anyhow::anyhow!("BENCHMARKS.md: no section named {name}"))?;
        if seen.contains(&name) {
            anyhow::bail!("BENCHMARKS.md: the section {name} is marked twice");
        }
        let begin = format!("<!-- generated:begin {name} -->");
        let end = format!("<!-- generated:end {name} -->");
        let after = &rest[at + begin.len()..];
        let stop = after
            .find(&end)
            .ok_or_else(|| anyhow::anyhow!("BENCHMARKS.md: no {end}"))?;
        if after[..stop].contains("<!-- generated:") {
            anyhow::bail!("BENCHMARKS.md: a marker inside the section {name}");
        }
        out.push_str(&rest[..at]);
        out.push_str(&begin);
        out.push('\n');
        out.push_str(body.trim_end());
        out.push_str("\n\n");
        out.push_str(&end);
        rest = &after[stop + end.len()..];
        seen.push(name);
    }
    if rest.contains("<!-- generated:end ") {
        anyhow::bail!("BENCHMARKS.md: a generated:end marker without its begin");
    }
    out.push_str(rest);
    for (name, _) in sections {
        if !seen.contains(name) {
            anyhow::bail!("BENCHMARKS.md has no section {name} (<!-- generated:begin {name} -->)");
        }
    }
    Ok(out)
}

/// The run's header and the machine it ran on.
fn machine_section(report: &Report) -> String {
    let (cfg, machine, results) = (&report.config, &report.machine, &report.results);
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(
        w,
        "Written by `{}` on {} (took {:.0} s), from its `target/bench/{}`.\n",
        report.command,
        machine.date,
        report.seconds,
        if report.full {
            "results.json"
        } else {
            "results-partial.json"
        }
    );
    let _ = writeln!(w, "| machine | |\n| --- | --- |");
    let _ = writeln!(w, "| CPUs (nproc) | {} |", machine.nproc);
    let _ = writeln!(w, "| memory | {} |", machine.memory);
    let _ = writeln!(w, "| CPU model | {} |", machine.cpu);
    let _ = writeln!(
        w,
        "| PostgreSQL | {} ({}) |",
        machine.postgres,
        if machine.external_postgres {
            "the server of BENCH_DATABASE_URL"
        } else if cfg.durable {
            "private cluster started by the bench, durable as PostgreSQL ships, on the machine's disk, Unix socket"
        } else {
            "private throwaway cluster started by the bench (BENCH_DURABLE=0): CPU cost only, not a deployment's figures, Unix socket"
        }
    );
    if !results.pg_settings.is_empty() {
        let _ = writeln!(
            w,
            "| PostgreSQL settings | {} |",
            results
                .pg_settings
                .iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if let Some(on) = machine.autogroup {
        let _ = writeln!(
            w,
            "| kernel.sched_autogroup_enabled | {} |",
            if on {
                "1: every backend a scheduling group of its own, not a database host's setting (docs/production.md)"
            } else {
                "0, as on a database host (docs/production.md)"
            }
        );
    }
    let _ = writeln!(
        w,
        "| load average (1, 5, 15 min) | before: {}; after: {} |",
        machine.load_before, machine.load_after
    );
    let _ = writeln!(
        w,
        "| CPU speed check (a fixed single-threaded loop, median of 5; lower is faster) | before: {:.0} ms; after: {:.0} ms |",
        machine.cpu_before, machine.cpu_after
    );
    let _ = writeln!(
        w,
        "| server | `poolkeeper serve` as a separate process ({}, pool of {} connections, RUST_LOG={}), on the same machine as the clients and PostgreSQL |\n",
        report.server_build, report.server_pool, cfg.server_log
    );
    md
}

/// The tables: item by item against the targets, and item 15's statements.
fn results_section(report: &Report) -> String {
    let (cfg, results) = (&report.config, &report.results);
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "## Results\n");
    let _ = writeln!(
        w,
        "Each figure is the median of {} runs; latencies are p50 / p99 of every call in a run, then the median of the runs.\n",
        cfg.runs
    );
    let _ = writeln!(
        w,
        "| # | measure | result | target | |\n| --- | --- | --- | --- | --- |"
    );
    for t in &results.throughput {
        throughput_rows(w, t, cfg);
    }
    if let Some((first, ours)) = &results.race {
        let _ = writeln!(
            w,
            "| 2 | 8 orders on 3 machines, {} rounds, 8 connections released by a barrier: sales lost | article's first version (whole candidate set locked): {} lost of {} ({} rounds losing; {} orders failed on a unique violation); ours (`allocator::reserve`): {} lost of {} | ours loses none | {} |",
            first.rounds,
            first.lost,
            first.possible,
            first.rounds_losing,
            first.errors,
            ours.lost,
            ours.possible,
            met(ours.lost == 0 && ours.errors == 0)
        );
    }
    if let Some(base) = results.growth.first() {
        let longest = results.growth.iter().map(|s| s.history).max().unwrap_or(0);
        for s in &results.growth {
            let r50 = s.reserve.p50_ms / base.reserve.p50_ms;
            let r99 = s.reserve.p99_ms / base.reserve.p99_ms;
            if s.sold > 0 {
                let _ = writeln!(
                    w,
                    "| 3 | reserve latency (one client, `allocator::reserve`), no history, with {} machines in service: 9 in 10 of every pool, its lowest ids (in id order every sold machine comes before the first sellable one) | p50 {:.2} ms, p99 {:.2} ms; ratio to none sold: p50 ×{:.2}, p99 ×{:.2} | | |",
                    thousands(s.sold),
                    s.reserve.p50_ms,
                    s.reserve.p99_ms,
                    r50,
                    r99,
                );
                continue;
            }
            let last = s.history == longest && s.history > 0;
            let _ = writeln!(
                w,
                "| 3 | reserve latency (one client, `allocator::reserve`) with {} ended reservations in the history | p50 {:.2} ms, p99 {:.2} ms; ratio to empty: p50 ×{:.2}, p99 ×{:.2} | {} | {} |",
                thousands(s.history),
                s.reserve.p50_ms,
                s.reserve.p99_ms,
                r50,
                r99,
                if last { "≤ ×1.2 at 1,000,000" } else { "" },
                if last { met(r50 <= 1.2) } else { "" }
            );
        }
    }
    for parallel in [1, 2] {
        let runs: Vec<&crate::sweep::Run> = results
            .sweep
            .iter()
            .filter(|r| r.parallel == parallel)
            .collect();
        let Some(first) = runs.first() else { continue };
        let total = median(&runs.iter().map(|r| r.total_ms).collect::<Vec<_>>());
        let longest = runs.iter().map(|r| r.batch.max_ms).fold(0.0, f64::max);
        let p99 = median(&runs.iter().map(|r| r.batch.p99_ms).collect::<Vec<_>>());
        let (what, target) = if parallel == 2 {
            (
                "as shipped: two batch statements at a time, as `sweep::expire_two_batches`",
                true,
            )
        } else {
            ("for comparison: one batch statement at a time", false)
        };
        let _ = writeln!(
            w,
            "| 4 | sweep: expire {} overdue reservations, batches of {} ({what}) | {:.2} s in {} batches | {} | {} |",
            thousands(first.expired as i64),
            poolkeeper::sweep::BATCH_SIZE,
            total / 1000.0,
            first.batches,
            if target { "< 3 s" } else { "" },
            if target { met(total < 3000.0) } else { "" }
        );
        let _ = writeln!(
            w,
            "| 4 | sweep ({}): longest time one batch held its locks (its statement, seen from the client) | longest of all runs {:.1} ms; batch p99 {:.1} ms | {} | {} |",
            if parallel == 2 {
                "as shipped"
            } else {
                "one at a time"
            },
            longest,
            p99,
            if target { "≤ 100 ms" } else { "" },
            if target { met(longest <= 100.0) } else { "" }
        );
    }
    for dry_run in [false, true] {
        let runs: Vec<f64> = results
            .healing
            .iter()
            .filter(|r| r.dry_run == dry_run)
            .map(|r| r.total_ms)
            .collect();
        let Some(first) = results.healing.iter().find(|r| r.dry_run == dry_run) else {
            continue;
        };
        let _ = writeln!(
            w,
            "| 11 | healing (R15): a rack of {} held machines into maintenance in one status change, every hold moved to a spare of its spec among 20,000 other machines{} | median {:.0} ms (runs: {}) | | |",
            first.holds,
            if dry_run {
                ", as a dry run (made and rolled back: the preview)"
            } else {
                ", committed"
            },
            median(&runs),
            runs.iter()
                .map(|t| format!("{t:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if let Some(k) = &results.headroom {
        let rate = |runs: &[crate::throughput::Run]| {
            median(&runs.iter().map(|r| r.cycles_per_s).collect::<Vec<_>>())
        };
        let p99 = |runs: &[crate::throughput::Run]| {
            median(&runs.iter().map(|r| r.reserve.p99_ms).collect::<Vec<_>>())
        };
        let (with, without) = (rate(&k.with), rate(&k.without));
        let ratio = if without > 0.0 { with / without } else { 0.0 };
        let _ = writeln!(
            w,
            "| 13 | headroom (R18): item 1's cycle at {} clients, every pool keeping 1 machine for a segment the orders do not name (each reserve takes the pool's turn), against no headroom | ×{:.2} ({:.0}/s against {:.0}/s; reserve p99 {:.2} ms against {:.2} ms; runs with: {}; without: {}) | ≥ ×0.80 | {} |",
            crate::headroom::CLIENTS,
            ratio,
            with,
            without,
            p99(&k.with),
            p99(&k.without),
            k.with
                .iter()
                .map(|r| format!("{:.0}", r.cycles_per_s))
                .collect::<Vec<_>>()
                .join(", "),
            k.without
                .iter()
                .map(|r| format!("{:.0}", r.cycles_per_s))
                .collect::<Vec<_>>()
                .join(", "),
            met(ratio >= 0.8)
        );
        // The hot path's cost with headroom, against the ceiling of item 1
        // at the same client count (the ceiling keeps no headroom: the
        // pool's turn is the API's own work).
        let pg = |runs: &[crate::throughput::Run]| {
            median(&runs.iter().map(|r| r.cpu.postgres_ms).collect::<Vec<_>>())
        };
        let server = |runs: &[crate::throughput::Run]| {
            median(&runs.iter().map(|r| r.cpu.server_ms).collect::<Vec<_>>())
        };
        if let Some(t) = results
            .throughput
            .iter()
            .find(|t| t.clients == crate::headroom::CLIENTS)
        {
            let ceiling = t.db_cpu.postgres_ms.max(1e-9);
            let _ = writeln!(
                w,
                "| 13 | headroom (R18): CPU per reservation with / without headroom, against item 1's ceiling at {} connections ({:.2} ms of PostgreSQL) | PostgreSQL {:.2} / {:.2} ms: ×{:.2} / ×{:.2}; server + PostgreSQL {:.2} / {:.2} ms: the API at {:.2} / {:.2} of the ceiling by CPU | ≤ ×1.5; ≥ 0.5 | {} |",
                crate::headroom::CLIENTS,
                ceiling,
                pg(&k.with),
                pg(&k.without),
                pg(&k.with) / ceiling,
                pg(&k.without) / ceiling,
                pg(&k.with) + server(&k.with),
                pg(&k.without) + server(&k.without),
                ceiling / (pg(&k.with) + server(&k.with)).max(1e-9),
                ceiling / (pg(&k.without) + server(&k.without)).max(1e-9),
                met(pg(&k.with) <= 1.5 * ceiling
                    && pg(&k.without) <= 1.5 * ceiling
                    && 2.0 * ceiling >= pg(&k.with) + server(&k.with)
                    && 2.0 * ceiling >= pg(&k.without) + server(&k.without))
            );
        }
    }
    if let Some(c) = &results.capacity {
        let reads = crate::stats::Latency::median_of(&c.reads);
        let rate = |runs: &[crate::throughput::Run]| {
            median(&runs.iter().map(|r| r.cycles_per_s).collect::<Vec<_>>())
        };
        let (beside, alone) = (rate(&c.beside), rate(&c.alone));
        let ratio = if alone > 0.0 { beside / alone } else { 0.0 };
        let _ = writeln!(
            w,
            "| 14 | capacity (R17): `GET /api/v1/capacity` of one pool among {} machines, {} readers beside item 1's load at 8 clients | p50 {:.2} ms, p99 {:.2} ms | p99 < 10 ms | {} |",
            c.machines,
            c.readers,
            reads.p50_ms,
            reads.p99_ms,
            met(reads.p99_ms < 10.0)
        );
        let _ = writeln!(
            w,
            "| 14 | capacity (R17): item 1's reserve rate with those readers against without | ×{:.2} ({:.0}/s against {:.0}/s) | ≥ ×0.90 | {} |",
            ratio,
            beside,
            alone,
            met(ratio >= 0.9)
        );
        // What the readers cost: they read in a closed loop on the same
        // two CPUs as the load, the server and PostgreSQL, so the CPU their
        // reads take is what the reserve rate loses. Per run: the CPU of
        // the run with readers beyond what its cycles cost alone, over the
        // reads.
        let per_run: Vec<(f64, f64)> = c
            .reads
            .iter()
            .zip(c.beside.iter().zip(&c.alone))
            .map(|(reads, (beside, alone))| {
                let n = reads.samples as f64;
                let extra = (beside.cpu.total_ms - alone.cpu.total_ms) * beside.cycles as f64;
                (n / c.seconds, if n > 0.0 { extra / n } else { 0.0 })
            })
            .collect();
        let reads_per_s = median(&per_run.iter().map(|r| r.0).collect::<Vec<_>>());
        let cpu_per_read = median(&per_run.iter().map(|r| r.1).collect::<Vec<_>>());
        let _ = writeln!(
            w,
            "| 14 | capacity (R17): what the readers take (closed loop, same machine) | {:.0} reads/s (×{:.1} the reserve cycles); CPU per read, server + PostgreSQL + client, beyond the load's own: {:.3} ms; machine busy {:.0}% with readers, {:.0}% without |  |  |",
            reads_per_s,
            if beside > 0.0 {
                reads_per_s / beside
            } else {
                0.0
            },
            cpu_per_read,
            100.0
                * median(
                    &c.beside
                        .iter()
                        .map(|r| r.cpu.machine_busy)
                        .collect::<Vec<_>>()
                ),
            100.0
                * median(
                    &c.alone
                        .iter()
                        .map(|r| r.cpu.machine_busy)
                        .collect::<Vec<_>>()
                ),
        );
    }
    if let Some(t) = &results.tracing {
        let med = |runs: &[crate::throughput::Run], f: fn(&crate::throughput::Run) -> f64| {
            median(&runs.iter().map(f).collect::<Vec<_>>())
        };
        let ratio = t.ratio();
        let _ = writeln!(
            w,
            "| 12 | tracing: item 1 at {} clients, OpenTelemetry on at a 1% sampler (OTLP/HTTP to a local sink) over off, servers alternating run by run | ×{:.3}: {:.0}/s against {:.0}/s; reserve p50 {:.2} / {:.2} ms, p99 {:.2} / {:.2} ms (on / off); {} exports, {} bytes | ≥ ×0.95 | {} |",
            crate::traced::CLIENTS,
            ratio,
            med(&t.on, |r| r.cycles_per_s),
            med(&t.off, |r| r.cycles_per_s),
            med(&t.on, |r| r.reserve.p50_ms),
            med(&t.off, |r| r.reserve.p50_ms),
            med(&t.on, |r| r.reserve.p99_ms),
            med(&t.off, |r| r.reserve.p99_ms),
            t.exports,
            t.exported_bytes,
            met(ratio >= 0.95)
        );
    }
    if let Some(p) = &results.pages {
        for (i, (name, path, size, l)) in p.pages.iter().enumerate() {
            let alone = p.alone.get(i).copied().unwrap_or_default();
            let _ = writeln!(
                w,
                "| 5 | page `{path}`: {name} ({} kB of HTML); {} machines, {} held, {} in service; {} readers during the 8-client allocation load | p50 {:.1} ms, p99 {:.1} ms (one reader, no load: p50 {:.1} ms, p99 {:.1} ms) | p99 < 50 ms | {} |",
                size / 1024,
                thousands(p.machines_in_org),
                thousands(p.held),
                thousands(p.sold),
                p.readers,
                l.p50_ms,
                l.p99_ms,
                alone.p50_ms,
                alone.p99_ms,
                met(l.p99_ms < 50.0)
            );
        }
        let _ = writeln!(
            w,
            "| 5 | the allocation load meanwhile (8 HTTP clients) | {:.0} reservations/s, reserve p50 {:.1} ms, p99 {:.1} ms | | |",
            p.load_cycles_per_s, p.load_reserve.p50_ms, p.load_reserve.p99_ms
        );
    }
    if !results.fill.is_empty() {
        let r = &results.fill;
        let m = |f: fn(&crate::fill::Run) -> f64| median(&r.iter().map(f).collect::<Vec<_>>());
        let ratio = m(|x| x.ratio);
        let _ = writeln!(
            w,
            "| 6 | a fresh deployment filling up: database analyzed empty, {} reserve+cancel cycles through HTTP, 8 clients; rate of the last 10% over the first 10% | first {:.0}/s, last {:.0}/s: ×{:.2} (runs: {}) | ≥ ×0.8 | {} |",
            thousands(r[0].cycles as i64),
            m(|x| x.first_rate),
            m(|x| x.last_rate),
            ratio,
            r.iter()
                .map(|x| format!("×{:.2}", x.ratio))
                .collect::<Vec<_>>()
                .join(", "),
            met(ratio >= 0.8)
        );
    }
    if !results.round_trips.is_empty() {
        let worst = results
            .round_trips
            .iter()
            .map(|c| c.statements_per_call)
            .fold(0.0, f64::max);
        let _ = writeln!(
            w,
            "| 7 | round trips to PostgreSQL per API call (top-level statements per call, counted by pg_stat_statements over {} calls each) | {} | ≤ 2 | {} |",
            results.round_trips[0].calls,
            results
                .round_trips
                .iter()
                .map(|c| format!("{}: {:.2}", c.call, c.statements_per_call))
                .collect::<Vec<_>>()
                .join("; "),
            met(worst <= 2.0)
        );
    }
    if !results.orders_of_three.is_empty() {
        let runs = &results.orders_of_three;
        let rate = crate::stats::median(&runs.iter().map(|r| r.cycles_per_s).collect::<Vec<_>>());
        let reserve =
            crate::stats::Latency::median_of(&runs.iter().map(|r| r.reserve).collect::<Vec<_>>());
        let cancel =
            crate::stats::Latency::median_of(&runs.iter().map(|r| r.cancel).collect::<Vec<_>>());
        let one = results
            .throughput
            .iter()
            .find(|t| t.clients == 8)
            .map(|t| t.http_cycles_per_s);
        let _ = writeln!(
            w,
            "| 9 | orders of 3 machines (R13: `quantity` 3, all or nothing), reserve then cancel of the whole order through the API, 8 clients | {:.0} orders/s ({:.0} machines/s{}); reserve p50 {:.2} ms, p99 {:.2} ms; cancel p50 {:.2} ms; {} contended | | |",
            rate,
            3.0 * rate,
            one.map(|o| format!("; orders of one: {o:.0}/s, item 1"))
                .unwrap_or_default(),
            reserve.p50_ms,
            reserve.p99_ms,
            cancel.p50_ms,
            runs.iter().map(|r| r.contended).sum::<u64>()
        );
    }
    if let Some(p) = &results.pooler {
        let direct = p.paths.first().map(|d| d.cycles_per_s).unwrap_or(0.0);
        for (i, path) in p.paths.iter().enumerate() {
            let ratio = if i == 0 || direct <= 0.0 {
                String::new()
            } else {
                format!("; ×{:.2} the direct rate", path.cycles_per_s / direct)
            };
            let statements = path
                .statements_per_cycle
                .map(|s| format!("; {s:.2} statements per cycle"))
                .unwrap_or_default();
            let _ = writeln!(
                w,
                "| 8 | {} clients, one pool of {}, the API's reserve then cancel calls: {} ({}) | {:.0}/s{ratio}; reserve p50 {:.2} ms, p99 {:.2} ms; cancel p50 {:.2} ms, p99 {:.2} ms{statements} (runs: {}) | | |",
                p.clients,
                p.clients,
                path.path,
                p.pgbouncer,
                path.cycles_per_s,
                path.reserve.p50_ms,
                path.reserve.p99_ms,
                path.cancel.p50_ms,
                path.cancel.p99_ms,
                path.runs
                    .iter()
                    .map(|r| format!("{r:.0}/s"))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
        }
    }
    if let Some(ha) = &results.ha {
        let _ = writeln!(w, "{}", crate::ha::row(ha));
    }
    if let Some(f) = &results.fleet {
        fleet_rows(w, f);
    }
    if let Some(s) = &results.substitutes {
        substitutes_rows(w, s);
    }
    if let Some(p) = &results.planning {
        planning_rows(w, p);
    }
    if let Some(h) = &results.webhooks {
        webhook_rows(w, h);
    }
    for s in &results.skipped {
        let _ = writeln!(w, "\nLeft out: {s}.");
    }
    statement_tables(w, &results.statements);
    if let Some(s) = &results.substitutes {
        substitute_tables(w, s);
    }
    md
}

/// Item 17: PostgreSQL CPU per cycle with a list declared and served by
/// the substitute, each against plain runs of the same rounds.
fn substitutes_rows(w: &mut String, s: &crate::substitutes::Result) {
    let pg = |runs: &[crate::throughput::Run]| {
        median(&runs.iter().map(|r| r.cpu.postgres_ms).collect::<Vec<_>>())
    };
    let rate = |runs: &[crate::throughput::Run]| {
        median(&runs.iter().map(|r| r.cycles_per_s).collect::<Vec<_>>())
    };
    let each = |runs: &[crate::throughput::Run]| {
        runs.iter()
            .map(|r| format!("{:.2}", r.cpu.postgres_ms))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let plain = pg(&s.plain).max(1e-9);
    for (what, runs, limit) in [
        (
            "a substitute declared for the asked profile and accepted by every reserve, the asked pool in stock",
            &s.declared,
            1.05,
        ),
        (
            "every reserve asking a sold-out profile and served by its first substitute (`substituted` demand recorded)",
            &s.served,
            1.5,
        ),
    ] {
        let ratio = pg(runs) / plain;
        let _ = writeln!(
            w,
            "| 17 | substitutes (R20): item 1's cycle at {} clients, {what}, against plain runs (no list, not accepted) alternating with it | PostgreSQL CPU per cycle {:.2} ms against {:.2} ms: ×{:.2} ({:.0}/s against {:.0}/s; runs: {}; plain: {}) | ≤ ×{limit:.2} | {} |",
            crate::substitutes::CLIENTS,
            pg(runs),
            plain,
            ratio,
            rate(runs),
            rate(&s.plain),
            each(runs),
            each(&s.plain),
            met(ratio <= limit)
        );
    }
}

/// Item 17's statement tables, in item 15's layout.
fn substitute_tables(w: &mut String, s: &crate::substitutes::Result) {
    if s.tables.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "\n## 17. Substitutes, statement by statement\n\nItem 17's three cycles, each in a run of its own with `pg_stat_statements.track = all`, as item 15."
    );
    statement_rows(w, &s.tables);
}

/// Item 16: each read's p50 alone at the largest size beside the first
/// (the baseline), and under item 1's load.
fn fleet_rows(w: &mut String, f: &crate::fleet::Result) {
    let (Some(small), Some(large)) = (f.sizes.first(), f.sizes.last()) else {
        return;
    };
    for (s, l) in small.reads.iter().zip(&large.reads) {
        let growth = l.alone.p50_ms / s.alone.p50_ms.max(0.001);
        let page = !l.path.starts_with("/api/");
        let ok = growth <= 2.0 && (!page || l.alone.p50_ms <= 50.0);
        let _ = writeln!(
            w,
            "| 16 | {} (`{}`) at {} machines and {} reservations of history beside {} machines: p50 alone (one client), then under item 1's 8-client load | alone p50 {:.1} ms against {:.1} ms: ×{:.2}; p99 {:.1} ms; loaded p50 {:.1} ms against {:.1} ms | ×2 at most{} | {} |",
            l.name,
            l.path,
            thousands(large.machines),
            thousands(large.reservations),
            thousands(small.machines),
            l.alone.p50_ms,
            s.alone.p50_ms,
            growth,
            l.alone.p99_ms,
            l.loaded.p50_ms,
            s.loaded.p50_ms,
            if page { ", a page ≤ 50 ms" } else { "" },
            met(ok)
        );
    }
    let _ = writeln!(
        w,
        "| 16 | the allocation load meanwhile (8 HTTP clients), at {} and {} machines | {:.0} and {:.0} reservations/s | | |",
        thousands(small.machines),
        thousands(large.machines),
        small.load_cycles_per_s,
        large.load_cycles_per_s
    );
}

/// Item 18: R21's daily job per day written, and the planning reads alone.
fn planning_rows(w: &mut String, p: &crate::planning::Result) {
    let waits = |f: fn(&crate::planning::Day) -> f64| p.days.iter().map(f).fold(0.0, f64::max);
    let days = p.days.len().max(1) as f64;
    let mean =
        |f: fn(&crate::planning::Day) -> i64| p.days.iter().map(f).sum::<i64>() as f64 / days;
    let pools = p.days.iter().map(|d| d.pools).max().unwrap_or(0);
    let _ = writeln!(
        w,
        "| 18 | the daily job (`planning::write_next_day`, one statement a day, the cursor row FOR UPDATE and the lease row FOR SHARE to its commit), {} days written one by one, {} pools ({} machines, {} days of activity before: {} reservations, {} refusal rows), a day of {:.0} holds, {:.0} refusal rows and {:.0} machine changes | {} pools a day; p50 {:.0} ms, max {:.0} ms (days: {}); probes held off at most {:.0} ms (lease row) and {:.0} ms (cursor row) | < 1 s, no lock held > 100 ms | {} |",
        p.days.len(),
        thousands(p.pools),
        thousands(p.machines),
        p.history_days,
        thousands(p.history_reservations),
        thousands(p.history_refusals),
        mean(|d| d.created),
        mean(|d| d.refusals),
        mean(|d| d.machine_changes),
        pools,
        p.job_p50_ms,
        p.job_max_ms,
        p.days
            .iter()
            .map(|d| format!("{:.0}", d.ms))
            .collect::<Vec<_>>()
            .join(", "),
        waits(|d| d.lease_wait_ms),
        waits(|d| d.cursor_wait_ms),
        met(p.job_max_ms < 100.0)
    );
    for r in &p.reads {
        let target = if r.path.starts_with("/planning/pool") {
            Some(20.0)
        } else if r.path.starts_with("/planning") {
            Some(50.0)
        } else {
            None
        };
        let _ = writeln!(
            w,
            "| 18 | {} at {} pools with {} days of history each ({} rows), {} flagged; one client, nothing else running | p50 {:.1} ms, p99 {:.1} ms ({} kB) | {} | {} |",
            r.name,
            thousands(p.pools),
            p.page_days,
            thousands(p.page_rows),
            p.flagged,
            r.alone.p50_ms,
            r.alone.p99_ms,
            r.bytes / 1024,
            target.map_or(String::new(), |t| format!("p50 < {t:.0} ms")),
            target.map_or("", |t| met(r.alone.p50_ms < t))
        );
    }
}

/// Item 15: where a cycle's time goes inside PostgreSQL, per statement, so
/// that a regression names its statement.
fn statement_tables(w: &mut String, tables: &[crate::statements::Table]) {
    if tables.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "\n## 15. Statement by statement\n\nItem 1's reserve then cancel through the API at {} clients, one run with `pg_stat_statements.track = all` (not one of item 1's measured runs: counting costs CPU). Per completed cycle: calls, executor time (CPU waits included: {} clients share the machine's cores, so read the shares, not the milliseconds, as CPU), shared buffers touched and the statement's own WAL bytes. Top-level statements are the server's round trips; the nested ones run inside them. Statements under {} calls per cycle (the background workers) are left out.",
        crate::statements::CLIENTS,
        crate::statements::CLIENTS,
        0.005
    );
    statement_rows(w, tables);
}

fn statement_rows(w: &mut String, tables: &[crate::statements::Table]) {
    for t in tables {
        let _ = writeln!(
            w,
            "\nPools with {}: {} cycles, {:.0}/s.\n\n| statement | level | calls | ms | buffers | WAL bytes |\n| --- | --- | --- | --- | --- | --- |",
            t.pools, t.cycles, t.cycles_per_s
        );
        for r in t.rows.iter().take(25) {
            let _ = writeln!(
                w,
                "| `{}` | {} | {:.2} | {:.3} | {:.1} | {:.0} |",
                r.statement.replace('|', "\\|").replace('`', "'"),
                if r.toplevel { "top" } else { "nested" },
                r.calls_per_cycle,
                r.ms_per_cycle,
                r.buffers_per_cycle,
                r.wal_bytes_per_cycle
            );
        }
    }
}

fn throughput_rows(w: &mut String, t: &Throughput, cfg: &Config) {
    let is8 = t.clients == 8;
    // The targets, on a durable cluster: the ratio per client count and
    // reserve p99 at 8 clients; CPU per reservation (server + PostgreSQL)
    // at most twice the ceiling's.
    let ratio_target = match t.clients {
        1 => Some(0.35),
        8 | 32 => Some(0.5),
        _ => None,
    };
    let cpu_http = t.http_cpu.server_ms + t.http_cpu.postgres_ms;
    let cpu_db = t.db_cpu.postgres_ms;
    let _ = writeln!(
        w,
        "| 1 | {} client{}: HTTP API, reserve then cancel (reservations/s) | {:.0}/s; reserve p50 {:.2} ms, p99 {:.2} ms; cancel p50 {:.2} ms, p99 {:.2} ms{}; CPU per reservation: server {:.2} ms, clients {:.2} ms, PostgreSQL {:.2} ms | {} | {} |",
        t.clients,
        if t.clients == 1 { "" } else { "s" },
        t.http_cycles_per_s,
        t.http_reserve.p50_ms,
        t.http_reserve.p99_ms,
        t.http_cancel.p50_ms,
        t.http_cancel.p99_ms,
        if t.http_contended > 0 {
            format!("; {} contended answers", t.http_contended)
        } else {
            String::new()
        },
        t.http_cpu.server_ms,
        t.http_cpu.client_ms,
        t.http_cpu.postgres_ms,
        if is8 { "reserve p99 < 25 ms" } else { "" },
        if is8 {
            met(t.http_reserve.p99_ms < 25.0)
        } else {
            ""
        }
    );
    let _ = writeln!(
        w,
        "| 1 | {} connection{}: the database's ceiling (the same allocation in PL/pgSQL) | {:.0}/s; reserve p50 {:.2} ms, p99 {:.2} ms{}; CPU per reservation: clients {:.2} ms, PostgreSQL {:.2} ms | | |",
        t.clients,
        if t.clients == 1 { "" } else { "s" },
        t.db_cycles_per_s,
        t.db_reserve.p50_ms,
        t.db_reserve.p99_ms,
        if t.db_contended > 0 {
            format!("; {} found nothing to lock", t.db_contended)
        } else {
            String::new()
        },
        t.db_cpu.client_ms,
        t.db_cpu.postgres_ms,
    );
    let _ = writeln!(
        w,
        "| 1 | {} client{}: HTTP over ceiling | {:.0}% | {} | {} |",
        t.clients,
        if t.clients == 1 { "" } else { "s" },
        t.ratio * 100.0,
        ratio_target
            .map(|r| format!("≥ {:.0}%", r * 100.0))
            .unwrap_or_default(),
        ratio_target.map(|r| met(t.ratio >= r)).unwrap_or("")
    );
    let _ = writeln!(
        w,
        "| 1 | {} client{}: CPU per reservation, server + PostgreSQL, over the ceiling's | {:.2} ms over {:.2} ms: ×{:.2}, the API at {:.2} of the ceiling by CPU (server per request: {:.2} ms) | {} | {} |",
        t.clients,
        if t.clients == 1 { "" } else { "s" },
        cpu_http,
        cpu_db,
        cpu_http / cpu_db.max(1e-9),
        cpu_db / cpu_http.max(1e-9),
        t.http_cpu.server_ms / 2.0,
        if is8 {
            "≤ ×2 (≥ 0.5 of the ceiling)"
        } else {
            ""
        },
        if is8 {
            met(cpu_http <= 2.0 * cpu_db)
        } else {
            ""
        }
    );
    // PostgreSQL alone: what the API's functions and round trips cost the
    // database beyond the same decisions in the ceiling.
    let _ = writeln!(
        w,
        "| 1 | {} client{}: PostgreSQL CPU per reservation, HTTP API over the ceiling ({:.0}/s against {:.0}/s) | {:.2} ms over {:.2} ms: ×{:.2} | {} | {} |",
        t.clients,
        if t.clients == 1 { "" } else { "s" },
        t.http_cycles_per_s,
        t.db_cycles_per_s,
        t.http_cpu.postgres_ms,
        cpu_db,
        t.http_cpu.postgres_ms / cpu_db.max(1e-9),
        if is8 { "≤ ×1.5" } else { "" },
        if is8 {
            met(t.http_cpu.postgres_ms <= 1.5 * cpu_db)
        } else {
            ""
        }
    );
    // The same two figures against the ceiling paced to the API's rate:
    // the rate-dependent part of a cycle's cost (the WAL writer's wake-ups,
    // a flush shared by fewer commits) weighs the same on both sides.
    if let Some((paced_rate, paced)) = t.paced() {
        let pg = t.http_cpu.postgres_ms / paced.postgres_ms.max(1e-9);
        let both = cpu_http / paced.postgres_ms.max(1e-9);
        let _ = writeln!(
            w,
            "| 1 | {} clients: CPU per reservation, HTTP API over the ceiling paced to the API's rate ({:.0}/s against {:.0}/s) | PostgreSQL {:.2} ms over {:.2} ms: ×{:.2}; server + PostgreSQL {:.2} ms over {:.2} ms: the API at {:.2} of the ceiling by CPU | ≤ ×1.5; ≥ 0.5 | {} |",
            t.clients,
            t.http_cycles_per_s,
            paced_rate,
            t.http_cpu.postgres_ms,
            paced.postgres_ms,
            pg,
            cpu_http,
            paced.postgres_ms,
            1.0 / both.max(1e-9),
            if pg <= 1.5 && both <= 2.0 {
                "met"
            } else if pg <= 1.5 || both <= 2.0 {
                "**half met**"
            } else {
                "**missed**"
            }
        );
    }
    let (h, d) = (&t.http_wal, &t.db_wal);
    let _ = writeln!(
        w,
        "| 1 | {} client{}: per cycle, HTTP API / ceiling: WAL records; WAL bytes; full-page images; WAL syncs; commits | {:.1} / {:.1}; {:.0} B / {:.0} B; {:.2} / {:.2}; {:.2} / {:.2}; {:.2} / {:.2} | | |",
        t.clients,
        if t.clients == 1 { "" } else { "s" },
        h.records,
        d.records,
        h.bytes,
        d.bytes,
        h.fpi,
        d.fpi,
        h.syncs,
        d.syncs,
        h.commits,
        d.commits,
    );
    // Clients order on sites of their own up to the number of sites: their
    // orders never want the same machine, so any lock wait between them is
    // one this design must not have.
    let own_sites = t.clients as i64 <= cfg.sites;
    let examples: Vec<&String> = h
        .lock_wait_examples
        .iter()
        .chain(&d.lock_wait_examples)
        .take(3)
        .collect();
    let waits = |c: &crate::wal::PerCycle| {
        if c.lock_waits == 0 {
            "0".to_owned()
        } else {
            format!(
                "{} ({} on a table's extension, {} on rows or transactions)",
                c.lock_waits,
                c.extension_waits,
                c.lock_waits - c.extension_waits
            )
        }
    };
    let _ = writeln!(
        w,
        "| 1 | {} client{}: lock waits longer than deadlock_timeout (log_lock_waits), all runs, HTTP API / ceiling{} | {} / {}{} | {} | {} |",
        t.clients,
        if t.clients == 1 { "" } else { "s" },
        if own_sites {
            ", each client on a site of its own (no two orders want the same machine)"
        } else {
            ", several clients per site (orders may want the same machine)"
        },
        waits(h),
        waits(d),
        if examples.is_empty() {
            String::new()
        } else {
            format!(
                "; {}",
                examples
                    .iter()
                    .map(|e| format!("`{}`", e.replace('|', "\\|")))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
        if own_sites {
            "none between orders for different machines"
        } else {
            ""
        },
        if own_sites {
            met(h.lock_waits == 0 && d.lock_waits == 0)
        } else {
            ""
        }
    );
}

fn thousands(n: i64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Item 19: the delivery worker's rate and its poll at a small and a large
/// backlog.
fn webhook_rows(w: &mut String, h: &crate::webhooks::Result) {
    let [small, large] = crate::webhooks::BACKLOGS;
    for pending in [small, large] {
        let each: Vec<String> = h
            .runs
            .iter()
            .filter(|r| r.pending == pending)
            .map(|r| format!("{:.0}", r.per_s))
            .collect();
        let last = pending == large;
        let ratio = h.rate(large) / h.rate(small).max(f64::MIN_POSITIVE);
        let _ = writeln!(
            w,
            "| 19 | webhooks: the worker delivers the first {} of {} pending (one organization, two events per reservation, a receiver answering at once) | {:.0} deliveries/s (runs: {}); its poll's statement alone p50 {:.2} ms{} | {} | {} |",
            thousands(crate::webhooks::DRAINED),
            thousands(pending),
            h.rate(pending),
            each.join(", "),
            h.poll_p50(pending),
            if last {
                format!("; ×{ratio:.2} the rate at {}", thousands(small))
            } else {
                String::new()
            },
            if last {
                "≥ ×0.8 the rate at the small backlog"
            } else {
                ""
            },
            if last { met(ratio >= 0.8) } else { "" }
        );
    }
}
