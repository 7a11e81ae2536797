//! Domain values that parse, not validate: once a value of one of these
//! types exists, it is well formed, and the database never sees junk.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {problem}")]
pub struct ParseError {
    pub what: &'static str,
    pub problem: String,
}

/// "1 machine", "2 machines": a count with its noun, for words people read.
pub fn count_of(n: impl Into<i64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

fn parse_error(what: &'static str, problem: impl Into<String>) -> ParseError {
    ParseError {
        what,
        problem: problem.into(),
    }
}

/// Checks a short identifier: 1 to `max` characters of ASCII letters,
/// digits, '.', '_' and '-'. Public for query values that follow the rule
/// without being a domain value (the API's `after`).
pub fn parse_label(what: &'static str, s: &str, max: usize) -> Result<String, ParseError> {
    if s.is_empty() {
        return Err(parse_error(what, "must not be empty"));
    }
    if s.len() > max {
        return Err(parse_error(
            what,
            format!("must be at most {max} characters"),
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(parse_error(
            what,
            format!("must use letters, digits, '.', '_' or '-', not {c:?}"),
        ));
    }
    Ok(s.to_owned())
}

/// A closed set: one enum per set of fixed words the schema or the API
/// knows (a state, an exclusion key, a flash code), with its wire name
/// (the JSON value and the database's text, kept to the set by a CHECK)
/// and its words for people. Read from the database as text: a value the
/// set does not know is a decode error, never a silent default. Adding a
/// member is one line here; every `match` on the set then names it.
macro_rules! closed_set {
    ($(#[$doc:meta])* $vis:vis enum $name:ident ($what:literal) {
        $($(#[$vdoc:meta])* $variant:ident = $wire:literal, $words:literal;)+
    }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            /// Every member, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The wire name: JSON, the database, query strings.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire,)+
                }
            }

            /// The words for people (pages, messages).
            pub fn words(self) -> &'static str {
                match self {
                    $($name::$variant => $words,)+
                }
            }

            pub fn parse(s: &str) -> Result<$name, $crate::domain::ParseError> {
                match s {
                    $($wire => Ok($name::$variant),)+
                    _ => Err($crate::domain::ParseError {
                        what: $what,
                        problem: format!("must be one of {}", [$($wire),+].join(", ")),
                    }),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
                $name::parse(&s).map_err(serde::de::Error::custom)
            }
        }

        impl sqlx::Type<sqlx::Postgres> for $name {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <str as sqlx::Type<sqlx::Postgres>>::type_info()
            }
            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $name {
            fn decode(
                value: sqlx::postgres::PgValueRef<'r>,
            ) -> Result<$name, sqlx::error::BoxDynError> {
                let s = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
                Ok($name::parse(s)?)
            }
        }

        impl sqlx::Encode<'_, sqlx::Postgres> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<sqlx::Postgres>>::encode(self.as_str(), buf)
            }
        }
    };
}
pub(crate) use closed_set;

closed_set! {
    /// Where a reservation is in its life (the `reservations_state_known`
    /// CHECK): held until converted, cancelled or expired; the three are
    /// final.
    pub enum ReservationState("state") {
        Held = "held", "held";
        Converted = "converted", "converted into a service";
        Expired = "expired", "expired";
        Cancelled = "cancelled", "cancelled";
    }
}

closed_set! {
    /// What happened to a reservation (the `reservation_events_kind_known`
    /// CHECK), in its timeline and its webhooks.
    pub enum EventKind("kind") {
        Created = "created", "created";
        Converted = "converted", "converted";
        Cancelled = "cancelled", "cancelled";
        Expired = "expired", "expired";
        Extended = "extended", "extended";
        MachineReplaced = "machine_replaced", "moved to another machine";
        Expiring = "expiring", "warned of its deadline";
    }
}

impl ReservationState {
    /// Held: the only state a transition starts from.
    pub fn is_held(self) -> bool {
        self == ReservationState::Held
    }
}

