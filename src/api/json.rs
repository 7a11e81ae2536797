//! How the JSON API reads numbers, so that the server and the published
//! OpenAPI document agree.
//!
//! - In a JSON body, JSON Schema's `integer` is any number whose fraction is
//!   zero: `40121`, `40121.0` and `4.0121e4` are the same integer, and many
//!   clients (JavaScript, a Python float) write the second form. The body
//!   deserializers below accept every such form, and refuse a fraction
//!   (`40121.5`) or a value outside int64 with a message naming the field.
//! - In a path or a query string, an integer is text: it is written in
//!   digits (`42`, `-7`), the way every client serializes an integer.
//!   `4.0`, `+4`, `04` and ` 4` are refused, so that one id has one
//!   spelling in URLs and logs.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, Visitor};

use crate::domain::ParseError;
use crate::reservations::MAX_REASON_CHARS;

/// 2^63 as a float: the first value past `i64::MAX` (floats round there).
const I64_END: f64 = 9_223_372_036_854_775_808.0;

/// The integer a JSON number stands for, if it is a whole number in int64.
fn whole(field: &'static str, v: f64) -> Result<i64, ParseError> {
    if !v.is_finite() || v.fract() != 0.0 {
        return Err(ParseError {
            what: field,
            problem: format!("must be a whole number, not {v}"),
        });
    }
    if !(-I64_END..I64_END).contains(&v) {
        return Err(out_of_range(field, v));
    }
    // In range and integral: the conversion is exact.
    Ok(v as i64)
}

fn out_of_range(field: &'static str, v: impl fmt::Display) -> ParseError {
    ParseError {
        what: field,
        problem: format!("{v} is out of range (a 64-bit integer)"),
    }
}

struct Integer {
    field: &'static str,
}

impl<'de> Visitor<'de> for Integer {
    type Value = i64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: a whole number", self.field)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
        Ok(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
        i64::try_from(v).map_err(|_| E::custom(out_of_range(self.field, v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<i64, E> {
        whole(self.field, v).map_err(E::custom)
    }
}

struct OptionalInteger {
    field: &'static str,
}

impl<'de> Visitor<'de> for OptionalInteger {
    type Value = Option<i64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: a whole number or null", self.field)
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<i64>, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<i64>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<i64>, D::Error> {
        d.deserialize_any(Integer { field: self.field }).map(Some)
    }
}

/// A body integer named `field`, in any of its JSON forms.
pub fn integer<'de, D: Deserializer<'de>>(d: D, field: &'static str) -> Result<i64, D::Error> {
    d.deserialize_any(Integer { field })
}

/// An optional body integer: absent or `null` is `None`.
pub fn optional_integer<'de, D: Deserializer<'de>>(
    d: D,
    field: &'static str,
) -> Result<Option<i64>, D::Error> {
    d.deserialize_option(OptionalInteger { field })
}

/// `fence` of convert and cancel bodies.
pub fn fence<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    integer(d, "fence")
}

/// `hold_seconds` of a reserve body (its range is `HoldSeconds`'s).
pub fn hold_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    optional_integer(d, "hold_seconds")
}

/// `quantity` of a reserve body (its range is `allocator::Quantity`'s).
pub fn quantity<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    optional_integer(d, "quantity")
}

/// `seconds` of an extend body, absent when it gives `until` (its range
/// is `HoldSeconds`'s).
pub fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    optional_integer(d, "seconds")
}

/// `machines` of a headroom body (its range is `capacity::MAX_HEADROOM`'s).
pub fn machines<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    integer(d, "machines")
}

/// `id` of a reservation named in an order's body.
pub fn id<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    integer(d, "id")
}

/// An optional `reason` (an extension's): absent or `null` is `None`,
/// otherwise as `reason`.
pub fn optional_reason<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let s: Option<String> = serde::Deserialize::deserialize(d)?;
    s.map(|s| reason(serde::de::value::StringDeserializer::<D::Error>::new(s)))
        .transpose()
}

/// `reason` of a cancel body: at most 500 characters as sent (before
/// trimming), counted as JSON Schema's `maxLength` counts them;
/// the rest of its rules (not blank, no control characters) are
/// `reservations::check_reason`'s, which the document's pattern mirrors.
pub fn reason<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s: String = serde::Deserialize::deserialize(d)?;
    if s.chars().count() > MAX_REASON_CHARS {
        return Err(de::Error::custom(ParseError {
            what: "reason",
            problem: format!("must be at most {MAX_REASON_CHARS} characters"),
        }));
    }
    Ok(s)
}

