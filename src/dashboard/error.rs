//! The dashboard's error boundary: every failure is a page in the layout
//! (templates/error.html), never a bare 500 for a user's mistake.

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpResponse, ResponseError};
use askama::Template;

use super::layout::{Chrome, html_response};
use crate::db;

#[derive(thiserror::Error)]
pub enum DashError {
    /// No live session: 303 to the login page.
    #[error("please log in")]
    LoginRequired,
    /// 400: the request is malformed; nothing was written.
    #[error("{0}")]
    BadRequest(String),
    /// 403: the role, the CSRF token or the session does not allow it.
    #[error("{0}")]
    Forbidden(String),
    /// 403 (R12): the datacenter module is off for this deployment or org.
    #[error("{0}")]
    ModuleOff(String),
    /// 404: absent, or another organization's (never 403).
    #[error("{0} not found")]
    NotFound(&'static str),
    /// 405: the path exists but not with this method.
    #[error("this address does not accept that kind of request")]
    MethodNotAllowed,
    /// 413: the request body is larger than any form needs.
    #[error("the request is too large; nothing was changed")]
    TooLarge,
    /// 409: a stale page acted on something that has changed since.
    #[error("{message}")]
    Stale {
        heading: String,
        message: String,
        link: Option<(String, String)>,
    },
    /// 429: too many failed logins for this account or address.
    #[error("too many failed attempts; wait a few minutes and try again")]
    Throttled,
    /// 503: the database cannot answer right now.
    #[error("the database is not available right now, and nothing was changed; try again shortly")]
    Unavailable(#[source] anyhow::Error),
    /// 503 (F3): the connection broke while a write was being committed:
    /// it may or may not have been made. The page says what was being
    /// written and where to see whether it was (`check`: a link and its
    /// words), never "nothing was changed". Made only by `commit`.
    #[error(
        "The connection to the database was lost while {what} was being saved: it may or may not \
         have been made. {how}"
    )]
    OutcomeUnknown {
        what: String,
        how: String,
        check: (String, String),
        #[source]
        source: anyhow::Error,
    },
    /// 500: a bug or an unexpected database state.
    #[error("something went wrong on our side; the error was logged")]
    Internal(#[source] anyhow::Error),
}

impl std::fmt::Debug for DashError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        crate::error::fmt_chain(self, f)
    }
}

impl From<sqlx::Error> for DashError {
    fn from(e: sqlx::Error) -> Self {
        anyhow::Error::from(e).into()
    }
}

impl From<anyhow::Error> for DashError {
    fn from(e: anyhow::Error) -> Self {
        let failure = db::classify(e.as_ref());
        // F2: a read-only server closes the pool's older connections.
        db::note_read_only_failure(&failure);
        crate::metrics::count_db_error(&failure, crate::metrics::Surface::Dashboard);
        if failure.is_unavailable() {
            DashError::Unavailable(e)
        } else if let db::DbFailure::BadValue(problem) = failure.failure {
            // Logged: a value that got past `input::guard` is worth knowing.
            tracing::warn!(error = ?e, "a request's value was refused by the database");
            DashError::BadRequest(format!(
                "A value in this request cannot be used: {problem}. Nothing was changed."
            ))
        } else {
            DashError::Internal(e)
        }
    }
}

impl From<askama::Error> for DashError {
    fn from(e: askama::Error) -> Self {
        DashError::Internal(anyhow::Error::new(e))
    }
}

impl DashError {
    pub fn bad_request(message: impl Into<String>) -> DashError {
        DashError::BadRequest(message.into())
    }
    pub fn forbidden(message: impl Into<String>) -> DashError {
        DashError::Forbidden(message.into())
    }

