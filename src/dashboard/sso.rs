//! S1-S3 over HTTP: `GET /login/sso?org=SLUG` sends the browser to the
//! organization's provider, `GET /login/sso/callback` completes the
//! sign-in, and sign-out reaches the provider's end-session endpoint. The
//! protocol and the users are `crate::sso`'s.
//!
//! The dashboard's CSP has `form-action 'self'`, which browsers also apply
//! to the redirects that follow a form's submission: the login page's form
//! and the logout form therefore end on a page of ours that moves on by
//! `<meta http-equiv="refresh">` (a navigation of its own, which
//! `form-action` does not govern). The callback does the same towards `/`,
//! so that the first request after the provider's cross-site redirect is a
//! same-site one and carries the `SameSite=Strict` session cookie.

use super::layout::Flash;
use actix_web::cookie::{Cookie, SameSite, time::Duration as CookieDuration};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;
use sqlx::PgConnection;

use super::error::{DashError, Written, commit};
use super::session::{Staff, cookie_name, hash_token, random_token, source_addr};
use super::view::{Chrome, html_response};
use crate::db::Db;
use crate::domain::Role;
use crate::settings::Settings;
use crate::sso::{self, Account, SsoError};

/// The page on the way: a heading, its paragraphs, and where the browser
/// goes next on its own (`next`).
#[derive(Template)]
#[template(path = "sso.html")]
struct SsoPage {
    chrome: Chrome,
    heading: String,
    paragraphs: Vec<String>,
    next: Option<String>,
    next_text: String,
}

fn sso_page(
    status: StatusCode,
    heading: &str,
    paragraphs: Vec<String>,
    next: Option<(String, &str)>,
) -> Result<HttpResponse, DashError> {
    let (next, next_text) = match next {
        Some((url, text)) => (Some(url), text.to_owned()),
        None => (None, String::new()),
    };
    let page = SsoPage {
        chrome: Chrome::anonymous(heading),
        heading: heading.to_owned(),
        paragraphs,
        next,
        next_text,
    };
    Ok(html_response(status, page.render()?))
}

/// The cookie that binds a sign-in under way to the browser that started
/// it. `Lax`: it must come back with the provider's cross-site redirect.
fn browser_cookie_name(settings: &Settings) -> &'static str {
    if settings.secure_cookies {
        "__Host-pk_sso"
    } else {
        "pk_sso"
    }
}

fn browser_cookie(settings: &Settings, value: String) -> Cookie<'static> {
    Cookie::build(browser_cookie_name(settings), value)
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(settings.secure_cookies)
        .max_age(CookieDuration::minutes(i64::from(sso::PENDING_MINUTES)))
        .finish()
}

fn public_url(settings: &Settings) -> Result<&str, DashError> {
    settings.public_url.as_deref().ok_or_else(|| {
        DashError::bad_request(
            "Single sign-on is not available: this server has no POOLKEEPER_PUBLIC_URL, \
             which the provider's redirect needs. Log in with your password, or ask the operator.",
        )
    })
}

fn redirect_uri(public: &str) -> String {
    format!("{public}/login/sso/callback")
}

/// The provider could not be used: say so, and what still works (S2).
fn provider_down(e: &SsoError) -> Result<HttpResponse, DashError> {
    tracing::warn!(error = %e, "single sign-on: the identity provider cannot be used");
    sso_page(
        StatusCode::SERVICE_UNAVAILABLE,
        "Your identity provider cannot be reached",
        vec![
            format!("Single sign-on could not start or finish: {e}."),
            "Nothing was changed. Try again in a few minutes. If your organization kept \
             password sign-in for its admins, an admin can log in with their password \
             on the log in page."
                .to_owned(),
        ],
        None,
    )
}

#[derive(Deserialize)]
pub struct StartQuery {
    #[serde(default)]
    org: String,
    /// `form` when sent by the login page's form (see the module's note).
    #[serde(default)]
    via: String,
}

