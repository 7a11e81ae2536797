//! The pieces of the API's OpenAPI document that no request or response
//! type says by itself: the schemas of the domain's labels and of the
//! query filters, the path parameters, the field shapes that several bodies
//! share (a fence, a reason, a deadline), the closed sets of error codes,
//! the error bodies (`ApiError` writes them as maps) and the shared error
//! answers. The handlers' `#[utoipa::path]` annotations name them;
//! `api::openapi` assembles the document.

use std::borrow::Cow;

use serde_json::{Value, json};
use utoipa::openapi::schema::{ObjectBuilder, Ref, Schema, SchemaType, Type};
use utoipa::openapi::{RefOr, ResponseBuilder};
use utoipa::{IntoParams, PartialSchema, ToResponse, ToSchema};

use crate::domain::{AssetTag, CustomerRef, OrderRef, Profile, Segment, ServiceRef, Site, Vendor};

// ---------------------------------------------------------------------------
// The domain's labels: each parses by one rule, published once.
// ---------------------------------------------------------------------------

/// `^[A-Za-z0-9._-]+$`, as `domain::parse_label` checks.
const LABEL_PATTERN: &str = "^[A-Za-z0-9._-]+$";
/// A label that is not `.` or `..`: a path segment a client can send.
const PATH_LABEL_PATTERN: &str =
    "^(?:[A-Za-z0-9_-][A-Za-z0-9._-]*|\\.[A-Za-z0-9_-][A-Za-z0-9._-]*|\\.\\.[A-Za-z0-9._-]+)$";

fn label(max: usize, pattern: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(max))
        .pattern(Some(pattern))
}

/// A `ToSchema` published under one name for a type whose schema is given.
macro_rules! named_schema {
    ($ty:ty, $name:literal, $schema:expr) => {
        impl PartialSchema for $ty {
            fn schema() -> RefOr<Schema> {
                Schema::Object($schema.build()).into()
            }
        }
        impl ToSchema for $ty {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed($name)
            }
        }
    };
}

named_schema!(Site, "Label", label(64, LABEL_PATTERN));
named_schema!(Vendor, "Label", label(64, LABEL_PATTERN));
named_schema!(Profile, "Label", label(64, LABEL_PATTERN));
named_schema!(OrderRef, "OrderRef", label(128, LABEL_PATTERN));
named_schema!(CustomerRef, "CustomerRef", label(128, LABEL_PATTERN));
named_schema!(
    ServiceRef,
    "ServiceRef",
    label(128, LABEL_PATTERN).examples(["SRV-9"])
);
named_schema!(
    AssetTag,
    "AssetTag",
    label(64, PATH_LABEL_PATTERN).description(Some(
        "a label that is not \".\" or \"..\" (those are not path segments a client can send)"
    ))
);
named_schema!(
    Segment,
    "SegmentName",
    label(32, "^[a-z0-9][a-z0-9_-]*$")
        .description(Some("a segment of customers (R18): lower-case letters, digits, '_' and '-', starting with a letter or digit"))
        .examples(["enterprise", "repairs"])
);

/// An order ref in a path (`/orders/{order_ref}`): not `.` or `..`.
pub struct OrderRefPath;
named_schema!(
    OrderRefPath,
    "OrderRefPath",
    label(128, PATH_LABEL_PATTERN).description(Some(
        "an order_ref that is not \".\" or \"..\" (those are not path segments a client can send)"
    ))
);

/// A query filter of labels: empty means no filter.
pub struct LabelFilter;
named_schema!(
    LabelFilter,
    "LabelFilter",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(64))
        .pattern(Some("^[A-Za-z0-9._-]*$"))
        .description(Some("a label; empty means no filter"))
);

/// The value of a `LabelFilter` query parameter: absent or empty is no
/// filter (as an HTML form sends it, and as the document says), anything
/// else must parse, or the request is a 400 naming it.
pub(crate) fn label_filter<T>(
    v: &Option<String>,
    parse: impl Fn(&str) -> Result<T, crate::domain::ParseError>,
) -> Result<Option<T>, crate::error::ApiError> {
    match v.as_deref() {
        None | Some("") => Ok(None),
        Some(s) => parse(s)
            .map(Some)
            .map_err(|e| crate::error::invalid(e.to_string())),
    }
}

