//! The bench's private PostgreSQL, its databases, and the data they start
//! with. Bulk data goes in with INSERT ... SELECT generate_series on a
//! connection without the application's statement_timeout.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use poolkeeper::domain::{Scope, Slug};
use poolkeeper::embedded_pg::{ClusterOptions, EmbeddedPostgres};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection};

/// Sizes and durations, from the environment (BENCH_QUICK=1 for a run of
/// under a minute while developing).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Config {
    pub quick: bool,
    /// Machines of the allocation pool, spread over `sites` sites.
    pub machines: i64,
    pub sites: i64,
    /// Concurrent clients of the throughput runs.
    pub clients: Vec<usize>,
    /// Runs per measurement (the median is reported); at least 3.
    pub runs: usize,
    /// Length of one throughput run.
    pub run_seconds: f64,
    /// Rounds of the 8-orders-on-3-machines race.
    pub race_rounds: usize,
    /// Ended reservations in the history of the database of items 1 and 5.
    pub api_history: i64,
    /// Ended reservations in the history at each growth step.
    pub history_steps: Vec<i64>,
    /// Reserve calls per growth run.
    pub growth_reserves: usize,
    /// Overdue held reservations the sweep expires.
    pub sweep_reservations: i64,
    /// Item 11: holds on the rack put into maintenance at once.
    pub heal_holds: i64,
    /// Machines of the organization whose pages are read, and its held reservations.
    pub page_machines: i64,
    pub page_held: i64,
    pub page_sold: i64,
    /// Item 16: the fleet sizes whose reads are set side by side
    /// (`BENCH_FLEET`, machines; the first is the baseline).
    pub fleet_sizes: Vec<i64>,
    /// Item 18: pools of the planning item (`BENCH_PLANNING`, 20 profiles
    /// per site, 20 machines each), days the daily job writes
    /// (`BENCH_PLANNING_DAYS`), days of activity before them
    /// (`BENCH_PLANNING_HISTORY`) and days of history per pool the pages
    /// read (`BENCH_PLANNING_PAGE_DAYS`).
    #[serde(default)]
    pub planning_pools: i64,
    #[serde(default)]
    pub planning_days: i64,
    #[serde(default)]
    pub planning_history_days: i64,
    #[serde(default)]
    pub planning_page_days: i64,
    /// Reserve+cancel cycles of one run of the fill item.
    pub fill_cycles: u64,
    /// Readers of the dashboard pages.
    pub page_readers: usize,
    /// Log filter of the server process.
    pub server_log: String,
    /// Which items to run: throughput, race, growth, sweep, pages, fill, pooler.
    pub only: Vec<String>,
    /// The cluster commits durably (fsync, synchronous_commit and
    /// full_page_writes on, as PostgreSQL ships): the headline. `BENCH_DURABLE=0`
    /// starts it throwaway instead (all three off), which measures CPU cost
    /// only and writes under target/bench/.
    pub durable: bool,
    /// Seconds to wait after a throughput run before reading the cumulative
    /// statistics: an idle backend reports its last second of counters up to
    /// 10 s later (PostgreSQL 15's PGSTAT_IDLE_INTERVAL).
    pub settle_seconds: f64,
    /// Extra server settings, `name=value;name=value` (BENCH_PG_SET), applied
    /// with ALTER SYSTEM before the cluster starts, e.g. `commit_delay=100`.
    pub pg_set: Vec<(String, String)>,
}

fn pick<T>(quick: bool, full: T, quick_value: T) -> T {
    if quick { quick_value } else { full }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn env_list<T: std::str::FromStr>(name: &str, default: Vec<T>) -> Vec<T> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => {
            let parsed: Vec<T> = v.split(',').filter_map(|s| s.trim().parse().ok()).collect();
            if parsed.is_empty() { default } else { parsed }
        }
        _ => default,
    }
}

