//! The JSON API's error boundary: every failure becomes
//! `{"error": CODE, "message": TEXT, ...}` with the status docs/api.md gives.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::{Map, Value, json};

use crate::db;

#[derive(thiserror::Error)]
pub enum ApiError {
    /// 400 `invalid`: the request is malformed; nothing was written.
    #[error("{0}")]
    Invalid(String),
    /// 401 `unauthorized`.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// 403 `forbidden`: the token lacks a scope.
    #[error("{0}")]
    Forbidden(String),
    /// 403 `module_disabled` (R12).
    #[error("the datacenter module is disabled {0}")]
    ModuleDisabled(&'static str),
    /// 404 `not_found`: absent, or another organization's (never 403).
    #[error("{0} not found")]
    NotFound(&'static str),
    /// 422 with a machine-readable code: the body is well formed (valid by
    /// the published document) but its content is refused, for a reason
    /// no JSON Schema can say (a webhook URL whose host resolves to an
    /// internal address, say). Nothing was written.
    #[error("{message}")]
    Unprocessable { code: &'static str, message: String },
    /// 422 `idempotency_mismatch`: the key (an `order_ref`) was used before
    /// by a request that differs in `fields`; the original stands, nothing
    /// was written.
    #[error(
        "this order_ref was first used with another request (it differs in {}); \
         the original order stands and nothing was written: use a new order_ref for a new order",
        .fields.join(", ")
    )]
    Mismatch { fields: Vec<&'static str> },
    /// 422 `idempotency_mismatch` for a convert or cancel: this caller
    /// already ended the reservation with the same fence and another
    /// `service_ref` or `reason` (`fields`); it stays as that request left
    /// it, nothing was written.
    #[error(
        "this caller already ended it with the same fence and another {}; \
         it stays as that request left it and nothing was written: read the reservation",
        .fields.join(", ")
    )]
    ReplayMismatch { fields: Vec<&'static str> },
    /// 409 with a machine-readable code and extra fields.
    #[error("{message}")]
    Conflict {
        code: &'static str,
        message: String,
        extra: Map<String, Value>,
        retry_after: Option<u32>,
    },
    /// 503 `unavailable`: the database cannot answer right now; retry.
    #[error("the database is not available right now; retry shortly")]
    Unavailable(#[source] anyhow::Error),
    /// 503 `outcome_unknown` (F3): the connection was lost after a write
    /// was sent; it may or may not have committed. Retrying it with the same
    /// `order_ref` (reserve) or fence (convert, cancel) says which.
    #[error(
        "the connection to the database was lost while this request was being written; it may \
         or may not have taken effect: retry it unchanged (same order_ref, or same fence) to learn which"
    )]
    OutcomeUnknown(#[source] anyhow::Error),
    /// 500 `internal`: a bug or an unexpected database state.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

pub fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::Invalid(message.into())
}

pub fn not_found(what: &'static str) -> ApiError {
    ApiError::NotFound(what)
}

pub fn conflict(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::Conflict {
        code,
        message: message.into(),
        extra: Map::new(),
        retry_after: None,
    }
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Invalid(_) => "invalid",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::ModuleDisabled(_) => "module_disabled",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict { code, .. } => code,
            ApiError::Unprocessable { code, .. } => code,
            ApiError::Mismatch { .. } | ApiError::ReplayMismatch { .. } => "idempotency_mismatch",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::OutcomeUnknown(_) => "outcome_unknown",
            ApiError::Internal(_) => "internal",
        }
    }

    /// Adds a field to a conflict's body.
    pub fn with(mut self, key: &str, value: Value) -> ApiError {
        if let ApiError::Conflict { extra, .. } = &mut self {
            extra.insert(key.to_owned(), value);
        }
        self
    }

    pub fn retry_after(mut self, seconds: u32) -> ApiError {
        if let ApiError::Conflict { retry_after, .. } = &mut self {
            *retry_after = Some(seconds);
        }
        self
    }
}

