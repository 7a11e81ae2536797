//! API tokens: created by `poolkeeper token add`, printed once, stored only
//! as a SHA-256 digest. The bearer extractor resolves a request's token to
//! its organization and scopes.

use std::future::Future;
use std::pin::Pin;

use crate::db::Db;
use actix_web::{FromRequest, HttpRequest, dev::Payload, web};
use base64::Engine;
use chrono::{DateTime, Utc};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgExecutor};

use crate::domain::Scope;
use crate::error::ApiError;
use crate::settings::Settings;

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

/// The caller of an API request, resolved from its bearer token.
#[derive(Debug, Clone)]
pub struct ApiClient {
    pub org_id: i64,
    pub token_name: String,
    scopes: Vec<String>,
    datacenter_enabled: bool,
}

impl ApiClient {
    /// 403 `forbidden` unless the token carries `scope`.
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.scopes.iter().any(|s| s == scope.as_str()) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "this token lacks the {} scope",
                scope.as_str()
            )))
        }
    }

    /// R12: 403 `module_disabled` unless both the deployment switch and the
    /// organization's setting are on.
    pub fn require_module(&self, settings: &Settings) -> Result<(), ApiError> {
        if !settings.datacenter_module {
            return Err(ApiError::ModuleDisabled("on this deployment"));
        }
        if !self.datacenter_enabled {
            return Err(ApiError::ModuleDisabled("for this organization"));
        }
        Ok(())
    }

    /// Both checks every module endpoint makes before anything else.
    pub fn module_call(&self, settings: &Settings, scope: Scope) -> Result<(), ApiError> {
        self.require(scope)?;
        self.require_module(settings)
    }
}

/// The bearer token of a request, as its SHA-256, parsed without a
/// database round trip: the order endpoints pass it to the function that
/// decides (`api_reserve`, `api_transition`), which checks it in the same
/// statement. Missing or malformed: 401.
#[derive(Debug, Clone)]
pub struct BearerToken {
    digest: Vec<u8>,
}

impl BearerToken {
    pub fn digest(&self) -> &[u8] {
        &self.digest
    }

    fn from_header(req: &HttpRequest) -> Result<BearerToken, ApiError> {
        let token = match req
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .map(|v| v.to_str())
        {
            Some(Ok(v)) => v.strip_prefix("Bearer ").map(str::trim),
            _ => None,
        }
        .filter(|t| !t.is_empty())
        .ok_or(ApiError::Unauthorized("send Authorization: Bearer TOKEN"))?;
        Ok(BearerToken {
            digest: digest(token),
        })
    }

    /// The caller this token names (one round trip): 401 when unknown or
    /// revoked.
    pub async fn resolve(&self, pool: &Db) -> Result<ApiClient, ApiError> {
        let row: Option<(i64, String, Vec<String>, bool)> = sqlx::query_as(
            "SELECT t.org_id, t.name, t.scopes, o.datacenter_enabled
               FROM api_tokens t JOIN organizations o ON o.id = t.org_id
              WHERE t.token_hash = $1 AND t.revoked_at IS NULL",
        )
        .bind(&self.digest)
        .fetch_optional(pool)
        .await?;
        let (org_id, token_name, scopes, datacenter_enabled) =
            row.ok_or(ApiError::Unauthorized("unknown or revoked token"))?;
        Ok(ApiClient {
            org_id,
            token_name,
            scopes,
            datacenter_enabled,
        })
    }
}

impl FromRequest for BearerToken {
    type Error = ApiError;
    type Future = std::future::Ready<Result<BearerToken, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(BearerToken::from_header(req))
    }
}

impl FromRequest for ApiClient {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<ApiClient, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let token = BearerToken::from_header(req);
        let pool = req.app_data::<web::Data<Db>>().cloned();
        Box::pin(async move {
            let token = token?;
            let pool = pool.ok_or_else(|| {
                ApiError::Internal(anyhow::anyhow!("no database pool configured"))
            })?;
            token.resolve(pool.get_ref()).await
        })
    }
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
