//! Item 13 (R18): item 1's reserve+cancel cycle at 8 clients on pools that
//! keep headroom, against the same pools keeping none, runs alternating on
//! one database and one server. With headroom every reserve of the pool
//! takes the pool's turn and counts its last sellable machines in its own
//! transaction; the headroom (1 machine per pool, for a segment the
//! clients never name) never binds, so both runs sell the same machines.

use crate::cpu::Meter;
use crate::setup::{self, Config, Db, Org, PROFILE};
use crate::throughput::{self, Run};

pub const CLIENTS: usize = 8;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Result {
    pub without: Vec<Run>,
    pub with: Vec<Run>,
}

pub(crate) async fn keep(db: &Db, org: &Org, sites: i64, on: bool) -> anyhow::Result<()> {
    db.exec("DELETE FROM headroom").await?;
    if on {
        for i in 0..sites {
            sqlx::query(
                "INSERT INTO headroom (org_id, site, profile, segment, machines, updated_by)
                 VALUES ($1, $2, $3, 'enterprise', 1, 'bench')",
            )
            .bind(org.id)
            .bind(setup::site(i))
            .bind(PROFILE)
            .execute(&db.setup)
            .await?;
        }
    }
    Ok(())
}

pub async fn run(
    cfg: &Config,
    db: &Db,
    org: &Org,
    base: &str,
    meter: &Meter,
) -> anyhow::Result<Result> {
    let mut out = Result {
        without: Vec::new(),
        with: Vec::new(),
    };
    for r in 0..cfg.runs {
        for on in [false, true] {
            keep(db, org, cfg.sites, on).await?;
            let run = throughput::http_run(
                meter,
                base,
                &org.token,
                cfg.sites,
                CLIENTS,
                cfg.run_seconds,
                &format!("k{}-{r}", u8::from(on)),
            )
            .await?;
            eprintln!(
                "  headroom {}, run {r}: {:.0}/s p50 {:.2} p99 {:.2} ms",
                if on { "on" } else { "off" },
                run.cycles_per_s,
                run.reserve.p50_ms,
                run.reserve.p99_ms
            );
            if on {
                out.with.push(run);
            } else {
                out.without.push(run);
            }
        }
    }
    keep(db, org, cfg.sites, false).await?;
    Ok(out)
}