macro_rules! label {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:literal) => {
        label!($(#[$doc])* $name, $what, $max, Ok);
    };
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:literal, $check:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub fn parse(s: &str) -> Result<Self, ParseError> {
                // The type's own check first: its message says what the type
                // allows, narrower than the generic label's.
                $check(s.to_owned())
                    .and_then(|s| parse_label($what, &s, $max))
                    .map($name)
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl TryFrom<String> for $name {
            type Error = ParseError;
            fn try_from(s: String) -> Result<Self, ParseError> {
                Self::parse(&s)
            }
        }
        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

label!(
    /// A machine's asset tag, unique within an organization. It is a path
    /// segment of the API (`/machines/{asset_tag}`), so `.` and `..`, which
    /// every HTTP client resolves away before sending, cannot be one.
    AssetTag, "asset_tag", 64, not_a_dot_segment
);

fn not_a_dot_segment(s: String) -> Result<String, ParseError> {
    if s == "." || s == ".." {
        return Err(parse_error(
            "asset_tag",
            "cannot be \".\" or \"..\": those are not path segments a client can send",
        ));
    }
    Ok(s)
}
label!(
    /// A datacenter site, such as `par1`.
    Site, "site", 64
);
label!(
    /// A hardware vendor, such as `dell`.
    Vendor, "vendor", 64
);
label!(
    /// A hardware profile, such as `epyc-9354-256g`.
    Profile, "profile", 64
);
label!(
    /// An order reference: the idempotency key of a reservation.
    OrderRef, "order_ref", 128
);
label!(
    /// A service reference from the billing side, such as `SRV-9`.
    ServiceRef, "service_ref", 128
);
label!(
    /// A segment of customers that headroom is kept for (R18), such as
    /// `enterprise` or `repairs`: lower-case letters, digits, '_' and '-',
    /// at most 32, as the database's check says.
    Segment, "segment", 32, segment_format
);
label!(
    /// The order service's end customer (R19), such as `CUST-42`.
    CustomerRef, "customer_ref", 128
);

fn segment_format(s: String) -> Result<String, ParseError> {
    if s.is_empty() {
        return Err(parse_error("segment", "must not be empty"));
    }
    let mut chars = s.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !first_ok
        || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    {
        return Err(parse_error(
            "segment",
            "must start with a lower-case letter or digit and use only lower-case letters, digits, '_' and '-'",
        ));
    }
    Ok(s)
}

/// An organization's slug: lower-case letters, digits and '-'.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slug(String);

impl Slug {
    pub fn parse(s: &str) -> Result<Slug, ParseError> {
        let ok = !s.is_empty()
            && s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !s.starts_with('-');
        if ok {
            Ok(Slug(s.to_owned()))
        } else {
            Err(parse_error(
                "slug",
                "use 1-63 lower-case letters, digits or '-'",
            ))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// R20: whether a reserve accepts the declared substitutes of its
/// profile (`allowed`) or only the profile asked (`none`, the default:
/// some customers need the exact hardware).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SubstitutesMode {
    #[default]
    None,
    Allowed,
}

impl SubstitutesMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SubstitutesMode::None => "none",
            SubstitutesMode::Allowed => "allowed",
        }
    }
}

/// The datacenter team's word on a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum MachineStatus {
    Ready,
    Provisioning,
    Maintenance,
    Broken,
    Retired,
}

impl MachineStatus {
    pub const ALL: [MachineStatus; 5] = [
        MachineStatus::Ready,
        MachineStatus::Provisioning,
        MachineStatus::Maintenance,
        MachineStatus::Broken,
        MachineStatus::Retired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MachineStatus::Ready => "ready",
            MachineStatus::Provisioning => "provisioning",
            MachineStatus::Maintenance => "maintenance",
            MachineStatus::Broken => "broken",
            MachineStatus::Retired => "retired",
        }
    }

    pub fn parse(s: &str) -> Result<MachineStatus, ParseError> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                parse_error(
                    "status",
                    "must be one of ready, provisioning, maintenance, broken, retired",
                )
            })
    }
}

impl fmt::Display for MachineStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a staff user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Support,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Support => "support",
            Role::Admin => "admin",
        }
    }
    pub fn parse(s: &str) -> Result<Role, ParseError> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "support" => Ok(Role::Support),
            "admin" => Ok(Role::Admin),
            _ => Err(parse_error("role", "must be viewer, support or admin")),
        }
    }
}