/// R20: whether capacity tells what the declared substitutes could serve.
pub struct SubstitutesFilter;
named_schema!(
    SubstitutesFilter,
    "SubstitutesFilter",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["allowed", "none", ""]))
        .description(Some("allowed: each pool also tells what its declared substitutes could serve (R20); none or empty: not"))
);

/// A query filter of segments: empty means none.
pub struct SegmentFilter;
named_schema!(
    SegmentFilter,
    "SegmentFilter",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(32))
        .pattern(Some("^([a-z0-9][a-z0-9_-]*)?$"))
        .description(Some("a segment; empty means none"))
);

/// A query filter of machine statuses: empty means no filter.
pub struct StatusFilter;
impl PartialSchema for StatusFilter {
    fn schema() -> RefOr<Schema> {
        let empty = ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .enum_values(Some([""]));
        Schema::AnyOf(
            utoipa::openapi::schema::AnyOfBuilder::new()
                .item(Ref::from_schema_name("MachineStatus"))
                .item(empty)
                .description(Some("a machine status; empty means no filter"))
                .build(),
        )
        .into()
    }
}
impl ToSchema for StatusFilter {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((
            crate::domain::MachineStatus::name().into(),
            crate::domain::MachineStatus::schema(),
        ));
    }
}

// ---------------------------------------------------------------------------
// Path parameters
// ---------------------------------------------------------------------------

/// `{id}` of a reservation or a service link.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct IdPath {
    /// written in digits
    #[param(minimum = 1, maximum = 9223372036854775807_i64)]
    id: i64,
}

/// `{asset_tag}` of a machine.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct AssetTagPath {
    asset_tag: AssetTag,
}

/// `{order_ref}` of an order.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct OrderRefInPath {
    order_ref: OrderRefPath,
}

// ---------------------------------------------------------------------------
// Closed sets still held in strings, and field shapes shared by bodies
// ---------------------------------------------------------------------------

/// The pattern of a reason: at least one character that is not white
/// space, no control characters but tab and newline
/// (`reservations::check_reason`).
const REASON_PATTERN: &str = "^[^\\u0000-\\u0008\\u000B-\\u001F\\u007F-\\u009F]*[^\\u0000-\\u0020\\u007F-\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000][^\\u0000-\\u0008\\u000B-\\u001F\\u007F-\\u009F]*$";

pub(crate) fn reason() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(500))
        .pattern(Some(REASON_PATTERN))
        .description(Some("at least one character that is not white space; no control characters but tab and newline; stored trimmed"))
        .examples(["payment declined"])
}

pub(crate) fn optional_reason() -> OneOrAny {
    OneOrAny(
        utoipa::openapi::schema::AnyOfBuilder::new()
            .item(reason())
            .item(ObjectBuilder::new().schema_type(Type::Null))
            .description(Some("why (shown on the timeline); absent or null: none")),
    )
}

/// `optional_reason`'s schema (a newtype: `schema_with` wants one type).
pub(crate) struct OneOrAny(utoipa::openapi::schema::AnyOfBuilder);
impl From<OneOrAny> for RefOr<Schema> {
    fn from(v: OneOrAny) -> Self {
        Schema::AnyOf(v.0.build()).into()
    }
}

/// A fence, any 64-bit integer.
pub(crate) fn fence() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::Int64,
        )))
        .minimum(Some(i64::MIN as f64))
        .maximum(Some(i64::MAX as f64))
        .description(Some(
            "the reservation's fence, from its answer; 227 and 227.0 are the same integer",
        ))
}

