//! Logging in and out: the login form (login CSRF as a double-submit
//! token), throttled password checks, the session renewed at login and
//! revoked at logout. The session itself is `session`'s.

use super::layout::Flash;
use std::sync::OnceLock;

use crate::db::Db;
use actix_web::cookie::{Cookie, SameSite, time::Duration as CookieDuration};
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::csrf;
use super::error::{DashError, Written, commit};
use super::session::{
    Staff, audit_on, cookie_name, hash_token, login_cookie_name, random_token, source_addr,
};
use super::view::{Chrome, page, see_other};
use crate::domain::Email;
use crate::settings::Settings;

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    chrome: Chrome,
    login_csrf: String,
    email: String,
    error: Option<&'static str>,
}

fn login_cookie(settings: &Settings, value: String) -> Cookie<'static> {
    let mut c = Cookie::build(login_cookie_name(settings), value)
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(settings.secure_cookies)
        .max_age(CookieDuration::hours(1))
        .finish();
    c.set_secure(settings.secure_cookies);
    c
}

/// The login form. Login CSRF is a double-submit token: a cookie and a
/// hidden field that must match.
pub(crate) async fn login_form(
    req: HttpRequest,
    settings: web::Data<Settings>,
) -> Result<HttpResponse, DashError> {
    let token = random_token();
    let mut chrome = Chrome::anonymous("Log in");
    chrome.flash = super::view::flash_from(&req);
    let mut resp = page(&LoginPage {
        chrome,
        login_csrf: token.clone(),
        email: String::new(),
        error: None,
    })?;
    resp.add_cookie(&login_cookie(&settings, token))
        .map_err(|e| DashError::Internal(e.into()))?;
    Ok(resp)
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    email: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf: String,
}

/// A hash to verify against when the account does not exist, so that an
/// unknown email takes as long as a wrong password.
fn dummy_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| crate::staff::hash_password("not-a-real-password").unwrap_or_default())
}

#[derive(sqlx::FromRow)]
struct UserRow {
    id: i64,
    org_id: i64,
    password_hash: String,
    disabled: bool,
}

/// Recorded instead of whatever was typed when it is not an email.
const NOT_AN_EMAIL: &str = "(not an email)";

pub(crate) async fn login(
    req: HttpRequest,
    pool: web::Data<Db>,
    settings: web::Data<Settings>,
    form: web::Form<LoginForm>,
) -> Result<HttpResponse, DashError> {
    check_login_csrf(&req, &settings, &form.csrf)?;
    let addr = source_addr(&req);
    // What is recorded (throttling, audit): the account name when the field
    // holds an email, else a fixed word, so that a password typed into the
    // email field never reaches the audit log.
    let account = match Email::parse(&form.email) {
        Ok(e) => e.as_str().to_owned(),
        Err(_) => NOT_AN_EMAIL.to_owned(),
    };
    refuse_if_throttled(&pool, &account, &addr).await?;
    let user = find_user(&pool, &form.email).await?;
    let ok = password_matches(user.as_ref(), form.password.clone()).await?;
    match user {
        Some(u) if ok && !u.disabled => {
            // S2: an organization that signs in through its provider may
            // keep passwords for its admins only.
            if let Some(why) = super::sso::password_refused(&pool, u.id).await? {
                record_attempt(
                    &pool,
                    Some(u.org_id),
                    &account,
                    &addr,
                    false,
                    crate::audit::AuditAction::LoginRefusedSso,
                    None,
                )
                .await?;
                return Err(DashError::forbidden(why));
            }
            logged_in(&req, &pool, &settings, &u, &account, &addr).await
        }
        other => {
            record_attempt(
                &pool,
                other.map(|u| u.org_id),
                &account,
                &addr,
                false,
                crate::audit::AuditAction::LoginFailed,
                None,
            )
            .await?;
            let email_text = form.email.trim().to_ascii_lowercase();
            form_again(&settings, email_text)
        }
    }
}

/// Login CSRF: the form's token must match its cookie (double submit).
fn check_login_csrf(req: &HttpRequest, settings: &Settings, sent: &str) -> Result<(), DashError> {
    let expected = req
        .cookie(login_cookie_name(settings))
        .map(|c| c.value().to_owned());
    if expected.as_deref().is_some_and(|e| csrf::same(e, sent)) {
        Ok(())
    } else {
        Err(DashError::forbidden(
            "The login form expired or was not sent by this site; reload the login page and try again.",
        ))
    }
}

/// Too many failures of the account or from the address lately: refused
/// (even with the right password), and the refusal recorded.
async fn refuse_if_throttled(pool: &Db, account: &str, addr: &str) -> Result<(), DashError> {
    // Failures count per account and address together (`throttle`).
    if !super::throttle::refused(pool, account, addr).await? {
        return Ok(());
    }
    // Filed under the account's organization when it exists, so that
    // its admins see the refusals on /audit.
    let org_id: Option<i64> = sqlx::query_scalar("SELECT org_id FROM users WHERE email = $1")
        .bind(account)
        .fetch_optional(pool)
        .await?;
    record_attempt(
        pool,
        org_id,
        account,
        addr,
        false,
        crate::audit::AuditAction::LoginThrottled,
        None,
    )
    .await?;
    Err(DashError::Throttled)
}

/// The account the email field names, if it is an email and exists.
async fn find_user(pool: &Db, email: &str) -> Result<Option<UserRow>, DashError> {
    let Ok(email) = Email::parse(email) else {
        return Ok(None);
    };
    Ok(sqlx::query_as(
        "SELECT id, org_id, password_hash, disabled_at IS NOT NULL AS disabled FROM users WHERE email = $1",
    )
    .bind(email.as_str())
    .fetch_optional(pool)
    .await?)
}

