//! The one place that reads what the database said: `classify` walks an
//! error's cause chain once and says what the failure means to its callers
//! (a `503`, an unknown outcome (F3), a bad value, a unique violation, a
//! hold that moved), with the SQLSTATE it read. The API's and the
//! dashboard's error boundaries, the metrics and every caller that checks
//! a SQLSTATE or a constraint name read it here.

use std::error::Error as StdError;

/// What a failure of the database, or of the connection to it, means to
/// the code that meets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbFailure<'a> {
    /// The connection was lost once a statement may have been sent: an I/O
    /// error, the server terminated the session (admin or crash shutdown),
    /// a connection exception (class 08), statement completion unknown
    /// (40003). On a statement of a transaction whose COMMIT was never
    /// sent, nothing was written: unavailable. On a COMMIT, or a write
    /// statement committed on its own, it may or may not have committed:
    /// the outcome is unknown (F3). A commit waiting for the synchronous
    /// standby when its session is terminated is already committed
    /// locally; one on a leader that then loses its lock may be gone after
    /// the failover. Only the retry can tell (R9, and the replay of a
    /// transition with the same fence), so the answer says neither.
    ConnectionLost,
    /// The database cannot answer right now and nothing was written: no
    /// connection in time, the pool closed, the server cannot connect now
    /// or has too many connections, a statement or lock timeout, or class
    /// 40 (a deadlock, a serialization failure: the transaction was rolled
    /// back, and the same request again is safe). The honest answer is 503
    /// with Retry-After, not 500.
    Unavailable,
    /// A read-only server (SQLSTATE 25006: a standby, F2): unavailable, and
    /// the pool's older connections are to be closed (`note_read_only`).
    ReadOnly,
    /// `HOLD_MOVED`: a hold moved to another machine while a transition
    /// took its locks; nothing was written. Run again by `lock_order`;
    /// unavailable if it reaches a boundary (it is class 40).
    HoldMoved,
    /// A data exception (SQLSTATE class 22: invalid byte sequence,
    /// character not in repertoire, numeric value out of range, invalid
    /// text representation...): a value a request brought that the
    /// database cannot store or compare. The boundaries answer 400, never
    /// 500, as a second net behind the dashboard's `input::guard` and the
    /// API's parsers; the text is PostgreSQL's message with its SQLSTATE,
    /// which names the problem and not the data.
    BadValue(String),
    /// A unique constraint or index was violated (SQLSTATE 23505), by name.
    UniqueViolation { constraint: Option<&'a str> },
    /// Anything else: another database error, a driver error, or no error
    /// of the database at all (a bug of ours).
    Other,
}

/// A failure as `classify` read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified<'a> {
    pub failure: DbFailure<'a>,
    /// The SQLSTATE of the database error in the chain; `None` when the
    /// chain holds none (a pool timeout, a broken connection, a bug).
    pub sqlstate: Option<String>,
}

impl Classified<'_> {
    /// A `503` with Retry-After: the database cannot answer now, or the
    /// connection broke before anything was committed.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self.failure,
            DbFailure::ConnectionLost
                | DbFailure::Unavailable
                | DbFailure::ReadOnly
                | DbFailure::HoldMoved
        )
    }

    /// F3: the outcome of a COMMIT, or of a write statement committed on
    /// its own, that failed with this is unknown. Only such an error can
    /// be this; errors from acquiring a connection are not (nothing was
    /// sent).
    pub fn is_outcome_unknown(&self) -> bool {
        self.failure == DbFailure::ConnectionLost
    }

    /// The SQLSTATE's class (its first two characters), when the chain
    /// holds a database error whose code has one.
    pub fn sqlstate_class(&self) -> Option<&str> {
        let class = self.sqlstate.as_deref()?.get(..2)?;
        class
            .chars()
            .all(|c| c.is_ascii_alphanumeric())
            .then_some(class)
    }
}

/// Reads `err`: the deepest `sqlx::Error` of its cause chain (our own error
/// types wrap sqlx's, which may wrap another, as a migration's does, and
/// wraps the driver's: R6) decides.
pub fn classify<'a>(err: &'a (dyn StdError + 'static)) -> Classified<'a> {
    let mut found = None;
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(sqlx_err) = e.downcast_ref::<sqlx::Error>() {
            found = Some(sqlx_err);
        }
        current = e.source();
    }
    let db = match found {
        None => return classified(DbFailure::Other, None),
        Some(sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed) => {
            return classified(DbFailure::Unavailable, None);
        }
        Some(sqlx::Error::Io(_)) => return classified(DbFailure::ConnectionLost, None),
        Some(sqlx::Error::Database(db)) => db.as_ref(),
        Some(_) => return classified(DbFailure::Other, None),
    };
    let Some(code) = db.code().map(|c| c.into_owned()) else {
        return classified(DbFailure::Other, None);
    };
    let failure = match code.as_str() {
        // admin shutdown, crash shutdown, connection exceptions, statement
        // completion unknown
        "57P01" | "57P02" | "40003" => DbFailure::ConnectionLost,
        c if c.starts_with("08") => DbFailure::ConnectionLost,
        "25006" => DbFailure::ReadOnly,
        HOLD_MOVED => DbFailure::HoldMoved,
        // cannot connect now, too many connections, query cancelled
        // (statement_timeout), lock_timeout
        "57P03" | "53300" | "57014" | "55P03" => DbFailure::Unavailable,
        // F3: class 40 (deadlock, serialization failure) rolled the
        // transaction back; the same request again is safe.
        c if c.starts_with("40") => DbFailure::Unavailable,
        c if c.starts_with("22") => DbFailure::BadValue(format!("{} (SQLSTATE {c})", db.message())),
        "23505" => DbFailure::UniqueViolation {
            constraint: db.constraint(),
        },
        _ => DbFailure::Other,
    };
    classified(failure, Some(code))
}

