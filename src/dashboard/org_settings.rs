//! `/settings` (admin): the organization's half of the R12 switch, with the
//! deployment's half shown read-only, R19's cap on one customer's live
//! holds, R18's repairs segment and headroom per pool, and the
//! organization's webhook: its URL, its signing secret, its backlog and
//! last failures.

use crate::db::Db;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::csrf;
use super::error::{DashError, Written, commit};
use super::session::{Staff, audit_on};
use super::view::{Chrome, fmt_opt_time, fmt_time, html_response, see_other};
use crate::domain::{Profile, Segment, Site};
use crate::settings::Settings;
use crate::webhooks;

pub(crate) fn require_admin(staff: &Staff) -> Result<(), DashError> {
    if staff.is_admin() {
        Ok(())
    } else {
        Err(DashError::forbidden(
            "Only an admin can change the organization's settings.",
        ))
    }
}

#[derive(Template)]
#[template(path = "settings.html")]
struct SettingsPage {
    chrome: Chrome,
    org_enabled: bool,
    /// R16: how long before a deadline the order service hears of it.
    expiry_warning_seconds: i32,
    /// R19: the cap on one customer's live holds (0: none).
    customer_hold_limit: i32,
    /// R18: the segment whose headroom healing may use for repairs.
    repairs_segment: String,
    /// R18: the headroom kept, per pool and segment.
    headroom: Vec<HeadroomRow>,
    deployment_on: bool,
    webhook: Option<WebhookView>,
    /// What the URL field shows (the refused URL after an error).
    url_value: String,
    error: Option<String>,
    allow_private: bool,
    backlog: BacklogView,
    failures: Vec<FailureView>,
    /// S1: the single sign-on, read-only (set with `poolkeeper org sso`).
    sso: Option<crate::sso::Config>,
    sso_redirect: String,
}

#[derive(sqlx::FromRow)]
pub struct HeadroomRow {
    pub site: String,
    pub profile: String,
    pub segment: String,
    pub machines: i32,
    pub updated_at: chrono::DateTime<chrono::Utc>,
    pub updated_by: String,
}

/// Bounds of R19's cap, as the organizations table's check says.
pub const MAX_CUSTOMER_HOLD_LIMIT: i32 = 10_000;
/// Bound of R18's headroom per pool and segment, as the headroom table's
/// check says (0 removes it).
pub const MAX_HEADROOM: i32 = 100_000;

pub struct WebhookView {
    pub url: String,
    pub secret: String,
    pub updated_at: String,
    pub updated_by: String,
}

pub struct BacklogView {
    pub pending: i64,
    pub due: i64,
    pub oldest_pending: String,
    pub delivered_24h: i64,
    pub failed_24h: i64,
}

pub struct FailureView {
    pub at: String,
    pub event_id: i64,
    pub status: String,
    pub latency_ms: i32,
    pub error: String,
}

pub(crate) async fn show(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
) -> Result<HttpResponse, DashError> {
    require_admin(&staff)?;
    settings_page(&req, &staff, &settings, &pool, StatusCode::OK, None, None).await
}

/// The page, with `error` and the refused `url` after a bad webhook form.
async fn settings_page(
    req: &HttpRequest,
    staff: &Staff,
    settings: &Settings,
    pool: &Db,
    status: StatusCode,
    error: Option<String>,
    url: Option<String>,
) -> Result<HttpResponse, DashError> {
    let hook = webhooks::get(pool, staff.org_id).await?;
    let b = webhooks::backlog(pool, Some(staff.org_id)).await?;
    let failures = webhooks::recent_failures(pool, Some(staff.org_id), 10).await?;
    let expiry_warning_seconds = crate::orgs::expiry_warning_seconds(pool, staff.org_id).await?;
    let (customer_hold_limit, repairs_segment): (i32, Option<String>) = sqlx::query_as(
        "SELECT customer_hold_limit, repairs_segment FROM organizations WHERE id = $1",
    )
    .bind(staff.org_id)
    .fetch_one(pool)
    .await?;
    let headroom: Vec<HeadroomRow> = sqlx::query_as(
        "SELECT site, profile, segment, machines, updated_at, updated_by FROM headroom
          WHERE org_id = $1 ORDER BY site, profile, segment",
    )
    .bind(staff.org_id)
    .fetch_all(pool)
    .await?;
    let sso = crate::sso::config(pool, staff.org_id).await?;
    let body = SettingsPage {
        sso,
        sso_redirect: format!(
            "{}/login/sso/callback",
            settings
                .public_url
                .as_deref()
                .unwrap_or("<POOLKEEPER_PUBLIC_URL, unset>")
        ),
        chrome: Chrome::new(req, staff, "Settings", "settings"),
        org_enabled: staff.datacenter_enabled,
        expiry_warning_seconds,
        customer_hold_limit,
        repairs_segment: repairs_segment.unwrap_or_default(),
        headroom,
        deployment_on: settings.datacenter_module,
        url_value: url.unwrap_or_else(|| hook.as_ref().map(|h| h.url.clone()).unwrap_or_default()),
        webhook: hook.map(|h| WebhookView {
            url: h.url,
            secret: h.secret,
            updated_at: fmt_time(&h.updated_at),
            updated_by: h.updated_by,
        }),
        error,
        allow_private: settings.webhook_allow_private,
        backlog: BacklogView {
            pending: b.pending,
            due: b.due,
            oldest_pending: fmt_opt_time(&b.oldest_pending),
            delivered_24h: b.delivered_24h,
            failed_24h: b.failed_24h,
        },
        failures: failures.into_iter().map(failure_view).collect(),
    }
    .render()?;
    Ok(html_response(status, body))
}

