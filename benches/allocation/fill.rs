//! Item 6: a fresh deployment does not slow as it fills. A database created
//! and migrated, its machines loaded, then `VACUUM ANALYZE` while
//! `reservations` is empty (the statistics say "empty", as on a new
//! deployment whose DBA or `vacuumdb --analyze` ran once); a fresh
//! `poolkeeper serve` on it; 8 clients do reserve+cancel cycles through HTTP
//! until `fill_cycles` are done. The rate of the last 10% of the cycles is
//! compared with the rate of the first 10%. Each run has its own database.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Barrier, Mutex};

use crate::server::Server;
use crate::setup::{Cluster, Config, PROFILE, site};

const CLIENTS: usize = 8;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Run {
    pub cycles: u64,
    /// Cycles per second over the first and the last tenth of the cycles.
    pub first_rate: f64,
    pub last_rate: f64,
    /// last_rate / first_rate.
    pub ratio: f64,
    /// Reservations in the table at the end (held + ended).
    pub reservations: i64,
}

pub async fn run(cluster: &Cluster, cfg: &Config) -> anyhow::Result<Vec<Run>> {
    let mut runs = Vec::new();
    for r in 0..cfg.runs {
        let db = cluster.database(&format!("bench_fill{r}")).await?;
        let org = crate::setup::org(&db, "fill").await?;
        crate::setup::machines(&db, org.id, "m", cfg.machines, cfg.sites, PROFILE, "ready").await?;
        db.exec("VACUUM ANALYZE").await?;
        let server = Server::start(&db.url, &cluster.dir, &cfg.server_log).await?;
        let outcome = cycles(&server.base, &org.token, cfg.sites, cfg.fill_cycles).await;
        server.stop().await;
        let done = outcome?;
        let reservations = db.scalar_i64("SELECT count(*) FROM reservations").await?;
        let run = of(done, reservations);
        eprintln!(
            "  fill run {r}: {} cycles, first 10% {:.0}/s, last 10% {:.0}/s (x{:.2}); {} reservations",
            run.cycles, run.first_rate, run.last_rate, run.ratio, run.reservations
        );
        runs.push(run);
        db.setup.close().await;
        crate::drop_database(cluster, &db.name).await?;
    }
    Ok(runs)
}

/// The completion time of every cycle, from the start.
async fn cycles(base: &str, token: &str, sites: i64, total: u64) -> anyhow::Result<Vec<Duration>> {
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let start = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .build()?;
        let (base, token) = (base.to_owned(), token.to_owned());
        let (barrier, next, done, start) =
            (barrier.clone(), next.clone(), done.clone(), start.clone());
        let site = site(c as i64 % sites);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let t0 = *start.get_or_init(Instant::now);
            let mut i = 0u64;
            loop {
                i += 1;
                let cycle = crate::throughput::http_cycle(
                    &http,
                    &base,
                    &token,
                    &site,
                    &format!("fill-{c}-{i}"),
                )
                .await?;
                if cycle.cancel.is_none() {
                    continue;
                }
                if next.fetch_add(1, Ordering::SeqCst) >= total {
                    return anyhow::Ok(());
                }
                done.lock().await.push(t0.elapsed());
            }
        }));
    }
    barrier.wait().await;
    for t in tasks {
        t.await??;
    }
    let mut done = std::mem::take(&mut *done.lock().await);
    done.sort();
    Ok(done)
}

fn of(done: Vec<Duration>, reservations: i64) -> Run {
    let n = done.len();
    let tenth = (n / 10).max(1);
    let secs = |d: Duration| d.as_secs_f64().max(1e-9);
    let first_rate = tenth as f64 / secs(done.get(tenth - 1).copied().unwrap_or_default());
    let last_rate = match (done.get(n.saturating_sub(tenth + 1)), done.last()) {
        (Some(&from), Some(&to)) if to > from => tenth as f64 / secs(to - from),
        _ => 0.0,
    };
    Run {
        cycles: n as u64,
        first_rate,
        last_rate,
        ratio: last_rate / first_rate,
        reservations,
    }
}
