//! The one place where the text a person sends the dashboard is checked:
//! every query string, every url-encoded form body and every
//! path segment of a dashboard route passes `guard` before any extractor or
//! handler sees it. What PostgreSQL cannot store (NUL, bytes that are not
//! UTF-8), control characters a field does not allow, and values longer than
//! any field needs are refused with the dashboard's 400 page, naming the
//! field; nothing is written. Handlers then only check what their values
//! mean (a site, a fence, an email), never whether the text is storable.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::web::Bytes;

use super::error::DashError;

/// The longest value a field may carry, in characters, when it is not in
/// `FIELD_MAX`: more than any identifier, email or search the pages take.
pub const DEFAULT_MAX_CHARS: usize = 256;

/// Fields with a bound of their own.
const FIELD_MAX: &[(&str, usize)] = &[
    // The settings page's webhook URL (its input says maxlength 2048).
    ("url", 2048),
    // The header's search box.
    ("q", 200),
    // A cancellation reason: the rule's own bound.
    ("reason", crate::reservations::MAX_REASON_CHARS),
    // A password is hashed, never stored; long passphrases are welcome.
    ("password", 1024),
    // An identity provider's answer at /login/sso/callback (S1): some
    // providers' authorization codes run to well over a kilobyte.
    ("code", 4096),
    ("error_description", 1024),
];

/// Fields typed in a <textarea>: line breaks and tabs are text there.
const MULTI_LINE: &[&str] = &["reason"];

/// More pairs than any form or filter has: a body of 10,000 empty pairs is
/// refused before anything parses it.
const MAX_PAIRS: usize = 64;

/// Field names are the pages' own, all short.
const MAX_NAME_CHARS: usize = 64;

/// Where a value came from, for the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Query,
    Form,
    Path,
}

/// Why a value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    NotUtf8 { field: String },
    Control { field: String, ch: char },
    TooLong { field: String, max: usize },
    TooManyFields,
}

impl Refusal {
    pub fn message(&self, source: Source) -> String {
        let what = match source {
            Source::Query => "in the address",
            Source::Form => "in the form",
            Source::Path => "in the address",
        };
        match self {
            Refusal::NotUtf8 { field } => format!(
                "The field “{field}” {what} is not valid text (it is not UTF-8); nothing was changed."
            ),
            Refusal::Control { field, ch } => format!(
                "The field “{field}” {what} contains a control character ({}), which it cannot hold; \
                 nothing was changed.",
                describe(*ch)
            ),
            Refusal::TooLong { field, max } => format!(
                "The field “{field}” {what} is longer than {max} characters; nothing was changed."
            ),
            Refusal::TooManyFields => {
                format!(
                    "The request carries more than {MAX_PAIRS} fields {what}; nothing was changed."
                )
            }
        }
    }
}

fn describe(ch: char) -> String {
    match ch {
        '\0' => "NUL".to_owned(),
        '\n' => "a line break".to_owned(),
        '\r' => "a carriage return".to_owned(),
        '\t' => "a tab".to_owned(),
        c => format!("U+{:04X}", c as u32),
    }
}

/// The longest value `field` may carry.
/// A whole number as a person types it in a number field: digits only.
/// `str::parse` also takes a sign (`+5`), which no number field offers, so
/// that one value has one spelling in forms, links and the audit log.
pub fn whole_number<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

pub fn max_chars(field: &str) -> usize {
    FIELD_MAX
        .iter()
        .find(|(f, _)| *f == field)
        .map_or(DEFAULT_MAX_CHARS, |(_, m)| *m)
}

/// One value of `field`: storable (no NUL), no control character unless
/// the field is multi-line (then line breaks and tabs only), not too long.
pub fn check_value(field: &str, value: &str) -> Result<(), Refusal> {
    let multi_line = MULTI_LINE.contains(&field);
    if let Some(ch) = value
        .chars()
        .find(|c| c.is_control() && !(multi_line && matches!(c, '\n' | '\r' | '\t')))
    {
        return Err(Refusal::Control {
            field: field.to_owned(),
            ch,
        });
    }
    let max = max_chars(field);
    if value.chars().count() > max {
        return Err(Refusal::TooLong {
            field: field.to_owned(),
            max,
        });
    }
    Ok(())
}

