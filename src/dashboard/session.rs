//! Staff sessions, server-side in PostgreSQL: the cookie carries a random
//! token, the table only its SHA-256. Renewed at login, revoked at logout
//! (both in `login`), bounded by an idle timeout and an absolute lifetime.

use crate::db::Db;
use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpMessage, HttpRequest, web};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures_util::future::LocalBoxFuture;
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::error::DashError;
use crate::domain::Role;
use crate::settings::Settings;

/// A logged-in staff member, extracted from the session cookie on every
/// request (and the session's last_seen_at moved forward, at most once per
/// `touch_every`).
#[derive(Debug, Clone)]
pub struct Staff {
    pub user_id: i64,
    pub org_id: i64,
    pub email: String,
    /// S1: the name from the provider's last sign-in; `None` for a user
    /// who never signed in through one.
    pub display_name: Option<String>,
    pub role: Role,
    pub org_name: String,
    pub datacenter_enabled: bool,
    pub csrf_token: String,
    pub(super) token_hash: Vec<u8>,
}

impl Staff {
    /// Support and admin act on reservations; viewers only look.
    pub fn can_act(&self) -> bool {
        matches!(self.role, Role::Support | Role::Admin)
    }
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

/// The session cookie of a new session, however it was signed in
/// (password or the provider): strict, HTTP only, for the session's
/// absolute lifetime.
pub fn session_cookie(
    settings: &crate::settings::Settings,
    token: String,
) -> actix_web::cookie::Cookie<'static> {
    actix_web::cookie::Cookie::build(cookie_name(settings), token)
        .path("/")
        .http_only(true)
        .same_site(actix_web::cookie::SameSite::Strict)
        .secure(settings.secure_cookies)
        .max_age(actix_web::cookie::time::Duration::seconds(
            settings.session_max.as_secs() as i64,
        ))
        .finish()
}

pub fn cookie_name(settings: &Settings) -> &'static str {
    if settings.secure_cookies {
        "__Host-pk_session"
    } else {
        "pk_session"
    }
}

pub fn login_cookie_name(settings: &Settings) -> &'static str {
    if settings.secure_cookies {
        "__Host-pk_login"
    } else {
        "pk_login"
    }
}

pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

