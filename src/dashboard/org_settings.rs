//! `/settings` (admin): the organization's half of the R12 switch, with the
//! deployment's half shown read-only, R19's cap on one customer's live
//! holds, R18's repairs segment and headroom per pool, and the
//! organization's webhook: its URL, its signing secret, its backlog and
//! last failures.

use super::layout::Flash;
use crate::capacity::HeadroomSetting;
use crate::db::Db;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::error::{DashError, Written, commit};
use super::session::{Staff, audit_on};
use super::view::{Chrome, Select, fmt_opt_time, fmt_time, html_response, see_other};
use crate::capacity::Change;
use crate::domain::{Profile, Segment, Site};
use crate::settings::Settings;
use crate::webhooks;

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
    /// The headroom form's site and profile: the organization's own values.
    headroom_pool: Vec<Select>,
    /// R20: the substitutes declared per profile.
    substitutes: Vec<crate::capacity::Substitutes>,
    /// The substitutes form's profile: the organization's own profiles.
    substitutes_profile: Select,
    /// R21: each site's procurement lead time (days, and whether staff set
    /// it), and the form's site.
    lead_times: Vec<(String, i32, bool)>,
    lead_site: Select,
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
/// Bound of R18's headroom per pool and segment (0 removes it).
pub use crate::capacity::MAX_HEADROOM;

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
    let facets = crate::inventory::facets(pool, staff.org_id).await?;
    let sso = crate::sso::config(pool, staff.org_id).await?;
    let substitutes = crate::capacity::list_substitutes(pool, staff.org_id).await?;
    let lead_times =
        super::planning::lead_times_of_sites(pool, staff.org_id, &facets.sites).await?;
    let body = SettingsPage {
        substitutes,
        substitutes_profile: Select::of(
            "substitutes-profile",
            "profile",
            "Profile",
            &facets.profiles,
            None,
        )
        .required(),
        lead_site: Select::of("lead-site", "site", "Site", &facets.sites, None).required(),
        lead_times,
        sso,
        sso_redirect: format!(
            "{}/login/sso/callback",
            settings
                .public_url
                .as_deref()
                .unwrap_or("<POOLKEEPER_PUBLIC_URL, unset>")
        ),
        headroom_pool: vec![
            Select::of("headroom-site", "site", "Site", &facets.sites, None).required(),
            Select::of(
                "headroom-profile",
                "profile",
                "Profile",
                &facets.profiles,
                None,
            )
            .required(),
        ],
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

/// The settings form, read: each field absent (or empty) leaves its
/// setting as it is, but the checkbox, which is off when absent.
struct SettingsChange {
    enabled: bool,
    /// R16, in seconds.
    warning: Option<i32>,
    /// R19 (0: no cap).
    hold_limit: Option<i32>,
    /// R18: `Some(None)` clears the repairs segment.
    repairs: Option<Option<Segment>>,
}

impl SettingsChange {
    fn parse(form: &SettingsForm) -> Result<SettingsChange, DashError> {
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
                super::input::whole_number::<i32>(text)
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
                super::input::whole_number::<i32>(text)
                    .filter(|n| (0..=MAX_CUSTOMER_HOLD_LIMIT).contains(n))
                    .ok_or_else(|| {
                        DashError::bad_request(format!(
                            "The cap on one customer's live holds is a whole number from 0 to \
                             {MAX_CUSTOMER_HOLD_LIMIT} (0: no cap); nothing was changed."
                        ))
                    })?,
            ),
        };
        let repairs = match form.repairs_segment.as_deref().map(str::trim) {
            None => None,
            Some("") => Some(None),
            Some(text) => Some(Some(Segment::parse(text).map_err(|e| {
                DashError::bad_request(format!("The repairs segment: {e}; nothing was changed."))
            })?)),
        };
        Ok(SettingsChange {
            enabled,
            warning,
            hold_limit,
            repairs,
        })
    }
}