/// `%XX` and `+` decoded to bytes, as `application/x-www-form-urlencoded`
/// says; a stray `%` stays itself (as browsers and serde_urlencoded do).
fn percent_decode(s: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < s.len() => match (hex(s[i + 1]), hex(s[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// Every `name=value` pair of an url-encoded string, decoded and checked.
/// A field name must be text without control characters too.
pub fn check_encoded(raw: &[u8]) -> Result<(), Refusal> {
    let pairs = raw.split(|b| *b == b'&').filter(|p| !p.is_empty());
    for (n, pair) in pairs.enumerate() {
        if n >= MAX_PAIRS {
            return Err(Refusal::TooManyFields);
        }
        let (k, v) = match pair.iter().position(|b| *b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &[][..]),
        };
        let key = String::from_utf8(percent_decode(k)).map_err(|_| Refusal::NotUtf8 {
            field: "(a field name)".to_owned(),
        })?;
        let name = || "(a field name)".to_owned();
        if let Some(ch) = key.chars().find(|c| c.is_control()) {
            return Err(Refusal::Control { field: name(), ch });
        }
        if key.chars().count() > MAX_NAME_CHARS {
            return Err(Refusal::TooLong {
                field: name(),
                max: MAX_NAME_CHARS,
            });
        }
        let value = String::from_utf8(percent_decode(v))
            .map_err(|_| Refusal::NotUtf8 { field: key.clone() })?;
        check_value(&key, &value)?;
    }
    Ok(())
}

pub(super) fn is_form(req: &ServiceRequest) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| {
            m.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

/// The middleware on every dashboard route (`dashboard::routes!`): the path
/// segments and the query string, then a form body (read once, up to the
/// dashboard's form limit, and handed on to the handler's extractor).
pub async fn guard<B: MessageBody + 'static>(
    mut req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let refuse =
        |req: ServiceRequest, e: DashError| Ok(req.error_response(e).map_into_right_body());
    for (name, value) in req.match_info().iter() {
        // Path segments arrive decoded; `static/{path}` is a file name.
        if let Err(r) = check_value(name, value) {
            return refuse(req, DashError::bad_request(r.message(Source::Path)));
        }
    }
    if let Err(r) = check_encoded(req.query_string().as_bytes()) {
        return refuse(req, DashError::bad_request(r.message(Source::Query)));
    }
    if is_form(&req) {
        let body = match req.extract::<Bytes>().await {
            Ok(b) => b,
            // Over the limit (PayloadConfig): the 413 page; a broken body: 400.
            Err(e) => {
                let too_large = e
                    .as_error::<actix_web::error::PayloadError>()
                    .is_some_and(|p| matches!(p, actix_web::error::PayloadError::Overflow));
                let err = if too_large {
                    DashError::TooLarge
                } else {
                    DashError::bad_request(format!("the form could not be read: {e}"))
                };
                return refuse(req, err);
            }
        };
        if let Err(r) = check_encoded(&body) {
            return refuse(req, DashError::bad_request(r.message(Source::Form)));
        }
        req.set_payload(Payload::from(body));
    }
    next.call(req)
        .await
        .map(ServiceResponse::map_into_left_body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storable_text_passes_and_names_are_given_for_the_rest() {
        assert_eq!(check_encoded(b"q=DEMO-HOLD&site=par1"), Ok(()));
        assert_eq!(check_encoded(b"q=%F0%9F%98%80+%25_%27%22"), Ok(()));
        assert_eq!(check_encoded(b"q=100%"), Ok(()), "a stray % is itself");
        assert_eq!(
            check_encoded(b"site=par1&name=a%00b"),
            Err(Refusal::Control {
                field: "name".into(),
                ch: '\0'
            })
        );
        assert_eq!(
            check_encoded(b"q=%FF%FE"),
            Err(Refusal::NotUtf8 { field: "q".into() })
        );
        assert!(matches!(
            check_encoded(b"name=a%0Ab"),
            Err(Refusal::Control { ch: '\n', .. })
        ));
        assert_eq!(
            check_encoded(b"reason=line%0D%0Aanother%09tab"),
            Ok(()),
            "a textarea keeps its lines"
        );
        assert!(matches!(
            check_encoded(b"reason=a%00b"),
            Err(Refusal::Control { ch: '\0', .. })
        ));
        let long = format!("site={}", "x".repeat(DEFAULT_MAX_CHARS + 1));
        assert_eq!(
            check_encoded(long.as_bytes()),
            Err(Refusal::TooLong {
                field: "site".into(),
                max: DEFAULT_MAX_CHARS
            })
        );
        let url = format!("url={}", "x".repeat(2000));
        assert_eq!(check_encoded(url.as_bytes()), Ok(()));
        let many = "a=1&".repeat(MAX_PAIRS + 1);
        assert_eq!(check_encoded(many.as_bytes()), Err(Refusal::TooManyFields));
        assert!(check_encoded(b"a%00=1").is_err(), "field names too");
    }

    #[test]
    fn the_message_names_the_field() {
        let m = Refusal::Control {
            field: "name".into(),
            ch: '\0',
        }
        .message(Source::Form);
        assert!(m.contains("“name”") && m.contains("NUL"), "{m}");
    }
}
