//! Start-up schema work: the embedded migrations (with the legacy
//! checksums rewritten), the SQL definitions and the lease purge of L5,
//! under one advisory lock so that replicas starting together migrate once.

use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

use super::errors::sqlstate;
use super::handle::Db;

/// The migrations, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The advisory lock that serialises start-up work across replicas: the
/// migrations, the SQL definitions and the lease purge of L5. An arbitrary constant, 'pool' 'kpr'.
pub const MIGRATION_LOCK_KEY: i64 = 0x0070_6f6f_6c6b_7072;

/// Keys whose lease expired more than this long ago are purged at start-up (L5).
pub const LEASE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The migrations whose files lost their functions to `sql/`,
/// with the SHA-384 sqlx recorded for them before: version, legacy checksum
/// (hex). Frozen copies of those files: tests/fixtures/migrations-2026-12-03.
pub const LEGACY_CHECKSUMS: [(i64, &str); 4] = [
    (
        20261203000001,
        "1cb6956d31238c3f40161505f9f8ccc939cca7e8bab2e31c74146150bb5c327c8ec24e123fbc888fcd4916e33733e678",
    ),
    (
        20261203000005,
        "2c2e593524b05c6770aad9d76f5cb50237a714919cb13e694fe0ba5f8a859817525cc1fe08a020cd372b7ac7e2a32a51",
    ),
    (
        20261203000006,
        "1371de51bd316b09fe939f23db124ed7f19fe28708fc4d428fde05c2ed76484d3bdb5f87b52dbb4e2d4d6f8b36eff84d",
    ),
    (
        20261203000007,
        "68a4cd4e3571b4ed2aaba83c7dc06d2424d4cfb8a61c0ff0d621df86f15462c07c8d6773313af5623c149e6d44ce2146",
    ),
];

/// Runs the migrations, the SQL definitions and the lease purge under one
/// advisory lock, so that replicas starting together migrate exactly once
/// and wait for each other.
pub async fn migrate(opts: &PgConnectOptions) -> anyhow::Result<MigrationReport> {
    migrate_with(opts, &super::definitions::DefinitionSet::embedded()?).await
}

/// `migrate` with a given definition set (tests install newer and older ones).
pub async fn migrate_with(
    opts: &PgConnectOptions,
    definitions: &super::definitions::DefinitionSet,
) -> anyhow::Result<MigrationReport> {
    let mut conn = PgConnection::connect_with(opts).await?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(MIGRATION_LOCK_KEY)
        .execute(&mut conn)
        .await?;
    let outcome = migrate_locked(&mut conn, definitions).await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATION_LOCK_KEY)
        .execute(&mut conn)
        .await;
    let report = outcome?;
    unlocked?;
    conn.close().await?;
    Ok(report)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    pub applied: usize,
    /// Legacy checksums rewritten to the current files' (`LEGACY_CHECKSUMS`).
    pub checksums_rewritten: u64,
    /// What happened to the SQL definitions; `None` when they were not
    /// looked at by the migrator (already current, seen by the app role).
    pub definitions: Option<super::definitions::Outcome>,
    pub leases_purged: u64,
}

async fn migrate_locked(
    conn: &mut PgConnection,
    definitions: &super::definitions::DefinitionSet,
) -> anyhow::Result<MigrationReport> {
    // The decision is made again here, under the lock: another replica
    // may have migrated since `prepare_schema` looked. A newer release's
    // migrations (versions this binary does not know) mean the database
    // is ahead: an older binary starting beside a newer one, mid-rollout.
    // It applies nothing (sqlx would refuse the unknown versions), says so,
    // and serves; its definitions are left to `definitions::apply`, which
    // never puts older ones back.
    let ours = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let newest = newest_applied(conn).await?;
    if newest > ours {
        tracing::warn!(
            database = newest,
            ours,
            "the database is ahead of this binary (a newer release migrated it): \
             applying no migration, serving with the schema as it is"
        );
        let definitions = super::definitions::apply(conn, definitions).await?;
        let purged = purge_leases(&mut *conn).await?;
        return Ok(MigrationReport {
            applied: 0,
            checksums_rewritten: 0,
            definitions: Some(definitions),
            leases_purged: purged,
        });
    }
    let before = applied_versions(conn).await?;
    let rewritten = rewrite_legacy_checksums(conn).await?;
    MIGRATOR.run(&mut *conn).await?;
    let after = applied_versions(conn).await?;
    // The definitions after the migrations: they use the tables and types.
    let definitions = super::definitions::apply(conn, definitions).await?;
    // L5: purge keys whose lease expired more than 24 h ago. The fence comes
    // from a sequence, so a purged key that is claimed again still gets a
    // higher fence than any issued before.
    let purged = purge_leases(&mut *conn).await?;
    Ok(MigrationReport {
        applied: after.saturating_sub(before),
        checksums_rewritten: rewritten,
        definitions: Some(definitions),
        leases_purged: purged,
    })
}