pub(crate) fn failure_view(f: webhooks::Failure) -> FailureView {
    FailureView {
        at: fmt_time(&f.at),
        event_id: f.event_id,
        status: f
            .status
            .map(|s| s.to_string())
            .unwrap_or_else(|| "no answer".into()),
        latency_ms: f.latency_ms,
        error: f.error,
    }
}

#[derive(Deserialize)]
pub struct SettingsForm {
    #[serde(default)]
    csrf: String,
    /// A checkbox: present ("on") when ticked, absent otherwise.
    datacenter: Option<String>,
    /// R16, in seconds; absent or empty leaves it as it is.
    #[serde(default)]
    expiry_warning_seconds: Option<String>,
    /// R19, 0 to 10000 (0: no cap); absent or empty leaves it as it is.
    #[serde(default)]
    customer_hold_limit: Option<String>,
    /// R18's repairs segment; absent leaves it as it is, empty clears it.
    #[serde(default)]
    repairs_segment: Option<String>,
}

pub(crate) async fn save(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    form: web::Form<SettingsForm>,
) -> Result<HttpResponse, DashError> {
    csrf::check(&staff, &form.csrf)?;
    require_admin(&staff)?;
    let enabled = match form.datacenter.as_deref() {
        None => false,
        Some("on") => true,
        Some(_) => {
            return Err(DashError::bad_request(
                "The datacenter setting must be a checkbox.",
            ));
        }
    };
    let warning = match form.expiry_warning_seconds.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(text) => Some(
            text.parse::<i32>()
                .ok()
                .filter(|s| (0..=3600).contains(s))
                .ok_or_else(|| {
                    DashError::bad_request(
                        "The warning before a deadline is a whole number of seconds from 0 to 3600; \
                         nothing was changed.",
                    )
                })?,
        ),
    };
    let hold_limit = match form.customer_hold_limit.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(text) => Some(
            text.parse::<i32>()
                .ok()
                .filter(|n| (0..=MAX_CUSTOMER_HOLD_LIMIT).contains(n))
                .ok_or_else(|| {
                    DashError::bad_request(format!(
                        "The cap on one customer's live holds is a whole number from 0 to \
                         {MAX_CUSTOMER_HOLD_LIMIT} (0: no cap); nothing was changed."
                    ))
                })?,
        ),
    };
    let repairs: Option<Option<Segment>> = match form.repairs_segment.as_deref().map(str::trim) {
        None => None,
        Some("") => Some(None),
        Some(text) => Some(Some(Segment::parse(text).map_err(|e| {
            DashError::bad_request(format!("The repairs segment: {e}; nothing was changed."))
        })?)),
    };
    // The audit rows commit with the changes, or none does.
    let mut tx = pool.begin().await?;
    let object = format!("org:{}", staff.org_id);
    if let Some(limit) = hold_limit {
        let changed = sqlx::query(
            "UPDATE organizations SET customer_hold_limit = $2
              WHERE id = $1 AND customer_hold_limit IS DISTINCT FROM $2",
        )
        .bind(staff.org_id)
        .bind(limit)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if changed > 0 {
            let detail = if limit == 0 {
                "no cap".to_owned()
            } else {
                format!("{limit} live holds per customer")
            };
            audit_on(
                &mut tx,
                &req,
                &staff,
                "org.customer_hold_limit",
                &object,
                Some(&detail),
            )
            .await?;
        }
    }
    if let Some(segment) = &repairs {
        let segment = segment.as_ref().map(Segment::as_str);
        let changed = sqlx::query(
            "UPDATE organizations SET repairs_segment = $2
              WHERE id = $1 AND repairs_segment IS DISTINCT FROM $2",
        )
        .bind(staff.org_id)
        .bind(segment)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if changed > 0 {
            audit_on(
                &mut tx,
                &req,
                &staff,
                "org.repairs_segment",
                &object,
                Some(segment.unwrap_or("none")),
            )
            .await?;
        }
    }
    if let Some(seconds) = warning
        && crate::orgs::set_expiry_warning_on(&mut *tx, staff.org_id, seconds).await?
    {
        audit_on(
            &mut tx,
            &req,
            &staff,
            "org.expiry_warning",
            &format!("org:{}", staff.org_id),
            Some(&format!("{seconds} s before a deadline")),
        )
        .await?;
    }
    crate::orgs::set_datacenter_enabled_on(&mut *tx, staff.org_id, enabled).await?;
    audit_on(
        &mut tx,
        &req,
        &staff,
        "org.datacenter_enabled",
        &format!("org:{}", staff.org_id),
        Some(if enabled { "on" } else { "off" }),
    )
    .await?;
    commit(
        tx,
        Written::new(
            "the organization's settings (the datacenter switch, the warning before a deadline, \
             the cap on one customer's holds, the repairs segment)",
            "The settings page shows the values in force now, and the audit log whether the \
             change was recorded; save them again if they are not the ones you chose.",
            ("/settings", "Open the settings"),
        ),
    )
    .await?;
    Ok(see_other("/settings?flash=settings_saved"))
}

