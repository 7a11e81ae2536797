//! Item 16: the fleet. Every page and read of the datacenter team and the
//! order service at a large provider's size (by default 400,000 machines
//! in 20 sites, 10 profiles and 3 vendors, with 2.5 ended reservations of
//! history per machine: 1,000,000), beside the same at 10,000 machines, in
//! one run: each read's p50 alone (one client, nothing else running), then
//! under item 1's 8-client allocation load. The counts come from the
//! per-pool figures, so a read should cost what the pools cost (600 here),
//! not what the machines cost: the report sets each read's p50 at the
//! fleet size beside its p50 at the small size.

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::setup::{Cluster, Config, Db, PROFILE};
use crate::stats::Latency;
use crate::{cpu, growth, pages, server, setup, throughput};

pub const SITES: i64 = 20;
pub const PROFILES: i64 = 10;
/// Live holds at every size (few, as in a shop: the order path's count).
pub const HELD: i64 = 1_000;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Read {
    pub name: String,
    pub path: String,
    /// Medians over the runs of each run's latency summary.
    pub alone: Latency,
    pub loaded: Latency,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Size {
    pub machines: i64,
    pub reservations: i64,
    pub held: i64,
    pub sold: i64,
    pub reads: Vec<Read>,
    /// The 8-client allocation load during the loaded reads (median rate).
    pub load_cycles_per_s: f64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Result {
    pub sizes: Vec<Size>,
}

/// Who sends a read: the order service's token, or a logged-in viewer.
#[derive(Clone, Copy)]
enum As {
    Api,
    Staff,
}

/// The reads measured: label, path, who. The reserve+cancel cycle is
/// measured beside them by `cycle_alone`.
fn reads(site: &str) -> Vec<(&'static str, String, As)> {
    vec![
        (
            "capacity of one pool (`GET /api/v1/capacity?site&profile`)",
            format!("/api/v1/capacity?site={site}&profile={PROFILE}"),
            As::Api,
        ),
        ("the live list", "/reservations".to_owned(), As::Staff),
        (
            "capacity of all pools (`GET /api/v1/capacity`)",
            "/api/v1/capacity".to_owned(),
            As::Api,
        ),
        (
            "the overview (capacity snapshot off)",
            "/".to_owned(),
            As::Staff,
        ),
        ("`/machines`, no filter", "/machines".to_owned(), As::Staff),
        (
            "Why not? for one spec",
            format!("/why-not?site={site}&profile={PROFILE}"),
            As::Staff,
        ),
        (
            "search by an asset tag prefix",
            "/search?q=f-00012".to_owned(),
            As::Staff,
        ),
        (
            // A prefix of every order of the history and the exact ref of
            // none (one exact hit answers with a redirect to its page).
            "search by an order_ref prefix",
            "/search?q=HIST-".to_owned(),
            As::Staff,
        ),
    ]
}

pub async fn run(cluster: &Cluster, cfg: &Config) -> anyhow::Result<Result> {
    let mut sizes = Vec::new();
    for &machines in &cfg.fleet_sizes {
        let name = format!("bench_fleet_{machines}");
        let db = cluster.database(&name).await?;
        let size = one_size(cluster, cfg, &db, machines).await;
        db.setup.close().await;
        crate::drop_database(cluster, &name).await?;
        sizes.push(size?);
    }
    Ok(Result { sizes })
}

async fn one_size(cluster: &Cluster, cfg: &Config, db: &Db, machines: i64) -> anyhow::Result<Size> {
    let started = Instant::now();
    let org = setup::org(db, "fleet").await?;
    load(db, org.id, machines).await?;
    let reservations = machines * 5 / 2;
    growth::add_history(db, org.id, 0, reservations).await?;
    let sold = sell(db, org.id, machines / 4).await?;
    setup::held(
        db,
        org.id,
        &format!(
            "SELECT * FROM machines WHERE org_id = $1 AND status = 'ready' AND NOT in_service
              ORDER BY id LIMIT {HELD}"
        ),
        "live",
        "t.at",
        "t.at + interval '1 hour'",
    )
    .await?;
    pages::create_viewer(db, org.id).await?;
    let app = db.app_pool(2).await?;
    // The figures the sweep's holder folds each period, folded once now.
    poolkeeper::capacity::fold_figures(&app).await?;
    app.close().await;
    db.exec("VACUUM ANALYZE").await?;
    db.exec("CHECKPOINT").await?;
    eprintln!(
        "fleet: {machines} machines, {reservations} reservations of history, {sold} sold, {HELD} held: loaded in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let server = server::Server::start_with(
        &db.url,
        &cluster.dir,
        &cfg.server_log,
        &[("POOLKEEPER_CAPACITY_CACHE_MS", "0".to_owned())],
    )
    .await?;
    let outcome = measure(cfg, db, &org, &server, machines, reservations, sold).await;
    server.stop().await;
    outcome
}

/// `machines` machines over 20 sites, 10 profiles (the first is
/// `PROFILE`) and 3 vendors (dell, hpe, lenovo); 1 in 23 in maintenance
/// (23: no site, profile or vendor is all in maintenance).
/// Tags `f-0000001`...
async fn load(db: &Db, org_id: i64, machines: i64) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
         SELECT $1, 'f-' || lpad(g::text, 7, '0'),
                's' || lpad((1 + g % $3)::text, 2, '0'),
                (ARRAY['dell', 'hpe', 'lenovo'])[1 + (g / $3) % 3],
                CASE WHEN (g / ($3 * 3)) % $4 = 0 THEN $5
                     ELSE 'profile-' || lpad(((g / ($3 * 3)) % $4)::text, 2, '0') END,
                CASE WHEN g % 23 = 7 THEN 'maintenance' ELSE 'ready' END
           FROM generate_series(1, $2) g",
    )
    .bind(org_id)
    .bind(machines)
    .bind(SITES)
    .bind(PROFILES)
    .bind(PROFILE)
    .execute(&db.setup)
    .await?;
    Ok(())
}

