//! The lock order (docs/rules.md, "Lock order"; sql/locks.sql): machine
//! rows, then reservation rows, each in id order, then only SKIP LOCKED.
//! `lock_holds` reads a hold's machine before it locks it; when healing
//! moved the hold in between, it raises `HOLD_MOVED` having written nothing
//! rather than wait for the new machine out of order. These run the work
//! again, so that the caller never sees it unless holds keep moving.

use sqlx::{Acquire, PgConnection};

use super::is_hold_moved;

/// At most this many runs of one piece of work: each rerun follows a move
/// that committed, so more than a few means the machines under the hold
/// are being changed over and over; the error then goes out as what it is
/// (class 40: rolled back, `503` with `Retry-After`).
pub const HOLD_MOVED_RUNS: u32 = 8;

/// A savepoint of the caller's transaction for one run of a transition
/// that the dashboard writes beside an audit row: `begin`, run the
/// statement on it, then `end` says whether to run it again.
pub struct Savepoint<'c> {
    savepoint: sqlx::Transaction<'c, sqlx::Postgres>,
}

impl<'c> Savepoint<'c> {
    pub async fn begin(conn: &'c mut PgConnection) -> Result<Savepoint<'c>, sqlx::Error> {
        Ok(Savepoint {
            savepoint: conn.begin().await?,
        })
    }

    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.savepoint
    }

    /// Keeps what run `run` (from 1) did and gives its value, or, when a
    /// hold moved under it, rolls back to the savepoint (its locks released)
    /// and answers `None`: run it again.
    pub async fn end<T>(
        self,
        outcome: Result<T, sqlx::Error>,
        run: u32,
    ) -> Result<Option<T>, sqlx::Error> {
        match outcome {
            Ok(value) => {
                self.savepoint.commit().await?;
                Ok(Some(value))
            }
            Err(e) if run_again(&e, run) => {
                self.savepoint.rollback().await?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// Whether run `run` (from 1), which failed with `err`, is to be run
/// again: a hold moved under it, and the runs are not used up.
pub fn run_again(err: &sqlx::Error, run: u32) -> bool {
    is_hold_moved(err) && run < HOLD_MOVED_RUNS
}