pub(crate) async fn save(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    form: web::Form<SettingsForm>,
) -> Result<HttpResponse, DashError> {
    let change = SettingsChange::parse(&form)?;
    // The audit rows commit with the changes, or none does.
    let mut tx = pool.begin().await?;
    if let Some(limit) = change.hold_limit {
        save_hold_limit(&mut tx, &req, &staff, limit).await?;
    }
    if let Some(segment) = &change.repairs {
        save_repairs_segment(&mut tx, &req, &staff, segment.as_ref()).await?;
    }
    if let Some(seconds) = change.warning
        && crate::orgs::set_expiry_warning_on(&mut *tx, staff.org_id, seconds).await?
    {
        audit_on(
            &mut tx,
            &req,
            &staff,
            crate::audit::AuditAction::OrgExpiryWarning,
            &format!("org:{}", staff.org_id),
            Some(&format!("{seconds} s before a deadline")),
        )
        .await?;
    }
    let enabled = change.enabled;
    crate::orgs::set_datacenter_enabled_on(&mut *tx, staff.org_id, enabled).await?;
    audit_on(
        &mut tx,
        &req,
        &staff,
        crate::audit::AuditAction::OrgDatacenterEnabled,
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
    Ok(see_other(&Flash::SettingsSaved.after("/settings")))
}

/// R19's cap, with its audit row when it changed.
async fn save_hold_limit(
    conn: &mut sqlx::PgConnection,
    req: &HttpRequest,
    staff: &Staff,
    limit: i32,
) -> Result<(), DashError> {
    let changed = sqlx::query(
        "UPDATE organizations SET customer_hold_limit = $2
          WHERE id = $1 AND customer_hold_limit IS DISTINCT FROM $2",
    )
    .bind(staff.org_id)
    .bind(limit)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if changed > 0 {
        let detail = if limit == 0 {
            "no cap".to_owned()
        } else {
            format!("{limit} live holds per customer")
        };
        let object = format!("org:{}", staff.org_id);
        audit_on(
            conn,
            req,
            staff,
            crate::audit::AuditAction::OrgCustomerHoldLimit,
            &object,
            Some(&detail),
        )
        .await?;
    }
    Ok(())
}

/// R18's repairs segment (`None`: none), with its audit row when it changed.
async fn save_repairs_segment(
    conn: &mut sqlx::PgConnection,
    req: &HttpRequest,
    staff: &Staff,
    segment: Option<&Segment>,
) -> Result<(), DashError> {
    let segment = segment.map(Segment::as_str);
    let changed = sqlx::query(
        "UPDATE organizations SET repairs_segment = $2
          WHERE id = $1 AND repairs_segment IS DISTINCT FROM $2",
    )
    .bind(staff.org_id)
    .bind(segment)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if changed > 0 {
        let object = format!("org:{}", staff.org_id);
        audit_on(
            conn,
            req,
            staff,
            crate::audit::AuditAction::OrgRepairsSegment,
            &object,
            Some(segment.unwrap_or("none")),
        )
        .await?;
    }
    Ok(())
}

#[derive(Deserialize)]
pub struct WebhookForm {
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
    match form.action.as_str() {
        "save" => set_webhook(&req, &staff, &settings, &pool, &form.url).await,
        "rotate" => rotate_webhook_secret(&req, &staff, &pool).await,
        "remove" => remove_webhook(&req, &staff, &pool).await,
        _ => Err(DashError::bad_request(
            "The webhook action must be save, rotate or remove.",
        )),
    }
}

/// `save`: the URL checked (the settings page again, 400, when it is
/// refused), then set.
async fn set_webhook(
    req: &HttpRequest,
    staff: &Staff,
    settings: &Settings,
    pool: &Db,
    typed: &str,
) -> Result<HttpResponse, DashError> {
    let checked = match webhooks::parse_url(typed) {
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
                req,
                staff,
                settings,
                pool,
                StatusCode::BAD_REQUEST,
                Some(msg),
                Some(typed.to_owned()),
            )
            .await;
        }
    };
    let mut tx = pool.begin().await?;
    webhooks::set_on(&mut tx, staff.org_id, url.as_str(), false, &staff.email).await?;
    let object = format!("org:{}", staff.org_id);
    audit_on(
        &mut tx,
        req,
        staff,
        crate::audit::AuditAction::OrgWebhookSet,
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
    Ok(see_other(&Flash::WebhookSaved.after("/settings")))
}

