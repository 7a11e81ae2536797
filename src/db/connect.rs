//! Connecting: the application's pools (direct, or behind a pooler), the
//! session limits every connection carries, and the checks that a pooled
//! role has them and that statements run as the deployment says.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::errors::sqlstate;
use super::handle::Db;
use super::read_only::primary_only;

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

/// The application's pool, waiting for a connection as long as the
/// settings' default (`POOLKEEPER_DB_ACQUIRE_SECONDS`): past it the answer
/// is `503` with `Retry-After` (error.rs), not a hung request.
pub async fn connect(opts: PgConnectOptions, max_connections: u32) -> Result<Db, sqlx::Error> {
    let acquire_timeout = crate::settings::Settings::defaults().db_acquire_timeout;
    connect_with_acquire_timeout(opts, max_connections, acquire_timeout).await
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
        // which `classify` reads as unavailable (503 with Retry-After); the
        // pool then drops it and the retry gets a fresh one.
        .test_before_acquire(false)
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(acquire_timeout)
}
