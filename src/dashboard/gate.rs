//! R12, in one place: the datacenter module's pages and actions need both
//! the deployment switch and the organization's setting.

use crate::settings::Settings;

use super::error::DashError;
use super::session::Staff;

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