    fn heading(&self) -> String {
        match self {
            DashError::LoginRequired => "Please log in".into(),
            DashError::BadRequest(_) => "That request could not be used".into(),
            DashError::Forbidden(_) => "Not allowed".into(),
            DashError::ModuleOff(_) => "The datacenter module is off".into(),
            DashError::NotFound(_) => "Not found".into(),
            DashError::Stale { heading, .. } => heading.clone(),
            DashError::MethodNotAllowed => "Method not allowed".into(),
            DashError::TooLarge => "Request too large".into(),
            DashError::Throttled => "Too many attempts".into(),
            DashError::Unavailable(_) => "Temporarily unavailable".into(),
            DashError::OutcomeUnknown { .. } => "The change may or may not have been made".into(),
            DashError::Internal(_) => "Something went wrong".into(),
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    chrome: Chrome,
    status: u16,
    heading: String,
    message: String,
    link: Option<(String, String)>,
}

impl ResponseError for DashError {
    fn status_code(&self) -> StatusCode {
        match self {
            DashError::LoginRequired => StatusCode::SEE_OTHER,
            DashError::BadRequest(_) => StatusCode::BAD_REQUEST,
            DashError::Forbidden(_) | DashError::ModuleOff(_) => StatusCode::FORBIDDEN,
            DashError::NotFound(_) => StatusCode::NOT_FOUND,
            DashError::Stale { .. } => StatusCode::CONFLICT,
            DashError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            DashError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            DashError::Throttled => StatusCode::TOO_MANY_REQUESTS,
            DashError::Unavailable(_) | DashError::OutcomeUnknown { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            DashError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            DashError::LoginRequired => {
                return HttpResponse::SeeOther()
                    .insert_header((header::LOCATION, "/login"))
                    .insert_header((header::CACHE_CONTROL, "no-store"))
                    .finish();
            }
            DashError::Internal(_) => tracing::error!(error = ?self, "dashboard request failed"),
            DashError::Unavailable(_) => tracing::warn!(error = ?self, "database unavailable"),
            DashError::OutcomeUnknown { .. } => {
                tracing::warn!(error = ?self, "database connection lost during a commit")
            }
            _ => {}
        }
        let page = ErrorPage {
            chrome: Chrome::anonymous(&self.heading()),
            status: self.status_code().as_u16(),
            heading: self.heading(),
            message: self.to_string(),
            link: match self {
                DashError::Stale { link, .. } => link.clone(),
                DashError::OutcomeUnknown { check, .. } => Some(check.clone()),
                _ => None,
            },
        };
        let body = page.render().unwrap_or_else(|e| {
            tracing::error!(error = %e, "rendering the error page failed");
            format!(
                "<!doctype html><title>Error</title><p>{}</p>",
                self.status_code()
            )
        });
        let mut resp = html_response(self.status_code(), body);
        if let DashError::Unavailable(_) | DashError::OutcomeUnknown { .. } = self {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        resp
    }
}

/// A dashboard write, for the page that answers when its commit's outcome
/// is unknown (F3): what was being written, how to see whether it was, and
/// the page that shows it.
pub struct Written {
    /// A noun phrase: "the new webhook secret".
    pub what: String,
    /// One or two sentences: where to look, and what to do either way.
    pub how: String,
    /// The page that shows whether it was made: (path, link words).
    pub check: (String, String),
}

impl Written {
    pub fn new(what: impl Into<String>, how: impl Into<String>, check: (&str, &str)) -> Written {
        Written {
            what: what.into(),
            how: how.into(),
            check: (check.0.to_owned(), check.1.to_owned()),
        }
    }
}

/// Commits a dashboard write's transaction: every dashboard write ends
/// here (F3). The commit is the one moment its outcome can be unknown:
/// before it, a lost connection left nothing written (`503`, "nothing was
/// changed", as `From` says); at it (a session terminated while its commit
/// waits for the synchronous standby, a failover), the change may be
/// durable although never acknowledged, so the page says so, with
/// `written`'s words and link. Any other error of the commit is as `From`
/// maps it.
pub async fn commit(
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
    written: Written,
) -> Result<(), DashError> {
    tx.commit().await.map_err(|e| {
        let e = db::connection_trouble(e);
        let failure = db::classify(&e);
        if failure.is_outcome_unknown() {
            crate::metrics::count_db_error(&failure, crate::metrics::Surface::Dashboard);
            DashError::OutcomeUnknown {
                what: written.what,
                how: written.how,
                check: written.check,
                source: e.into(),
            }
        } else {
            e.into()
        }
    })
}

/// The largest form the dashboard accepts: its forms carry a token, a
/// fence, a reason of at most 500 characters, an email and a password.
pub const FORM_LIMIT: usize = 16 * 1024;

/// A form, query or path that does not parse is a 400 page, not a bare body;
/// an oversize one is a 413 page.
pub fn form_config() -> actix_web::web::FormConfig {
    actix_web::web::FormConfig::default()
        .limit(FORM_LIMIT)
        .error_handler(|err, _req| match err {
            actix_web::error::UrlencodedError::Overflow { .. } => DashError::TooLarge.into(),
            err => DashError::bad_request(format!("the form could not be read: {err}")).into(),
        })
}

/// Raw payloads (Bytes, String) on dashboard routes: the same bound.
pub fn payload_config() -> actix_web::web::PayloadConfig {
    actix_web::web::PayloadConfig::new(FORM_LIMIT)
}

pub fn query_config() -> actix_web::web::QueryConfig {
    actix_web::web::QueryConfig::default().error_handler(|err, _req| {
        DashError::bad_request(format!("the query string could not be read: {err}")).into()
    })
}

pub fn path_config() -> actix_web::web::PathConfig {
    actix_web::web::PathConfig::default()
        .error_handler(|_err, _req| DashError::NotFound("page").into())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(e: &DashError) -> (u16, String) {
        let resp = e.error_response();
        let status = resp.status().as_u16();
        let bytes = actix_web::body::to_bytes(resp.into_body())
            .await
            .unwrap_or_default();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[actix_web::test]
    async fn every_error_is_a_page_in_the_layout_with_its_status() {
        let cases = [
            (
                DashError::bad_request("the site is not valid"),
                400,
                "the site is not valid",
            ),
            (
                DashError::forbidden("viewers cannot act"),
                403,
                "viewers cannot act",
            ),
            (
                DashError::ModuleOff("off here".into()),
                403,
                "The datacenter module is off",
            ),
            (
                DashError::NotFound("reservation"),
                404,
                "reservation not found",
            ),
            (DashError::Throttled, 429, "Too many attempts"),
            (
                DashError::Unavailable(anyhow::anyhow!("pool closed")),
                503,
                "try again shortly",
            ),
            (
                DashError::Internal(anyhow::anyhow!("secret detail")),
                500,
                "Something went wrong",
            ),
            (
                DashError::OutcomeUnknown {
                    what: "the new API token".into(),
                    how: "Revoke it on the tokens page if it is listed.".into(),
                    check: ("/tokens".into(), "Open the tokens page".into()),
                    source: anyhow::anyhow!("connection reset"),
                },
                503,
                "while the new API token was being saved: it may or may not have been made. \
                 Revoke it on the tokens page if it is listed.",
            ),
        ];
        for (err, status, text) in cases {
            let (got, body) = body_of(&err).await;
            assert_eq!(got, status, "{err:?}");
            assert!(body.contains(text), "{status}: {body}");
            assert!(body.contains("/static/app.css"), "rendered in the layout");
        }
        let (_, body) = body_of(&DashError::Internal(anyhow::anyhow!("secret detail"))).await;
        assert!(!body.contains("secret detail"), "internals stay in the log");
        let (status, _) = body_of(&DashError::LoginRequired).await;
        assert_eq!(status, 303);
    }
}
