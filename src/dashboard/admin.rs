//! Admin pages: the audit log, staff users, API tokens. Every
//! handler checks the role on the server; every write checks CSRF first and
//! commits its audit row in the same transaction as the change.

use super::layout::Flash;
use crate::db::Db;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::error::{DashError, Written, commit};
use super::session::{Staff, audit_on};
use super::view::{Chrome, fmt_opt_time, fmt_time, html_response, page, see_other};
use crate::domain::{Email, Role, Scope};

// ---- /audit ----

const AUDIT_PAGE: i64 = 50;

pub struct AuditView {
    pub at: String,
    pub actor: String,
    /// S1: the actor's name beside the email, when it is not the email.
    pub actor_name: Option<String>,
    pub action: String,
    /// The action's words for people; empty for a name no longer written.
    pub action_words: &'static str,
    pub object: String,
    pub source_addr: String,
    pub detail: String,
}

#[derive(Template)]
#[template(path = "audit.html")]
struct AuditPage {
    chrome: Chrome,
    rows: Vec<AuditView>,
    next: Option<i64>,
}

#[derive(Deserialize)]
pub struct AuditQuery {
    before: Option<i64>,
}

pub(crate) async fn audit_log(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    q: web::Query<AuditQuery>,
) -> Result<HttpResponse, DashError> {
    let mut rows = crate::audit::page(&pool, staff.org_id, q.before, AUDIT_PAGE).await?;
    let next = if rows.len() as i64 > AUDIT_PAGE {
        rows.truncate(AUDIT_PAGE as usize);
        rows.last().map(|r| r.id)
    } else {
        None
    };
    page(&AuditPage {
        chrome: Chrome::new(&req, &staff, "Audit log", "audit"),
        rows: rows
            .into_iter()
            .map(|r| AuditView {
                at: fmt_time(&r.at),
                actor_name: r.actor_name.filter(|name| *name != r.actor),
                actor: r.actor,
                action_words: crate::audit::AuditAction::parse(&r.action)
                    .map(crate::audit::AuditAction::words)
                    .unwrap_or_default(),
                action: r.action,
                object: r.object.unwrap_or_default(),
                source_addr: r.source_addr.unwrap_or_default(),
                detail: r.detail.unwrap_or_default(),
            })
            .collect(),
        next,
    })
}

// ---- /users ----

pub struct UserView {
    pub id: i64,
    pub email: String,
    pub role: String,
    pub created_at: String,
    pub disabled_at: String,
    pub is_self: bool,
}

#[derive(Template)]
#[template(path = "users.html")]
struct UsersPage {
    chrome: Chrome,
    users: Vec<UserView>,
    error: Option<String>,
    email: String,
}

async fn users_page(
    req: &HttpRequest,
    staff: &Staff,
    pool: &Db,
    status: StatusCode,
    error: Option<String>,
    email: String,
) -> Result<HttpResponse, DashError> {
    let users = crate::staff::list(pool, staff.org_id).await?;
    let body = UsersPage {
        chrome: Chrome::new(req, staff, "Users", "users"),
        users: users
            .into_iter()
            .map(|u| UserView {
                is_self: u.id == staff.user_id,
                id: u.id,
                email: u.email,
                role: u.role,
                created_at: fmt_time(&u.created_at),
                disabled_at: fmt_opt_time(&u.disabled_at),
            })
            .collect(),
        error,
        email,
    }
    .render()?;
    Ok(html_response(status, body))
}

pub(crate) async fn users(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
) -> Result<HttpResponse, DashError> {
    users_page(&req, &staff, &pool, StatusCode::OK, None, String::new()).await
}

#[derive(Deserialize)]
pub struct AddUserForm {
    #[serde(default)]
    email: String,
    #[serde(default)]
    role: String,
    #[serde(default)]
    password: String,
}

pub(crate) async fn add_user(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    form: web::Form<AddUserForm>,
) -> Result<HttpResponse, DashError> {
    let email_text = form.email.trim().to_owned();
    let refuse = |msg: String| {
        users_page(
            &req,
            &staff,
            &pool,
            StatusCode::BAD_REQUEST,
            Some(msg),
            email_text.clone(),
        )
    };
    let email = match Email::parse(&email_text) {
        Ok(e) => e,
        Err(e) => {
            return refuse(format!("The email is not valid: {e}. Nothing was changed.")).await;
        }
    };
    let role = match Role::parse(form.role.trim()) {
        Ok(r) => r,
        Err(e) => return refuse(format!("The role is not valid: {e}. Nothing was changed.")).await,
    };
    let password = form.password.clone();
    let mut tx = pool.begin().await?;
    // The new user belongs to the admin's organization, never another.
    let created = crate::staff::create_on(&mut *tx, staff.org_id, &email, role, &password).await;
    let id = match created {
        Ok(id) => id,
        Err(crate::staff::StaffError::Database(e)) => return Err(e.into()),
        Err(e @ crate::staff::StaffError::Hash(_)) => return Err(DashError::Internal(e.into())),
        Err(e) => {
            drop(tx);
            return refuse(format!("{e}; nothing was changed.")).await;
        }
    };
    // The password is never logged: the row names the user and the role.
    audit_on(
        &mut tx,
        &req,
        &staff,
        crate::audit::AuditAction::UserAdd,
        &format!("user:{}", email.as_str()),
        Some(&format!("id {id}, role {}", role.as_str())),
    )
    .await?;
    commit(
        tx,
        Written::new(
            format!("the new user {}", email.as_str()),
            "The users page lists the user if it was added; add it again only if it is not there.",
            ("/users", "Open the users page"),
        ),
    )
    .await?;
    Ok(see_other(&Flash::UserAdded.after("/users")))
}

