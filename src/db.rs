//! Connections, migrations, and the one place that reads database errors.

use std::error::Error as StdError;
use std::str::FromStr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, TryFutureExt};
use futures_util::stream::{BoxStream, TryStreamExt};
use sqlx::migrate::Migrator;
use sqlx::pool::{PoolConnection, PoolConnectionMetadata};
use sqlx::postgres::{
    PgConnectOptions, PgPool, PgPoolOptions, PgQueryResult, PgRow, PgStatement, PgTypeInfo,
};
use sqlx::{Connection, Either, Execute, Executor, PgConnection, Postgres, SqlStr, Transaction};

/// The migrations, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The advisory lock that serialises start-up work across replicas: the
/// migrations, the SQL definitions and the lease purge of L5. An arbitrary constant, 'pool' 'kpr'.
pub const MIGRATION_LOCK_KEY: i64 = 0x0070_6f6f_6c6b_7072;

/// Keys whose lease expired more than this long ago are purged at start-up (L5).
pub const LEASE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The session limits and their values (RELIABILITY.md): no statement, lock
/// wait or idle transaction may hold a connection (and the rows it locked)
/// for long. Sent as startup `options` on a direct connection; through a
/// pooler, which refuses startup `options`, they must be set on the role.
pub const SESSION_LIMITS: [(&str, &str); 3] = [
    ("statement_timeout", "15s"),
    ("lock_timeout", "5s"),
    ("idle_in_transaction_session_timeout", "30s"),
];

/// Per-connection limits (`SESSION_LIMITS`), as startup options.
pub fn with_session_limits(opts: PgConnectOptions) -> PgConnectOptions {
    opts.options(SESSION_LIMITS).application_name("poolkeeper")
}

/// Options behind a pooler: no startup `options` (PgBouncer refuses them);
/// the limits come from the role instead (`check_role_limits`).
pub fn for_pooler(opts: PgConnectOptions) -> PgConnectOptions {
    opts.application_name("poolkeeper")
}

/// The application's database, direct (`pooler = false`: limits as startup
/// options) or through a pooler; `pinned` turns the statement cache off and
/// runs every statement in a transaction (`Db`).
pub async fn connect_app(
    opts: PgConnectOptions,
    max_connections: u32,
    acquire_timeout: Duration,
    pooler: bool,
    pinned: bool,
) -> Result<Db, sqlx::Error> {
    let opts = if pinned {
        opts.statement_cache_capacity(0)
    } else {
        opts
    };
    if !pooler {
        let pool = connect_pool(opts, max_connections, acquire_timeout).await?;
        return Ok(Db::new(pool, pinned));
    }
    // Unlike `connect_pool`, this pool keeps sqlx's ping before acquire
    // (one round trip per request; what BENCHMARKS.md item 8 measured).
    let pool = primary_only(PgPoolOptions::new(), None)
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(acquire_timeout)
        .connect_with(for_pooler(opts))
        .await?;
    Ok(Db::new(pool, pinned))
}

