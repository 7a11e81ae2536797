//! Connections, migrations, and the one place that reads database errors.

use std::error::Error as StdError;
use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};

/// The migrations, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The advisory lock that serialises start-up work across replicas: the
/// migrations and the lease purge of L5. An arbitrary constant, 'pool' 'kpr'.
pub const MIGRATION_LOCK_KEY: i64 = 0x0070_6f6f_6c6b_7072;

/// Keys whose lease expired more than this long ago are purged at start-up (L5).
pub const LEASE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Per-connection limits: no statement, lock wait or idle transaction may
/// hold a connection (and the rows it locked) for long.
pub fn with_session_limits(opts: PgConnectOptions) -> PgConnectOptions {
    opts.options([
        ("statement_timeout", "15s"),
        ("lock_timeout", "5s"),
        ("idle_in_transaction_session_timeout", "30s"),
    ])
    .application_name("poolkeeper")
}

/// The session limits and their values (RELIABILITY.md). Sent as startup
/// `options` on a direct connection; through a transaction-mode pooler,
/// which refuses startup `options`, they must be set on the role.
pub const SESSION_LIMITS: [(&str, &str); 3] = [
    ("statement_timeout", "15s"),
    ("lock_timeout", "5s"),
    ("idle_in_transaction_session_timeout", "30s"),
];

/// Options behind a pooler: no startup `options` (PgBouncer refuses them);
/// the limits come from the role instead (`check_role_limits`). The
/// statement cache stays on: sqlx 0.9 names every prepared statement even
/// with `statement_cache_capacity(0)` (it only stops closing them), so
/// turning the cache off does not help a transaction-mode pooler; what does
/// is a pooler that tracks prepared statements (`check_statement_support`).
pub fn for_pooler(opts: PgConnectOptions) -> PgConnectOptions {
    opts.application_name("poolkeeper")
}

/// The application's pool, direct (`pooler = false`: limits as startup
/// options) or through a pooler.
pub async fn connect_app(
    opts: PgConnectOptions,
    max_connections: u32,
    acquire_timeout: Duration,
    pooler: bool,
) -> Result<PgPool, sqlx::Error> {
    if !pooler {
        return connect_with_acquire_timeout(opts, max_connections, acquire_timeout).await;
    }
    PgPoolOptions::new()
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(acquire_timeout)
        .connect_with(for_pooler(opts))
        .await
}

/// The session limits a pooled session does not have, as the SQL that sets
/// them on the role; empty when every limit is in force (set, and no looser
/// than RELIABILITY.md's).
pub async fn missing_role_limits(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    // One round trip; pg_settings gives the values in milliseconds.
    let rows: Vec<(String, i64, String)> = sqlx::query_as(
        "SELECT name, setting::bigint, current_user::text FROM pg_settings
          WHERE name IN ('statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout')",
    )
    .fetch_all(pool)
    .await?;
    let mut missing = Vec::new();
    for (name, wanted) in SESSION_LIMITS {
        let wanted_ms = parse_ms(wanted);
        let row = rows.iter().find(|(n, _, _)| n == name);
        let ok = row.is_some_and(|(_, ms, _)| *ms > 0 && *ms <= wanted_ms);
        if !ok {
            let role = row
                .map(|(_, _, r)| r.as_str())
                .or_else(|| rows.first().map(|(_, _, r)| r.as_str()))
                .unwrap_or("poolkeeper_app");
            missing.push(format!(
                "ALTER ROLE {} SET {name} = '{wanted}';",
                quote_ident(role)
            ));
        }
    }
    Ok(missing)
}

fn parse_ms(v: &str) -> i64 {
    v.trim_end_matches('s').parse::<i64>().unwrap_or(0) * 1000
}