pub(crate) async fn disable_user(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    id: web::Path<i64>,
) -> Result<HttpResponse, DashError> {
    let id = id.into_inner();
    if id == staff.user_id {
        return Err(DashError::bad_request(
            "You cannot disable your own account; ask another admin. Nothing was changed.",
        ));
    }
    let mut tx = pool.begin().await?;
    // Another organization's user, or an absent one, is 404.
    let email = crate::staff::disable_on(&mut tx, staff.org_id, id)
        .await?
        .ok_or(DashError::NotFound("active user"))?;
    audit_on(
        &mut tx,
        &req,
        &staff,
        crate::audit::AuditAction::UserDisable,
        &format!("user:{email}"),
        Some("sessions revoked"),
    )
    .await?;
    commit(
        tx,
        Written::new(
            format!("the disabling of user {email}"),
            "The users page shows whether the user is still active; disable it again if it is.",
            ("/users", "Open the users page"),
        ),
    )
    .await?;
    Ok(see_other(&Flash::UserDisabled.after("/users")))
}

// ---- /tokens ----

pub struct TokenView {
    pub id: i64,
    pub name: String,
    pub scopes: String,
    pub created_at: String,
    pub revoked_at: String,
}

#[derive(Template)]
#[template(path = "tokens.html")]
struct TokensPage {
    chrome: Chrome,
    tokens: Vec<TokenView>,
    /// (name, secret): shown once, right after creation.
    created: Option<(String, String)>,
    error: Option<String>,
}

async fn tokens_page(
    req: &HttpRequest,
    staff: &Staff,
    pool: &Db,
    status: StatusCode,
    created: Option<(String, String)>,
    error: Option<String>,
) -> Result<HttpResponse, DashError> {
    let tokens = crate::tokens::list(pool, staff.org_id).await?;
    let body = TokensPage {
        chrome: Chrome::new(req, staff, "API tokens", "tokens"),
        tokens: tokens
            .into_iter()
            .map(|t| TokenView {
                id: t.id,
                name: t.name,
                scopes: t.scopes.join(", "),
                created_at: fmt_time(&t.created_at),
                revoked_at: fmt_opt_time(&t.revoked_at),
            })
            .collect(),
        created,
        error,
    }
    .render()?;
    Ok(html_response(status, body))
}

pub(crate) async fn tokens(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
) -> Result<HttpResponse, DashError> {
    tokens_page(&req, &staff, &pool, StatusCode::OK, None, None).await
}

#[derive(Deserialize)]
pub struct AddTokenForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    orders: Option<String>,
    #[serde(default)]
    inventory: Option<String>,
}

pub(crate) async fn add_token(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    form: web::Form<AddTokenForm>,
) -> Result<HttpResponse, DashError> {
    let name = form.name.trim();
    let mut scopes = Vec::new();
    if form.orders.is_some() {
        scopes.push(Scope::Orders);
    }
    if form.inventory.is_some() {
        scopes.push(Scope::Inventory);
    }
    let problem = if name.is_empty() || name.chars().count() > 100 {
        Some("A token needs a name of 1 to 100 characters; nothing was created.")
    } else if scopes.is_empty() {
        Some("A token needs at least one scope; nothing was created.")
    } else {
        None
    };
    if let Some(p) = problem {
        return tokens_page(
            &req,
            &staff,
            &pool,
            StatusCode::BAD_REQUEST,
            None,
            Some(p.into()),
        )
        .await;
    }
    let mut tx = pool.begin().await?;
    let (name, secret) = match crate::tokens::create_on(&mut *tx, staff.org_id, Some(name), &scopes)
        .await
    {
        Ok(made) => made,
        Err(crate::tokens::TokenError::Database(e)) => return Err(e.into()),
        Err(e) => {
            drop(tx);
            let msg = format!("{e}; nothing was created.");
            return tokens_page(&req, &staff, &pool, StatusCode::CONFLICT, None, Some(msg)).await;
        }
    };
    let scope_text: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    // The secret is never written to the audit log: only its name.
    audit_on(
        &mut tx,
        &req,
        &staff,
        crate::audit::AuditAction::TokenCreate,
        &format!("token:{name}"),
        Some(&scope_text.join(",")),
    )
    .await?;
    commit(
        tx,
        Written::new(
            format!("the new API token “{name}”"),
            "The token may exist although its secret was never shown, and the secret cannot be \
             shown again: if the tokens page lists this token, revoke it there and create \
             another.",
            ("/tokens", "Open the tokens page"),
        ),
    )
    .await?;
    // Shown once, in this response (never cached), never stored in clear.
    tokens_page(
        &req,
        &staff,
        &pool,
        StatusCode::OK,
        Some((name, secret)),
        None,
    )
    .await
}

pub(crate) async fn revoke_token(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    id: web::Path<i64>,
) -> Result<HttpResponse, DashError> {
    let mut tx = pool.begin().await?;
    let name = crate::tokens::revoke_on(&mut tx, staff.org_id, id.into_inner())
        .await?
        .ok_or(DashError::NotFound("live token"))?;
    audit_on(
        &mut tx,
        &req,
        &staff,
        crate::audit::AuditAction::TokenRevoke,
        &format!("token:{name}"),
        None,
    )
    .await?;
    commit(
        tx,
        Written::new(
            format!("the revocation of API token “{name}”"),
            "The tokens page shows whether the token is revoked; revoke it again if it is not.",
            ("/tokens", "Open the tokens page"),
        ),
    )
    .await?;
    Ok(see_other(&Flash::TokenRevoked.after("/tokens")))
}
