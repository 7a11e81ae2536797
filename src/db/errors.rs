//! The one place that reads database errors: the database error in a
//! cause chain, constraint names, SQLSTATEs, and which errors are a `503`
//! (unavailable) or an unknown outcome (F3).

use std::error::Error as StdError;

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
                    // lock_timeout, read-only transaction (a standby, F2),
                    // connection exceptions (class 08)
                    matches!(
                        code,
                        "57P01" | "57P02" | "57P03" | "53300" | "57014" | "55P03" | "25006"
                    ) || code.starts_with("08")
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
/// connection exception) once the statement may have been sent. Only an
/// error of a COMMIT, or of a write statement committed on its own, can
/// be this: the same error on a statement of a transaction whose COMMIT
/// was never sent left nothing written (`is_unavailable`). A commit
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

/// SQLSTATE of `lock_holds` (sql/locks.sql) when a hold moved to another
/// machine while a transition was taking its locks: nothing was written,
/// and the same work run again (from a savepoint, or as a new statement)
/// reads the hold on its new machine (`retry_when_hold_moved`).
pub const HOLD_MOVED: &str = "40PK1";

/// Whether `err` is `HOLD_MOVED`.
pub fn is_hold_moved(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some(HOLD_MOVED))
}