/// The session limits a pooled session does not have, as the SQL that sets
/// them on the role; empty when every limit is in force (set, and no looser
/// than RELIABILITY.md's).
pub async fn missing_role_limits(pool: &Db) -> Result<Vec<String>, sqlx::Error> {
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

/// Through a transaction-mode pooler, checks that the way statements run
/// suits the pooler, and refuses to start otherwise.
///
/// - Statement cache on (the default): the pooler must keep prepared
///   statements apart per client (PgBouncer >= 1.21 with
///   `max_prepared_statements`, which renames them `PGBOUNCER_n` on the
///   server). One that passes them through to shared server sessions
///   (PgBouncer 1.18) would run another client's statement of the same name:
///   refused, pointing to `POOLKEEPER_DB_STATEMENT_CACHE=off`.
/// - Statement cache off (`Db` pinned): the pooler must pass statements
///   through, because each pinned transaction starts with `DEALLOCATE ALL`,
///   which would remove the statements a tracking pooler believes it has
///   prepared on the server: refused, pointing to the cache on.
///
/// The probe is deterministic: within one transaction the server session
/// is ours, and it shows the statement under sqlx's own name or not.
pub async fn check_statement_support(db: &Db) -> anyhow::Result<()> {
    let passes_through = || {
        anyhow::anyhow!(
            "POOLKEEPER_DB_POOLER=transaction: the pooler passes prepared statements through to \
             shared server sessions, where cached statements would run for other clients. Set \
             POOLKEEPER_DB_STATEMENT_CACHE=off (every statement then runs in its own transaction), \
             or use PgBouncer 1.21 or later with max_prepared_statements = 200 (or more), or \
             pool_mode = session with POOLKEEPER_DB_POOLER=session"
        )
    };
    let tracks = || {
        anyhow::anyhow!(
            "POOLKEEPER_DB_STATEMENT_CACHE=off: the pooler tracks prepared statements \
             (max_prepared_statements), and the pinned transactions' DEALLOCATE ALL would drop \
             them behind its back. Leave the statement cache on (POOLKEEPER_DB_STATEMENT_CACHE=on)"
        )
    };
    let mut tx = db.begin().await?;
    let probe: Result<(i32, i64), sqlx::Error> = sqlx::query_as(
        "SELECT $1::int4, (SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'sqlx_s_%')",
    )
    .bind(1)
    .fetch_one(&mut *tx)
    .await;
    match probe {
        Ok((_, passed_through)) => {
            tx.rollback().await?;
            match (db.is_pinned(), passed_through > 0) {
                (false, true) => Err(passes_through()),
                (true, false) => Err(tracks()),
                _ => Ok(()),
            }
        }
        // Another client's statement of the same name already sits on
        // this server session: the same diagnosis, seen from the other side.
        Err(e) if sqlstate(&e).as_deref() == Some("42P05") && !db.is_pinned() => {
            Err(passes_through())
        }
        Err(e) => Err(e.into()),
    }
}

/// Through a pooler, refuses to go on unless the role carries the limits,
/// naming the SQL to run: silently running without them would let one stuck
/// statement hold rows and connections for ever (RELIABILITY.md).
pub async fn check_role_limits(pool: &Db) -> anyhow::Result<()> {
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
pub async fn connect(opts: PgConnectOptions, max_connections: u32) -> Result<Db, sqlx::Error> {
    connect_with_acquire_timeout(opts, max_connections, DEFAULT_ACQUIRE_TIMEOUT).await
}

/// The application's database, direct, waiting at most `acquire_timeout`
/// for a connection (`POOLKEEPER_DB_ACQUIRE_SECONDS`).
pub async fn connect_with_acquire_timeout(
    opts: PgConnectOptions,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<Db, sqlx::Error> {
    Ok(Db::direct(
        connect_pool(opts, max_connections, acquire_timeout).await?,
    ))
}

/// `connect_with_acquire_timeout`, opening no connection until one is
/// needed (the F2 test starts it against a server that refuses writes).
pub fn connect_lazy(opts: PgConnectOptions, max_connections: u32, acquire_timeout: Duration) -> Db {
    Db::direct(
        direct_pool_options(max_connections, acquire_timeout)
            .connect_lazy_with(with_session_limits(opts)),
    )
}

/// A direct pool. Every connection carries the session limits; the
/// workers' own pools clone these options.
async fn connect_pool(
    opts: PgConnectOptions,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<PgPool, sqlx::Error> {
    direct_pool_options(max_connections, acquire_timeout)
        .connect_with(with_session_limits(opts))
        .await
}

fn direct_pool_options(max_connections: u32, acquire_timeout: Duration) -> PgPoolOptions {
    primary_only(PgPoolOptions::new(), None)
        // No ping before handing out a pooled connection: it was a round
        // trip on every request. A connection that broke while idle fails
        // its first statement instead, with an I/O error or SQLSTATE 57P01,
        // which `is_unavailable` maps to 503 with Retry-After; the pool then
        // drops it and the retry gets a fresh one.
        .test_before_acquire(false)
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(acquire_timeout)
}

/// F2: the statement every new connection runs first (a simple query: one
/// round trip, no prepared statement, so it is safe through any pooler).
/// A standby, a primary restarting read-only, or a server whose sessions
/// default to read-only answers true, and the connection is refused.
const PRIMARY_CHECK: &str =
    "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool";

/// F2: pool options that never hand out a connection to a server that
/// cannot write. sqlx's ping before acquire passes on a standby, so:
///
/// - `after_connect` runs `PRIMARY_CHECK` (with the worker's shorter
///   `statement_timeout` in the same simple query when one is given); a
///   connection that reached a read-only server is closed, and sqlx retries
///   the connect with backoff until the acquire timeout, past which the
///   request gets 503 with Retry-After (the endpoint usually follows the new
///   leader well within it);
/// - `before_acquire` closes every idle connection opened before the last
///   time a statement met a read-only server (`note_read_only`): the
///   endpoint moved, and they may all lead to the demoted node. No round
///   trip: it compares two instants.
pub fn primary_only(options: PgPoolOptions, statement_timeout: Option<Duration>) -> PgPoolOptions {
    let check = match statement_timeout {
        // The value is a number of milliseconds, written by us.
        Some(t) => format!(
            "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool, \
                    set_config('statement_timeout', '{}ms', false)",
            t.as_millis()
        ),
        None => PRIMARY_CHECK.to_owned(),
    };
    options
        .after_connect(move |conn, _| {
            let check = check.clone();
            Box::pin(async move {
                let row = sqlx::raw_sql(sqlx::AssertSqlSafe(check))
                    .fetch_one(&mut *conn)
                    .await?;
                let read_only: bool = sqlx::Row::try_get(&row, 0)?;
                if read_only {
                    note_read_only_now();
                    return Err(sqlx::Error::Protocol(
                        "the server is read-only or in recovery: not the primary (F2)".to_owned(),
                    ));
                }
                Ok(())
            })
        })
        .before_acquire(|_, meta| Box::pin(async move { Ok(!opened_before_read_only(&meta)) }))
}

/// When a statement last met a read-only server, in nanoseconds since
/// `clock_base()` (0: never). Process-wide: every pool of a process points
/// at the same endpoint; a pool of another database (tests) only reconnects.
static READ_ONLY_SEEN: AtomicU64 = AtomicU64::new(0);

fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// F2, for `/metrics`: new connections that reached a read-only server.
pub static READ_ONLY_SEEN_TOTAL: std::sync::LazyLock<prometheus::IntCounter> =
    std::sync::LazyLock::new(|| {
        prometheus::IntCounter::new(
            "poolkeeper_db_read_only_seen_total",
            "Times a new connection reached a read-only server or a standby (F2: a failover under way)",
        )
        .expect("static metric definition")
    });

/// For `/metrics`: the wait for a pooled connection (through BEGIN when
/// pinned).
pub static ACQUIRE_WAIT: std::sync::LazyLock<prometheus::Histogram> =
    std::sync::LazyLock::new(|| {
        prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "poolkeeper_db_acquire_seconds",
                "Time the API waited for a pooled connection (through BEGIN when pinned)",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
        )
        .expect("static metric definition")
    });

fn note_read_only_now() {
    READ_ONLY_SEEN_TOTAL.inc();
    let base = clock_base();
    let now = u64::try_from(base.elapsed().as_nanos())
        .unwrap_or(u64::MAX)
        .max(1);
    READ_ONLY_SEEN.fetch_max(now, Ordering::Relaxed);
}

/// F2: records that `err` came from a read-only server (SQLSTATE 25006):
/// every connection opened before now is closed at its next acquire.
/// True when it did.
pub fn note_read_only(err: &(dyn StdError + 'static)) -> bool {
    if sqlstate(err).as_deref() == Some("25006") {
        note_read_only_now();
        return true;
    }
    false
}

fn opened_before_read_only(meta: &PoolConnectionMetadata) -> bool {
    let seen = READ_ONLY_SEEN.load(Ordering::Relaxed);
    if seen == 0 {
        return false;
    }
    let seen_at = clock_base() + Duration::from_nanos(seen);
    match Instant::now().checked_sub(meta.age) {
        Some(opened_at) => opened_at <= seen_at,
        None => true,
    }
}

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
    migrate_with(opts, &crate::definitions::DefinitionSet::embedded()?).await
}

/// `migrate` with a given definition set (tests install newer and older ones).
pub async fn migrate_with(
    opts: &PgConnectOptions,
    definitions: &crate::definitions::DefinitionSet,
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
    pub definitions: Option<crate::definitions::Outcome>,
    pub leases_purged: u64,
}

async fn migrate_locked(
    conn: &mut PgConnection,
    definitions: &crate::definitions::DefinitionSet,
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
        let definitions = crate::definitions::apply(conn, definitions).await?;
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
    let definitions = crate::definitions::apply(conn, definitions).await?;
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

/// `BEGIN` for a pinned transaction: the statement that follows `BEGIN`
/// drops whatever prepared statements an earlier client of the pooler left
/// on this server session, so that sqlx's names (`sqlx_s_N`, numbered per
/// client connection) cannot collide with them. One round trip: both run
/// as one simple query.
const PINNED_BEGIN: &str = "BEGIN; DEALLOCATE ALL";

/// The application's database: a pool, and how its statements must run
/// through whatever sits in front of PostgreSQL.
///
/// Direct, or behind a pooler that keeps a client's server session (or
/// tracks prepared statements), statements run as sqlx runs them: prepared
/// once per connection, then one round trip each.
///
/// *Pinned* (`POOLKEEPER_DB_STATEMENT_CACHE=off`), for a transaction-mode
/// pooler that passes prepared statements through to shared server
/// sessions (PgBouncer 1.18): sqlx prepares a statement in one round trip
/// and executes it in the next, and such a pooler may hand each round trip
/// to a different server session, where another client's statement of the
/// same name runs instead (`tests/api/pgbouncer.rs`). So every statement
/// runs inside an explicit transaction, which keeps one server session for
/// the client until it ends, begun by `PINNED_BEGIN`; and nothing is cached
/// (`statement_cache_capacity(0)`), so no statement is ever executed in a
/// later transaction than the one that prepared it. A statement on `&Db`
/// is its own transaction, committed before the call returns.
#[derive(Clone, Debug)]
pub struct Db {
    pool: PgPool,
    pinned: bool,
}

impl Db {
    /// Statements run as sqlx runs them (a direct connection, or a pooler
    /// that keeps sessions or tracks prepared statements).
    pub fn direct(pool: PgPool) -> Db {
        Db {
            pool,
            pinned: false,
        }
    }

    /// Pinned (see the type's documentation) or direct, as `pinned` says;
    /// pinned, `pool`'s options must have the statement cache off.
    pub fn new(pool: PgPool, pinned: bool) -> Db {
        Db { pool, pinned }
    }

    /// Connections open, idle, and the pool's limit (for `/metrics`).
    pub fn pool_sizes(&self) -> (u32, u32, u32) {
        let idle = u32::try_from(self.pool.num_idle()).unwrap_or(u32::MAX);
        (
            self.pool.size(),
            idle,
            self.pool.options().get_max_connections(),
        )
    }

    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// A transaction; pinned, it first clears the server session's
    /// leftover prepared statements (`PINNED_BEGIN`).
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let _wait = ACQUIRE_WAIT.start_timer();
        if self.pinned {
            self.pool.begin_with(PINNED_BEGIN).await
        } else {
            self.pool.begin().await
        }
        .map_err(connection_trouble)
    }

    /// A connection for several statements in a row. Pinned, it is a
    /// transaction: what it wrote is kept only by `finish`, and dropping it
    /// unfinished rolls back, as a transaction would.
    pub async fn acquire(&self) -> Result<Conn, sqlx::Error> {
        if self.pinned {
            Ok(Conn::Pinned(self.begin().await?))
        } else {
            let _wait = ACQUIRE_WAIT.start_timer();
            Ok(Conn::Direct(
                self.pool.acquire().await.map_err(connection_trouble)?,
            ))
        }
    }

    /// A background worker's own small pool (the sweep's, the webhook
    /// worker's), lazily connecting and pinned as this one is, so that the
    /// HTTP load cannot starve the worker. It waits for a connection no
    /// longer than the worker's call bound, and each session gets the
    /// worker's shorter `statement_timeout` (both from its lease timings).
    /// Not through a transaction-mode pooler: there a session-level SET
    /// would stay on the server session and reach other clients'
    /// transactions, so the worker keeps the role's limits and relies on its
    /// client-side call bound.
    pub fn worker_pool(
        &self,
        application_name: &str,
        max_connections: u32,
        call_timeout: std::time::Duration,
        statement_timeout: std::time::Duration,
        transaction_pooler: bool,
    ) -> Db {
        let options = (*self.pool.connect_options())
            .clone()
            .application_name(application_name);
        let builder = |statement_timeout| {
            primary_only(PgPoolOptions::new(), statement_timeout)
                .max_connections(max_connections)
                .min_connections(0)
                .acquire_timeout(call_timeout)
        };
        if transaction_pooler {
            return Db::new(builder(None).connect_lazy_with(options), self.pinned);
        }
        let pool = builder(Some(statement_timeout)).connect_lazy_with(options);
        Db::new(pool, self.pinned)
    }

    pub async fn close(&self) {
        self.pool.close().await
    }

    pub fn connect_options(&self) -> std::sync::Arc<PgConnectOptions> {
        self.pool.connect_options()
    }
}

/// A connection from `Db::acquire`: the pool's connection, or, pinned, a
/// transaction on it.
pub enum Conn {
    Direct(PoolConnection<Postgres>),
    Pinned(Transaction<'static, Postgres>),
}

impl Conn {
    /// After `err` on this connection: when the server turned out read-only
    /// (F2), the connection is closed instead of going back to the pool,
    /// and so are the pool's older ones (`note_read_only`).
    pub fn failed(&mut self, err: &sqlx::Error) {
        if note_read_only(err)
            && let Conn::Direct(c) = self
        {
            c.close_on_drop();
        }
    }

    /// Keeps what was written: pinned, commits; direct, each statement
    /// already committed on its own.
    pub async fn finish(self) -> Result<(), sqlx::Error> {
        match self {
            Conn::Direct(_) => Ok(()),
            Conn::Pinned(tx) => tx.commit().await,
        }
    }
}

impl std::ops::Deref for Conn {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match self {
            Conn::Direct(c) => c,
            Conn::Pinned(t) => t,
        }
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Conn::Direct(c) => c,
            Conn::Pinned(t) => t,
        }
    }
}

impl<'c> Executor<'c> for &'c Db {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pinned {
            return Box::pin(
                self.pool
                    .fetch_many(query)
                    .map_err(connection_trouble)
                    .inspect_err(|e| {
                        note_read_only(e);
                    }),
            );
        }
        // Pinned: the whole answer is read inside the transaction, which
        // commits before the first row is handed out.
        Box::pin(
            futures_util::stream::once(async move {
                let mut tx = self.begin().await?;
                let steps: Vec<_> = (&mut *tx).fetch_many(query).try_collect().await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(futures_util::stream::iter(steps.into_iter().map(Ok)))
            })
            .try_flatten(),
        )
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pinned {
            return Box::pin(
                self.pool
                    .fetch_optional(query)
                    .map_err(connection_trouble)
                    .inspect_err(|e| {
                        note_read_only(e);
                    }),
            );
        }
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let row = (&mut *tx).fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.prepare_with(sql, parameters)
    }

    fn describe<'e>(
        self,
        sql: SqlStr,
    ) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.describe(sql)
    }
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
        &crate::definitions::DefinitionSet::embedded()?,
    )
    .await
}