fn quote_ident(name: &str) -> String {
    let plain = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain && !name.is_empty() {
        name.to_owned()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// Through a transaction-mode pooler, refuses to start unless the pooler
/// keeps prepared statements apart per client (PgBouncer >= 1.21 with
/// `max_prepared_statements`, which renames them `PGBOUNCER_n` on the
/// server). Without that, sqlx's statements (prepared in one round trip,
/// executed in the next) land on server sessions shared with other
/// clients: `tests/api/pgbouncer.rs` shows PgBouncer 1.18 giving "already
/// exists" errors and, with unnamed statements, another client's answer.
/// The probe is deterministic: within one transaction the server session
/// is ours, and it shows the statement under sqlx's own name or not.
pub async fn check_statement_support(pool: &PgPool) -> anyhow::Result<()> {
    let refusal = || {
        anyhow::anyhow!(
            "POOLKEEPER_DB_POOLER=transaction: the pooler passes prepared statements through to \
             shared server sessions, where they would run for other clients. Use PgBouncer 1.21 \
             or later with max_prepared_statements = 200 (or more), or pool_mode = session with \
             POOLKEEPER_DB_POOLER=session"
        )
    };
    let mut tx = pool.begin().await?;
    let probe: Result<(i32, i64), sqlx::Error> = sqlx::query_as(
        "SELECT $1::int4, (SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'sqlx_s_%')",
    )
    .bind(1)
    .fetch_one(&mut *tx)
    .await;
    match probe {
        Ok((_, passed_through)) => {
            tx.rollback().await?;
            if passed_through > 0 {
                return Err(refusal());
            }
            Ok(())
        }
        // Another client's statement of the same name already sits on
        // this server session: the same diagnosis, seen from the other side.
        Err(e) if sqlstate(&e).as_deref() == Some("42P05") => Err(refusal()),
        Err(e) => Err(e.into()),
    }
}

/// Through a pooler, refuses to go on unless the role carries the limits,
/// naming the SQL to run: silently running without them would let one stuck
/// statement hold rows and connections for ever (RELIABILITY.md).
pub async fn check_role_limits(pool: &PgPool) -> anyhow::Result<()> {
    let missing = missing_role_limits(pool).await?;
    if missing.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "POOLKEEPER_DB_POOLER: a pooler cannot pass the session limits, \
         and the role does not carry them. As the owner or an administrator, run:\n  {}\n\
         then reconnect the pooler's server connections (PgBouncer: RECONNECT)",
        missing.join("\n  ")
    )
}

pub fn parse_url(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    PgConnectOptions::from_str(url)
}

/// How long a request waits for a pooled connection by default: past it the
/// answer is `503` with `Retry-After` (error.rs), not a hung request.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

/// The application's pool.
pub async fn connect(opts: PgConnectOptions, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    connect_with_acquire_timeout(opts, max_connections, DEFAULT_ACQUIRE_TIMEOUT).await
}

/// The application's pool, waiting at most `acquire_timeout` for a
/// connection (`POOLKEEPER_DB_ACQUIRE_SECONDS`). Every connection carries the
/// session limits; the sweep's own pool clones these options.
pub async fn connect_with_acquire_timeout(
    opts: PgConnectOptions,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        // No ping before handing out a pooled connection: it was a round
        // trip on every request. A connection that broke while idle fails
        // its first statement instead, with an I/O error or SQLSTATE 57P01,
        // which `is_unavailable` maps to 503 with Retry-After; the pool then
        // drops it and the retry gets a fresh one.
        .test_before_acquire(false)
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(acquire_timeout)
        .connect_with(with_session_limits(opts))
        .await
}

/// Runs the migrations and the lease purge under one advisory lock, so that
/// replicas starting together migrate exactly once and wait for each other.
pub async fn migrate(opts: &PgConnectOptions) -> anyhow::Result<MigrationReport> {
    let mut conn = PgConnection::connect_with(opts).await?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(MIGRATION_LOCK_KEY)
        .execute(&mut conn)
        .await?;
    let outcome = migrate_locked(&mut conn).await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATION_LOCK_KEY)
        .execute(&mut conn)
        .await;
    let report = outcome?;
    unlocked?;
    conn.close().await?;
    Ok(report)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrationReport {
    pub applied: usize,
    pub leases_purged: u64,
}

async fn migrate_locked(conn: &mut PgConnection) -> anyhow::Result<MigrationReport> {
    let before = applied_versions(conn).await?;
    MIGRATOR.run(&mut *conn).await?;
    let after = applied_versions(conn).await?;
    // L5: purge keys whose lease expired more than 24 h ago. The fence comes
    // from a sequence, so a purged key that is claimed again still gets a
    // higher fence than any issued before.
    let purged = purge_leases(&mut *conn).await?;
    Ok(MigrationReport {
        applied: after.saturating_sub(before),
        leases_purged: purged,
    })
}

async fn applied_versions(conn: &mut PgConnection) -> Result<usize, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(0);
    }
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(&mut *conn)
        .await?;
    Ok(n as usize)
}