pub fn hash_token(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

fn app_data(req: &HttpRequest) -> Result<(Db, web::Data<Settings>), DashError> {
    let pool = req
        .app_data::<web::Data<Db>>()
        .ok_or_else(|| DashError::Internal(anyhow::anyhow!("no database pool in app data")))?;
    let settings = req
        .app_data::<web::Data<Settings>>()
        .ok_or_else(|| DashError::Internal(anyhow::anyhow!("no settings in app data")))?;
    Ok((pool.get_ref().clone(), settings.clone()))
}

/// How stale a session's `last_seen_at` may be before a request moves it
/// forward: a tenth of the idle timeout, at most a minute. A session may
/// thus end up to that much before `session_idle` of true inactivity (a
/// minute early at the default idle timeout); in exchange most page views
/// write nothing and wait for no durable commit (BENCHMARKS.md item 5).
pub fn touch_every(session_idle: std::time::Duration) -> std::time::Duration {
    (session_idle / 10).min(std::time::Duration::from_secs(60))
}

#[derive(sqlx::FromRow)]
struct SessionRow {
    user_id: i64,
    org_id: i64,
    email: String,
    role: String,
    display_name: Option<String>,
    org_name: String,
    datacenter_enabled: bool,
    csrf_token: String,
}

impl FromRequest for Staff {
    type Error = DashError;
    type Future = LocalBoxFuture<'static, Result<Staff, DashError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        // Found already by the route's check (`gate::check`).
        if let Some(staff) = req.extensions().get::<Staff>().cloned() {
            return Box::pin(std::future::ready(Ok(staff)));
        }
        let req = req.clone();
        Box::pin(async move {
            let (pool, settings) = app_data(&req)?;
            let token = req
                .cookie(cookie_name(&settings))
                .map(|c| c.value().to_owned())
                .ok_or(DashError::LoginRequired)?;
            let token_hash = hash_token(&token);
            // One statement checks revocation, the idle timeout and the
            // absolute lifetime against the database clock, and touches the
            // session when its last touch is older than `touch_every`: a
            // page view is then a read, not a durable commit (and several
            // tabs of one session do not queue on its row lock).
            let row: Option<SessionRow> = sqlx::query_as(
                "WITH live AS (
                     SELECT s.token_hash, s.last_seen_at, u.id AS user_id, u.org_id, u.email, u.role,
                            u.display_name, o.name AS org_name, o.datacenter_enabled, s.csrf_token
                       FROM sessions s JOIN users u ON u.id = s.user_id
                       JOIN organizations o ON o.id = u.org_id
                      WHERE s.token_hash = $1
                        AND s.revoked_at IS NULL AND u.disabled_at IS NULL
                        AND s.last_seen_at > clock_timestamp() - make_interval(secs => $2)
                        AND s.created_at > clock_timestamp() - make_interval(secs => $3)),
                 touched AS (
                     UPDATE sessions t SET last_seen_at = clock_timestamp()
                       FROM live
                      WHERE t.token_hash = live.token_hash AND t.revoked_at IS NULL
                        AND live.last_seen_at < clock_timestamp() - make_interval(secs => $4)
                     RETURNING 1)
                 SELECT user_id, org_id, email, role, display_name, org_name, datacenter_enabled,
                        csrf_token
                   FROM live",
            )
            .bind(&token_hash)
            .bind(settings.session_idle.as_secs_f64())
            .bind(settings.session_max.as_secs_f64())
            .bind(touch_every(settings.session_idle).as_secs_f64())
            .fetch_optional(&pool)
            .await?;
            let row = row.ok_or(DashError::LoginRequired)?;
            let role = Role::parse(&row.role).map_err(|e| DashError::Internal(e.into()))?;
            Ok(Staff {
                user_id: row.user_id,
                org_id: row.org_id,
                email: row.email,
                display_name: row.display_name,
                role,
                org_name: row.org_name,
                datacenter_enabled: row.datacenter_enabled,
                csrf_token: row.csrf_token,
                token_hash,
            })
        })
    }
}

/// The client's address: the TCP peer, or, when the peer is one of
/// `POOLKEEPER_TRUSTED_PROXIES`, the address its forwarding headers name
/// (never a header from anyone else, which a client could write).
pub fn source_addr(req: &HttpRequest) -> String {
    let Some(peer) = req.peer_addr().map(|a| a.ip()) else {
        return "unknown".into();
    };
    let trusted = req
        .app_data::<web::Data<Settings>>()
        .map(|s| s.trusted_proxies.as_slice())
        .unwrap_or(&[]);
    super::throttle::client_addr(peer, trusted, req.headers()).to_string()
}

/// A staff action's audit row, on the caller's transaction: the row commits
/// with the action it records.
pub async fn audit_on(
    conn: &mut sqlx::PgConnection,
    req: &HttpRequest,
    staff: &Staff,
    action: crate::audit::AuditAction,
    object: &str,
    detail: Option<&str>,
) -> Result<(), sqlx::Error> {
    let addr = source_addr(req);
    // S1: a single sign-on user's entries name the provider's subject
    // beside the email, which the provider may reassign.
    let subject: Option<(String, Option<String>)> = sqlx::query_as(
        "SELECT u.sso_subject, s.issuer FROM users u LEFT JOIN org_sso s ON s.org_id = u.org_id
          WHERE u.id = $1 AND u.sso_subject IS NOT NULL",
    )
    .bind(staff.user_id)
    .fetch_optional(&mut *conn)
    .await?;
    let detail = match subject {
        Some((subject, issuer)) => {
            let who = format!(
                "subject {subject:?} of {}",
                issuer
                    .as_deref()
                    .unwrap_or("a provider no longer configured")
            );
            Some(match detail {
                Some(d) => format!("{d} ({who})"),
                None => who,
            })
        }
        None => detail.map(str::to_owned),
    };
    crate::audit::record(
        conn,
        &crate::audit::Entry {
            org_id: Some(staff.org_id),
            actor: &staff.email,
            action,
            object,
            source_addr: &addr,
            detail: detail.as_deref(),
        },
    )
    .await
}