/// `count` machines sold, the highest ids first, in statements of
/// `SOLD_BATCH`: each sale's link sets its machine in service by a row
/// trigger whose writes fire the machines' statement triggers, and one
/// statement of 100,000 sales queues all of them in one transaction,
/// which took over 13 minutes here where batches take seconds.
async fn sell(db: &Db, org_id: i64, count: i64) -> anyhow::Result<i64> {
    const SOLD_BATCH: i64 = 2_500;
    let mut sold = 0;
    while sold < count {
        let batch = SOLD_BATCH.min(count - sold);
        let n = setup::sold(
            db,
            org_id,
            &format!(
                "SELECT id, asset_tag FROM machines
                  WHERE org_id = $1 AND status = 'ready' AND NOT in_service
                  ORDER BY id DESC LIMIT {batch}"
            ),
        )
        .await?;
        if n == 0 {
            bail!("fleet: only {sold} of {count} machines could be sold");
        }
        sold += n;
    }
    Ok(sold)
}

async fn measure(
    cfg: &Config,
    db: &Db,
    org: &setup::Org,
    server: &server::Server,
    machines: i64,
    reservations: i64,
    sold: i64,
) -> anyhow::Result<Size> {
    let base = &server.base;
    let staff = pages::login(base).await?;
    let api = reqwest::Client::builder()
        .default_headers(reqwest::header::HeaderMap::from_iter([(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {}", org.token).parse()?,
        )]))
        .build()?;
    let list = reads(&setup::site(2));
    let clients = [api, staff];
    let client = |who: As| match who {
        As::Api => &clients[0],
        As::Staff => &clients[1],
    };
    // Warm-up: every read once, each must answer 200.
    for (_, path, who) in &list {
        let r = client(*who).get(format!("{base}{path}")).send().await?;
        if r.status() != 200 {
            bail!("fleet: {path} answered {}", r.status());
        }
    }
    let seconds = cfg.run_seconds / 2.0;
    let mut alone_runs: Vec<Vec<Latency>> = Vec::new();
    let mut cycle_runs = Vec::new();
    for r in 0..cfg.runs {
        let mut run = Vec::new();
        for (_, path, who) in &list {
            run.push(read_for(client(*who), &format!("{base}{path}"), seconds).await?);
        }
        alone_runs.push(run);
        cycle_runs.push(cycle_alone(base, &org.token, seconds, &format!("a{r}")).await?);
    }
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&db.setup)
        .await?;
    let meter = cpu::Meter::new(server.pid(), backend);
    let mut loaded_runs: Vec<Vec<Latency>> = Vec::new();
    let mut load_rates = Vec::new();
    let mut loaded_cycles = Vec::new();
    for r in 0..cfg.runs {
        let tag = format!("f{r}");
        let load = throughput::http_run(&meter, base, &org.token, SITES, 8, cfg.run_seconds, &tag);
        let reads = async {
            let mut run = Vec::new();
            let each = cfg.run_seconds / list.len() as f64;
            for (_, path, who) in &list {
                run.push(read_for(client(*who), &format!("{base}{path}"), each).await?);
            }
            anyhow::Ok(run)
        };
        let (load, reads) = tokio::join!(load, reads);
        let load = load?;
        load_rates.push(load.cycles_per_s);
        loaded_cycles.push(load.reserve);
        loaded_runs.push(reads?);
    }
    let mut out = vec![Read {
        name: "reserve + cancel (one cycle through the API; loaded: item 1's own reserve)".into(),
        path: "/api/v1/reservations".into(),
        alone: Latency::median_of(&cycle_runs),
        loaded: Latency::median_of(&loaded_cycles),
    }];
    for (i, (name, path, _)) in list.iter().enumerate() {
        let col = |runs: &[Vec<Latency>]| {
            Latency::median_of(&runs.iter().map(|r| r[i]).collect::<Vec<_>>())
        };
        out.push(Read {
            name: (*name).to_owned(),
            path: path.clone(),
            alone: col(&alone_runs),
            loaded: col(&loaded_runs),
        });
        eprintln!(
            "  {machines}: {name}: alone p50 {:.1} ms, loaded p50 {:.1} ms",
            col(&alone_runs).p50_ms,
            col(&loaded_runs).p50_ms
        );
    }
    Ok(Size {
        machines,
        reservations,
        held: HELD,
        sold,
        reads: out,
        load_cycles_per_s: crate::stats::median(&load_rates),
    })
}

