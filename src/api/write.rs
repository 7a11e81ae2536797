//! F3: the one path every write of the API takes, so that its answer under
//! a failure is the truth:
//!
//! - nothing was sent (no connection, or the transaction could not begin):
//!   `503 unavailable` with `Retry-After`;
//! - the connection broke on a statement of a transaction, before its
//!   COMMIT was sent: nothing can have been written, `503 unavailable`;
//! - the connection broke once the COMMIT (or a statement committed on its
//!   own) was sent: `503 outcome_unknown` with `Retry-After`, and the same
//!   request again answers what happened (RELIABILITY.md's table, one row
//!   per write);
//! - SQLSTATE class 40 (a deadlock, a serialization failure: rolled back,
//!   nothing written): `503 unavailable` with `Retry-After`, never `500`;
//!   but a one-statement write that met a hold moved under it while it
//!   took its locks (`db::HOLD_MOVED`, the lock order) runs again first.
//!
//! A handler that writes gets its connection only here: the test
//! `lost_commits::every_write_whose_commit_is_lost_answers_outcome_unknown_and_its_retry_replays`
//! walks every write route of the OpenAPI document and kills its backend
//! while its commit waits, so a route that writes another way fails it;
//! `writes::every_write_route_whose_backend_dies_mid_statement_answers_503`
//! kills it while the statement waits, before any commit.

use sqlx::PgConnection;

use crate::db::{Conn, Db};
use crate::error::ApiError;

/// How a write runs on its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One statement, committed on its own (one round trip: reserve and
    /// the transitions, whose functions do all of their work in it).
    Statement,
    /// Several statements in one transaction, committed at the end.
    Transaction,
}

/// Runs `work` on a connection of `db` and answers as the module says.
/// `work` returns the domain's own refusals inside `T`; only the
/// database's errors go in the `Err`.
pub async fn write<T>(
    db: &Db,
    shape: Shape,
    mut work: impl AsyncFnMut(&mut PgConnection) -> Result<T, sqlx::Error>,
) -> Result<T, ApiError> {
    match shape {
        Shape::Statement => {
            let mut run = 1;
            loop {
                let mut conn = db.acquire().await.map_err(unsent)?;
                match work(&mut conn).await {
                    // Nothing was written; pinned, dropping the connection
                    // rolls its transaction back. A new statement reads
                    // the hold where it is now.
                    Err(e) if crate::db::lock_order::run_again(&e, run) => run += 1,
                    outcome => return finish(conn, outcome).await,
                }
            }
        }
        Shape::Transaction => {
            let mut tx = db.begin().await.map_err(unsent)?;
            match work(&mut tx).await {
                Ok(value) => tx
                    .commit()
                    .await
                    .map(|()| value)
                    .map_err(ApiError::from_write),
                // Before the COMMIT: dropping the transaction rolls back,
                // and a broken connection had nothing committed either.
                Err(e) => Err(unsent(e)),
            }
        }
    }
}

/// Nothing of the write was committed: no connection, or an error before
/// the COMMIT was sent. A lost or refused connection is `503 unavailable`
/// (`ApiError`'s `From`), never `outcome_unknown`.
fn unsent(e: sqlx::Error) -> ApiError {
    ApiError::from(e)
}

/// Ends a one-statement write's connection: on success keeps what was
/// written (pinned, commits); on failure closes a connection that reached a
/// read-only server (F2) and says whether the outcome is unknown (F3): for
/// a statement committed on its own it is; pinned, the statement ran in a
/// transaction whose COMMIT was never sent, so nothing was written.
async fn finish<T>(mut conn: Conn, outcome: Result<T, sqlx::Error>) -> Result<T, ApiError> {
    match outcome {
        Ok(value) => conn
            .finish()
            .await
            .map(|()| value)
            .map_err(ApiError::from_write),
        Err(e) => {
            conn.failed(&e);
            match conn {
                Conn::Direct(_) => Err(ApiError::from_write(e)),
                Conn::Pinned(_) => Err(unsent(e)),
            }
        }
    }
}