/// An integer written in a path or a query string: digits, with an
/// optional leading '-', no leading zeros, within int64.
pub fn integer_text(field: &'static str, s: &str) -> Result<i64, ParseError> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if !canonical {
        return Err(ParseError {
            what: field,
            problem: format!("must be a whole number written in digits, such as 42, not {s:?}"),
        });
    }
    s.parse::<i64>().map_err(|_| out_of_range(field, s))
}

/// An object id from the path: an integer text from 1 (ids start at 1).
pub fn path_id(s: &str) -> Result<i64, ParseError> {
    let id = integer_text("id", s)?;
    if id < 1 {
        return Err(ParseError {
            what: "id",
            problem: format!("ids are whole numbers from 1, not {id}"),
        });
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        #[serde(deserialize_with = "fence")]
        fence: i64,
        #[serde(default, deserialize_with = "hold_seconds")]
        hold_seconds: Option<i64>,
    }

    fn read(json: &str) -> Result<Body, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn integral_numbers_are_read_in_every_json_form() {
        for (json, fence) in [
            (r#"{"fence": 227}"#, 227),
            (r#"{"fence": 227.0}"#, 227),
            (r#"{"fence": 2.27e2}"#, 227),
            (r#"{"fence": -3.0}"#, -3),
            (r#"{"fence": 9223372036854775807}"#, i64::MAX),
            (r#"{"fence": -9223372036854775808}"#, i64::MIN),
        ] {
            assert_eq!(read(json).map(|b| b.fence), Ok(fence), "{json}");
        }
        assert_eq!(
            read(r#"{"fence": 1, "hold_seconds": 40121.0}"#).map(|b| b.hold_seconds),
            Ok(Some(40121))
        );
        assert_eq!(
            read(r#"{"fence": 1, "hold_seconds": null}"#).map(|b| b.hold_seconds),
            Ok(None)
        );
        assert_eq!(read(r#"{"fence": 1}"#).map(|b| b.hold_seconds), Ok(None));
    }

    #[test]
    fn fractions_out_of_range_and_other_types_are_refused_naming_the_field() {
        for (json, says) in [
            (r#"{"fence": 227.5}"#, "fence: must be a whole number"),
            (
                r#"{"fence": 1, "hold_seconds": 40121.5}"#,
                "hold_seconds: must be a whole number",
            ),
            (
                r#"{"fence": 9223372036854775808}"#,
                "fence: 9223372036854775808 is out of range",
            ),
            (
                r#"{"fence": 1e19}"#,
                "fence: 10000000000000000000 is out of range",
            ),
            (r#"{"fence": "5"}"#, "expected fence: a whole number"),
            (r#"{"fence": true}"#, "expected fence: a whole number"),
            (
                r#"{"fence": 1, "hold_seconds": "5"}"#,
                "expected hold_seconds: a whole number",
            ),
        ] {
            let err = read(json).expect_err(json);
            assert!(err.contains(says), "{json}: {err}");
        }
    }

    #[test]
    fn integers_in_paths_and_queries_are_digits() {
        assert_eq!(integer_text("limit", "42"), Ok(42));
        assert_eq!(integer_text("limit", "-7"), Ok(-7));
        assert_eq!(integer_text("limit", "0"), Ok(0));
        for bad in ["", "-", "4.0", "+4", "04", " 4", "4 ", "1e3", "x", "-0x1"] {
            let err = integer_text("limit", bad).expect_err(bad);
            assert_eq!(err.what, "limit", "{bad}");
        }
        assert!(integer_text("limit", "9223372036854775808").is_err());
        assert_eq!(path_id("7"), Ok(7));
        assert!(path_id("0").is_err());
        assert!(path_id("-1").is_err());
    }

    #[test]
    fn reasons_are_counted_in_characters_as_sent() {
        #[derive(Debug, Deserialize)]
        struct R {
            #[serde(deserialize_with = "reason")]
            reason: String,
        }
        let ok = serde_json::json!({ "reason": "é".repeat(500) });
        let read = serde_json::from_value::<R>(ok).expect("500 characters");
        assert_eq!(read.reason.chars().count(), 500);
        let long = serde_json::json!({ "reason": format!("{} ", "a".repeat(500)) });
        let err = serde_json::from_value::<R>(long).expect_err("too long");
        assert!(
            err.to_string().contains("reason: must be at most 500"),
            "{err}"
        );
    }
}
