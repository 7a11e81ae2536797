//! F5: after a restore, nothing handed out before it matches anything
//! handed out after it.
//!
//! Every new connection of every pool runs `incarnation_verify()`
//! (sql/incarnation.sql) once the primary check of F2 passed: on the
//! database the fingerprint was recorded in it is one read; on a restored
//! copy (a dump restored, a recovery to a point in time, a promotion) it
//! advances every sequence past anything issued before and records the new
//! fingerprint before the connection is handed out. `serve` and the other
//! commands run it again after the migrations (`verify`), and refuse to
//! start when it fails.
//!
//! A connection opened while the function was not there (a database not
//! yet migrated, or a dump still being restored in one transaction) is
//! never handed out after it appears: every connection opened before the
//! last such sighting is closed at its next acquire (`opened_unverified`),
//! and the new one runs the check. No round trip on the hot path.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnectionMetadata;
use sqlx::{PgConnection, PgExecutor};

/// The column F2's check adds to its query (same round trip): is the check
/// there to run?
pub const PRESENT: &str = "to_regprocedure('incarnation_verify()') IS NOT NULL";

/// The check itself.
const VERIFY: &str = "SELECT incarnation_verify()";

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incarnation {
    /// The database the fingerprint was recorded in.
    Same,
    /// First check of a fresh database: its fingerprint is recorded.
    Recorded,
    /// A new incarnation: every sequence advanced; the text says why and to
    /// what (logged).
    Advanced(String),
    /// The check is not installed (not migrated yet, or a restore under way
    /// in one transaction): the connection is used for start-up work only.
    Absent,
}

/// F5: runs the check on `conn`, a new connection that passed F2's check
/// (`present`: its `PRESENT` column). A simple query, like F2's: safe
/// through any pooler.
pub async fn verify_connection(
    conn: &mut PgConnection,
    present: bool,
) -> Result<Incarnation, sqlx::Error> {
    if !present {
        note_unverified_now();
        return Ok(Incarnation::Absent);
    }
    let row = sqlx::raw_sql(VERIFY).fetch_one(&mut *conn).await?;
    let outcome: Option<String> = sqlx::Row::try_get(&row, 0)?;
    Ok(judge(outcome))
}

fn judge(outcome: Option<String>) -> Incarnation {
    match outcome {
        None => Incarnation::Same,
        Some(s) if s == "recorded" => Incarnation::Recorded,
        Some(s) => {
            tracing::warn!(what = %s, "a new incarnation of the database (F5)");
            Incarnation::Advanced(s)
        }
    }
}

/// F5, at start-up after the migrations: the check on the application's
/// pool, whose first connection may have been opened before the check was
/// installed. An error stops the start-up: serving unchecked could hand out
/// an id or a fence a second time.
pub async fn verify<'c>(db: impl PgExecutor<'c>) -> Result<Incarnation, sqlx::Error> {
    let outcome: Option<String> = sqlx::query_scalar(VERIFY).fetch_one(db).await?;
    Ok(judge(outcome))
}

/// When a new connection last found no check to run, in nanoseconds since
/// `clock_base()` (0: never). Process-wide, like F2's sighting: a pool of
/// another database (tests) only reconnects.
static UNVERIFIED_SEEN: AtomicU64 = AtomicU64::new(0);

fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// sqlx stamps a connection's age after `after_connect` returns, so the
/// one that found no check is stamped just after the sighting (in the same
/// poll: no await between): the sighting counts this much later.
const STAMP_MARGIN: Duration = Duration::from_secs(1);

fn note_unverified_now() {
    let now = u64::try_from((clock_base().elapsed() + STAMP_MARGIN).as_nanos())
        .unwrap_or(u64::MAX)
        .max(1);
    UNVERIFIED_SEEN.fetch_max(now, Ordering::Relaxed);
}

/// True for a connection opened at or before the last time a new connection
/// found no check to run (plus `STAMP_MARGIN`): it may be that one, so it
/// is closed at acquire and its replacement checks. A checked connection
/// opened within the margin is closed once too, which costs a reconnect.
pub fn opened_unverified(meta: &PoolConnectionMetadata) -> bool {
    let seen = UNVERIFIED_SEEN.load(Ordering::Relaxed);
    if seen == 0 {
        return false;
    }
    let seen_at = clock_base() + Duration::from_nanos(seen);
    match Instant::now().checked_sub(meta.age) {
        Some(opened_at) => opened_at <= seen_at,
        None => true,
    }
}
