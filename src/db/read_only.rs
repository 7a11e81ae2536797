//! F2: a connection never reaches a server that cannot write. New
//! connections check that they reached the primary; a statement that met a
//! read-only server closes every connection opened before it.

use std::error::Error as StdError;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnectionMetadata;
use sqlx::postgres::PgPoolOptions;

use super::errors::{Classified, DbFailure, classify};

/// F2: the statement every new connection runs first (a simple query: one
/// round trip, no prepared statement, so it is safe through any pooler).
/// A standby, a primary restarting read-only, or a server whose sessions
/// default to read-only answers true, and the connection is refused.
/// Its second column says whether F5's check is installed
/// (`incarnation::PRESENT`), which then runs before the connection is
/// handed out.
const PRIMARY_CHECK: &str = "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool, \
                    to_regprocedure('incarnation_verify()') IS NOT NULL";

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
                    to_regprocedure('incarnation_verify()') IS NOT NULL, \
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
                // F5: a restored copy advances its sequences before this
                // connection hands out anything; an error refuses it.
                let present: bool = sqlx::Row::try_get(&row, 1)?;
                super::incarnation::verify_connection(conn, present).await?;
                Ok(())
            })
        })
        .before_acquire(|_, meta| {
            Box::pin(async move {
                Ok(
                    !opened_before_read_only(&meta)
                        && !super::incarnation::opened_unverified(&meta),
                )
            })
        })
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

pub(super) fn note_read_only_now() {
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
    note_read_only_failure(&classify(err))
}

/// `note_read_only` for a failure already classified.
pub fn note_read_only_failure(failure: &Classified<'_>) -> bool {
    if failure.failure == DbFailure::ReadOnly {
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
