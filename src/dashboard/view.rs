//! What every page shares: the layout's context (`Chrome`), the never-cached
//! HTML response, and small formatting helpers.

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse};
use askama::Template;
use chrono::{DateTime, Utc};

use super::error::DashError;
pub use super::layout::{Chrome, UserView, flash_from, flash_message, html_response};
use super::session::Staff;

/// A logged-in page's layout context (`Chrome` itself lives in `layout`,
/// below the error pages, which draw it without a session).
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
                name: staff
                    .display_name
                    .clone()
                    .filter(|name| *name != staff.email),
                role: staff.role.as_str(),
                org_name: staff.org_name.clone(),
                is_admin: staff.is_admin(),
            }),
            csrf: staff.csrf_token.clone(),
            flash: flash_from(req),
        }
    }
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

/// Prose for a table cell, HTML-escaped, each word holding a character
/// after which browsers may break a line (a hyphen or a dash, a slash, `?`,
/// `!`, `%`, `+`: `PK-00013`, `2026-12-06T00:16:30Z`, a URL) in a
/// `<span class="w">` that does not wrap, so that a cell never breaks a
/// word. The cell still wraps between words. Output with `|safe`.
pub fn words(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let (word, tail) = rest.split_at(end);
        let wrap = word.chars().any(|c| {
            matches!(
                c,
                '-' | '/' | '?' | '!' | '%' | '+' | '}' | ']' | '\u{2010}'..='\u{2014}'
            )
        });
        if wrap {
            out.push_str("<span class=\"w\">");
        }
        escape_into(&mut out, word);
        if wrap {
            out.push_str("</span>");
        }
        let spaces = tail.len() - tail.trim_start().len();
        escape_into(&mut out, &tail[..spaces]);
        rest = &tail[spaces..];
    }
    out
}

fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
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

/// A filter's <select> (templates/_select.html): the organization's own
/// values, so that nobody types `par1` and wonders about a typo.
pub struct Select {
    pub id: &'static str,
    pub name: &'static str,
    pub label: &'static str,
    /// The first option's words (value ""): "any", or "choose one".
    pub blank: &'static str,
    pub required: bool,
    pub options: Vec<SelectOption>,
}

pub struct SelectOption {
    pub value: String,
    pub text: String,
    pub selected: bool,
}

impl Select {
    /// `values` as options, `current` selected; a current value that is not
    /// among them (an old link, a machine since gone) stays shown, selected.
    pub fn new<'a>(
        id: &'static str,
        name: &'static str,
        label: &'static str,
        values: impl IntoIterator<Item = (&'a str, &'a str)>,
        current: Option<&str>,
    ) -> Select {
        let current = current.map(str::trim).filter(|c| !c.is_empty());
        let mut options: Vec<SelectOption> = values
            .into_iter()
            .map(|(value, text)| SelectOption {
                selected: current == Some(value),
                value: value.to_owned(),
                text: text.to_owned(),
            })
            .collect();
        if let Some(c) = current
            && !options.iter().any(|o| o.selected)
        {
            options.push(SelectOption {
                value: c.to_owned(),
                text: c.to_owned(),
                selected: true,
            });
        }
        Select {
            id,
            name,
            label,
            blank: "any",
            required: false,
            options,
        }
    }

    /// Of plain values (their text is the value).
    pub fn of(
        id: &'static str,
        name: &'static str,
        label: &'static str,
        values: &[String],
        current: Option<&str>,
    ) -> Select {
        Select::new(
            id,
            name,
            label,
            values.iter().map(|v| (v.as_str(), v.as_str())),
            current,
        )
    }

    /// A select a person must choose in (why-not's order).
    pub fn required(mut self) -> Select {
        self.required = true;
        self.blank = "choose one";
        self
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
}

#[cfg(test)]
mod words_tests {
    use super::words;

    #[test]
    fn words_with_a_break_inside_are_kept_whole_and_everything_is_escaped() {
        assert_eq!(
            words("moved to PK-00013 at 2026-12-06, <b>&\"' not_ready a/b"),
            "moved to <span class=\"w\">PK-00013</span> at <span class=\"w\">2026-12-06,</span> \
             &lt;b&gt;&amp;&#34;&#39; not_ready <span class=\"w\">a/b</span>"
        );
        assert_eq!(words("<i>-x"), "<span class=\"w\">&lt;i&gt;-x</span>");
        assert_eq!(words("  two  spaces\n"), "  two  spaces\n");
        assert_eq!(words(""), "");
    }
}