impl Config {
    pub fn from_env() -> Config {
        let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        Config {
            quick,
            machines: env_or("BENCH_MACHINES", 10_000),
            sites: env_or("BENCH_SITES", 10),
            clients: env_list("BENCH_CLIENTS", vec![1, 8, 32]),
            runs: env_or("BENCH_RUNS", 3usize).max(3),
            run_seconds: env_or("BENCH_SECONDS", pick(quick, 6.0, 1.0)),
            race_rounds: env_or("BENCH_RACE_ROUNDS", pick(quick, 50, 10)),
            api_history: env_or("BENCH_API_HISTORY", 20_000),
            history_steps: env_list(
                "BENCH_HISTORY",
                pick(quick, vec![0, 100_000, 1_000_000], vec![0, 10_000, 50_000]),
            ),
            growth_reserves: env_or("BENCH_GROWTH_RESERVES", pick(quick, 400, 60)),
            sweep_reservations: env_or("BENCH_SWEEP", pick(quick, 100_000, 10_000)),
            heal_holds: env_or("BENCH_HEAL", 200),
            page_machines: env_or("BENCH_PAGE_MACHINES", pick(quick, 50_000, 20_000)),
            page_held: env_or("BENCH_PAGE_HELD", 1_000),
            page_sold: env_or("BENCH_PAGE_SOLD", pick(quick, 25_000, 10_000)),
            page_readers: env_or("BENCH_PAGE_READERS", 8),
            fill_cycles: env_or("BENCH_FILL", pick(quick, 30_000, 3_000)),
            fleet_sizes: env_list(
                "BENCH_FLEET",
                pick(quick, vec![10_000, 400_000], vec![2_000, 20_000]),
            ),
            planning_pools: env_or("BENCH_PLANNING", pick(quick, 1_000, 100)).max(20),
            planning_days: env_or("BENCH_PLANNING_DAYS", pick(quick, 7, 3)).max(1),
            planning_history_days: env_or("BENCH_PLANNING_HISTORY", pick(quick, 365, 30)).max(3),
            planning_page_days: env_or("BENCH_PLANNING_PAGE_DAYS", 365).max(1),
            server_log: std::env::var("BENCH_SERVER_LOG").unwrap_or_else(|_| "info".to_owned()),
            only: env_list(
                "BENCH_ONLY",
                [
                    "throughput",
                    "statements",
                    "race",
                    "growth",
                    "sweep",
                    "healing",
                    "tracing",
                    "headroom",
                    "substitutes",
                    "capacity",
                    "pages",
                    "fill",
                    "pooler",
                    "ha",
                    "fleet",
                    "planning",
                    "webhooks",
                ]
                .map(String::from)
                .to_vec(),
            ),
            durable: std::env::var("BENCH_DURABLE").map_or(true, |v| v != "0" && v != "off"),
            settle_seconds: env_or("BENCH_SETTLE", 10.5),
            pg_set: std::env::var("BENCH_PG_SET")
                .unwrap_or_default()
                .split(';')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .filter(|(k, _)| !k.is_empty())
                .collect(),
        }
    }

    pub fn runs_item(&self, item: &str) -> bool {
        self.only.iter().any(|s| s == item)
    }
}

/// The private cluster: durable as PostgreSQL ships (or throwaway with
/// `BENCH_DURABLE=0`), in a temporary directory removed at the end. With `BENCH_DATABASE_URL` (a superuser URL of an
/// existing server, e.g. one started with
/// `-c shared_preload_libraries=pg_stat_statements` for profiling), the
/// bench creates its databases there instead.
pub struct Cluster {
    pub pg: Option<EmbeddedPostgres>,
    /// Admin connection options (database `postgres`).
    admin: PgConnectOptions,
    /// The URL with `DBNAME` where the database name goes.
    url_template: String,
    pub dir: PathBuf,
    /// The server's log (lock waits are read from it); none on an external server.
    pub log: Option<PathBuf>,
}

impl Cluster {
    pub async fn start(cfg: &Config) -> anyhow::Result<Cluster> {
        let dir = std::env::temp_dir().join(format!("poolkeeper-bench-{}", std::process::id()));
        if let Some(url) = std::env::var("BENCH_DATABASE_URL")
            .ok()
            .filter(|u| !u.is_empty())
        {
            std::fs::create_dir_all(&dir)?;
            let admin = poolkeeper::db::parse_url(&url)?;
            let (path, query) = url
                .split_once('?')
                .map(|(p, q)| (p, format!("?{q}")))
                .unwrap_or((&url, String::new()));
            let base = path.rsplit_once('/').map(|(b, _)| b).unwrap_or(path);
            return Ok(Cluster {
                pg: None,
                admin,
                url_template: format!("{base}/DBNAME{query}"),
                dir,
                log: None,
            });
        }
        poolkeeper::embedded_pg::prepare_private_dir(&dir)?;
        let opts = ClusterOptions {
            data_dir: dir.join("pg"),
            log_file: dir.join("postgres.log"),
            throwaway: !cfg.durable,
        };
        let pg = start_counting(opts.clone(), &cfg.pg_set).await?;
        Ok(Cluster {
            admin: pg.connect_options("postgres"),
            url_template: pg.url("DBNAME"),
            pg: Some(pg),
            dir,
            log: Some(opts.log_file),
        })
    }

