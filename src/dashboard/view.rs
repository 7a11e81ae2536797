//! What every page shares: the layout's context (`Chrome`), the never-cached
//! HTML response, and small formatting helpers.

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse};
use askama::Template;
use chrono::{DateTime, Utc};

use super::error::DashError;
use super::session::Staff;

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
    pub role: &'static str,
    pub org_name: String,
    pub is_admin: bool,
}

impl Chrome {
    pub fn new(
        req: &HttpRequest,
        staff: &Staff,
        title: impl Into<String>,
        section: &'static str,
    ) -> Chrome {
        Chrome {
            title: title.into(),
            section,
            user: Some(UserView {
                email: staff.email.clone(),
                role: staff.role.as_str(),
                org_name: staff.org_name.clone(),
                is_admin: staff.is_admin(),
            }),
            csrf: staff.csrf_token.clone(),
            flash: flash_from(req),
        }
    }

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

/// Flash messages travel as a short code in the query string after a
/// redirect (post/redirect/get); only these fixed texts can be shown, so a
/// crafted link cannot put words on the page.
pub fn flash_message(code: &str) -> Option<&'static str> {
    Some(match code {
        "cancelled" => "The reservation was cancelled.",
        "converted" => "The reservation was converted into a service.",
        "extended" => "The hold was extended; its new deadline is below.",
        "logged_out" => "You are logged out.",
        "settings_saved" => "Settings saved.",
        "webhook_saved" => "Webhook saved. Pending events go to this URL.",
        "webhook_rotated" => "A new signing secret was made: give it to the receiver now.",
        "webhook_removed" => "Webhook removed; its pending events were dropped.",
        "webhook_absent" => "No webhook was set; nothing changed.",
        "user_added" => "The user was added.",
        "user_disabled" => "The user was disabled and their sessions ended.",
        "token_revoked" => "The token was revoked; it is refused from now on.",
        "session_expired" => "Your session has ended; please log in again.",
        _ => return None,
    })
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

pub fn page<T: Template>(t: &T) -> Result<HttpResponse, DashError> {
    Ok(html_response(StatusCode::OK, t.render()?))
}

/// 303 after a successful POST (post/redirect/get).
pub fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .finish()
}

pub fn fmt_time(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

pub fn fmt_opt_time(t: &Option<DateTime<Utc>>) -> String {
    t.as_ref().map(fmt_time).unwrap_or_default()
}

/// "14:59" or "1:02:03": what the countdown shows, as app.js does.
pub fn fmt_remaining(seconds: i64) -> String {
    let s = seconds.max(0);
    let (h, m, sec) = (s / 3600, (s % 3600) / 60, s % 60);
    if h > 0 {
        format!("{h}:{m:02}:{sec:02}")
    } else {
        format!("{m}:{sec:02}")
    }
}

/// Percent-encodes a query-string value.
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Builds `path?k=v&...` from the non-empty pairs.
pub fn url_with(path: &str, pairs: &[(&str, &str)]) -> String {
    let q: Vec<String> = pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect();
    if q.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", q.join("&"))
    }
}

/// An optional form or query field: blank means absent.
pub fn non_blank(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_is_formatted_like_the_script() {
        assert_eq!(fmt_remaining(0), "0:00");
        assert_eq!(fmt_remaining(-5), "0:00");
        assert_eq!(fmt_remaining(899), "14:59");
        assert_eq!(fmt_remaining(3723), "1:02:03");
    }

    #[test]
    fn urls_encode_values_and_skip_blanks() {
        assert_eq!(
            url_with("/m", &[("site", "par1"), ("vendor", "")]),
            "/m?site=par1"
        );
        assert_eq!(url_with("/s", &[("q", "a b&c")]), "/s?q=a%20b%26c");
        assert_eq!(url_with("/m", &[]), "/m");
    }

    #[test]
    fn only_known_flash_codes_are_shown() {
        assert!(flash_message("cancelled").is_some());
        assert!(flash_message("<script>").is_none());
    }
}
