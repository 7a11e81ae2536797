//! This run beside its targets: the figures of a run that BENCHMARKS.md's
//! analysis reads (CPU and WAL per cycle at 8 clients, the sweep per
//! reservation) and each target the run missed, by how much. Figures from
//! the run's data only: what they mean, what limits them and what would
//! close a gap is the hand-edited analysis of BENCHMARKS.md, which a run
//! never rewrites.

use std::fmt::Write as _;

use crate::Results;
use crate::stats::median;

/// For each target of item 1 this run missed: by how much, with the
/// figures that say where the time went.
fn missed(results: &Results) -> String {
    let mut out = String::new();
    let w = &mut out;
    for t in &results.throughput {
        let target = match t.clients {
            1 => 0.35,
            8 | 32 => 0.5,
            _ => continue,
        };
        if t.ratio >= target {
            continue;
        }
        let http_cpu = t.http_cpu.server_ms + t.http_cpu.postgres_ms + t.http_cpu.client_ms;
        let short = (target - t.ratio) * 100.0;
        let _ = writeln!(
            w,
            "- **{} client{}: HTTP at {:.0}% of the ceiling, {:.0} point{} short of {:.0}%.** CPU per cycle over HTTP {:.2} ms (server {:.2}, clients {:.2}, PostgreSQL {:.2}) against {:.2} ms in the ceiling; WAL syncs per cycle {:.2} against {:.2}.",
            t.clients,
            if t.clients == 1 { "" } else { "s" },
            t.ratio * 100.0,
            short,
            if short.round() == 1.0 { "" } else { "s" },
            target * 100.0,
            http_cpu,
            t.http_cpu.server_ms,
            t.http_cpu.client_ms,
            t.http_cpu.postgres_ms,
            t.db_cpu.total_ms,
            t.http_wal.syncs,
            t.db_wal.syncs,
        );
    }
    if let Some(t8) = results.throughput.iter().find(|t| t.clients == 8) {
        if t8.http_reserve.p99_ms >= 25.0 {
            let _ = writeln!(
                w,
                "- **Reserve p99 at 8 clients: {:.1} ms against < 25 ms ({:.1} ms over).** The ceiling's reserve p99 in the same runs: {:.1} ms; the load average is in the machine table.",
                t8.http_reserve.p99_ms,
                t8.http_reserve.p99_ms - 25.0,
                t8.db_reserve.p99_ms
            );
        }
        let cpu_http = t8.http_cpu.server_ms + t8.http_cpu.postgres_ms;
        if cpu_http > 2.0 * t8.db_cpu.postgres_ms {
            let _ = writeln!(
                w,
                "- **CPU per reservation at 8 clients: ×{:.2} the ceiling's, against ≤ ×2.** Server {:.2} ms and PostgreSQL {:.2} ms per cycle against PostgreSQL {:.2} ms in the ceiling.",
                cpu_http / t8.db_cpu.postgres_ms.max(1e-9),
                t8.http_cpu.server_ms,
                t8.http_cpu.postgres_ms,
                t8.db_cpu.postgres_ms
            );
        }
        let (h, d) = (&t8.http_wal, &t8.db_wal);
        if h.lock_waits + d.lock_waits > 0 {
            let _ = writeln!(
                w,
                "- **Lock waits at 8 clients: {} over HTTP, {} in the ceiling, of which {} and {} on a table's extension** (the others waited on a row or a transaction; the examples in the table say which).",
                h.lock_waits, d.lock_waits, h.extension_waits, d.extension_waits
            );
        }
    }
    out
}