/// `GET /login/sso?org=SLUG`: to the organization's provider (S1).
pub(crate) async fn start(
    req: HttpRequest,
    pool: web::Data<Db>,
    settings: web::Data<Settings>,
    query: web::Query<StartQuery>,
) -> Result<HttpResponse, DashError> {
    let slug = query.org.trim().to_ascii_lowercase();
    if slug.is_empty() {
        return Err(DashError::bad_request(
            "Give your organization's short name (the one your administrator gave you) \
             on the log in page.",
        ));
    }
    let public = public_url(&settings)?;
    // Bounded per client address before anything else is looked up.
    let addr = source_addr(&req);
    let Some(start_id) = super::throttle::sso_start(pool.get_ref(), &addr).await? else {
        tracing::warn!(source_addr = %addr, "single sign-on: too many starts from one address");
        return Err(DashError::Throttled);
    };
    // Unknown and without single sign-on read alike: the page lists and
    // confirms no organization.
    let Some(config) = sso::config_by_slug(pool.get_ref(), &slug).await? else {
        return sso_page(
            StatusCode::NOT_FOUND,
            "No single sign-on for that name",
            vec![format!(
                "There is no single sign-on under {slug:?}. Check the name your administrator \
                 gave you, or log in with your email and password."
            )],
            None,
        );
    };
    let provider = match sso::discover(&config, &redirect_uri(public)).await {
        Ok(p) => p,
        Err(e) => return provider_down(&e),
    };
    let auth = provider.authorize();
    let browser = random_token();
    sso::begin(
        pool.get_ref(),
        config.org_id,
        &auth,
        &hash_token(&auth.state),
        &hash_token(&browser),
        start_id,
    )
    .await?;
    let mut resp = if query.via == "form" {
        sso_page(
            StatusCode::OK,
            "On to your identity provider",
            vec!["Your browser is going to your organization's sign-in page.".to_owned()],
            Some((auth.url, "Continue to your identity provider")),
        )?
    } else {
        HttpResponse::SeeOther()
            .insert_header((actix_web::http::header::LOCATION, auth.url))
            .insert_header((actix_web::http::header::CACHE_CONTROL, "no-store"))
            .finish()
    };
    resp.add_cookie(&browser_cookie(&settings, browser))
        .map_err(|e| DashError::Internal(e.into()))?;
    Ok(resp)
}

#[derive(Deserialize)]
pub struct CallbackQuery {
    #[serde(default)]
    code: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    error_description: String,
}

/// `GET /login/sso/callback`: completes the sign-in (S1). Every refusal
/// writes nothing but the consumed sign-in under way.
pub(crate) async fn callback(
    req: HttpRequest,
    pool: web::Data<Db>,
    settings: web::Data<Settings>,
    query: web::Query<CallbackQuery>,
) -> Result<HttpResponse, DashError> {
    let public = public_url(&settings)?;
    let pending = take_pending(&req, &pool, &settings, &query).await?;
    if let Some(page) = provider_refusal(&query)? {
        return Ok(page);
    }
    let Some(config) = sso::config(pool.get_ref(), pending.org_id).await? else {
        return Err(DashError::bad_request(
            "Single sign-on was turned off for your organization while you were signing in.",
        ));
    };
    let identity = match identify(&config, public, &query, &pending).await? {
        Ok(identity) => identity,
        Err(page) => return Ok(page),
    };
    // S1: no mapped role, no access; say what was seen and what is expected.
    let Some(role) = identity.values.as_deref().and_then(|v| config.role_for(v)) else {
        return no_role(&config, &identity);
    };
    let signed = Signed {
        identity: &identity,
        role,
        state_hash: hash_token(&query.state),
    };
    sign_in(&req, &pool, &settings, &config, &signed).await
}

/// Who the provider signed in, with which role, by which sign-in.
struct Signed<'a> {
    identity: &'a sso::Identity,
    role: Role,
    state_hash: Vec<u8>,
}

/// The sign-in under way that this answer's state names, consumed, if this
/// browser (its cookie) started it; else the answer is refused.
async fn take_pending(
    req: &HttpRequest,
    pool: &Db,
    settings: &Settings,
    query: &CallbackQuery,
) -> Result<sso::Pending, DashError> {
    let browser = req
        .cookie(browser_cookie_name(settings))
        .map(|c| c.value().to_owned())
        .unwrap_or_default();
    let pending = if query.state.is_empty() || browser.is_empty() {
        None
    } else {
        sso::take(pool, &hash_token(&query.state), &hash_token(&browser)).await?
    };
    pending.ok_or_else(|| {
        DashError::bad_request(
            "This sign-in answer does not match a sign-in this browser started, or it was \
             already used, or it is older than 10 minutes. Nothing was changed: start again \
             from the log in page.",
        )
    })
}

/// The provider's answer is an error, or carries no code: the page that
/// says so (or the refusal), `None` when there is a code to exchange.
fn provider_refusal(query: &CallbackQuery) -> Result<Option<HttpResponse>, DashError> {
    if !query.error.is_empty() {
        return sso_page(
            StatusCode::FORBIDDEN,
            "Your identity provider did not sign you in",
            vec![format!(
                "It answered {:?}{}. Nothing was changed.",
                query.error,
                if query.error_description.is_empty() {
                    String::new()
                } else {
                    format!(": {}", query.error_description)
                }
            )],
            None,
        )
        .map(Some);
    }
    if query.code.is_empty() {
        return Err(DashError::bad_request(
            "The identity provider's answer has no code. Nothing was changed: start again from \
             the log in page.",
        ));
    }
    Ok(None)
}

