//! An organization's webhook: its URL and secret, set, rotated, removed.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::signatures::generate_secret;

/// An organization's webhook, with its secret (admins and `orders` tokens of
/// the organization see it; docs/webhooks.md says why).
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(description = "the organization's webhook, with its signing secret")]
pub struct Webhook {
    pub url: String,
    /// the HMAC-SHA256 key of the Poolkeeper-Signature header
    #[schema(pattern = "^whsec_")]
    pub secret: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// a token name or a staff email
    pub updated_by: String,
}

const WEBHOOK_COLUMNS: &str = "url, secret, created_at, updated_at, updated_by";

pub async fn get<'c>(
    db: impl sqlx::PgExecutor<'c>,
    org_id: i64,
) -> Result<Option<Webhook>, sqlx::Error> {
    let sql = format!("SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE org_id = $1");
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(org_id)
        .fetch_optional(db)
        .await
}

/// What a registration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    Created,
    Updated,
}

/// Sets the organization's webhook URL (already checked by the caller with
/// `parse_url` and `check_destination`). A new webhook gets a fresh secret;
/// a changed URL keeps its secret unless `rotate` is set, so the receiver
/// need not change its key to move. Pending deliveries go to the new URL.
pub async fn set_on(
    conn: &mut PgConnection,
    org_id: i64,
    url: &str,
    rotate: bool,
    actor: &str,
) -> Result<(Webhook, Saved), sqlx::Error> {
    let sql = format!(
        "INSERT INTO webhooks (org_id, url, secret, updated_by) VALUES ($1, $2, $3, $4)
         ON CONFLICT (org_id) DO UPDATE
            SET url = EXCLUDED.url,
                secret = CASE WHEN $5 THEN EXCLUDED.secret ELSE webhooks.secret END,
                updated_at = clock_timestamp(),
                updated_by = EXCLUDED.updated_by
         RETURNING {WEBHOOK_COLUMNS}, (xmax = 0) AS inserted"
    );
    let row: (String, String, DateTime<Utc>, DateTime<Utc>, String, bool) =
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(org_id)
            .bind(url)
            .bind(generate_secret())
            .bind(actor)
            .bind(rotate)
            .fetch_one(conn)
            .await?;
    let (url, secret, created_at, updated_at, updated_by, inserted) = row;
    Ok((
        Webhook {
            url,
            secret,
            created_at,
            updated_at,
            updated_by,
        },
        if inserted {
            Saved::Created
        } else {
            Saved::Updated
        },
    ))
}

/// Gives the organization's webhook a new secret; false when it has none.
pub async fn rotate_secret_on(
    conn: &mut PgConnection,
    org_id: i64,
    actor: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE webhooks SET secret = $2, updated_at = clock_timestamp(), updated_by = $3
          WHERE org_id = $1",
    )
    .bind(org_id)
    .bind(generate_secret())
    .bind(actor)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(done == 1)
}

/// Removes the organization's webhook; its pending deliveries are dropped
/// (nobody to send them to). Returns how many were dropped, or None when
/// there was no webhook.
pub async fn remove_on(conn: &mut PgConnection, org_id: i64) -> Result<Option<i64>, sqlx::Error> {
    let removed = sqlx::query("DELETE FROM webhooks WHERE org_id = $1")
        .bind(org_id)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if removed == 0 {
        return Ok(None);
    }
    let dropped = sqlx::query(
        "UPDATE webhook_deliveries
            SET state = 'dropped', finished_at = clock_timestamp(), last_error = 'webhook removed'
          WHERE org_id = $1 AND state = 'pending'",
    )
    .bind(org_id)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(Some(dropped as i64))
}