/// The section `verdicts` of BENCHMARKS.md.
pub fn verdicts(results: &Results) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "## This run beside its targets\n");
    if let Some(t8) = results.throughput.iter().find(|t| t.clients == 8) {
        let _ = writeln!(
            w,
            "At 8 clients: {:.2} ms of CPU per reservation over HTTP (server {:.2}, clients {:.2}, PostgreSQL {:.2}) against {:.2} ms in the ceiling (PostgreSQL {:.2}); the machine was {:.0}% busy during the HTTP runs.\n",
            t8.http_cpu.total_ms,
            t8.http_cpu.server_ms,
            t8.http_cpu.client_ms,
            t8.http_cpu.postgres_ms,
            t8.db_cpu.total_ms,
            t8.db_cpu.postgres_ms,
            t8.http_cpu.machine_busy * 100.0
        );
        let (h, d) = (&t8.http_wal, &t8.db_wal);
        let _ = writeln!(
            w,
            "Per cycle at 8 clients: {:.1} WAL records, {:.0} bytes, {:.2} full-page images, {:.2} WAL syncs and {:.2} commits over HTTP, against {:.1}, {:.0}, {:.2}, {:.2} and {:.2} in the ceiling.\n",
            h.records,
            h.bytes,
            h.fpi,
            h.syncs,
            h.commits,
            d.records,
            d.bytes,
            d.fpi,
            d.syncs,
            d.commits
        );
    }
    let item1 = missed(results);
    if !item1.is_empty() {
        let _ = writeln!(
            w,
            "### Targets of item 1 missed in this run\n\nWhat limits each and what would close it: *What limits item 1*, below.\n\n{item1}"
        );
    }
    let longest = results
        .growth
        .iter()
        .filter(|s| s.sold == 0)
        .max_by_key(|s| s.history);
    if let (Some(first), Some(last)) = (results.growth.first(), longest)
        && last.history > 0
    {
        let ratio = last.reserve.p50_ms / first.reserve.p50_ms;
        if ratio > 1.2 {
            let _ = writeln!(
                w,
                "**Item 3 missed in this run: reserve p50 ×{ratio:.2} at {} ended reservations against ≤ ×1.2** ({:.2} ms against {:.2} ms with none; *Item 3*, below, says when that is noise).\n",
                last.history, last.reserve.p50_ms, first.reserve.p50_ms
            );
        }
    }
    if !results.sweep.is_empty() {
        let per = |parallel: usize| {
            median(
                &results
                    .sweep
                    .iter()
                    .filter(|r| r.parallel == parallel)
                    .map(|r| r.total_ms * 1000.0 / r.expired.max(1) as f64)
                    .collect::<Vec<_>>(),
            )
        };
        let _ = writeln!(
            w,
            "Item 4 (the sweep): {:.1} µs per expired reservation one batch at a time, {:.1} µs two at once (×{:.2}).\n",
            per(1),
            per(2),
            per(1) / per(2).max(f64::MIN_POSITIVE),
        );
        let shipped = median(
            &results
                .sweep
                .iter()
                .filter(|r| r.parallel == 2)
                .map(|r| r.total_ms / 1000.0)
                .collect::<Vec<_>>(),
        );
        if shipped >= 3.0 {
            let _ = writeln!(
                w,
                "**Item 4 missed in this run: {shipped:.2} s against < 3 s ({:.2} s over).** {}\n",
                shipped - 3.0,
                speed(results),
            );
        }
    }
    if let Some(p) = &results.pages {
        let worst = p
            .pages
            .iter()
            .map(|(_, _, _, l)| l.p99_ms)
            .fold(0.0, f64::max);
        if worst >= 50.0 {
            let alone = p.alone.iter().map(|l| l.p50_ms).fold(0.0, f64::max);
            let _ = writeln!(
                w,
                "**Item 5 missed in this run: the slowest page's p99 is {worst:.1} ms against < 50 ms ({:.1} ms over).** Its own time is at most {alone:.1} ms (p50, one reader, no load). {}\n",
                worst - 50.0,
                speed(results),
            );
        }
    }
    out
}

/// How fast this run's machine was: its own yardstick, the CPU speed check
/// and the database's ceiling at one connection (PL/pgSQL that no change of
/// the server touches), both in the table.
fn speed(results: &Results) -> String {
    match results.throughput.iter().find(|t| t.clients == 1) {
        Some(t) => format!(
            "The database's own ceiling at 1 connection ran {:.0}/s in this run, and the CPU speed check is in the machine table: on a slower or busier machine the same work takes proportionally longer.",
            t.db_cycles_per_s
        ),
        None => {
            "The CPU speed check in the machine table says how fast the machine was.".to_owned()
        }
    }
}
