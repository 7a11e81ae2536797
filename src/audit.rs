//! The audit log of staff actions and logins: who, when, from
//! where, on what. Never a password or a token: callers pass an object name
//! ("user:ana@…", "token:checkout", "reservation:12") and a short detail.

use crate::db::Db;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// One audit row to write.
pub struct Entry<'a> {
    pub org_id: Option<i64>,
    pub actor: &'a str,
    pub action: &'a str,
    pub object: &'a str,
    pub source_addr: &'a str,
    pub detail: Option<&'a str>,
}

/// Writes `entry` on `conn`, so that a caller holding a transaction makes
/// the audit row commit (or roll back) with the action it records. The
/// actor's name (S1: from their provider's last sign-in) is kept beside
/// the email as it is now, when the actor is a user of the organization
/// that has one.
pub async fn record(conn: &mut PgConnection, entry: &Entry<'_>) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO audit_log (org_id, actor, action, object, source_addr, detail, actor_name)
         VALUES ($1, $2, $3, $4, $5, $6,
                 (SELECT display_name FROM users WHERE email = $2 AND org_id = $1))",
    )
    .bind(entry.org_id)
    .bind(entry.actor)
    .bind(entry.action)
    .bind(entry.object)
    .bind(entry.source_addr)
    .bind(entry.detail)
    .execute(conn)
    .await?;
    Ok(())
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Row {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    /// The actor's name when the entry was written, if they had one.
    pub actor_name: Option<String>,
    pub action: String,
    pub object: Option<String>,
    pub source_addr: Option<String>,
    pub detail: Option<String>,
}

/// One page of an organization's audit log, newest first, keyed on the
/// row id (a cursor, so pages do not shift when rows arrive). Returns up to
/// `limit + 1` rows: the extra one says there is a next page.
pub async fn page(
    pool: &Db,
    org_id: i64,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<Row>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, at, actor, actor_name, action, object, source_addr, detail
           FROM audit_log
          WHERE org_id = $1 AND ($2::bigint IS NULL OR id < $2)
          ORDER BY id DESC
          LIMIT $3",
    )
    .bind(org_id)
    .bind(before)
    .bind(limit + 1)
    .fetch_all(pool)
    .await
}