fn classified(failure: DbFailure<'_>, sqlstate: Option<String>) -> Classified<'_> {
    Classified { failure, sqlstate }
}

/// The name of the unique constraint or index that `err` violated, if that
/// is what happened (SQLSTATE 23505).
pub fn violated_unique<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a str> {
    match classify(err).failure {
        DbFailure::UniqueViolation { constraint } => constraint,
        _ => None,
    }
}

/// SQLSTATE of the database error inside `err`.
pub fn sqlstate(err: &(dyn StdError + 'static)) -> Option<String> {
    classify(err).sqlstate
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

/// SQLSTATE of `lock_holds` (sql/locks.sql) when a hold moved to another
/// machine while a transition was taking its locks: nothing was written,
/// and the same work run again (from a savepoint, or as a new statement)
/// reads the hold on its new machine (`lock_order::run_again`).
pub const HOLD_MOVED: &str = "40PK1";

/// Whether `err` is `HOLD_MOVED`.
pub fn is_hold_moved(err: &sqlx::Error) -> bool {
    classify(err).failure == DbFailure::HoldMoved
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    /// A database error with a given SQLSTATE, as the driver reports one.
    #[derive(Debug)]
    struct Fake(&'static str);

    impl std::fmt::Display for Fake {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "fake {}", self.0)
        }
    }

    impl StdError for Fake {}

    impl sqlx::error::DatabaseError for Fake {
        fn message(&self) -> &str {
            "the message"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn constraint(&self) -> Option<&str> {
            Some("the_key")
        }
        fn as_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn StdError + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn StdError + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn db(code: &'static str) -> anyhow::Error {
        anyhow::Error::from(sqlx::Error::Database(Box::new(Fake(code)))).context("a wrapper")
    }

    /// What each error means at a boundary: (unavailable, outcome unknown
    /// at a commit), read through a wrapper.
    #[test]
    fn every_error_is_read_once_for_what_it_means() {
        let io = || sqlx::Error::Io(std::io::Error::other("reset"));
        let cases: Vec<(anyhow::Error, bool, bool)> = vec![
            (io().into(), true, true),
            (sqlx::Error::PoolTimedOut.into(), true, false),
            (sqlx::Error::PoolClosed.into(), true, false),
            (sqlx::Error::RowNotFound.into(), false, false),
            (anyhow::anyhow!("a bug"), false, false),
            (db("57P01"), true, true),
            (db("57P02"), true, true),
            (db("08006"), true, true),
            (db("40003"), true, true),
            (db("57P03"), true, false),
            (db("53300"), true, false),
            (db("57014"), true, false),
            (db("55P03"), true, false),
            (db("25006"), true, false),
            (db("40001"), true, false),
            (db("40P01"), true, false),
            (db(HOLD_MOVED), true, false),
            (db("22P02"), false, false),
            (db("23505"), false, false),
            (db("42P01"), false, false),
        ];
        for (err, unavailable, unknown) in cases {
            let c = classify(err.as_ref());
            assert_eq!(c.is_unavailable(), unavailable, "{err:#}");
            assert_eq!(c.is_outcome_unknown(), unknown, "{err:#}");
        }
        assert_eq!(
            classify(db("22P02").as_ref()).failure,
            DbFailure::BadValue("the message (SQLSTATE 22P02)".into())
        );
        assert_eq!(violated_unique(db("23505").as_ref()), Some("the_key"));
        assert_eq!(violated_unique(db("23503").as_ref()), None);
        assert_eq!(classify(db("25006").as_ref()).failure, DbFailure::ReadOnly);
        let moved = sqlx::Error::Database(Box::new(Fake(HOLD_MOVED)));
        assert!(is_hold_moved(&moved));
        assert_eq!(sqlstate(db("42P01").as_ref()).as_deref(), Some("42P01"));
        assert_eq!(sqlstate(&io()), None);
        assert_eq!(classify(db("42P01").as_ref()).sqlstate_class(), Some("42"));
        assert_eq!(classify(db("4").as_ref()).sqlstate_class(), None);
    }
}
