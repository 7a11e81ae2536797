//! `/settings` (admin): the organization's half of the R12 switch, with the
//! deployment's half shown read-only.

use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;
use sqlx::PgPool;

use super::csrf;
use super::error::DashError;
use super::session::{Staff, audit_on};
use super::view::{Chrome, page, see_other};
use crate::settings::Settings;

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
    deployment_on: bool,
}

pub(crate) async fn show(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
) -> Result<HttpResponse, DashError> {
    require_admin(&staff)?;
    page(&SettingsPage {
        chrome: Chrome::new(&req, &staff, "Settings", "settings"),
        org_enabled: staff.datacenter_enabled,
        deployment_on: settings.datacenter_module,
    })
}

#[derive(Deserialize)]
pub struct SettingsForm {
    #[serde(default)]
    csrf: String,
    /// A checkbox: present ("on") when ticked, absent otherwise.
    datacenter: Option<String>,
}

pub(crate) async fn save(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<PgPool>,
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
    // The audit row commits with the change, or neither does.
    let mut tx = pool.begin().await?;
    crate::orgs::set_datacenter_enabled_on(&mut tx, staff.org_id, enabled).await?;
    audit_on(
        &mut tx,
        &req,
        &staff,
        "org.datacenter_enabled",
        &format!("org:{}", staff.org_id),
        Some(if enabled { "on" } else { "off" }),
    )
    .await?;
    tx.commit().await?;
    Ok(see_other("/settings?flash=settings_saved"))
}