/// One client reading `url` again and again for `seconds` (at least 5
/// times); the latency of each, request sent to last byte read.
pub(crate) async fn read_for(
    http: &reqwest::Client,
    url: &str,
    seconds: f64,
) -> anyhow::Result<Latency> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut samples = Vec::new();
    while samples.len() < 5 || Instant::now() < deadline {
        let t = Instant::now();
        let resp = http.get(url).send().await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        samples.push(t.elapsed());
        if status != 200 {
            bail!(
                "{url} answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
    }
    Ok(Latency::of(&mut samples))
}

/// One client's reserve+cancel cycles for `seconds`: the latency of the
/// whole cycle.
async fn cycle_alone(base: &str, token: &str, seconds: f64, tag: &str) -> anyhow::Result<Latency> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()?;
    let site = setup::site(2);
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut samples = Vec::new();
    let mut n = 0;
    while samples.len() < 5 || Instant::now() < deadline {
        n += 1;
        let t = Instant::now();
        let c = throughput::http_cycle(&http, base, token, &site, &format!("{tag}-{n}")).await?;
        if c.cancel.is_some() {
            samples.push(t.elapsed());
        }
        if n > 100_000 {
            bail!("fleet: no reserve succeeded in {n} attempts");
        }
    }
    Ok(Latency::of(&mut samples))
}