/// `prepare_schema` with a given definition set.
pub async fn prepare_schema_with(
    migration: Option<&PgConnectOptions>,
    app: &Db,
    definitions: &crate::definitions::DefinitionSet,
) -> anyhow::Result<MigrationReport> {
    use crate::definitions::Status;
    let current = match migrations_current(app).await {
        Ok(current) => current,
        // A database never migrated has no _sqlx_migrations (42P01).
        Err(e) if sqlstate(&e).as_deref() == Some("42P01") => false,
        Err(e) => return Err(e.into()),
    };
    let pending = if current {
        match crate::definitions::status(app, definitions).await? {
            Status::Current => None,
            Status::Newer { installed, ours } => {
                crate::definitions::warn_newer(installed, ours);
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

/// A data exception (SQLSTATE class 22: invalid byte sequence, character
/// not in repertoire, numeric value out of range, invalid text
/// representation...): a value a request brought that the database cannot
/// store or compare. The boundaries answer 400, never 500, as a
/// second net behind the dashboard's `input::guard` and the API's parsers;
/// the message is PostgreSQL's, which names the problem and not the data.
pub fn bad_value(err: &(dyn StdError + 'static)) -> Option<String> {
    let db = database_error(err)?;
    db.code()
        .filter(|c| c.starts_with("22"))
        .map(|c| format!("{} (SQLSTATE {c})", db.message()))
}

/// Errors that mean "the database is unreachable or overloaded right now":
/// the honest answer is 503 with Retry-After, not 500.
pub fn is_unavailable(err: &(dyn StdError + 'static)) -> bool {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(sqlx_err) = e.downcast_ref::<sqlx::Error>() {
            return match sqlx_err {
                sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
                sqlx::Error::Database(db) => {
                    let code = db.code();
                    let code = code.as_deref().unwrap_or_default();
                    // admin shutdown, crash shutdown, cannot connect now, too
                    // many connections, query cancelled (statement_timeout),
                    // lock_timeout, read-only transaction (a standby, F2)
                    matches!(
                        code,
                        "57P01" | "57P02" | "57P03" | "53300" | "57014" | "55P03" | "25006"
                    )
                    // F3: class 40 (deadlock, serialization failure) rolled
                    // the transaction back; the same request again is safe.
                    || code.starts_with("40")
                }
                _ => false,
            };
        }
        current = e.source();
    }
    false
}

/// A connection that does not speak PostgreSQL's protocol is a connection
/// in trouble, not a bug: HAProxy with no live server behind it accepts the
/// TCP connection and closes it, which sqlx reports as a protocol error
/// ("unexpected response from SSLRequest"). Reported as the I/O error it
/// is, so that the answer is 503 with Retry-After (measured: 33,638 answers
/// `500` in one freeze of the leader before this).
pub fn connection_trouble(e: sqlx::Error) -> sqlx::Error {
    match e {
        sqlx::Error::Protocol(message) => sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            format!("the database connection broke: {message}"),
        )),
        other => other,
    }
}

/// F3: errors after which a write may or may not have committed: the
/// connection was lost (I/O error, the server terminated the session, a
/// connection exception) once the statement may have been sent. A commit
/// waiting for the synchronous standby when its session is terminated is
/// already committed locally; one on a leader that then loses its lock may
/// be gone after the failover. Only the retry can tell (R9, and the replay
/// of a transition with the same fence), so the answer says neither.
/// Errors from acquiring a connection are not this: nothing was sent.
pub fn is_outcome_unknown(err: &(dyn StdError + 'static)) -> bool {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(sqlx_err) = e.downcast_ref::<sqlx::Error>() {
            return match sqlx_err {
                sqlx::Error::Io(_) => true,
                sqlx::Error::Database(db) => {
                    let code = db.code();
                    let code = code.as_deref().unwrap_or_default();
                    // admin shutdown, crash shutdown, connection exceptions,
                    // statement completion unknown
                    matches!(code, "57P01" | "57P02" | "40003") || code.starts_with("08")
                }
                _ => false,
            };
        }
        current = e.source();
    }
    false
}
