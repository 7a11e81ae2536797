//! API tokens: created by `poolkeeper token add`, printed once, stored only
//! as a SHA-256 digest; what a token says of its caller (`caller`, and
//! `CallerRefusal` for the functions that check it in their own statement).
//! The request extractors over them are in `api::caller`.

use crate::db::Db;
use base64::Engine;
use chrono::{DateTime, Utc};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgExecutor};

use crate::domain::Scope;

const PREFIX: &str = "pk_";

pub fn digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// A fresh token: 32 random bytes, URL-safe base64, with a recognisable prefix.
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "{PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("a token named {0:?} already exists in this organization")]
    NameTaken(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Creates a token and returns it; this is the only time it is ever seen.
pub async fn create(
    pool: &Db,
    org_id: i64,
    name: Option<&str>,
    scopes: &[Scope],
) -> Result<(String, String), TokenError> {
    create_on(pool, org_id, name, scopes).await
}

/// As `create`, on a caller's transaction (the tokens page writes its audit
/// row in the same transaction) or on the database: one statement.
pub async fn create_on(
    db: impl PgExecutor<'_>,
    org_id: i64,
    name: Option<&str>,
    scopes: &[Scope],
) -> Result<(String, String), TokenError> {
    let token = generate();
    let scopes: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    let default_name = format!(
        "token-{}",
        &digest(&token)[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let name = name.map(str::to_owned).unwrap_or(default_name);
    sqlx::query(
        "INSERT INTO api_tokens (org_id, name, token_hash, scopes) VALUES ($1, $2, $3, $4)",
    )
    .bind(org_id)
    .bind(&name)
    .bind(digest(&token))
    .bind(&scopes)
    .execute(db)
    .await
    .map_err(|e| match crate::db::violated_unique(&e) {
        Some("api_tokens_name_unique_per_org") => TokenError::NameTaken(name.clone()),
        _ => TokenError::Database(e),
    })?;
    Ok((name, token))
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TokenInfo {
    pub id: i64,
    pub name: String,
    pub scopes: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// An organization's tokens, live first, newest first; never the secret
/// (only its digest is stored anyway).
pub async fn list(pool: &Db, org_id: i64) -> Result<Vec<TokenInfo>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, name, scopes, created_at, revoked_at FROM api_tokens WHERE org_id = $1
          ORDER BY revoked_at IS NOT NULL, created_at DESC, id DESC",
    )
    .bind(org_id)
    .fetch_all(pool)
    .await
}

/// Revokes a token of `org_id` in the caller's transaction; the bearer
/// extractor refuses it from the next request on. Returns its name, or None
/// when absent, another organization's, or already revoked.
pub async fn revoke_on(
    conn: &mut PgConnection,
    org_id: i64,
    token_id: i64,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE api_tokens SET revoked_at = clock_timestamp()
          WHERE id = $1 AND org_id = $2 AND revoked_at IS NULL RETURNING name",
    )
    .bind(token_id)
    .bind(org_id)
    .fetch_optional(conn)
    .await
}

/// What a live token says of its caller: its organization, name and
/// scopes, and the organization's datacenter-module setting (R12).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TokenCaller {
    pub org_id: i64,
    pub token_name: String,
    pub scopes: Vec<String>,
    pub datacenter_enabled: bool,
}

/// The caller of the token with SHA-256 `digest` (one round trip); `None`
/// when no live token has it (unknown or revoked).
pub async fn caller(pool: &Db, digest: &[u8]) -> Result<Option<TokenCaller>, sqlx::Error> {
    sqlx::query_as(
        "SELECT t.org_id, t.name AS token_name, t.scopes, o.datacenter_enabled
           FROM api_tokens t JOIN organizations o ON o.id = t.org_id
          WHERE t.token_hash = $1 AND t.revoked_at IS NULL",
    )
    .bind(digest)
    .fetch_optional(pool)
    .await
}

/// What the order service's token says about its request (`api_caller`):
/// refused before anything is read or written, in the order the API checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerRefusal {
    /// Unknown or revoked token (401).
    Unauthorized,
    /// The token lacks the `orders` scope (403).
    Forbidden,
    /// R12: the deployment switch is off (403 module_disabled).
    ModuleOffDeployment,
    /// R12: the organization's setting is off (403 module_disabled).
    ModuleOffOrganization,
}

impl CallerRefusal {
    /// `api_caller`'s status; `None` for `ok`.
    pub(crate) fn parse(status: &str) -> Result<Option<CallerRefusal>, sqlx::Error> {
        Ok(Some(match status {
            "ok" => return Ok(None),
            "unauthorized" => CallerRefusal::Unauthorized,
            "forbidden" => CallerRefusal::Forbidden,
            "module_off_deployment" => CallerRefusal::ModuleOffDeployment,
            "module_off_org" => CallerRefusal::ModuleOffOrganization,
            other => {
                return Err(sqlx::Error::Protocol(format!(
                    "api_caller answered an unknown status {other:?}"
                )));
            }
        }))
    }
}

/// A row of a function answering for an API caller: `api_caller`'s status,
/// then the result (all NULL when the caller was refused).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct CallerRow<T> {
    pub(crate) caller: String,
    #[sqlx(flatten)]
    pub(crate) result: T,
}