/// The password against the account's hash, or against a dummy one when
/// there is no account (the same time either way).
async fn password_matches(user: Option<&UserRow>, password: String) -> Result<bool, DashError> {
    let stored = user
        .map(|u| u.password_hash.clone())
        .unwrap_or_else(|| dummy_hash().to_owned());
    // argon2 is deliberately slow: off the async workers.
    web::block(move || crate::staff::verify_password(&stored, &password))
        .await
        .map_err(|e| DashError::Internal(e.into()))
}

/// The form again (401), with a fresh login token and what was typed as
/// the email.
fn form_again(settings: &Settings, email: String) -> Result<HttpResponse, DashError> {
    let token = random_token();
    let mut resp = super::view::html_response(
        actix_web::http::StatusCode::UNAUTHORIZED,
        LoginPage {
            chrome: Chrome::anonymous("Log in"),
            login_csrf: token.clone(),
            email,
            error: Some("That email and password do not match an active account."),
        }
        .render()?,
    );
    resp.add_cookie(&login_cookie(settings, token))
        .map_err(|e| DashError::Internal(e.into()))?;
    Ok(resp)
}

/// A new session, to the overview. The session id is renewed at login: a
/// cookie planted before login is revoked, never promoted.
async fn logged_in(
    req: &HttpRequest,
    pool: &Db,
    settings: &Settings,
    user: &UserRow,
    account: &str,
    addr: &str,
) -> Result<HttpResponse, DashError> {
    let old = req.cookie(cookie_name(settings));
    let token = random_token();
    record_attempt(
        pool,
        Some(user.org_id),
        account,
        addr,
        true,
        crate::audit::AuditAction::Login,
        Some(NewSession {
            token: &token,
            user_id: user.id,
            replaces: old.as_ref().map(|c| c.value()),
        }),
    )
    .await?;
    let session = super::session::session_cookie(settings, token);
    let mut clear_login = login_cookie(settings, String::new());
    clear_login.make_removal();
    let mut resp = see_other("/");
    resp.add_cookie(&session)
        .map_err(|e| DashError::Internal(e.into()))?;
    resp.add_cookie(&clear_login)
        .map_err(|e| DashError::Internal(e.into()))?;
    Ok(resp)
}

/// A successful login's session, and the one its browser held before.
struct NewSession<'a> {
    token: &'a str,
    user_id: i64,
    replaces: Option<&'a str>,
}

/// login_attempts for throttling, audit_log for people; never the password.
/// A successful login's session commits with them, and the revocation of
/// the session its browser held before.
#[allow(clippy::too_many_arguments)]
async fn record_attempt(
    pool: &Db,
    org_id: Option<i64>,
    email: &str,
    addr: &str,
    succeeded: bool,
    action: crate::audit::AuditAction,
    session: Option<NewSession<'_>>,
) -> Result<(), DashError> {
    let mut tx = pool.begin().await?;
    if let Some(session) = session {
        if let Some(old) = session.replaces {
            sqlx::query("UPDATE sessions SET revoked_at = clock_timestamp() WHERE token_hash = $1 AND revoked_at IS NULL")
                .bind(hash_token(old))
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("INSERT INTO sessions (token_hash, user_id, csrf_token) VALUES ($1, $2, $3)")
            .bind(hash_token(session.token))
            .bind(session.user_id)
            .bind(random_token())
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query("INSERT INTO login_attempts (email, source_addr, succeeded) VALUES ($1, $2, $3)")
        .bind(email)
        .bind(addr)
        .bind(succeeded)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO audit_log (org_id, actor, action, object, source_addr) VALUES ($1, $2, $3, $4, $5)")
        .bind(org_id)
        .bind(email)
        .bind(action.as_str())
        .bind(format!("user:{email}"))
        .bind(addr)
        .execute(&mut *tx)
        .await?;
    commit(
        tx,
        Written::new(
            "the record of this login",
            "Either way this browser is not logged in: log in again.",
            ("/login", "Log in"),
        ),
    )
    .await
}

pub(crate) async fn logout(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    settings: web::Data<Settings>,
) -> Result<HttpResponse, DashError> {
    // The revocation and its audit row commit together.
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE sessions SET revoked_at = clock_timestamp() WHERE token_hash = $1")
        .bind(&staff.token_hash)
        .execute(&mut *tx)
        .await?;
    let object = format!("user:{}", staff.email);
    audit_on(
        &mut tx,
        &req,
        &staff,
        crate::audit::AuditAction::Logout,
        &object,
        None,
    )
    .await?;
    commit(
        tx,
        Written::new(
            "your logout",
            "If the overview asks you to log in, you are logged out; if it opens, log out again.",
            ("/", "Open the overview"),
        ),
    )
    .await?;
    // S3: and the provider's session, for a user who signed in there.
    // The session here has ended whatever happens there.
    let provider = super::sso::end_provider_session(&pool, &settings, &staff)
        .await
        .ok()
        .flatten();
    let mut gone = Cookie::build(cookie_name(&settings), "")
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(settings.secure_cookies)
        .finish();
    gone.make_removal();
    let mut resp = provider.unwrap_or_else(|| see_other(&Flash::LoggedOut.after("/login")));
    resp.add_cookie(&gone)
        .map_err(|e| DashError::Internal(e.into()))?;
    Ok(resp)
}