    pub fn external(&self) -> bool {
        self.pg.is_none()
    }

    pub async fn admin(&self) -> anyhow::Result<PgConnection> {
        Ok(PgConnection::connect_with(&self.admin).await?)
    }

    /// A fresh database with every migration applied (an old one of the
    /// same name, left by an interrupted run on an external server, is dropped).
    pub async fn database(&self, name: &str) -> anyhow::Result<Db> {
        let mut admin = self.admin().await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut admin)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        let options = self.admin.clone().database(name);
        poolkeeper::db::migrate(&options).await?;
        // Bulk loading and measuring: no statement_timeout here.
        let setup = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options.clone())
            .await?;
        let setup = poolkeeper::db::Db::direct(setup);
        Ok(Db {
            name: name.to_owned(),
            url: self.url_template.replace("DBNAME", name),
            options,
            setup,
        })
    }

    pub fn stop(self) {
        if let Some(pg) = &self.pg {
            pg.stop();
        }
        if std::env::var("BENCH_KEEP").is_ok_and(|v| v == "1") {
            eprintln!("bench: kept {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub struct Db {
    pub name: String,
    /// DATABASE_URL for the server process.
    pub url: String,
    pub options: PgConnectOptions,
    /// Unlimited statements, for loading data and reading results.
    pub setup: poolkeeper::db::Db,
}

impl Db {
    /// A pool configured as the application's (session limits included).
    pub async fn app_pool(&self, max: u32) -> anyhow::Result<poolkeeper::db::Db> {
        Ok(poolkeeper::db::connect(self.options.clone(), max).await?)
    }

    pub async fn connection(&self) -> anyhow::Result<PgConnection> {
        Ok(PgConnection::connect_with(&self.options).await?)
    }

    pub async fn exec(&self, sql: &str) -> anyhow::Result<u64> {
        Ok(sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&self.setup)
            .await
            .with_context(|| format!("running {}", sql.lines().next().unwrap_or("")))?
            .rows_affected())
    }

    pub async fn scalar_i64(&self, sql: &str) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.setup)
            .await?)
    }
}

/// An organization with the datacenter module on, and a token with both scopes.
pub struct Org {
    pub id: i64,
    pub token: String,
}

pub async fn org(db: &Db, slug: &str) -> anyhow::Result<Org> {
    let org = poolkeeper::orgs::create(&db.setup, &Slug::parse(slug)?, slug, true).await?;
    let (_, token) = poolkeeper::tokens::create(
        &db.setup,
        org.id,
        Some("checkout"),
        &[Scope::Orders, Scope::Inventory],
    )
    .await?;
    Ok(Org { id: org.id, token })
}

pub const PROFILE: &str = "epyc-9354-256g";

/// The site of index `i` (0-based): s01, s02, ...
pub fn site(i: i64) -> String {
    format!("s{:02}", i + 1)
}

/// `count` ready machines of `profile` spread round-robin over `sites`
/// sites, two vendors alternating within each site, tags `{prefix}-000001`...
pub async fn machines(
    db: &Db,
    org_id: i64,
    prefix: &str,
    count: i64,
    sites: i64,
    profile: &str,
    status: &str,
) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
         SELECT $1, $2 || '-' || lpad(g::text, 7, '0'), 's' || lpad((1 + (g - 1) % $4)::text, 2, '0'),
                CASE WHEN ((g - 1) / $4) % 2 = 0 THEN 'dell' ELSE 'hpe' END, $5, $6
           FROM generate_series(1, $3) g",
    )
    .bind(org_id)
    .bind(prefix)
    .bind(count)
    .bind(sites)
    .bind(profile)
    .bind(status)
    .execute(&db.setup)
    .await?;
    Ok(())
}