/// Exchanges the code and verifies the ID token: the identity, or
/// (`Err` inside) the page that says why there is none.
async fn identify(
    config: &sso::Config,
    public: &str,
    query: &CallbackQuery,
    pending: &sso::Pending,
) -> Result<Result<sso::Identity, HttpResponse>, DashError> {
    let provider = match sso::discover(config, &redirect_uri(public)).await {
        Ok(p) => p,
        Err(e) => return provider_down(&e).map(Err),
    };
    match provider
        .sign_in(
            &query.code,
            &pending.pkce_verifier,
            &pending.nonce,
            &config.claim,
        )
        .await
    {
        Ok(identity) => Ok(Ok(identity)),
        Err(e @ SsoError::Unreachable { .. }) => provider_down(&e).map(Err),
        Err(e @ (SsoError::Exchange(_) | SsoError::Token(_))) => {
            tracing::warn!(error = %e, "single sign-on refused");
            sso_page(
                StatusCode::FORBIDDEN,
                "The sign-in was refused",
                vec![
                    format!("{e}."),
                    "Nothing was changed: start again from the log in page.".to_owned(),
                ],
                None,
            )
            .map(Err)
        }
        Err(e) => Err(DashError::Internal(e.into())),
    }
}

/// S1: the refusal when no value of the role claim maps to a role.
fn no_role(config: &sso::Config, identity: &sso::Identity) -> Result<HttpResponse, DashError> {
    let seen = match &identity.values {
        None => format!("Your sign-in carried no {:?} claim.", config.claim),
        Some(v) if v.is_empty() => {
            format!("Your sign-in's {:?} claim was empty.", config.claim)
        }
        Some(v) => format!(
            "Your sign-in's {:?} claim held: {}.",
            config.claim,
            v.iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    sso_page(
        StatusCode::FORBIDDEN,
        "No poolkeeper role for you",
        vec![
            seen,
            format!(
                "Your organization gives a role to these values of {:?}: {}. \
                 Ask your identity provider's administrator to add you to one of them.",
                config.claim,
                config.expected()
            ),
            "Nothing was changed.".to_owned(),
        ],
        None,
    )
}

/// The user a sign-in landed on, as `sso::Account::Ready` holds it.
struct Landed {
    user_id: i64,
    email: String,
    name: String,
    created: bool,
    previous_role: Option<String>,
}

/// In one transaction: the user found, linked or created, the audit rows,
/// and a new session; then the page that sets its cookie.
async fn sign_in(
    req: &HttpRequest,
    pool: &Db,
    settings: &Settings,
    config: &sso::Config,
    signed: &Signed<'_>,
) -> Result<HttpResponse, DashError> {
    let (identity, role) = (signed.identity, signed.role);
    let addr = source_addr(req);
    let mut tx = pool.begin().await?;
    let account = sso::account_on(&mut tx, config.org_id, identity, role)
        .await
        .map_err(|e| match e {
            SsoError::Database(e) => DashError::from(e),
            other => DashError::Internal(other.into()),
        })?;
    let landed = match account {
        Account::Ready {
            user_id,
            email,
            name,
            created,
            previous_role,
        } => Landed {
            user_id,
            email,
            name,
            created,
            previous_role,
        },
        Account::Refused(why) => {
            return sso_page(
                StatusCode::FORBIDDEN,
                "The sign-in was refused",
                vec![why, "Nothing was changed.".to_owned()],
                None,
            );
        }
    };
    record_sign_in(&mut tx, config, identity, role, &landed, &addr).await?;
    sso::completed(&mut tx, &signed.state_hash).await?;
    let token = open_session(&mut tx, req, settings, landed.user_id).await?;
    commit(
        tx,
        Written::new(
            "your sign-in",
            "Either way this browser is not signed in: start again from the log in page.",
            ("/login", "Log in"),
        ),
    )
    .await?;
    signed_in_page(settings, token, &landed, role)
}

/// The audit rows of a sign-in: the user made, the role changed by the
/// provider's claim, and the login itself, in that order.
async fn record_sign_in(
    conn: &mut PgConnection,
    config: &sso::Config,
    identity: &sso::Identity,
    role: Role,
    landed: &Landed,
    addr: &str,
) -> Result<(), DashError> {
    let subject = format!("subject {:?} of {}", identity.subject, config.issuer);
    let object = format!("user:{}", landed.email);
    let mut audit = vec![];
    if landed.created {
        audit.push((
            crate::audit::AuditAction::UserAdd,
            format!("{} by single sign-on, {subject}", role.as_str()),
        ));
    }
    if let Some(before) = &landed.previous_role {
        audit.push((
            crate::audit::AuditAction::UserRoleChanged,
            format!(
                "{before} to {} by the provider's {:?} claim, {subject}",
                role.as_str(),
                config.claim
            ),
        ));
    }
    audit.push((
        crate::audit::AuditAction::Login,
        format!("single sign-on, {subject}"),
    ));
    for (action, detail) in &audit {
        crate::audit::record(
            &mut *conn,
            &crate::audit::Entry {
                org_id: Some(config.org_id),
                actor: &landed.email,
                action: *action,
                object: &object,
                source_addr: addr,
                detail: Some(detail),
            },
        )
        .await?;
    }
    Ok(())
}

/// A new session for `user_id`; its token, for the cookie.
async fn open_session(
    conn: &mut PgConnection,
    req: &HttpRequest,
    settings: &Settings,
    user_id: i64,
) -> Result<String, DashError> {
    // A new session id at every sign-in: one the browser held is revoked.
    if let Some(old) = req.cookie(cookie_name(settings)) {
        sqlx::query("UPDATE sessions SET revoked_at = clock_timestamp() WHERE token_hash = $1 AND revoked_at IS NULL")
            .bind(hash_token(old.value()))
            .execute(&mut *conn)
            .await?;
    }
    let token = random_token();
    sqlx::query("INSERT INTO sessions (token_hash, user_id, csrf_token) VALUES ($1, $2, $3)")
        .bind(hash_token(&token))
        .bind(user_id)
        .bind(random_token())
        .execute(&mut *conn)
        .await?;
    Ok(token)
}

/// The page after a sign-in: it sets the session cookie and removes the
/// sign-in-under-way one.
fn signed_in_page(
    settings: &Settings,
    token: String,
    landed: &Landed,
    role: Role,
) -> Result<HttpResponse, DashError> {
    let session = super::session::session_cookie(settings, token);
    let mut done = browser_cookie(settings, String::new());
    done.make_removal();
    let mut resp = sso_page(
        StatusCode::OK,
        "Signed in",
        vec![if landed.name == landed.email {
            format!("Signed in as {} ({}).", landed.email, role.as_str())
        } else {
            format!(
                "Signed in as {} <{}> ({}).",
                landed.name,
                landed.email,
                role.as_str()
            )
        }],
        Some(("/".to_owned(), "Open the overview")),
    )?;
    resp.add_cookie(&session)
        .map_err(|e| DashError::Internal(e.into()))?;
    resp.add_cookie(&done)
        .map_err(|e| DashError::Internal(e.into()))?;
    Ok(resp)
}

/// S2: when the user's organization keeps password sign-in for admins
/// only and the user is not one, why their password may not be used.
pub(crate) async fn password_refused(db: &Db, user_id: i64) -> Result<Option<String>, DashError> {
    let row: Option<(String, String)> = sqlx::query_as(
        "SELECT u.role, s.passwords FROM users u JOIN org_sso s ON s.org_id = u.org_id WHERE u.id = $1",
    )
    .bind(user_id)
    .fetch_optional(db)
    .await?;
    Ok(match row {
        Some((role, passwords)) if passwords == "admins" && role != "admin" => Some(
            "Your organization signs its staff in through its identity provider: use \
             single sign-on below. Passwords are kept for admins only."
                .to_owned(),
        ),
        _ => None,
    })
}

/// S3: after the session here ended, the page that takes a user who
/// signed in through a provider to its end-session endpoint, when it
/// publishes one. `None`: not such a user, or no such endpoint, or the
/// provider cannot be reached (the session here has ended either way).
pub(crate) async fn end_provider_session(
    db: &Db,
    settings: &Settings,
    staff: &Staff,
) -> Result<Option<HttpResponse>, DashError> {
    let Some(public) = settings.public_url.as_deref() else {
        return Ok(None);
    };
    let is_sso: bool =
        sqlx::query_scalar("SELECT sso_subject IS NOT NULL FROM users WHERE id = $1")
            .bind(staff.user_id)
            .fetch_optional(db)
            .await?
            .unwrap_or(false);
    if !is_sso {
        return Ok(None);
    }
    let Some(config) = sso::config(db, staff.org_id).await? else {
        return Ok(None);
    };
    let provider = match sso::discover(&config, &redirect_uri(public)).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "single sign-on: sign-out could not reach the provider");
            return Ok(None);
        }
    };
    let back = format!("{public}{}", Flash::LoggedOut.after("/login"));
    let Some(url) = provider.end_session_url(&config.client_id, &back) else {
        return Ok(None);
    };
    sso_page(
        StatusCode::OK,
        "Signing out of your identity provider",
        vec!["You are logged out of poolkeeper; your browser now signs out of your identity provider too.".to_owned()],
        Some((url, "Sign out of your identity provider")),
    )
    .map(Some)
}
