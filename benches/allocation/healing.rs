//! Item 11 (R15): a rack of N machines, each under a live hold, put into
//! maintenance in one status change (`poolkeeper::healing::change_status`,
//! what the API and the dashboard call), every hold moving to one of N spare
//! machines of the same site and profile among a larger pool. Timed from
//! the first statement to the commit; the dry run (the same change rolled
//! back) beside it.

use std::time::Instant;

use poolkeeper::domain::{AssetTag, MachineStatus};
use poolkeeper::healing::{self, HoldOutcome, StatusChange};

use crate::setup::{self, Db, PROFILE};
use crate::stats::ms;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Run {
    pub holds: usize,
    pub dry_run: bool,
    pub total_ms: f64,
}

/// N live holds, one per rack machine, with their `created` events; every
/// machine ready again.
async fn load(db: &Db, org_id: i64) -> anyhow::Result<()> {
    db.exec("TRUNCATE reservation_events, service_links, reservations CASCADE")
        .await?;
    db.exec("UPDATE machines SET status = 'ready'").await?;
    setup::held(
        db,
        org_id,
        "SELECT * FROM machines WHERE org_id = $1 AND asset_tag LIKE 'rack-%'",
        "rack",
        "t.at",
        "t.at + interval '15 minutes'",
    )
    .await?;
    db.exec("VACUUM ANALYZE").await?;
    Ok(())
}

pub async fn run(db: &Db, cfg: &setup::Config) -> anyhow::Result<Vec<Run>> {
    let org = setup::org(db, "healing").await?;
    let n = cfg.heal_holds;
    // The rack and its spares at site s01; the rest of the pool elsewhere.
    setup::machines(db, org.id, "rack", n, 1, PROFILE, "ready").await?;
    setup::machines(db, org.id, "spare", n, 1, PROFILE, "ready").await?;
    setup::machines(db, org.id, "pool", 20_000, cfg.sites, PROFILE, "ready").await?;
    let tags: Vec<AssetTag> = sqlx::query_scalar::<_, String>(
        "SELECT asset_tag FROM machines WHERE org_id = $1 AND asset_tag LIKE 'rack-%' ORDER BY id",
    )
    .bind(org.id)
    .fetch_all(&db.setup)
    .await?
    .iter()
    .map(|t| AssetTag::parse(t))
    .collect::<Result<_, _>>()?;
    let pool = db.app_pool(2).await?;
    let change = StatusChange {
        org_id: org.id,
        tags: &tags,
        status: MachineStatus::Maintenance,
        actor: "bench",
    };
    let mut runs = Vec::new();
    for dry_run in [true, false] {
        for r in 0..cfg.runs {
            load(db, org.id).await?;
            let start = Instant::now();
            let changed = if dry_run {
                healing::preview(&pool, &change).await?
            } else {
                let mut tx = pool.begin().await?;
                let changed = healing::change_status(&mut tx, &change).await?;
                tx.commit().await?;
                changed
            };
            let took = ms(start.elapsed());
            let changed = changed.map_err(|e| anyhow::anyhow!("refused: {e:?}"))?;
            let moved = changed
                .holds
                .iter()
                .filter(|h| matches!(h, HoldOutcome::Moved { .. }))
                .count();
            anyhow::ensure!(
                moved as i64 == n && changed.holds.len() as i64 == n,
                "{moved} of {n} holds moved ({} outcomes)",
                changed.holds.len()
            );
            eprintln!(
                "  healing run {r}{}: {moved} holds moved in {took:.0} ms",
                if dry_run { " (dry run)" } else { "" }
            );
            runs.push(Run {
                holds: moved,
                dry_run,
                total_ms: took,
            });
        }
    }
    pool.close().await;
    Ok(runs)
}