/// The migrations of `LEGACY_CHECKSUMS` were applied, on databases made
/// before the functions moved to `sql/`, from files that still held them; their files
/// now hold only the schema, so sqlx would refuse their checksums. A
/// recorded checksum equal to exactly the legacy one becomes the new file's
/// (what the migration did to the schema is unchanged; its functions are
/// now the definitions'); any other mismatch is left for sqlx to refuse.
async fn rewrite_legacy_checksums(conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(0);
    }
    let mut rewritten = 0;
    for (version, legacy) in LEGACY_CHECKSUMS {
        let Some(current) = MIGRATOR.iter().find(|m| m.version == version) else {
            continue;
        };
        rewritten += sqlx::query(
            "UPDATE _sqlx_migrations SET checksum = $2
              WHERE version = $1 AND checksum = decode($3, 'hex')",
        )
        .bind(version)
        .bind(current.checksum.as_ref())
        .bind(legacy)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    }
    Ok(rewritten)
}

/// The newest migration version applied (0: none, or never migrated).
async fn newest_applied(conn: &mut PgConnection) -> Result<i64, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(0);
    }
    let newest: Option<i64> =
        sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(&mut *conn)
            .await?;
    Ok(newest.unwrap_or(0))
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
/// When every migration is already applied and the SQL definitions are
/// current (or newer than ours: an older binary during a rolling deploy,
/// which applies nothing), nothing needs DDL or a session:
/// only the L5 purge runs, as one statement on the application's own
/// connection (the least-privileged role has DELETE on `leases`; concurrent
/// purges by replicas starting together delete each row once). Otherwise
/// the migrations and definitions run under the advisory lock on
/// `migration` (a direct session as the owner:
/// `POOLKEEPER_MIGRATION_DATABASE_URL`, or `DATABASE_URL` when no pooler is
/// in between); without one, start-up fails and says what to set.
pub async fn prepare_schema(
    migration: Option<&PgConnectOptions>,
    app: &Db,
) -> anyhow::Result<MigrationReport> {
    prepare_schema_with(
        migration,
        app,
        &super::definitions::DefinitionSet::embedded()?,
    )
    .await
}

/// `prepare_schema` with a given definition set.
pub async fn prepare_schema_with(
    migration: Option<&PgConnectOptions>,
    app: &Db,
    definitions: &super::definitions::DefinitionSet,
) -> anyhow::Result<MigrationReport> {
    use super::definitions::Status;
    let current = match migrations_current(app).await {
        Ok(current) => current,
        // A database never migrated has no _sqlx_migrations (42P01).
        Err(e) if sqlstate(&e).as_deref() == Some("42P01") => false,
        Err(e) => return Err(e.into()),
    };
    let pending = if current {
        match super::definitions::status(app, definitions).await? {
            Status::Current => None,
            Status::Newer { installed, ours } => {
                super::definitions::warn_newer(installed, ours);
                None
            }
            Status::Pending { files, .. } => Some(format!(
                "SQL definitions are pending ({})",
                files.join(", ")
            )),
        }
    } else {
        Some("migrations are pending".to_owned())
    };
    if let Some(what) = pending {
        let Some(opts) = migration else {
            anyhow::bail!(
                "{what} and there is no direct session to run them: \
                 set POOLKEEPER_MIGRATION_DATABASE_URL to a direct URL (not through the pooler) \
                 of the owner role, or run `poolkeeper migrate` with it first"
            );
        };
        return migrate_with(opts, definitions).await;
    }
    let purged = purge_leases(app).await?;
    Ok(MigrationReport {
        applied: 0,
        checksums_rewritten: 0,
        definitions: None,
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
pub async fn migrations_current(pool: &Db) -> Result<bool, sqlx::Error> {
    let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied: Option<i64> =
        sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(pool)
            .await?;
    Ok(applied.unwrap_or(0) >= latest)
}