/// An RFC 3339 deadline with its offset (`until`).
pub(crate) fn until() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::DateTime,
        )))
        .pattern(Some("^[0-9]{4}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"))
        .examples(["2026-12-05T15:00:00Z"])
        .description(Some("the new deadline (RFC 3339, with its offset; kept to the microsecond). Idempotent: retried unchanged after it took effect, it answers 200 with this same deadline. No later than the deadline already set: 200, nothing changed (an extension never shortens a hold). Past POOLKEEPER_HOLD_MAX_SECONDS from the hold's creation: 409 hold_cap_exceeded with latest_expires_at"))
}

/// An extension's `seconds`.
pub(crate) fn seconds() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(1))
        .maximum(Some(86_400))
        .description(Some("the hold ends this many seconds from now by the database's clock (never earlier than it did); the whole hold, from creation, may not pass POOLKEEPER_HOLD_MAX_SECONDS; 600 and 600.0 are the same integer. Not idempotent: retried, it moves the deadline again from the retry's now (use until to retry safely)"))
        .examples([600])
}

/// R18's `kept` of a reserve's `409 reserved`.
fn kept_counts() -> ObjectBuilder {
    crate::capacity::segment_counts().description(Some(
        "R18: machines of the pool kept for each other segment",
    ))
}

/// A constant: the one value a field takes.
fn constant(v: Value) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::AnyValue)
        .enum_values(Some([v]))
}

macro_rules! codes {
    ($($f:ident = $code:literal),* $(,)?) => {
        $(pub(crate) fn $f() -> ObjectBuilder { constant(json!($code)) })*
    };
}

codes!(
    code_contended = "contended",
    code_unavailable = "unavailable",
    code_reserved = "reserved",
    code_customer_limit = "customer_limit",
    code_invalid = "invalid",
    code_unauthorized = "unauthorized",
    code_not_found = "not_found",
    code_not_live = "not_live",
    code_url_refused = "url_refused",
    code_unknown_machines = "unknown_machines",
    code_unknown_pool = "unknown_pool",
    code_unknown_profile = "unknown_profile",
    code_idempotency_mismatch = "idempotency_mismatch",
    const_true = true,
);

fn code_forbidden() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::AnyValue)
        .enum_values(Some(["forbidden", "module_disabled"]))
}

fn code_write_unavailable() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["unavailable", "outcome_unknown"]))
}

fn code_transition() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some([
            "expired",
            "stale_fence",
            "not_held",
            "part_of_order",
            "order_mismatch",
            "hold_cap_exceeded",
            "machine_not_ready",
        ]))
}

// ---------------------------------------------------------------------------
// Error bodies: `ApiError` writes `{"error": code, "message": ...}` and,
// for a 409, the extra fields of its code.
// ---------------------------------------------------------------------------

// Any error answer.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct Error {
    /// machine-readable code
    error: String,
    /// a sentence for people
    message: String,
}