#[derive(Deserialize)]
pub struct WebhookForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    url: String,
}

/// `POST /settings/webhook`: `action` is `save` (set or change the URL; a
/// new webhook gets a secret, a changed URL keeps it), `rotate` (a new
/// secret) or `remove`. Each writes its audit row in the same transaction;
/// the secret is never in the audit log.
pub(crate) async fn save_webhook(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    form: web::Form<WebhookForm>,
) -> Result<HttpResponse, DashError> {
    csrf::check(&staff, &form.csrf)?;
    require_admin(&staff)?;
    let object = format!("org:{}", staff.org_id);
    match form.action.as_str() {
        "save" => {
            let checked = match webhooks::parse_url(&form.url) {
                Ok(url) => webhooks::check_destination(&url, settings.webhook_allow_private)
                    .await
                    .map(|_| url),
                Err(e) => Err(e),
            };
            let url = match checked {
                Ok(url) => url,
                Err(e) => {
                    let msg = format!("{e}. Nothing was saved.");
                    return settings_page(
                        &req,
                        &staff,
                        &settings,
                        &pool,
                        StatusCode::BAD_REQUEST,
                        Some(msg),
                        Some(form.url.clone()),
                    )
                    .await;
                }
            };
            let mut tx = pool.begin().await?;
            webhooks::set_on(&mut tx, staff.org_id, url.as_str(), false, &staff.email).await?;
            audit_on(
                &mut tx,
                &req,
                &staff,
                "org.webhook_set",
                &object,
                Some(url.as_str()),
            )
            .await?;
            commit(
                tx,
                Written::new(
                    "the webhook URL",
                    "The settings page shows the webhook URL in force now; save it again if it \
                     is not the one you entered.",
                    ("/settings", "Open the settings"),
                ),
            )
            .await?;
            Ok(see_other("/settings?flash=webhook_saved"))
        }
        "rotate" => {
            let mut tx = pool.begin().await?;
            if !webhooks::rotate_secret_on(&mut tx, staff.org_id, &staff.email).await? {
                return Ok(see_other("/settings?flash=webhook_absent"));
            }
            audit_on(
                &mut tx,
                &req,
                &staff,
                "org.webhook_secret_rotated",
                &object,
                None,
            )
            .await?;
            commit(
                tx,
                Written::new(
                    "the webhook's new signing secret",
                    "The settings page shows the secret in force now and when it last changed \
                     (the audit log records each rotation): if it was rotated, give the new \
                     secret to your receivers, or their signature checks fail.",
                    ("/settings", "Open the settings"),
                ),
            )
            .await?;
            Ok(see_other("/settings?flash=webhook_rotated"))
        }
        "remove" => {
            let mut tx = pool.begin().await?;
            let Some(dropped) = webhooks::remove_on(&mut tx, staff.org_id).await? else {
                return Ok(see_other("/settings?flash=webhook_absent"));
            };
            let detail = format!("{dropped} pending deliveries dropped");
            audit_on(
                &mut tx,
                &req,
                &staff,
                "org.webhook_removed",
                &object,
                Some(&detail),
            )
            .await?;
            commit(
                tx,
                Written::new(
                    "the removal of the webhook",
                    "The settings page shows whether a webhook is still set; remove it again if \
                     it is.",
                    ("/settings", "Open the settings"),
                ),
            )
            .await?;
            Ok(see_other("/settings?flash=webhook_removed"))
        }
        _ => Err(DashError::bad_request(
            "The webhook action must be save, rotate or remove.",
        )),
    }
}