/// What an API token may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Orders,
    Inventory,
    /// `/metrics` on the main listener: an operator's credential, since the
    /// pool gauges cover every organization; never combined with the
    /// others (the database refuses it too).
    Metrics,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Orders => "orders",
            Scope::Inventory => "inventory",
            Scope::Metrics => "metrics",
        }
    }
    /// Parses `orders[,inventory]`, or `metrics` alone.
    pub fn parse_list(s: &str) -> Result<Vec<Scope>, ParseError> {
        let mut scopes = Vec::new();
        for part in s.split(',').map(str::trim) {
            let scope = match part {
                "orders" => Scope::Orders,
                "inventory" => Scope::Inventory,
                "metrics" => Scope::Metrics,
                _ => {
                    return Err(parse_error(
                        "scope",
                        "must be orders, inventory, or both separated by a comma; or metrics",
                    ));
                }
            };
            if !scopes.contains(&scope) {
                scopes.push(scope);
            }
        }
        if scopes.contains(&Scope::Metrics) && scopes.len() > 1 {
            return Err(parse_error(
                "scope",
                "metrics is an operator's scope: give it a token of its own",
            ));
        }
        Ok(scopes)
    }
}

/// A staff user's login. Lower-cased, so that one person is one account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Email(String);

impl Email {
    pub fn parse(s: &str) -> Result<Email, ParseError> {
        let s = s.trim().to_ascii_lowercase();
        let valid = s.len() <= 254
            && !s.chars().any(|c| c.is_control() || c.is_whitespace())
            && matches!(s.split_once('@'), Some((local, domain)) if !local.is_empty() && domain.contains('.') && !domain.contains('@'));
        if valid {
            Ok(Email(s))
        } else {
            Err(parse_error("email", "is not an email address"))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_count_of_one_is_singular() {
        assert_eq!(count_of(1, "machine", "machines"), "1 machine");
        assert_eq!(count_of(0, "machine", "machines"), "0 machines");
        assert_eq!(
            count_of(2_i32, "machine matches", "machines match"),
            "2 machines match"
        );
    }

    #[test]
    fn a_segment_refused_says_what_segments_allow() {
        for bad in ["a b", "A.b", "x.y", "Enterprise"] {
            let e = Segment::parse(bad).expect_err(bad);
            assert!(e.problem.contains("lower-case"), "{bad}: {e}");
            assert!(!e.problem.contains("'.'"), "{bad}: {e}");
        }
        assert_eq!(
            Segment::parse("").expect_err("empty").problem,
            "must not be empty"
        );
        assert!(Segment::parse("enterprise-eu_2").is_ok());
    }
    use super::*;

    #[test]
    fn labels_refuse_empty_long_and_odd_characters() {
        assert!(Site::parse("par1").is_ok());
        assert!(Site::parse("").is_err());
        assert!(Site::parse(&"a".repeat(65)).is_err());
        assert!(Site::parse("par 1").is_err());
        assert!(Site::parse("par\u{0}1").is_err());
        assert!(OrderRef::parse("ORD-2026.12_01").is_ok());
        assert!(AssetTag::parse(".").is_err());
        assert!(AssetTag::parse("..").is_err());
        assert!(AssetTag::parse("...").is_ok());
        assert!(AssetTag::parse(".a").is_ok());
    }

    #[test]
    fn statuses_round_trip() {
        for st in MachineStatus::ALL {
            assert_eq!(MachineStatus::parse(st.as_str()), Ok(st));
        }
        assert!(MachineStatus::parse("sold").is_err());
    }

    #[test]
    fn emails_and_scopes() {
        assert_eq!(
            Email::parse(" Ana@Example.com ").map(|e| e.as_str().to_owned()),
            Ok("ana@example.com".into())
        );
        assert!(Email::parse("ana").is_err());
        assert_eq!(
            Scope::parse_list("orders,inventory").map(|v| v.len()),
            Ok(2)
        );
        assert!(Scope::parse_list("orders,admin").is_err());
        assert_eq!(Scope::parse_list("metrics"), Ok(vec![Scope::Metrics]));
        assert!(Scope::parse_list("orders,metrics").is_err());
    }
}
