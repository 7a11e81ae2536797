//! Item 7: round trips to PostgreSQL per API call, counted by the database.
//! The bench's cluster preloads `pg_stat_statements`; for each kind of call,
//! the statistics are reset, one client makes `CALLS` calls in a row through
//! HTTP, and the top-level statements the server ran are added up (the
//! statements inside a PL/pgSQL function are not top-level: they cost no
//! round trip). The sweep's and the lease's own statements, and the bench's,
//! are left out by their text.

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::setup::{Db, PROFILE, site};

const CALLS: usize = 100;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Count {
    pub call: String,
    pub calls: usize,
    /// Top-level statements per call.
    pub statements_per_call: f64,
}

/// The server's top-level statements since the last reset, but the
/// background workers' (the sweep, the leases, the webhook delivery worker's
/// polls: one of those in a window made a GET count 2.01; the expiry
/// warnings' look at the next deadline (R16), which made a refused reserve
/// count 2.04-2.06: 300 refusals in a row met 15 of its polls), and the
/// check that a new connection reached the primary (F2): part of opening a
/// connection, like its startup and authentication, which are not counted
/// either.
pub(crate) async fn statements(db: &Db) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND query NOT ILIKE '%pg_stat_statements%' AND query NOT ILIKE '%lease%'
            AND query NOT ILIKE '%sweep%' AND query NOT ILIKE '%pg_database%'
            AND query NOT ILIKE '%webhook_deliveries%'
            AND query NOT ILIKE '%expiry_warning_seconds%'
            AND query NOT ILIKE '%pg_is_in_recovery()%'",
    )
    .fetch_one(&db.setup)
    .await?)
}

pub(crate) async fn reset(db: &Db) -> anyhow::Result<()> {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&db.setup)
        .await?;
    Ok(())
}

/// Whether the cluster can count (its server preloads pg_stat_statements).
pub async fn available(db: &Db) -> bool {
    db.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .is_ok()
        && reset(db).await.is_ok()
}

pub async fn run(db: &Db, base: &str, token: &str) -> anyhow::Result<Vec<Count>> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()?;
    let post = |path: String, body: Value| {
        http.post(format!("{base}{path}"))
            .bearer_auth(token)
            .json(&body)
            .send()
    };
    let site = site(0);
    let mut out = Vec::new();
    let mut measure = |call: &str, before: i64, after: i64| {
        out.push(Count {
            call: call.to_owned(),
            calls: CALLS,
            statements_per_call: (after - before) as f64 / CALLS as f64,
        })
    };

    reset(db).await?;
    let mut held = Vec::new();
    for i in 0..CALLS {
        let r = post(
            "/api/v1/reservations".into(),
            json!({"order_ref": format!("rt-{i}"), "site": site, "profile": PROFILE}),
        )
        .await?;
        if r.status() != 201 {
            bail!("reserve answered {}", r.status());
        }
        let b: Value = r.json().await?;
        held.push((
            b["id"].as_i64().context("id")?,
            b["fence"].as_i64().context("fence")?,
        ));
    }
    measure("reserve (201)", 0, statements(db).await?);

    reset(db).await?;
    for i in 0..CALLS {
        let r = post(
            "/api/v1/reservations".into(),
            json!({"order_ref": format!("rt-{i}"), "site": site, "profile": PROFILE}),
        )
        .await?;
        if r.status() != 200 {
            bail!("replay answered {}", r.status());
        }
    }
    measure("reserve replayed (200)", 0, statements(db).await?);

    // Refused as a sold-out pool is: a site and a profile the inventory
    // has (a vendor it has not). The refusal metric's labels read the
    // inventory's names at a process's first refusal, and again at most
    // once per 30 s when a refusal names a site or profile they do not have
    // (`metrics::refusals`): one refusal before the count reads them, as a
    // server in service has.
    let refused = |i: String| {
        post(
            "/api/v1/reservations".into(),
            json!({"order_ref": format!("rt-none-{i}"), "site": site, "profile": PROFILE,
                   "vendor": "no-such-vendor"}),
        )
    };
    let first = refused("first".into()).await?;
    if first.status() != 409 {
        bail!("unavailable reserve answered {}", first.status());
    }
    reset(db).await?;
    for i in 0..CALLS {
        let r = refused(i.to_string()).await?;
        if r.status() != 409 {
            bail!("unavailable reserve answered {}", r.status());
        }
    }
    measure(
        "reserve refused (409 unavailable)",
        0,
        statements(db).await?,
    );

    reset(db).await?;
    for (id, _) in &held {
        let r = http
            .get(format!("{base}/api/v1/reservations/{id}"))
            .bearer_auth(token)
            .send()
            .await?;
        if r.status() != 200 {
            bail!("read answered {}", r.status());
        }
    }
    measure("read a reservation (GET, 200)", 0, statements(db).await?);

    // Half are cancelled, half converted; each count is per call of its kind.
    let half = CALLS / 2;
    reset(db).await?;
    for (id, fence) in &held[..half] {
        let r = post(
            format!("/api/v1/reservations/{id}/cancel"),
            json!({"fence": fence, "reason": "round trips"}),
        )
        .await?;
        if r.status() != 200 {
            bail!("cancel answered {}", r.status());
        }
    }
    let cancels = statements(db).await?;
    reset(db).await?;
    for (id, fence) in &held[half..] {
        let r = post(
            format!("/api/v1/reservations/{id}/convert"),
            json!({"fence": fence, "service_ref": format!("SRV-RT-{id}")}),
        )
        .await?;
        if r.status() != 200 {
            bail!("convert answered {}", r.status());
        }
    }
    let converts = statements(db).await?;
    out.push(Count {
        call: "cancel (200)".into(),
        calls: half,
        statements_per_call: cancels as f64 / half as f64,
    });
    out.push(Count {
        call: "convert (200)".into(),
        calls: CALLS - half,
        statements_per_call: converts as f64 / (CALLS - half) as f64,
    });
    Ok(out)
}
