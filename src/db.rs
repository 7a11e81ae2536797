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
    let purged = sqlx::query(
        "DELETE FROM leases WHERE expires_at < clock_timestamp() - make_interval(secs => $1)",
    )
    .bind(LEASE_RETENTION.as_secs_f64())
    .execute(&mut *conn)
    .await?
    .rows_affected();
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
