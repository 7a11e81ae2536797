//! Item 17 (R20): what substitutes cost a reserve. Item 1's reserve+cancel
//! cycle at 8 clients, three ways, alternating run by run on one database
//! and one server:
//! - plain: no list declared, reserves that do not accept substitutes
//!   (item 1 itself);
//! - declared: `PROFILE` lists a substitute and every reserve accepts
//!   substitutes, but the asked pool has stock, so the substitute is never
//!   walked: what a list costs the orders that do not need it;
//! - served: every reserve asks a profile whose pool has no sellable
//!   machine (one in maintenance per site, so that the profile exists) and
//!   whose first substitute is `PROFILE`: the asked pool's walk finds
//!   nothing, the substitute's pool serves, and the asked pool's demand
//!   records a `substituted` row.
//!
//! PostgreSQL CPU per completed cycle of each, then a statement table of
//! each (`pg_stat_statements.track = all` for runs of their own, as item
//! 15), so that a difference names its statement.

use crate::cpu::Meter;
use crate::setup::{self, Config, Db, Org, PROFILE};
use crate::statements::{self, Table};
use crate::throughput::{self, Ask, Run};

pub const CLIENTS: usize = 8;
/// The profile the served runs ask: sold out at every site.
pub const SOLD_OUT: &str = "bench-sold-out";
/// The substitute `PROFILE` declares in the declared runs (one machine in
/// maintenance per site: never walked, the asked pool has stock).
pub const UPGRADE: &str = "bench-upgrade";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Plain,
    Declared,
    Served,
}

impl Way {
    const ALL: [Way; 3] = [Way::Plain, Way::Declared, Way::Served];

    fn label(self) -> &'static str {
        match self {
            Way::Plain => "no substitute list, substitutes not accepted",
            Way::Declared => "a substitute declared and accepted, the asked pool in stock",
            Way::Served => "every reserve served by the first substitute",
        }
    }

    fn ask(self) -> Ask {
        match self {
            Way::Plain => Ask::default(),
            Way::Declared => Ask {
                substitutes: true,
                ..Ask::default()
            },
            Way::Served => Ask {
                profile: SOLD_OUT.to_owned(),
                substitutes: true,
                ..Ask::default()
            },
        }
    }
}

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Result {
    pub plain: Vec<Run>,
    pub declared: Vec<Run>,
    pub served: Vec<Run>,
    /// Statement tables: plain, declared, served.
    pub tables: Vec<Table>,
}

/// The profiles the lists name, each with a machine in maintenance per
/// site: a list may only name profiles the organization has.
async fn profiles(db: &Db, org: &Org, sites: i64) -> anyhow::Result<()> {
    for (prefix, profile) in [("subout", SOLD_OUT), ("subup", UPGRADE)] {
        setup::machines(db, org.id, prefix, sites, sites, profile, "maintenance").await?;
    }
    Ok(())
}

/// The lists of `way`, and none other.
async fn declare(db: &Db, org: &Org, way: Way) -> anyhow::Result<()> {
    db.exec("DELETE FROM substitutes").await?;
    let (profile, substitute) = match way {
        Way::Plain => return Ok(()),
        Way::Declared => (PROFILE, UPGRADE),
        Way::Served => (SOLD_OUT, PROFILE),
    };
    sqlx::query(
        "INSERT INTO substitutes (org_id, profile, substitutes, updated_by)
         VALUES ($1, $2, ARRAY[$3], 'bench')",
    )
    .bind(org.id)
    .bind(profile)
    .bind(substitute)
    .execute(&db.setup)
    .await?;
    Ok(())
}

pub async fn run(
    cfg: &Config,
    db: &Db,
    org: &Org,
    base: &str,
    meter: &Meter,
) -> anyhow::Result<Result> {
    profiles(db, org, cfg.sites).await?;
    let outcome = measure(cfg, db, org, base, meter).await;
    declare(db, org, Way::Plain).await?;
    outcome
}

async fn measure(
    cfg: &Config,
    db: &Db,
    org: &Org,
    base: &str,
    meter: &Meter,
) -> anyhow::Result<Result> {
    let mut out = Result::default();
    // Warm-up of each way: the plans of the substitute's statements.
    for way in Way::ALL {
        declare(db, org, way).await?;
        let tag = format!("sub-warm{}", way as u8);
        throughput::http_asks_run(
            meter,
            base,
            &org.token,
            cfg.sites,
            CLIENTS,
            1.0,
            &tag,
            &way.ask(),
        )
        .await?;
    }
    for r in 0..cfg.runs {
        for way in Way::ALL {
            declare(db, org, way).await?;
            let run = throughput::http_asks_run(
                meter,
                base,
                &org.token,
                cfg.sites,
                CLIENTS,
                cfg.run_seconds,
                &format!("sub{}-{r}", way as u8),
                &way.ask(),
            )
            .await?;
            eprintln!(
                "  substitutes, {}, run {r}: {:.0}/s, PostgreSQL {:.2} ms per cycle, reserve p50 {:.2} ms, {} contended",
                way.label(),
                run.cycles_per_s,
                run.cpu.postgres_ms,
                run.reserve.p50_ms,
                run.contended
            );
            match way {
                Way::Plain => out.plain.push(run),
                Way::Declared => out.declared.push(run),
                Way::Served => out.served.push(run),
            }
        }
    }
    if !crate::roundtrips::available(db).await {
        // No pg_stat_statements (a server started without it): the
        // figures above stand alone.
        return Ok(out);
    }
    statements::set_track(db, "all").await?;
    let tables = async {
        let mut tables = Vec::new();
        for way in Way::ALL {
            declare(db, org, way).await?;
            tables.push(
                statements::counted(cfg, db, org, base, meter, way.label(), &way.ask()).await?,
            );
        }
        anyhow::Ok(tables)
    }
    .await;
    statements::set_track(db, "top").await?;
    out.tables = tables?;
    Ok(out)
}