/// Prints the whole cause chain, so that a log line says why.
pub fn fmt_chain(err: &dyn std::error::Error, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    write!(f, "{err}")?;
    let mut source = err.source();
    while let Some(cause) = source {
        write!(f, "\n  caused by: {cause}")?;
        source = cause.source();
    }
    Ok(())
}

impl std::fmt::Debug for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fmt_chain(self, f)
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        anyhow::Error::from(e).into()
    }
}

impl ApiError {
    /// A write's COMMIT, or a write statement committed on its own, that
    /// failed: a lost connection is `OutcomeUnknown` (F3), anything else as
    /// `From`. An error before the COMMIT was sent is `From`'s (`503
    /// unavailable` for a lost connection: nothing was written).
    pub fn from_write(e: sqlx::Error) -> ApiError {
        let failure = db::classify(&e);
        if failure.is_outcome_unknown() {
            crate::metrics::count_db_error(&failure, crate::metrics::Surface::Api);
            ApiError::OutcomeUnknown(e.into())
        } else {
            e.into()
        }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        let failure = db::classify(e.as_ref());
        // F2: a read-only server closes the pool's older connections.
        db::note_read_only_failure(&failure);
        crate::metrics::count_db_error(&failure, crate::metrics::Surface::Api);
        if failure.is_unavailable() {
            ApiError::Unavailable(e)
        } else if let db::DbFailure::BadValue(problem) = failure.failure {
            tracing::warn!(error = ?e, "a request's value was refused by the database");
            ApiError::Invalid(format!("a value in this request cannot be used: {problem}"))
        } else {
            ApiError::Internal(e)
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::Unprocessable { .. }
            | ApiError::Mismatch { .. }
            | ApiError::ReplayMismatch { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) | ApiError::ModuleDisabled(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::Unavailable(_) | ApiError::OutcomeUnknown(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            ApiError::Internal(_) => tracing::error!(error = ?self, "request failed"),
            ApiError::Unavailable(_) => tracing::warn!(error = ?self, "database unavailable"),
            ApiError::OutcomeUnknown(_) => {
                tracing::warn!(error = ?self, "database connection lost during a write")
            }
            _ => {}
        }
        let mut body = Map::new();
        body.insert("error".into(), json!(self.code()));
        body.insert("message".into(), json!(self.to_string()));
        let mut retry = None;
        match self {
            ApiError::Conflict {
                extra, retry_after, ..
            } => {
                body.extend(extra.clone());
                retry = *retry_after;
            }
            ApiError::Mismatch { fields } | ApiError::ReplayMismatch { fields } => {
                body.insert("fields".into(), json!(fields));
            }
            ApiError::Unavailable(_) | ApiError::OutcomeUnknown(_) => {
                crate::metrics::count_unavailable(self.code());
                retry = Some(1)
            }
            _ => {}
        }
        let mut resp = HttpResponse::build(self.status_code());
        if let Some(seconds) = retry {
            resp.insert_header(("Retry-After", seconds.to_string()));
        }
        if let ApiError::Unauthorized(_) = self {
            resp.insert_header(("WWW-Authenticate", "Bearer"));
        }
        resp.json(Value::Object(body))
    }
}

/// Extractor error handlers: a body, path or query that does not parse is
/// `400 invalid`, in the API's error shape.
pub fn json_config() -> actix_web::web::JsonConfig {
    actix_web::web::JsonConfig::default()
        .limit(64 * 1024)
        .content_type_required(false)
        .error_handler(|err, _req| invalid(format!("invalid JSON body: {err}")).into())
}

pub fn path_config() -> actix_web::web::PathConfig {
    actix_web::web::PathConfig::default()
        .error_handler(|err, _req| invalid(format!("invalid path: {err}")).into())
}

pub fn query_config() -> actix_web::web::QueryConfig {
    actix_web::web::QueryConfig::default()
        .error_handler(|err, _req| invalid(format!("invalid query string: {err}")).into())
}
