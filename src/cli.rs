//! The command line of docs/configuration.md.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::domain::{Email, Role, Scope, Segment, Slug};
use crate::embedded_pg::{ClusterOptions, EmbeddedPostgres};
use crate::settings::{DbPooler, Settings};

#[derive(Debug, Parser)]
#[command(
    name = "poolkeeper",
    version,
    about = "Reserves dedicated machines for orders; a dashboard over the pool",
    after_help = crate::settings::help_text()
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run migrations, then serve the dashboard, the API and the sweep.
    #[command(after_help = crate::settings::help_text())]
    Serve,
    /// Run migrations and exit.
    Migrate,
    /// Organizations (tenants).
    Org {
        #[command(subcommand)]
        command: OrgCommand,
    },
    /// Staff users.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// API tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Sites: their procurement lead time (docs/rules.md, R21).
    Site {
        #[command(subcommand)]
        command: SiteCommand,
    },
    /// Load a demo organization, users, sites and machines (idempotent).
    Demo,
}

#[derive(Debug, Subcommand)]
enum OrgCommand {
    /// Create an organization.
    Add {
        slug: String,
        #[arg(long)]
        name: Option<String>,
        /// Turn the organization's datacenter-module setting on.
        #[arg(long)]
        enable_datacenter: bool,
    },
    /// Change an organization's capacity settings (docs/rules.md, R18 and R19).
    Set {
        slug: String,
        /// The most live holds one customer (a reserve's customer_ref) may
        /// have, 0 to 10000; 0: no cap (R19).
        #[arg(long, value_parser = clap::value_parser!(i32).range(0..=10_000))]
        customer_hold_limit: Option<i32>,
        /// The segment whose headroom healing may use for repairs (R18); ''
        /// clears it.
        #[arg(long)]
        repairs_segment: Option<String>,
    },
    /// Sign the organization's staff in through its OpenID Connect provider
    /// (docs/rules.md S1-S3, docs/configuration.md); or `--off`.
    Sso(SsoArgs),
}

#[derive(Debug, Subcommand)]
enum SiteCommand {
    /// Set a site's procurement lead time: a pool whose run-out falls
    /// within it is flagged (R21).
    Set {
        site: String,
        /// Days from ordering hardware to having it in the pool, 1 to 730.
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..=730))]
        lead_time_days: i64,
        /// The organization; without it, every organization.
        #[arg(long)]
        org: Option<String>,
    },
}

#[derive(Debug, clap::Args)]
struct SsoArgs {
    slug: String,
    /// The provider's issuer URL, exactly as its discovery document names it
    /// (https; Entra ID: https://login.microsoftonline.com/<tenant id>/v2.0).
    #[arg(long, required_unless_present = "off")]
    issuer: Option<String>,
    /// The client id the provider gave poolkeeper.
    #[arg(long, required_unless_present = "off")]
    client_id: Option<String>,
    /// A file whose first line is the client secret; the server reads it at
    /// each sign-in (only the path is stored).
    #[arg(long, required_unless_present = "off")]
    client_secret_file: Option<String>,
    /// The ID token claim whose values map to roles.
    #[arg(long, default_value = "groups")]
    claim: String,
    /// ROLE=VALUE: a claim value that gives admin, support or viewer; repeat
    /// it for several values of one role (any of them gives it), at least
    /// one in all; the highest mapped role wins. The value is taken whole
    /// (a group's distinguished name may hold commas).
    #[arg(long = "role", value_name = "ROLE=VALUE")]
    roles: Vec<String>,
    /// on: password sign-in as before; admins: only admins may still use a
    /// password (break-glass, for when the provider is down).
    #[arg(long, default_value = "on", value_parser = ["on", "admins"])]
    passwords: String,
    /// Remove the organization's single sign-on.
    #[arg(long, conflicts_with_all = ["issuer", "client_id", "client_secret_file", "roles"])]
    off: bool,
}