#[derive(Deserialize)]
pub struct HeadroomForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    site: String,
    #[serde(default)]
    profile: String,
    #[serde(default)]
    segment: String,
    #[serde(default)]
    machines: String,
}

/// `POST /settings/headroom` (admin): keeps `machines` of pool (site,
/// profile) for `segment` (R18); 0 removes it. The pool's turn
/// (`pool_turn`, sql/capacity.sql) is taken first in the transaction, as a
/// reserve into the pool takes it, so that a change never interleaves with
/// a decision on the pool's last machines; the audit row commits with it.
pub(crate) async fn save_headroom(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    form: web::Form<HeadroomForm>,
) -> Result<HttpResponse, DashError> {
    csrf::check(&staff, &form.csrf)?;
    require_admin(&staff)?;
    let bad = |what: String| DashError::bad_request(format!("{what}; nothing was changed."));
    let site = Site::parse(form.site.trim()).map_err(|e| bad(e.to_string()))?;
    let profile = Profile::parse(form.profile.trim()).map_err(|e| bad(e.to_string()))?;
    let segment = Segment::parse(form.segment.trim()).map_err(|e| bad(e.to_string()))?;
    let machines = form
        .machines
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|n| (0..=MAX_HEADROOM).contains(n))
        .ok_or_else(|| {
            bad(format!(
                "“Machines” is a whole number from 0 to {MAX_HEADROOM} (0 removes the headroom)"
            ))
        })?;
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pool_turn($1, $2, $3)")
        .bind(staff.org_id)
        .bind(site.as_str())
        .bind(profile.as_str())
        .execute(&mut *tx)
        .await?;
    let changed = if machines == 0 {
        sqlx::query(
            "DELETE FROM headroom WHERE org_id = $1 AND site = $2 AND profile = $3 AND segment = $4",
        )
        .bind(staff.org_id)
        .bind(site.as_str())
        .bind(profile.as_str())
        .bind(segment.as_str())
        .execute(&mut *tx)
        .await?
        .rows_affected()
    } else {
        sqlx::query(
            "INSERT INTO headroom (org_id, site, profile, segment, machines, updated_by)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (org_id, site, profile, segment) DO UPDATE
                SET machines = EXCLUDED.machines, updated_by = EXCLUDED.updated_by,
                    updated_at = clock_timestamp()
              WHERE headroom.machines IS DISTINCT FROM EXCLUDED.machines",
        )
        .bind(staff.org_id)
        .bind(site.as_str())
        .bind(profile.as_str())
        .bind(segment.as_str())
        .bind(machines)
        .bind(&staff.email)
        .execute(&mut *tx)
        .await?
        .rows_affected()
    };
    if changed > 0 {
        audit_on(
            &mut tx,
            &req,
            &staff,
            "headroom.set",
            &format!("pool:{site}/{profile}"),
            Some(&format!("{machines} machines kept for {segment}")),
        )
        .await?;
    }
    commit(
        tx,
        Written::new(
            "the headroom of the pool",
            "The settings page lists the headroom in force now, and the audit log whether the \
             change was recorded; save it again if it is not the one you chose.",
            ("/settings#headroom", "Open the settings"),
        ),
    )
    .await?;
    Ok(see_other(if machines == 0 {
        "/settings?flash=headroom_removed#headroom"
    } else {
        "/settings?flash=headroom_saved#headroom"
    }))
}