/// `rotate`: a new signing secret.
async fn rotate_webhook_secret(
    req: &HttpRequest,
    staff: &Staff,
    pool: &Db,
) -> Result<HttpResponse, DashError> {
    let mut tx = pool.begin().await?;
    if !webhooks::rotate_secret_on(&mut tx, staff.org_id, &staff.email).await? {
        return Ok(see_other(&Flash::WebhookAbsent.after("/settings")));
    }
    let object = format!("org:{}", staff.org_id);
    audit_on(
        &mut tx,
        req,
        staff,
        crate::audit::AuditAction::OrgWebhookSecretRotated,
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
    Ok(see_other(&Flash::WebhookRotated.after("/settings")))
}

/// `remove`: the webhook and its pending deliveries.
async fn remove_webhook(
    req: &HttpRequest,
    staff: &Staff,
    pool: &Db,
) -> Result<HttpResponse, DashError> {
    let mut tx = pool.begin().await?;
    let Some(dropped) = webhooks::remove_on(&mut tx, staff.org_id).await? else {
        return Ok(see_other(&Flash::WebhookAbsent.after("/settings")));
    };
    let detail = format!("{dropped} pending deliveries dropped");
    let object = format!("org:{}", staff.org_id);
    audit_on(
        &mut tx,
        req,
        staff,
        crate::audit::AuditAction::OrgWebhookRemoved,
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
    Ok(see_other(&Flash::WebhookRemoved.after("/settings")))
}

#[derive(Deserialize)]
pub struct HeadroomForm {
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
    let bad = |what: String| DashError::bad_request(format!("{what}; nothing was changed."));
    let site = Site::parse(form.site.trim()).map_err(|e| bad(e.to_string()))?;
    let profile = Profile::parse(form.profile.trim()).map_err(|e| bad(e.to_string()))?;
    let segment = Segment::parse(form.segment.trim()).map_err(|e| bad(e.to_string()))?;
    let setting = super::input::whole_number::<i64>(form.machines.trim())
        .and_then(|n| HeadroomSetting::new(site, profile, segment, n))
        .ok_or_else(|| {
            bad(format!(
                "“Machines” is a whole number from 0 to {MAX_HEADROOM} (0 removes the headroom)"
            ))
        })?;
    let HeadroomSetting {
        site,
        profile,
        segment,
        machines,
    } = &setting;
    let machines = *machines;
    let mut tx = pool.begin().await?;
    // The API's path (the pool's turn first, then the row): one rule for
    // both, and one audit name for each change.
    let (_, change) = crate::capacity::set(&mut tx, staff.org_id, &setting, &staff.email).await?;
    if change == Change::NoSuchPool {
        return Err(bad(format!(
            "No machine of {} is at site {site} with profile {profile}: headroom is kept only for a pool that has machines",
            staff.org_name
        )));
    }
    if let Some((action, detail)) = change.audit(machines, segment) {
        audit_on(
            &mut tx,
            &req,
            &staff,
            action,
            &format!("pool:{site}/{profile}"),
            Some(&detail),
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
    let flash = if machines == 0 {
        Flash::HeadroomRemoved
    } else {
        Flash::HeadroomSaved
    };
    Ok(see_other(&format!("{}#headroom", flash.after("/settings"))))
}

#[derive(Deserialize)]
pub struct SubstitutesForm {
    #[serde(default)]
    profile: String,
    /// In order of preference, separated by commas or spaces; empty removes.
    #[serde(default)]
    substitutes: String,
    /// Separated by commas or spaces; empty: orders of any segment.
    #[serde(default)]
    segments: String,
}

/// The words of a list field: separated by commas or white space.
fn words_of(field: &str) -> impl Iterator<Item = &str> {
    field
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
}

/// `POST /settings/substitutes` (admin): declares, in order of preference,
/// the profiles that may serve orders of `profile` (R20), for `segments`
/// only when given; an empty list removes the declaration. The API's rules
/// and path (`capacity::set_substitutes`): a bad list writes nothing; the
/// audit row commits with the change.
pub(crate) async fn save_substitutes(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    form: web::Form<SubstitutesForm>,
) -> Result<HttpResponse, DashError> {
    let bad = |what: String| DashError::bad_request(format!("{what}; nothing was changed."));
    let profile = Profile::parse(form.profile.trim()).map_err(|e| bad(e.to_string()))?;
    let substitutes = words_of(&form.substitutes)
        .map(Profile::parse)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    let mut segments: Vec<Segment> = Vec::new();
    for w in words_of(&form.segments) {
        let s = Segment::parse(w).map_err(|e| bad(e.to_string()))?;
        if !segments.contains(&s) {
            segments.push(s);
        }
    }
    if let Some(problem) = crate::capacity::substitutes_problem(&profile, &substitutes, &segments) {
        return Err(bad(problem));
    }
    let mut tx = pool.begin().await?;
    let (row, change) = crate::capacity::set_substitutes(
        &mut tx,
        staff.org_id,
        &profile,
        &substitutes,
        &segments,
        &staff.email,
    )
    .await?;
    match &change {
        crate::capacity::SubstitutesChange::Refused(problem)
        | crate::capacity::SubstitutesChange::UnknownProfiles(problem) => {
            return Err(bad(problem.clone()));
        }
        _ => {}
    }
    if let Some((action, detail)) = change.audit(&row) {
        audit_on(
            &mut tx,
            &req,
            &staff,
            action,
            &format!("profile:{profile}"),
            Some(&detail),
        )
        .await?;
    }
    commit(
        tx,
        Written::new(
            "the substitutes of the profile",
            "The settings page lists the substitutes in force now, and the audit log whether the \
             change was recorded; save them again if they are not the ones you chose.",
            ("/settings#substitutes", "Open the settings"),
        ),
    )
    .await?;
    let flash = if substitutes.is_empty() {
        Flash::SubstitutesRemoved
    } else {
        Flash::SubstitutesSaved
    };
    Ok(see_other(&format!(
        "{}#substitutes",
        flash.after("/settings")
    )))
}