/// What `serve` and the other commands do with the schema at start-up.
///
/// When every migration is already applied, nothing needs DDL or a session:
/// only the L5 purge runs, as one statement on the application's own
/// connection (the least-privileged role has DELETE on `leases`; concurrent
/// purges by replicas starting together delete each row once). Otherwise
/// the migrations run under the advisory lock on `migration` (a direct
/// session as the owner: `POOLKEEPER_MIGRATION_DATABASE_URL`, or
/// `DATABASE_URL` when no pooler is in between); without one, start-up
/// fails and says what to set.
pub async fn prepare_schema(
    migration: Option<&PgConnectOptions>,
    app: &PgPool,
) -> anyhow::Result<MigrationReport> {
    let current = match migrations_current(app).await {
        Ok(current) => current,
        // A database never migrated has no _sqlx_migrations (42P01).
        Err(e) if sqlstate(&e).as_deref() == Some("42P01") => false,
        Err(e) => return Err(e.into()),
    };
    if !current {
        let Some(opts) = migration else {
            anyhow::bail!(
                "migrations are pending and there is no direct session to run them: \
                 set POOLKEEPER_MIGRATION_DATABASE_URL to a direct URL (not through the pooler) \
                 of the owner role, or run `poolkeeper migrate` with it first"
            );
        };
        return migrate(opts).await;
    }
    let purged = purge_leases(app).await?;
    Ok(MigrationReport {
        applied: 0,
        leases_purged: purged,
    })
}

/// L5: purge keys whose lease expired more than 24 h ago.
async fn purge_leases<'c>(db: impl sqlx::PgExecutor<'c>) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "DELETE FROM leases WHERE expires_at < clock_timestamp() - make_interval(secs => $1)",
    )
    .bind(LEASE_RETENTION.as_secs_f64())
    .execute(db)
    .await?
    .rows_affected())
}

/// True when every embedded migration is applied (for `/readyz`).
pub async fn migrations_current(pool: &PgPool) -> Result<bool, sqlx::Error> {
    let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied: Option<i64> =
        sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(pool)
            .await?;
    Ok(applied.unwrap_or(0) >= latest)
}

/// The database error inside `err`, found by walking its cause chain: our
/// own error types wrap sqlx's, which wraps the driver's (R6).
pub fn database_error<'a>(
    err: &'a (dyn StdError + 'static),
) -> Option<&'a dyn sqlx::error::DatabaseError> {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>() {
            return Some(db.as_ref());
        }
        current = e.source();
    }
    None
}

/// The name of the unique constraint or index that `err` violated, if that
/// is what happened (SQLSTATE 23505).
pub fn violated_unique<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a str> {
    let db = database_error(err)?;
    if db.code().as_deref() != Some("23505") {
        return None;
    }
    db.constraint()
}

/// SQLSTATE of the database error inside `err`.
pub fn sqlstate(err: &(dyn StdError + 'static)) -> Option<String> {
    database_error(err)?.code().map(|c| c.into_owned())
}

/// Errors that mean "the database is unreachable or overloaded right now":
/// the honest answer is 503 with Retry-After, not 500.
pub fn is_unavailable(err: &(dyn StdError + 'static)) -> bool {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(sqlx_err) = e.downcast_ref::<sqlx::Error>() {
            return match sqlx_err {
                sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
                sqlx::Error::Database(db) => matches!(
                    db.code().as_deref(),
                    // admin shutdown, cannot connect now, too many connections,
                    // query cancelled (statement_timeout), lock_timeout
                    Some("57P01" | "57P02" | "57P03" | "53300" | "57014" | "55P03")
                ),
                _ => false,
            };
        }
        current = e.source();
    }
    false
}