macro_rules! error_body {
    ($(#[$doc:meta])* $name:ident, $code:ident) => {
        $(#[$doc])*
        #[derive(ToSchema)]
        #[allow(dead_code)]
        pub(crate) struct $name {
            #[schema(schema_with = $code)]
            error: String,
            message: String,
        }
    };
}

error_body!(
    /// malformed request
    InvalidError, code_invalid
);
error_body!(
    /// missing, unknown or revoked token
    UnauthorizedError, code_unauthorized
);
error_body!(
    /// missing scope, or the datacenter module is off
    ForbiddenError, code_forbidden
);
error_body!(
    /// absent, or another organization's
    NotFoundError, code_not_found
);
error_body!(
    /// the database cannot answer right now
    ServiceUnavailableError, code_unavailable
);
error_body!(
    /// unavailable: nothing was written (no connection, the database rolled the transaction back: a deadlock or a serialization failure, SQLSTATE class 40, or the connection was lost before the write was committed); outcome_unknown: the connection to the database was lost once the write's commit was sent, so it may or may not have taken effect. Retry the same request unchanged (same order_ref; same fences, and for convert the same service_refs; an extension with the same until): the answer then says what happened (RELIABILITY.md, "What a retry answers")
    WriteUnavailableError, code_write_unavailable
);
error_body!(
    /// the service link has already ended
    NotLiveError, code_not_live
);
error_body!(
    /// the URL is well formed JSON but refused: not an http(s) URL, credentials in it, or a host that is or resolves to a loopback, private, link-local or unspecified address (unless the deployment allows them); nothing written
    UrlRefusedError, code_url_refused
);
error_body!(
    /// some asset tags name no machine of the organization (the message lists them); nothing written
    UnknownMachinesError, code_unknown_machines
);
error_body!(
    /// no machine of the organization is of the site and profile named; nothing written
    UnknownPoolError, code_unknown_pool
);
error_body!(
    /// no machine of the organization is of a profile named (the message lists them); nothing written
    UnknownProfileError, code_unknown_profile
);

/// R20: the substitutes of a profile, in order of preference: at most 8,
/// none twice.
pub fn substitute_profiles() -> utoipa::openapi::schema::ArrayBuilder {
    utoipa::openapi::schema::ArrayBuilder::new()
        .items(label(64, LABEL_PATTERN))
        .max_items(Some(8))
        .unique_items(true)
        .description(Some(
            "in order of preference, at most 8, none twice and not the profile itself; empty removes the declaration",
        ))
}

// `409` of a transition (`reservations::refusal`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct TransitionError {
    #[schema(schema_with = code_transition)]
    error: String,
    message: String,
    /// with not_held: the state it ended in; with expired: expired
    #[schema(nullable = false)]
    state: Option<String>,
    /// with expired: the deadline that passed
    #[schema(nullable = false)]
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// with part_of_order: the order to act on
    #[schema(nullable = false)]
    order_ref: Option<String>,
    /// with part_of_order: its size
    #[schema(nullable = false, minimum = 1, maximum = 16)]
    quantity: Option<i64>,
    /// with order_mismatch: the order's reservations, every one of which must be named once
    #[schema(nullable = false, max_items = 16)]
    reservation_ids: Option<Vec<i64>>,
    /// with hold_cap_exceeded: POOLKEEPER_HOLD_MAX_SECONDS, the longest a hold may last from its creation
    #[schema(nullable = false, minimum = 1)]
    cap_seconds: Option<i64>,
    /// with hold_cap_exceeded: the latest deadline this hold may have
    #[schema(nullable = false)]
    latest_expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// with machine_not_ready: the reservation whose machine is not ready
    #[schema(nullable = false)]
    reservation_id: Option<i64>,
    /// with machine_not_ready: the machine that is not ready
    #[schema(nullable = false)]
    machine_id: Option<i64>,
    /// with machine_not_ready: the asset tag of the machine that is not ready
    #[schema(nullable = false)]
    asset_tag: Option<String>,
}

// `409 contended` of a reserve.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct ContendedError {
    #[schema(schema_with = code_contended)]
    error: String,
    message: String,
    /// candidates the walk looked at
    #[schema(minimum = 0)]
    scanned: i64,
    /// machines that match the order
    #[schema(minimum = 0)]
    candidates: i64,
    /// how many machines the order asked for
    #[schema(minimum = 1, maximum = 16)]
    quantity: i64,
    /// R17: the declared substitutes at the same site that could fill the same order now, in the declared order (R20), then the other sites whose pool of the same profile (and vendor) could, most available first
    alternatives: Vec<crate::allocator::Alternative>,
}

// `409 unavailable` of a reserve.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct UnavailableError {
    #[schema(schema_with = code_unavailable)]
    error: String,
    message: String,
    #[schema(inline)]
    excluded: crate::allocator::ExcludedCounts,
    /// how many machines the order asked for
    #[schema(minimum = 1, maximum = 16)]
    quantity: i64,
    /// machines that match the order: fewer than quantity
    #[schema(minimum = 0)]
    candidates: i64,
    /// R17: the declared substitutes at the same site that could fill the same order now, in the declared order (R20), then the other sites whose pool of the same profile (and vendor) could, most available first
    alternatives: Vec<crate::allocator::Alternative>,
}