/// Machines of `org_id` chosen by `machines` (a subquery over `machines`
/// naming `org_id` as $1, returning `id` and `asset_tag`) sold a day ago:
/// each with its converted reservation and a live service link, whose
/// trigger (sql/services.sql) marks the machine in service. Returns how
/// many.
pub async fn sold(db: &Db, org_id: i64, machines: &str) -> anyhow::Result<i64> {
    let sql = format!(
        "WITH sold AS (
            INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot, reason,
                                      hold_seconds, created_at, expires_at, ended_at, ended_by, end_reason)
            SELECT $1, 'sold-' || m.id, m.id, 'converted', '{{}}', jsonb_build_object('asset_tag', m.asset_tag),
                   'sold before the bench', 900, clock_timestamp() - interval '1 day',
                   clock_timestamp() - interval '1 day' + interval '15 minutes',
                   clock_timestamp() - interval '1 day' + interval '5 minutes', 'bench', 'converted into service'
              FROM ({machines}) m
            RETURNING id, machine_id),
         links AS (
            INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at)
            SELECT $1, machine_id, id, 'SRV-' || id, clock_timestamp() - interval '1 day' FROM sold
            RETURNING 1)
         SELECT count(*) FROM links"
    );
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .fetch_one(&db.setup)
        .await?)
}

/// Held reservations written in one statement, one per machine of
/// `machines` (a subquery over `machines` naming `org_id` as $1), each with
/// its `created` event: order refs `<prefix>-<machine id>`, created and
/// due at `created` and `expires` (SQL over `m`, the machine, and `t.at`,
/// one reading of the clock).
pub async fn held(
    db: &Db,
    org_id: i64,
    machines: &str,
    prefix: &str,
    created: &str,
    expires: &str,
) -> anyhow::Result<()> {
    let sql = format!(
        "WITH ins AS (
            INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason,
                                      hold_seconds, created_at, expires_at)
            SELECT $1, '{prefix}-' || m.id, m.id,
                   jsonb_build_object('site', m.site, 'profile', m.profile, 'vendor', NULL, 'hold_seconds', 900),
                   jsonb_build_object('asset_tag', m.asset_tag, 'site', m.site, 'vendor', m.vendor,
                                      'profile', m.profile, 'status', m.status, 'updated_at', m.updated_at),
                   m.asset_tag || ' matched site ' || m.site || ', profile ' || m.profile
                       || ', any vendor: candidate 1 of 25 in pass one; held for 900 s',
                   900, {created}, {expires}
              FROM ({machines}) m, (SELECT clock_timestamp() AS at) t
            RETURNING id, created_at
         )
         INSERT INTO reservation_events (reservation_id, at, kind, from_state, to_state, actor, detail)
         SELECT id, created_at, 'created', NULL, 'held', 'checkout', 'order {prefix}-' || id FROM ins"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .execute(&db.setup)
        .await?;
    Ok(())
}

/// What the bench sets on its cluster beyond PostgreSQL's defaults, and
/// why. Durability settings are left as shipped (or turned off by
/// `EmbeddedPostgres` for a throwaway cluster).
const BENCH_SETTINGS: [(&str, &str); 3] = [
    // Item 7 counts round trips with it.
    ("shared_preload_libraries", "pg_stat_statements"),
    // Item 1 counts lock waits from the log: every wait longer than
    // deadlock_timeout is logged, with what it waited for.
    ("log_lock_waits", "on"),
    ("deadlock_timeout", "1ms"),
];

/// The settings the machine table prints, read from the running server.
pub const PRINTED_SETTINGS: [&str; 14] = [
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "wal_level",
    "shared_buffers",
    "checkpoint_timeout",
    "max_wal_size",
    "commit_delay",
    "commit_siblings",
    "autovacuum",
    "max_connections",
    "log_lock_waits",
    "deadlock_timeout",
];

/// Starts the private cluster with the bench's settings (`BENCH_SETTINGS`,
/// then `BENCH_PG_SET`): started once to set them, then restarted.
async fn start_counting(
    opts: ClusterOptions,
    extra: &[(String, String)],
) -> anyhow::Result<EmbeddedPostgres> {
    let start = |opts: ClusterOptions| async move {
        tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&opts))
            .await
            .context("starting postgres")?
            .map_err(anyhow::Error::from)
    };
    let pg = start(opts.clone()).await?;
    let mut admin = PgConnection::connect_with(&pg.connect_options("postgres")).await?;
    let settings = BENCH_SETTINGS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain(extra.iter().cloned());
    for (name, value) in settings {
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        {
            anyhow::bail!("BENCH_PG_SET: not a setting name: {name}");
        }
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER SYSTEM SET {name} = '{}'",
            value.replace('\'', "''")
        )))
        .execute(&mut admin)
        .await
        .with_context(|| format!("ALTER SYSTEM SET {name}"))?;
    }
    admin.close().await?;
    pg.stop();
    drop(pg);
    start(opts).await
}
