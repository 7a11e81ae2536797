//! Who may open a route, declared once per route in the route table
//! (`dashboard::routes!`) and checked here before the handler runs: the
//! session, on a POST the form's CSRF token, the role, then R12's module
//! switches (the deployment's and the organization's), in that order.
//! Handlers take the `Staff` this check found and never call a guard.

use actix_web::body::BoxBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::web::{self, Bytes};
use actix_web::{Error, HttpMessage};

use crate::settings::Settings;

use super::csrf;
use super::error::DashError;
use super::input;
use super::session::Staff;

/// What a route asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone: the login form, static files.
    Public,
    /// Any logged-in staff member.
    Staff,
    /// R12: a page of the datacenter module, for any role.
    Datacenter,
    /// R12: an action of the datacenter module, for support and admin.
    DatacenterActor,
    /// Users, tokens and the audit log: admin only.
    Admin,
    /// The organization's settings: admin only.
    Settings,
    /// R12: a setting of the datacenter module (headroom, as
    /// `PUT /api/v1/headroom`): admin only, and refused while a switch is off.
    DatacenterSettings,
}

impl Access {
    /// The route belongs to the datacenter module (R12): refused while
    /// either switch is off.
    pub const fn datacenter_module(self) -> bool {
        matches!(
            self,
            Access::Datacenter | Access::DatacenterActor | Access::DatacenterSettings
        )
    }

    /// The route needs a session.
    pub const fn needs_session(self) -> bool {
        !matches!(self, Access::Public)
    }

    /// The role's half of the check.
    fn role(self, staff: &Staff) -> Result<(), DashError> {
        match self {
            Access::Public | Access::Staff | Access::Datacenter => Ok(()),
            Access::DatacenterActor if staff.can_act() => Ok(()),
            Access::DatacenterActor => Err(DashError::forbidden(
                "Your role (viewer) can look but not act; ask a support or admin user.",
            )),
            Access::Admin | Access::Settings | Access::DatacenterSettings if staff.is_admin() => {
                Ok(())
            }
            Access::Admin => Err(DashError::forbidden(format!(
                "Your role ({}) cannot see or change this; only an admin can.",
                staff.role.as_str()
            ))),
            Access::Settings | Access::DatacenterSettings => Err(DashError::forbidden(
                "Only an admin can change the organization's settings.",
            )),
        }
    }
}

/// R12, in one place: the datacenter module's pages and actions need both
/// the deployment switch and the organization's setting.
pub fn datacenter(settings: &Settings, staff: &Staff) -> Result<(), DashError> {
    if !settings.datacenter_module {
        return Err(DashError::ModuleOff(
            "The datacenter module is switched off for this deployment (POOLKEEPER_DATACENTER_MODULE=off).".into(),
        ));
    }
    if !staff.datacenter_enabled {
        return Err(DashError::ModuleOff(format!(
            "The datacenter module is off for {}; an admin can turn it on under Settings.",
            staff.org_name
        )));
    }
    Ok(())
}

/// The middleware on every route of the table, inside `input::guard` (the
/// text is already storable): refuses with the dashboard's answer (the
/// login redirect, a 403 page) or hands the request on with its `Staff`
/// kept, which the handler's `Staff` extractor then takes without asking
/// the database again.
pub async fn check(
    access: Access,
    mut req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    if !access.needs_session() {
        return next.call(req).await;
    }
    match admit(access, &mut req).await {
        Ok(staff) => {
            req.extensions_mut().insert(staff);
            next.call(req).await
        }
        Err(e) => Ok(req.error_response(e)),
    }
}

async fn admit(access: Access, req: &mut ServiceRequest) -> Result<Staff, DashError> {
    let staff = req.extract::<Staff>().await?;
    if req.method() == Method::POST {
        // Before the role and the switches: a forged form learns nothing.
        let sent = sent_csrf(req).await?;
        csrf::check(&staff, &sent)?;
    }
    access.role(&staff)?;
    if access.datacenter_module() {
        let settings = req
            .app_data::<web::Data<Settings>>()
            .ok_or_else(|| DashError::Internal(anyhow::anyhow!("no settings in app data")))?;
        datacenter(settings, &staff)?;
    }
    Ok(staff)
}

/// The `csrf` field of a url-encoded form body (empty without one), the
/// body handed on unchanged to the handler's form extractor.
async fn sent_csrf(req: &mut ServiceRequest) -> Result<String, DashError> {
    if !input::is_form(req) {
        return Ok(String::new());
    }
    let body = req
        .extract::<Bytes>()
        .await
        .map_err(|e| DashError::bad_request(format!("the form could not be read: {e}")))?;
    req.set_payload(Payload::from(body.clone()));
    Ok(url::form_urlencoded::parse(&body)
        .find(|(name, _)| name == "csrf")
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Role;

    fn staff(role: Role, datacenter_enabled: bool) -> Staff {
        Staff {
            user_id: 1,
            org_id: 1,
            email: "someone@example.com".into(),
            display_name: None,
            role,
            org_name: "Acme".into(),
            datacenter_enabled,
            csrf_token: "token".into(),
            token_hash: vec![],
        }
    }

    #[test]
    fn each_access_admits_the_roles_it_names() {
        let roles = [Role::Viewer, Role::Support, Role::Admin];
        for (access, admitted) in [
            (Access::Public, [true, true, true]),
            (Access::Staff, [true, true, true]),
            (Access::Datacenter, [true, true, true]),
            (Access::DatacenterActor, [false, true, true]),
            (Access::Admin, [false, false, true]),
            (Access::Settings, [false, false, true]),
        ] {
            for (role, want) in roles.iter().zip(admitted) {
                let got = access.role(&staff(*role, true));
                assert_eq!(got.is_ok(), want, "{access:?} as {role:?}");
                if let Err(e) = got {
                    assert!(matches!(e, DashError::Forbidden(_)), "{access:?}: {e:?}");
                }
            }
        }
    }

    #[test]
    fn the_module_needs_both_switches() {
        let mut settings = Settings::defaults();
        for (deployment, organization, open) in [
            (true, true, true),
            (true, false, false),
            (false, true, false),
            (false, false, false),
        ] {
            settings.datacenter_module = deployment;
            let got = datacenter(&settings, &staff(Role::Admin, organization));
            assert_eq!(got.is_ok(), open, "{deployment} {organization}");
            if let Err(e) = got {
                assert!(matches!(e, DashError::ModuleOff(_)), "{e:?}");
            }
        }
        assert!(Access::Datacenter.datacenter_module());
        assert!(Access::DatacenterActor.datacenter_module());
        assert!(!Access::Admin.datacenter_module() && !Access::Staff.datacenter_module());
        assert!(!Access::Public.needs_session() && Access::Staff.needs_session());
    }
}
