//! Item 4: the sweep expiring N overdue held reservations, batch by batch
//! with `poolkeeper::sweep::expire_batch` (the worker's own statement) and
//! `sweep::BATCH_SIZE`. Each batch is one autocommit statement: the time a
//! batch statement takes, seen from the client, bounds how long it held
//! its row locks.

use std::time::{Duration, Instant};

use poolkeeper::lease::{self, Claim, SWEEP_KEY};
use poolkeeper::sweep::{self, BATCH_SIZE};

use crate::setup::{self, Db, PROFILE};
use crate::stats::{Latency, ms};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Run {
    /// Batch statements running at once: 2 is the shipped sweep (pairs of
    /// statements, as `sweep::expire_two_batches`); 1 is for comparison.
    pub parallel: usize,
    pub expired: u64,
    pub total_ms: f64,
    pub batches: usize,
    pub batch: Latency,
}

/// N held reservations, overdue, one per machine, with their `created` events.
async fn load(db: &Db, org_id: i64, n: i64) -> anyhow::Result<()> {
    db.exec("TRUNCATE reservation_events, service_links, reservations, sweep_runs CASCADE")
        .await?;
    setup::held(
        db,
        org_id,
        &format!("SELECT * FROM machines WHERE org_id = $1 ORDER BY id LIMIT {n}"),
        "due",
        "t.at - interval '20 minutes' - m.id * interval '1 millisecond'",
        "t.at - interval '5 minutes' - m.id * interval '1 millisecond'",
    )
    .await?;
    db.exec("VACUUM ANALYZE").await?;
    Ok(())
}

pub async fn run(db: &Db, cfg: &setup::Config) -> anyhow::Result<Vec<Run>> {
    let org = setup::org(db, "sweep").await?;
    setup::machines(
        db,
        org.id,
        "m",
        cfg.sweep_reservations,
        cfg.sites,
        PROFILE,
        "ready",
    )
    .await?;
    let pool = db.app_pool(2).await?;
    let replica = "bench-sweep";
    let mandate = match lease::claim(&pool, SWEEP_KEY, replica, Duration::from_secs(3600)).await? {
        Claim::Acquired(m) => m,
        Claim::HeldByOther => {
            anyhow::bail!("the sweep lease of the bench database is held by another")
        }
    };
    let mut runs = Vec::new();
    for parallel in [1, 2] {
        for r in 0..cfg.runs {
            load(db, org.id, cfg.sweep_reservations).await?;
            let run = sweep_once(&pool, replica, mandate.fence, parallel).await?;
            let left = db
                .scalar_i64("SELECT count(*) FROM reservations WHERE state = 'held'")
                .await?;
            anyhow::ensure!(
                run.expired as i64 == cfg.sweep_reservations && left == 0,
                "sweep expired {} of {}, {left} left held",
                run.expired,
                cfg.sweep_reservations
            );
            eprintln!(
                "  sweep run {r} ({parallel} at once): {} expired in {:.0} ms, {} batches, longest {:.1} ms",
                run.expired, run.total_ms, run.batches, run.batch.max_ms
            );
            runs.push(run);
        }
    }
    pool.close().await;
    Ok(runs)
}

/// One sweep: a run, then rounds of `parallel` batch statements at once
/// until one comes back short (with 2, what `sweep::expire_two_batches` does
/// round after round), then the run closed. Each statement is timed alone.
async fn sweep_once(
    pool: &poolkeeper::db::Db,
    replica: &str,
    fence: i64,
    parallel: usize,
) -> anyhow::Result<Run> {
    let start = Instant::now();
    let run_id = sweep::start_run(pool, replica, fence).await?;
    let (mut expired, mut batches) = (0u64, Vec::new());
    loop {
        let round = (0..parallel).map(|_| async {
            let t = Instant::now();
            let n = sweep::expire_batch(pool, replica, fence, BATCH_SIZE).await?;
            Ok::<_, sweep::SweepError>((n, t.elapsed()))
        });
        let mut short = false;
        for outcome in futures_util::future::join_all(round).await {
            let (n, took) = outcome?;
            expired += n;
            batches.push(took);
            short |= (n as i64) < BATCH_SIZE;
        }
        if short {
            break;
        }
    }
    sweep::finish_run(pool, replica, fence, run_id, expired).await?;
    Ok(Run {
        parallel,
        expired,
        total_ms: ms(start.elapsed()),
        batches: batches.len(),
        batch: Latency::of(&mut batches),
    })
}
