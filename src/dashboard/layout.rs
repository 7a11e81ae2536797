//! The layout every page is drawn in: its context (`Chrome`), the flash
//! messages it may show, and the never-cached HTML response. Below the
//! error pages and the session: it imports neither (`view` adds
//! `Chrome::new` for a logged-in page).

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse};

/// The layout's context: who is logged in, which section is active, the
/// CSRF token for the logout form, and a flash message after a redirect.
#[derive(Debug, Clone)]
pub struct Chrome {
    pub title: String,
    pub section: &'static str,
    pub user: Option<UserView>,
    pub csrf: String,
    pub flash: Option<&'static str>,
}

#[derive(Debug, Clone)]
pub struct UserView {
    pub email: String,
    /// S1: the provider's name for the user, when it is not the email.
    pub name: Option<String>,
    pub role: &'static str,
    pub org_name: String,
    pub is_admin: bool,
}

impl Chrome {
    /// For pages shown without a session (login, errors).
    pub fn anonymous(title: &str) -> Chrome {
        Chrome {
            title: title.to_owned(),
            section: "",
            user: None,
            csrf: String::new(),
            flash: None,
        }
    }
}

crate::domain::closed_set! {
    /// Flash messages travel as a short code in the query string after a
    /// redirect (post/redirect/get); only these fixed texts can be shown, so
    /// a crafted link cannot put words on the page.
    pub enum Flash("flash") {
        Cancelled = "cancelled", "The reservation was cancelled.";
        Converted = "converted", "The reservation was converted into a service.";
        Extended = "extended", "The hold was extended; its new deadline is below.";
        LoggedOut = "logged_out", "You are logged out.";
        SettingsSaved = "settings_saved", "Settings saved.";
        WebhookSaved = "webhook_saved", "Webhook saved. Pending events go to this URL.";
        WebhookRotated = "webhook_rotated", "A new signing secret was made: give it to the receiver now.";
        WebhookRemoved = "webhook_removed", "Webhook removed; its pending events were dropped.";
        WebhookAbsent = "webhook_absent", "No webhook was set; nothing changed.";
        HeadroomSaved = "headroom_saved", "Headroom saved: the pool keeps it from the next reserve on.";
        HeadroomRemoved = "headroom_removed", "Headroom removed: orders of any segment may take those machines.";
        SubstitutesSaved = "substitutes_saved", "Substitutes saved: reserves that allow them use this list from the next one on.";
        SubstitutesRemoved = "substitutes_removed", "Substitutes removed: orders of this profile are served by its own pool only.";
        LeadTimeSaved = "lead_time_saved", "Lead time saved: the planning page flags against it now.";
        UserAdded = "user_added", "The user was added.";
        UserDisabled = "user_disabled", "The user was disabled and their sessions ended.";
        TokenRevoked = "token_revoked", "The token was revoked; it is refused from now on.";
        SessionExpired = "session_expired", "Your session has ended; please log in again.";
    }
}

impl Flash {
    /// `path` with this message after the redirect.
    pub fn after(self, path: &str) -> String {
        format!("{path}?flash={}", self.as_str())
    }
}

/// The text of a flash code; `None` for any code `Flash` does not know.
pub fn flash_message(code: &str) -> Option<&'static str> {
    Flash::parse(code).ok().map(Flash::words)
}

pub fn flash_from(req: &HttpRequest) -> Option<&'static str> {
    req.query_string()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "flash")
        .and_then(|(_, v)| flash_message(v))
}

/// An HTML response, never cached. The security headers (CSP without
/// 'unsafe-inline' and the rest) come from crate::security_headers, on every
/// response.
pub fn html_response(status: StatusCode, body: String) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_known_flash_codes_are_shown() {
        assert!(flash_message("cancelled").is_some());
        assert!(flash_message("<script>").is_none());
    }
}
