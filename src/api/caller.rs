//! The caller of an API request, as actix extractors: `BearerToken` (the
//! token's digest, parsed without a round trip) and `ApiClient` (the
//! token's organization and scopes, read from the database), with the 401
//! and 403 answers of the JSON API. What a token is and says is in
//! `crate::tokens`.

use std::future::Future;
use std::pin::Pin;

use actix_web::{FromRequest, HttpRequest, dev::Payload, web};

use crate::db::Db;
use crate::domain::Scope;
use crate::error::ApiError;
use crate::settings::Settings;

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
/// decides (`api_reserve_order_request`, `api_transition_request`, `api_order_request`), which checks it in the same
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
            digest: crate::tokens::digest(token),
        })
    }

    /// The caller this token names (one round trip): 401 when unknown or
    /// revoked.
    pub async fn resolve(&self, pool: &Db) -> Result<ApiClient, ApiError> {
        let caller = crate::tokens::caller(pool, &self.digest)
            .await?
            .ok_or(ApiError::Unauthorized("unknown or revoked token"))?;
        Ok(ApiClient {
            org_id: caller.org_id,
            token_name: caller.token_name,
            scopes: caller.scopes,
            datacenter_enabled: caller.datacenter_enabled,
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