#[derive(Debug, Subcommand)]
enum UserCommand {
    /// Create a staff user; the password is read from standard input.
    Add {
        #[arg(long)]
        org: String,
        #[arg(long)]
        email: String,
        #[arg(long)]
        role: String,
        #[arg(long, required = true)]
        password_stdin: bool,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create an API token and print it, alone, on stdout.
    Add {
        #[arg(long)]
        org: String,
        /// orders, inventory, or both separated by a comma; or metrics alone
        /// (reads /metrics, every organization's pool numbers: an operator's token).
        #[arg(long)]
        scope: String,
        /// A name for logs and for `ended_by` (default: derived from the token).
        #[arg(long)]
        name: Option<String>,
    },
}

pub fn main() -> ExitCode {
    let _ = dotenvy::dotenv();
    let cli = Cli::parse();
    // Flushes the spans not yet exported when main returns.
    let _telemetry = crate::telemetry::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("poolkeeper: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("poolkeeper: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let database = Database::open(&settings).await?;
    let result = run_command(cli.command, settings, &database).await;
    database.close();
    result
}

async fn run_command(
    command: Command,
    settings: Settings,
    database: &Database,
) -> anyhow::Result<()> {
    // The migrations need a real session for their advisory lock (and the
    // owner's rights): POOLKEEPER_MIGRATION_DATABASE_URL when set, else
    // DATABASE_URL unless it goes through a transaction-mode pooler.
    let migration = database.migration_options(&settings)?;
    if let Command::Migrate = command {
        return migrate_only(migration).await;
    }
    let pool = connect(database, &settings).await?;
    let report = crate::db::prepare_schema(migration.as_ref(), &pool)
        .await
        .context("running migrations")?;
    log_schema_report(report);
    // F5: the pool's first connection may predate the check's installation;
    // run it once more now, and never serve unchecked.
    crate::db::incarnation::verify(&pool)
        .await
        .context("checking whether the database was restored (F5)")?;
    match command {
        Command::Migrate => {}
        Command::Serve => crate::serve::serve(settings, pool.clone()).await?,
        Command::Org {
            command:
                OrgCommand::Add {
                    slug,
                    name,
                    enable_datacenter,
                },
        } => org_add(&pool, &slug, name, enable_datacenter).await?,
        Command::Org {
            command:
                OrgCommand::Set {
                    slug,
                    customer_hold_limit,
                    repairs_segment,
                },
        } => org_set(&pool, &slug, customer_hold_limit, repairs_segment).await?,
        Command::Org {
            command: OrgCommand::Sso(args),
        } => org_sso(&pool, &settings.public_url, args).await?,
        Command::User {
            command:
                UserCommand::Add {
                    org,
                    email,
                    role,
                    password_stdin: _,
                },
        } => user_add(&pool, &org, &email, &role).await?,
        Command::Token {
            command: TokenCommand::Add { org, scope, name },
        } => {
            let org = crate::orgs::by_slug(&pool, &org).await?;
            let scopes = Scope::parse_list(&scope)?;
            let (_, token) = crate::tokens::create(&pool, org.id, name.as_deref(), &scopes).await?;
            println!("{token}");
        }
        Command::Site {
            command:
                SiteCommand::Set {
                    site,
                    lead_time_days,
                    org,
                },
        } => site_set(&pool, &site, lead_time_days, org.as_deref()).await?,
        Command::Demo => crate::demo::load(&pool).await?.print(),
    }
    pool.close().await;
    Ok(())
}

/// `migrate`: on the migration session only (no application pool).
async fn migrate_only(migration: Option<PgConnectOptions>) -> anyhow::Result<()> {
    let Some(opts) = migration else {
        bail!(
            "POOLKEEPER_DB_POOLER=transaction: set POOLKEEPER_MIGRATION_DATABASE_URL to a direct URL of the owner role to migrate"
        );
    };
    let report = crate::db::migrate(&opts)
        .await
        .context("running migrations")?;
    log_schema_report(report);
    Ok(())
}

/// The application's pool, with the pooler's checks when there is one.
async fn connect(database: &Database, settings: &Settings) -> anyhow::Result<crate::db::Db> {
    let pool = crate::db::connect_app(
        database.options.clone(),
        settings.db_max_connections,
        settings.db_acquire_timeout,
        settings.db_pooler.pooled(),
        !settings.db_statement_cache,
    )
    .await
    .map_err(|e| {
        let hint = if matches!(e, sqlx::Error::Tls(_)) || e.to_string().contains("certificate") {
            " (TLS: sslrootcert must name the CA that signed the server's certificate, \
             and with sslmode=verify-full the URL's host must match it)"
        } else {
            ""
        };
        anyhow::Error::new(e).context(format!("connecting to the database{hint}"))
    })?;
    if settings.db_pooler == DbPooler::Transaction {
        crate::db::check_statement_support(&pool).await?;
    }
    if settings.db_pooler.pooled() {
        crate::db::check_role_limits(&pool).await?;
    }
    Ok(pool)
}

/// `org add`.
async fn org_add(
    pool: &crate::db::Db,
    slug: &str,
    name: Option<String>,
    enable_datacenter: bool,
) -> anyhow::Result<()> {
    let slug = Slug::parse(slug)?;
    let name = name.unwrap_or_else(|| slug.as_str().to_owned());
    let org = crate::orgs::create(pool, &slug, &name, enable_datacenter).await?;
    eprintln!(
        "created organization {} (datacenter module {})",
        org.slug,
        on_off(org.datacenter_enabled)
    );
    Ok(())
}

/// `org set`: R19's cap and R18's repairs segment.
async fn org_set(
    pool: &crate::db::Db,
    slug: &str,
    customer_hold_limit: Option<i32>,
    repairs_segment: Option<String>,
) -> anyhow::Result<()> {
    if customer_hold_limit.is_none() && repairs_segment.is_none() {
        bail!("nothing to set: give --customer-hold-limit N or --repairs-segment NAME");
    }
    let org = crate::orgs::by_slug(pool, slug).await?;
    let segment = match repairs_segment.as_deref() {
        None => None,
        Some("") => Some(None),
        Some(s) => Some(Some(Segment::parse(s)?)),
    };
    let change = crate::orgs::CapacitySettings {
        customer_hold_limit,
        repairs_segment: segment.as_ref().map(Option::as_ref),
    };
    let changed = crate::orgs::set_capacity_settings(pool, org.id, &change, "command line").await?;
    if changed.is_empty() {
        eprintln!("{}: already so, nothing changed", org.slug);
    }
    let (limit, repairs) = crate::orgs::capacity_settings(pool, org.id).await?;
    eprintln!(
        "{}: customer hold limit {}, repairs segment {}",
        org.slug,
        if limit == 0 {
            "none".to_owned()
        } else {
            limit.to_string()
        },
        repairs.as_deref().unwrap_or("none")
    );
    Ok(())
}

/// `site set`: R21's lead time of a site, for one organization or all.
async fn site_set(
    pool: &crate::db::Db,
    site: &str,
    days: i64,
    org: Option<&str>,
) -> anyhow::Result<()> {
    let site = crate::domain::Site::parse(site)?;
    let days = crate::planning::lead_time_days(days)?;
    let orgs: Vec<(i64, String)> = match org {
        Some(slug) => {
            let o = crate::orgs::by_slug(pool, slug).await?;
            vec![(o.id, o.slug.to_string())]
        }
        None => sqlx::query_as("SELECT id, slug FROM organizations ORDER BY slug")
            .fetch_all(pool)
            .await
            .context("reading the organizations")?,
    };
    if orgs.is_empty() {
        bail!("no organization: create one first (poolkeeper org add)");
    }
    for (id, slug) in orgs {
        let mut tx = pool.begin().await?;
        let before =
            crate::planning::set_lead_time(&mut tx, id, &site, days, "command line").await?;
        crate::audit::record(
            &mut tx,
            &crate::audit::Entry {
                org_id: Some(id),
                actor: "command line",
                action: crate::audit::AuditAction::SiteLeadTimeSet,
                object: &format!("site:{}", site.as_str()),
                source_addr: "command line",
                detail: Some(&format!("{before} -> {days} days")),
            },
        )
        .await?;
        tx.commit().await?;
        eprintln!(
            "{slug}: site {} lead time {days} days (was {before})",
            site.as_str()
        );
    }
    Ok(())
}

/// `user add`: the password from standard input.
async fn user_add(pool: &crate::db::Db, org: &str, email: &str, role: &str) -> anyhow::Result<()> {
    let org = crate::orgs::by_slug(pool, org).await?;
    let email = Email::parse(email)?;
    let role = Role::parse(role)?;
    let mut password = String::new();
    std::io::stdin()
        .read_to_string(&mut password)
        .context("reading the password from stdin")?;
    let password = password.trim_end_matches(['\r', '\n']);
    crate::staff::create(pool, org.id, &email, role, password).await?;
    eprintln!(
        "created {} user {} in {}",
        role.as_str(),
        email.as_str(),
        org.slug
    );
    Ok(())
}

fn log_schema_report(report: crate::db::MigrationReport) {
    if report.checksums_rewritten > 0 {
        tracing::info!(
            migrations = report.checksums_rewritten,
            "checksums of migrations whose functions moved to sql/ updated"
        );
    }
    if report.applied > 0 {
        tracing::info!(applied = report.applied, "migrations applied");
    }
    // A newer set installed was already logged as a warning where seen.
    if let Some(crate::db::definitions::Outcome::Applied { from, to, files }) = &report.definitions
    {
        tracing::info!(
            from,
            to,
            files = files.join(", "),
            "SQL definitions applied"
        );
    }
    if report.leases_purged > 0 {
        tracing::info!(
            purged = report.leases_purged,
            "purged leases expired for more than 24 h"
        );
    }
}

/// `poolkeeper org sso`: stores (or with `--off` removes) the organization's
/// single sign-on, then says what the provider must be told.
async fn org_sso(
    pool: &crate::db::Db,
    public_url: &Option<String>,
    args: SsoArgs,
) -> anyhow::Result<()> {
    let org = crate::orgs::by_slug(pool, &args.slug).await?;
    if args.off {
        if crate::sso::remove(pool, org.id, "command line").await? {
            eprintln!("{}: single sign-on removed", org.slug);
        } else {
            eprintln!("{}: had no single sign-on, nothing changed", org.slug);
        }
        return Ok(());
    }
    let mut values: [Vec<&str>; 3] = [vec![], vec![], vec![]];
    for pair in &args.roles {
        let Some((role, value)) = pair.split_once('=') else {
            bail!("--role {pair:?}: write ROLE=VALUE, e.g. --role admin=pk-admins");
        };
        let i = match Role::parse(role.trim())? {
            Role::Admin => 0,
            Role::Support => 1,
            Role::Viewer => 2,
        };
        if value.is_empty() {
            bail!("--role {pair:?}: the value is empty");
        }
        // Twice, or for two roles: `Setting::check` says so.
        values[i].push(value);
    }
    let setting = crate::sso::Setting {
        issuer: args.issuer.as_deref().unwrap_or(""),
        client_id: args.client_id.as_deref().unwrap_or(""),
        client_secret_file: args.client_secret_file.as_deref().unwrap_or(""),
        claim: &args.claim,
        admin_values: &values[0],
        support_values: &values[1],
        viewer_values: &values[2],
        passwords: crate::sso::Passwords::parse(&args.passwords)?,
    };
    crate::sso::set(pool, org.id, &setting, "command line").await?;
    let Some(config) = crate::sso::config(pool, org.id).await? else {
        bail!("the configuration was stored but cannot be read back");
    };
    eprintln!(
        "{}: single sign-on through {} (client {}, secret read from {}); claim {:?} gives {}; passwords {}",
        org.slug,
        config.issuer,
        config.client_id,
        config.client_secret_file,
        config.claim,
        config.expected(),
        config.passwords
    );
    match public_url {
        Some(url) => eprintln!(
            "register the redirect URI {url}/login/sso/callback and the post-logout redirect URI {url}/login?flash=logged_out with the provider"
        ),
        None => eprintln!(
            "warning: set POOLKEEPER_PUBLIC_URL for `serve`: the redirect URI is <POOLKEEPER_PUBLIC_URL>/login/sso/callback"
        ),
    }
    let redirect = format!(
        "{}/login/sso/callback",
        public_url.as_deref().unwrap_or("http://localhost")
    );
    if let Err(e) = crate::sso::discover(&config, &redirect).await {
        eprintln!("warning: {e} (stored anyway; sign-in fails until it answers)");
    }
    Ok(())
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

/// The database a command works on: `DATABASE_URL`, or the embedded default.
struct Database {
    options: PgConnectOptions,
    embedded: Option<EmbeddedPostgres>,
}

/// The embedded default's database name.
const EMBEDDED_DB: &str = "poolkeeper";

impl Database {
    async fn open(settings: &Settings) -> anyhow::Result<Database> {
        if let Some(url) = &settings.database_url {
            let options =
                crate::db::parse_url(url).context("DATABASE_URL is not a valid PostgreSQL URL")?;
            return Ok(Database {
                options,
                embedded: None,
            });
        }
        let root = PathBuf::from(".poolkeeper");
        std::fs::create_dir_all(&root).context("creating ./.poolkeeper")?;
        let opts = ClusterOptions {
            data_dir: root.join("pg"),
            log_file: root.join("postgres.log"),
            throwaway: false,
        };
        let cluster = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&opts)).await??;
        tracing::info!(data_dir = %cluster.data_dir().display(), owned = cluster.owned(), "embedded PostgreSQL is up");
        let mut admin = cluster
            .connect_options("postgres")
            .log_statements(tracing::log::LevelFilter::Off)
            .connect()
            .await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(EMBEDDED_DB)
                .fetch_one(&mut admin)
                .await?;
        // Two replicas may race here; the loser's duplicate_database (42P04) is fine.
        let create = sqlx::AssertSqlSafe(format!("CREATE DATABASE {EMBEDDED_DB}"));
        if !exists
            && let Err(e) = sqlx::query(create).execute(&mut admin).await
            && crate::db::sqlstate(&e).as_deref() != Some("42P04")
        {
            bail!("creating the embedded database: {e}");
        }
        admin.close().await?;
        Ok(Database {
            options: cluster.connect_options(EMBEDDED_DB),
            embedded: Some(cluster),
        })
    }

    /// The direct session for migrations, if there is one.
    fn migration_options(&self, settings: &Settings) -> anyhow::Result<Option<PgConnectOptions>> {
        if let Some(url) = &settings.migration_database_url {
            let opts = crate::db::parse_url(url)
                .context("POOLKEEPER_MIGRATION_DATABASE_URL is not a valid PostgreSQL URL")?;
            return Ok(Some(opts));
        }
        if settings.db_pooler == DbPooler::Transaction && self.embedded.is_none() {
            return Ok(None);
        }
        Ok(Some(self.options.clone()))
    }

    fn close(&self) {
        if let Some(cluster) = &self.embedded {
            if cluster.owned() {
                tracing::info!("stopping embedded PostgreSQL");
            }
            cluster.stop();
        }
    }
}