// `409 reserved` of a reserve (R18).
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct ReservedError {
    #[schema(schema_with = code_reserved)]
    error: String,
    message: String,
    #[schema(schema_with = kept_counts)]
    kept: std::collections::BTreeMap<String, i64>,
    /// machines that match the order
    #[schema(minimum = 0)]
    candidates: i64,
    /// how many machines the order asked for
    #[schema(minimum = 1, maximum = 16)]
    quantity: i64,
    /// R17: the declared substitutes at the same site that could fill the same order now, in the declared order (R20), then the other sites whose pool of the same profile (and vendor) could, most available first
    alternatives: Vec<crate::allocator::Alternative>,
}

// `409 customer_limit` of a reserve (R19).
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct CustomerLimitError {
    #[schema(schema_with = code_customer_limit)]
    error: String,
    message: String,
    /// R19: the organization's cap on one customer's live holds
    #[schema(minimum = 1)]
    limit: i64,
    /// the customer's live holds now
    #[schema(minimum = 0)]
    holds: i64,
    /// how many machines the order asked for
    #[schema(minimum = 1, maximum = 16)]
    quantity: i64,
}

// A reserve's `409`: one of four refusals.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum ReserveRefused {
    Contended(ContendedError),
    Unavailable(UnavailableError),
    Reserved(ReservedError),
    CustomerLimit(CustomerLimitError),
}

// A capacity alternative: another site that could fill the order now.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct CapacityAlternative {
    site: String,
    /// the profile that would serve: a declared substitute's at the same site (R20, named first with substitutes=allowed), else the one asked
    profile: String,
    #[schema(minimum = 1)]
    available: i64,
}

// ---------------------------------------------------------------------------
// The shared error answers
// ---------------------------------------------------------------------------

fn json_response<T: ToSchema>(description: &str) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content(
        "application/json",
        utoipa::openapi::ContentBuilder::new()
            .schema(Some(Ref::from_schema_name(T::name())))
            .build(),
    )
}

fn retry_after() -> utoipa::openapi::header::Header {
    utoipa::openapi::header::HeaderBuilder::new()
        .schema(Some(ObjectBuilder::new().schema_type(Type::Integer)))
        .build()
}

macro_rules! shared_response {
    ($name:ident, $body:ty, $description:literal $(, $header:expr)?) => {
        pub(crate) struct $name;
        impl<'r> ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
                let r = json_response::<$body>($description);
                $(let r = r.header("Retry-After", $header);)?
                (stringify!($name), r.build().into())
            }
        }
    };
}

shared_response!(
    Invalid,
    InvalidError,
    "malformed body, path or query (error invalid); nothing written"
);
shared_response!(
    Unauthorized,
    UnauthorizedError,
    "missing, unknown or revoked token (error unauthorized)"
);
shared_response!(
    Forbidden,
    ForbiddenError,
    "the token lacks the scope (error forbidden), or the datacenter module is off (error module_disabled)"
);
shared_response!(
    NotFound,
    NotFoundError,
    "absent, or another organization's (error not_found)"
);
shared_response!(
    Unavailable,
    ServiceUnavailableError,
    "the database cannot answer right now (error unavailable); retry after Retry-After seconds",
    retry_after()
);
shared_response!(
    WriteUnavailable,
    WriteUnavailableError,
    "the database cannot answer right now (error unavailable: nothing was written), or the connection was lost once this write's commit was sent (error outcome_unknown: it may or may not have taken effect); retry the same request, unchanged, after Retry-After seconds: it then answers what happened",
    retry_after()
);

/// the order_ref was first used with another request (or a convert or cancel this caller made is replayed with another service_ref or reason): the fields that differ; the original stands, nothing written
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct IdempotencyMismatchError {
    #[schema(schema_with = code_idempotency_mismatch)]
    error: String,
    message: String,
    #[schema(schema_with = mismatch_fields)]
    fields: Vec<String>,
}

fn mismatch_fields() -> utoipa::openapi::schema::ArrayBuilder {
    utoipa::openapi::schema::ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([
                    "site",
                    "profile",
                    "vendor",
                    "quantity",
                    "hold_seconds",
                    "segment",
                    "customer_ref",
                    "service_ref",
                    "reason",
                ])),
        )
        .min_items(Some(1))
}
