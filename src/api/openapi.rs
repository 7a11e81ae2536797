//! The OpenAPI document of the JSON API (`GET /api/openapi.json`),
//! generated: the schemas are derived from the request and response types
//! the handlers (de)serialize (`#[derive(ToSchema)]`, their doc comments are
//! the descriptions), the operations from the handlers' `#[utoipa::path]`
//! annotations. What no Rust type says is here: the wire shape of the
//! error bodies (`ApiError` builds them as maps), the closed sets still
//! held in strings, the shared error answers, the links between operations
//! and the webhook the API posts. A new field on a request or response
//! type shows up in the document without touching this file.

use serde_json::{Value, json};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::{OpenApi, ToSchema};

use crate::api::schemas::{
    Error, Forbidden, ForbiddenError, Invalid, InvalidError, LabelFilter, NotFound, NotFoundError,
    OrderRefPath, SegmentFilter, ServiceUnavailableError, StatusFilter, SubstitutesFilter,
    Unauthorized, UnauthorizedError, Unavailable, WriteUnavailable, WriteUnavailableError,
};

/// The generated document, as this deployment answers: a reserve's
/// `hold_seconds` goes up to its cap on a hold (R14,
/// `POOLKEEPER_HOLD_MAX_SECONDS`), and above it is `400`, so the published
/// maximum is the configured cap.
pub fn document(hold_max_seconds: u32) -> Value {
    // Built once per process: the types do not change while it runs.
    static GENERATED: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    let mut doc = GENERATED
        .get_or_init(|| {
            let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or(Value::Null);
            let webhooks = serde_json::to_value(WebhookDoc::openapi()).unwrap_or(Value::Null);
            finish(&mut doc, webhooks["paths"].clone());
            doc
        })
        .clone();
    if let Some(max) =
        doc.pointer_mut("/components/schemas/ReserveBody/properties/hold_seconds/maximum")
    {
        *max = json!(hold_max_seconds.min(86_400));
    }
    doc
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "poolkeeper",
        version = "1",
        description = "Reserve dedicated machines for orders before any side effect, then convert the reservation when payment clears, or cancel it. Every call sends Authorization: Bearer TOKEN; another organization's object is 404, never 403. A body that is not valid JSON, or a field of the wrong type or out of range, is 400 {\"error\":\"invalid\"} and writes nothing. Integers: in a JSON body, a number with a zero fraction is the same integer (40121 and 40121.0 are both accepted; 40121.5 is 400 naming the field); in a path or a query string an integer is written in digits (42). An empty list filter (site=, vendor=, profile=, status=, after=) means no filter.",
    ),
    servers((url = "/")),
    security(("bearer" = [])),
    paths(
        crate::api::machines::put,
        crate::api::machines::get,
        crate::api::machines::list,
        crate::api::machines::change_status,
        crate::api::reservations::reserve,
        crate::api::reservations::by_order_ref,
        crate::api::reservations::get,
        crate::api::reservations::events,
        crate::api::reservations::convert,
        crate::api::reservations::cancel,
        crate::api::reservations::extend,
        crate::api::reservations::get_order,
        crate::api::reservations::convert_order,
        crate::api::reservations::cancel_order,
        crate::api::reservations::extend_order,
        crate::api::services::end,
        crate::api::webhook::get,
        crate::api::webhook::put,
        crate::api::webhook::delete,
        crate::api::capacity::get_capacity,
        crate::api::capacity::list_headroom,
        crate::api::capacity::put_headroom,
        crate::api::capacity::list_substitutes,
        crate::api::capacity::put_substitutes,
        crate::api::planning::get_forecast,
        crate::api::planning::get_history,
    ),
    components(
        schemas(
            // Named by parameters and the webhook, which register none.
            LabelFilter,
            SegmentFilter,
            SubstitutesFilter,
            StatusFilter,
            OrderRefPath,
            ReservationEventDelivery,
            DatabaseRestoredDelivery,
            Error,
            InvalidError,
            UnauthorizedError,
            ForbiddenError,
            NotFoundError,
            ServiceUnavailableError,
            WriteUnavailableError
        ),
        responses(Invalid, Unauthorized, Forbidden, NotFound, Unavailable, WriteUnavailable)
    )
)]
struct ApiDoc;

/// The webhook the API posts, an operation of its own: `finish` moves its
/// path under `webhooks`.
#[derive(OpenApi)]
#[openapi(paths(reservation_event, database_restored))]
struct WebhookDoc;

#[utoipa::path(
    post,
    path = "reservationEvent",
    operation_id = "reservationEvent",
    summary = "A reservation event, POSTed to the organization's webhook URL",
    description = "Headers: Poolkeeper-Event-Id (= event_id), Poolkeeper-Timestamp (Unix seconds), Poolkeeper-Signature: t=TIMESTAMP,v1=HEX where HEX is HMAC-SHA256(secret, TIMESTAMP + '.' + raw body) in lower-case hex, Poolkeeper-Delivery-Attempt (1, 2, ...). Any 2xx answer within 5 s is a delivery; anything else (redirects included: they are not followed) is retried with exponential backoff and jitter for 24 h. At least once: deduplicate on event_id. The events of one reservation arrive in order.",
    request_body = ReservationEventDelivery,
    responses((status = "2XX", description = "delivered"))
)]
#[allow(dead_code)]
fn reservation_event() {}

#[utoipa::path(
    post,
    path = "databaseRestored",
    operation_id = "databaseRestored",
    summary = "The database was restored (F5), POSTed to the organization's webhook URL",
    description = "Sent once per organization with a webhook when a server finds the database is a restored copy (a dump restored, a recovery to a point in time, a promoted standby), with the same headers, signature and retries as a reservation event. See docs/webhooks.md, 'After a restore'.",
    request_body = DatabaseRestoredDelivery,
    responses((status = "2XX", description = "delivered"))
)]
#[allow(dead_code)]
fn database_restored() {}

/// What utoipa does not say by itself: the security scheme, the links
/// between operations, the examples of fields that are references, the
/// webhook; and every object the server reads or writes is closed
/// (`deny_unknown_fields` on requests; answers are serialized structs).
fn finish(doc: &mut Value, webhooks: Value) {
    doc["components"]["securitySchemes"] = json!({"bearer": {"type": "http", "scheme": "bearer"}});
    doc["components"]["links"] = links();
    for (path, method, status, names) in RESPONSE_LINKS {
        let pointer = format!(
            "/paths/{}/{method}/responses/{status}",
            path.replace('~', "~0").replace('/', "~1")
        );
        if let Some(response) = doc.pointer_mut(&pointer) {
            response["links"] = names
                .iter()
                .map(|n| {
                    (
                        n.to_string(),
                        json!({"$ref": format!("#/components/links/{n}")}),
                    )
                })
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
    }
    // `body_with` adds the service link to a converted reservation's answer.
    if let Some(props) = doc.pointer_mut("/components/schemas/Reservation/properties") {
        props["service"] = json!({
            "oneOf": [{"$ref": "#/components/schemas/ServiceLink"}, {"type": "null"}],
            "description": "the service link, once converted"
        });
    }
    for (schema, property, examples) in FIELD_EXAMPLES {
        let pointer = format!("/components/schemas/{schema}/properties/{property}");
        if let (Some(p), Ok(examples)) = (
            doc.pointer_mut(&pointer),
            serde_json::from_str::<Value>(examples),
        ) {
            p["examples"] = examples;
        }
    }
    doc["webhooks"] = json!({
        "reservationEvent": webhooks["reservationEvent"].clone(),
        "databaseRestored": webhooks["databaseRestored"].clone(),
    });
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut() {
            tidy_operations(item);
        }
    }
    if let Some(hooks) = doc.get_mut("webhooks").and_then(Value::as_object_mut) {
        for item in hooks.values_mut() {
            tidy_operations(item);
        }
    }
    for part in ["components", "paths", "webhooks"] {
        if let Some(v) = doc.get_mut(part) {
            close_objects(v);
            hoist_descriptions(v);
            unwrap_descriptions(v);
        }
    }
}

/// Doc comments wrap at the source's width; a description is one
/// paragraph per blank line, as Markdown reads it.
fn unwrap_descriptions(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                match child {
                    Value::String(text) if k == "description" => {
                        *text = text
                            .split("\n\n")
                            .map(|p| p.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
                            .collect::<Vec<_>>()
                            .join("\n\n");
                    }
                    _ => unwrap_descriptions(child),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(unwrap_descriptions),
        _ => {}
    }
}

/// utoipa writes the doc comment of an optional reference field on the
/// reference inside its `oneOf`; the field's own description says it
/// where readers and generators look.
fn hoist_descriptions(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if !map.contains_key("description")
                && let Some(first) = map
                    .get_mut("oneOf")
                    .and_then(Value::as_array_mut)
                    .and_then(|items| items.first_mut())
                    .and_then(Value::as_object_mut)
                && first.contains_key("$ref")
                && let Some(description) = first.remove("description")
            {
                map.insert("description".into(), description);
            }
            for child in map.values_mut() {
                hoist_descriptions(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(hoist_descriptions),
        _ => {}
    }
}

/// Operations keep the summary and description given to them, not the
/// handler's doc comment (written for engineers), and no default tags.
fn tidy_operations(item: &mut Value) {
    let Some(item) = item.as_object_mut() else {
        return;
    };
    for op in item.values_mut() {
        if let Some(op) = op.as_object_mut() {
            if op.get("description").and_then(Value::as_str) == Some("") {
                op.remove("description");
            }
            op.remove("tags");
        }
    }
}

/// Every object schema with properties is closed: request types deny
/// unknown fields, answers are serialized from structs.
fn close_objects(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            for child in map.values_mut() {
                close_objects(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// Examples of body fields that utoipa publishes without them (a `$ref`
/// carries none, nor does a list); the contract fuzzer builds its first
/// machines and orders from them. (schema, field, examples as JSON)
const FIELD_EXAMPLES: &[(&str, &str, &str)] = &[
    ("MachineBody", "site", r#"["par1"]"#),
    ("MachineBody", "vendor", r#"["dell"]"#),
    ("MachineBody", "profile", r#"["epyc-9354-256g"]"#),
    ("MachineBody", "status", r#"["ready"]"#),
    ("ReserveBody", "order_ref", r#"["ORD-1"]"#),
    ("ReserveBody", "site", r#"["par1"]"#),
    ("ReserveBody", "profile", r#"["epyc-9354-256g"]"#),
    ("ReserveBody", "vendor", r#"["dell"]"#),
    ("ReserveBody", "segment", r#"["enterprise"]"#),
    ("ReserveBody", "customer_ref", r#"["CUST-42"]"#),
    (
        "StatusChangeBody",
        "asset_tags",
        r#"[["PK-00011", "PK-00012"]]"#,
    ),
    ("StatusChangeBody", "status", r#"["maintenance"]"#),
];

/// Which answers link to which operations: (path, method, status, links).
const RESPONSE_LINKS: &[(&str, &str, &str, &[&str])] = &[
    (
        "/api/v1/machines/{asset_tag}",
        "put",
        "200",
        &["GetMachine", "PreviewStatusChange"],
    ),
    (
        "/api/v1/machines/{asset_tag}",
        "put",
        "201",
        &["GetMachine", "PreviewStatusChange"],
    ),
    ("/api/v1/reservations", "post", "200", RESERVE_LINKS),
    ("/api/v1/reservations", "post", "201", RESERVE_LINKS),
    (
        "/api/v1/reservations",
        "get",
        "200",
        &[
            "ReadReservation",
            "Convert",
            "Cancel",
            "Extend",
            "ReadOrder",
        ],
    ),
    (
        "/api/v1/reservations/{id}/convert",
        "post",
        "200",
        &["ReadReservation", "EndService"],
    ),
    (
        "/api/v1/reservations/{id}/extend",
        "post",
        "200",
        &["ReadReservation", "Convert", "Cancel"],
    ),
    (
        "/api/v1/orders/{order_ref}",
        "get",
        "200",
        &["ReadOrder", "ConvertOrder", "CancelOrder", "ExtendOrder"],
    ),
    (
        "/api/v1/orders/{order_ref}/convert",
        "post",
        "200",
        &["ReadOrder"],
    ),
    (
        "/api/v1/orders/{order_ref}/cancel",
        "post",
        "200",
        &["ReadOrder"],
    ),
    (
        "/api/v1/orders/{order_ref}/extend",
        "post",
        "200",
        &["ReadOrder"],
    ),
];

const RESERVE_LINKS: &[&str] = &[
    "ReadReservation",
    "ReservationEvents",
    "FindByOrderRef",
    "Convert",
    "Cancel",
    "Extend",
    "ReadOrder",
    "ConvertOrder",
    "CancelOrder",
    "ExtendOrder",
];

/// The links of the order flow (reserve, read, convert or cancel with the
/// answer's fence, end the service), by name.
fn links() -> Value {
    json!({
        "ReadReservation": {
            "operationId": "getReservation",
            "parameters": {"id": "$response.body#/id"},
            "description": "read the reservation back"
        },
        "ReservationEvents": {
            "operationId": "reservationEvents",
            "parameters": {"id": "$response.body#/id"},
            "description": "its history"
        },
        "FindByOrderRef": {
            "operationId": "findReservation",
            "parameters": {"order_ref": "$response.body#/order_ref"},
            "description": "find it by its order"
        },
        "Convert": {
            "operationId": "convert",
            "parameters": {"id": "$response.body#/id"},
            "requestBody": {"fence": "$response.body#/fence", "service_ref": "SRV-9"},
            "description": "payment cleared: convert with the fence of the answer"
        },
        "Cancel": {
            "operationId": "cancel",
            "parameters": {"id": "$response.body#/id"},
            "requestBody": {"fence": "$response.body#/fence", "reason": "payment declined"},
            "description": "the customer gave up: cancel with the fence of the answer"
        },
        "EndService": {
            "operationId": "endService",
            "parameters": {"id": "$response.body#/service/id"},
            "description": "end the service link the conversion made"
        },
        "GetMachine": {
            "operationId": "getMachine",
            "parameters": {"asset_tag": "$response.body#/asset_tag"},
            "description": "read the machine back"
        },
        "Extend": {
            "operationId": "extend",
            "parameters": {"id": "$response.body#/id"},
            "requestBody": {"fence": "$response.body#/fence", "seconds": 600},
            "description": "payment needs longer: extend the hold with the fence of the answer"
        },
        "ReadOrder": {
            "operationId": "getOrder",
            "parameters": {"order_ref": "$response.body#/order_ref"},
            "description": "read the whole order"
        },
        "ConvertOrder": {
            "operationId": "convertOrder",
            "parameters": {"order_ref": "$response.body#/order_ref"},
            "requestBody": {"reservations": "$response.body#/reservations"},
            "description": "payment cleared: convert every reservation of the order, naming each with its fence (and a service_ref each)"
        },
        "CancelOrder": {
            "operationId": "cancelOrder",
            "parameters": {"order_ref": "$response.body#/order_ref"},
            "requestBody": {"reservations": "$response.body#/reservations", "reason": "payment declined"},
            "description": "the customer gave up: cancel the whole order, naming each reservation with its fence"
        },
        "ExtendOrder": {
            "operationId": "extendOrder",
            "parameters": {"order_ref": "$response.body#/order_ref"},
            "requestBody": {"reservations": "$response.body#/reservations", "seconds": 600},
            "description": "payment needs longer: extend the order's one deadline"
        },
        "PreviewStatusChange": {
            "operationId": "changeMachineStatus",
            "parameters": {},
            "requestBody": {"asset_tags": ["$response.body#/asset_tag"], "status": "maintenance", "dry_run": true},
            "description": "before taking the machine out of the pool: what would happen to a hold on it (a dry run writes nothing)"
        }
    })
}

// ---------------------------------------------------------------------------
// The webhook's body, written by SQL (the outbox)
// ---------------------------------------------------------------------------

#[derive(ToSchema)]
#[allow(dead_code)]
struct ReservationEventDelivery {
    /// stable across retries: deduplicate on it; the id of GET /api/v1/reservations/{id}/events
    event_id: i64,
    #[serde(rename = "type")]
    #[schema(schema_with = delivery_type)]
    kind: String,
    occurred_at: chrono::DateTime<chrono::Utc>,
    /// the organization's slug
    organization: String,
    #[schema(inline)]
    reservation: DeliveredReservation,
    #[schema(inline)]
    event: DeliveredEvent,
}

fn delivery_type() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some([
            "reservation.created",
            "reservation.converted",
            "reservation.cancelled",
            "reservation.expired",
            "reservation.extended",
            "reservation.machine_replaced",
            "reservation.expiring",
        ]))
}

#[derive(ToSchema)]
#[allow(dead_code)]
struct DeliveredReservation {
    id: i64,
    order_ref: String,
    /// the state this event moved it to
    state: String,
    fence: i64,
    expires_at: chrono::DateTime<chrono::Utc>,
    /// the machine as it was when chosen (R8); its profile is the one that serves
    #[schema(value_type = Object)]
    machine: Value,
    /// the profile the order asked for (R20)
    profile_asked: String,
    /// whether a declared substitute of the asked profile serves the order (R20)
    substituted: bool,
}

#[derive(ToSchema)]
#[allow(dead_code)]
struct DeliveredEvent {
    #[schema(schema_with = crate::reservations::event_kind_schema)]
    kind: String,
    #[schema(schema_with = crate::reservations::from_state_schema, required = true)]
    from_state: Option<String>,
    #[schema(schema_with = crate::reservations::state_schema)]
    to_state: String,
    /// a token name, a staff email, sweep, allocator, conversion or cancellation
    actor: String,
    #[schema(required = true)]
    detail: Option<String>,
    /// set when the sweep wrote it
    #[schema(required = true)]
    replica: Option<String>,
    /// the sweep lease's fence, when the sweep wrote it
    #[schema(required = true)]
    lease_fence: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_names_every_schema_it_refers_to() {
        let doc = document(3600);
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        for part in text.split("\"#/components/schemas/").skip(1) {
            let name = part.split('"').next().unwrap_or_default();
            assert!(schemas.contains_key(name), "{name} is referred to");
        }
    }

    #[test]
    fn every_added_example_and_link_lands_on_a_field_or_answer_of_the_document() {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("a document");
        for (schema, property, examples) in FIELD_EXAMPLES {
            let pointer = format!("/components/schemas/{schema}/properties/{property}");
            assert!(doc.pointer(&pointer).is_some(), "{pointer} exists");
            assert!(
                serde_json::from_str::<Vec<Value>>(examples).is_ok(),
                "{pointer}: examples are a JSON list"
            );
        }
        let links = links();
        let ops: Vec<&str> = doc["paths"]
            .as_object()
            .expect("paths")
            .values()
            .flat_map(|item| item.as_object().into_iter().flatten())
            .filter_map(|(_, op)| op["operationId"].as_str())
            .collect();
        for (name, link) in links.as_object().expect("links") {
            let target = link["operationId"].as_str().unwrap_or_default();
            assert!(ops.contains(&target), "{name} links to {target}");
        }
        for (path, method, status, names) in RESPONSE_LINKS {
            let pointer = format!(
                "/paths/{}/{method}/responses/{status}",
                path.replace('~', "~0").replace('/', "~1")
            );
            assert!(doc.pointer(&pointer).is_some(), "{pointer} exists");
            for n in *names {
                assert!(links.get(n).is_some(), "{pointer}: link {n} is defined");
            }
        }
    }

    #[test]
    fn the_published_hold_maximum_is_the_deployments_cap() {
        let doc = document(1200);
        assert_eq!(
            doc.pointer("/components/schemas/ReserveBody/properties/hold_seconds/maximum"),
            Some(&json!(1200))
        );
    }
}

// ---------------------------------------------------------------------------
// F5: the restore's webhook body, written by SQL (sql/incarnation.sql)
// ---------------------------------------------------------------------------

/// F5: the database was restored from a backup or recovered to a point in time (or a failover promoted a standby): everything the order service was told after the restored point may be gone. Every id, fence and event id from now on is at least restore.first_new_id. Reconcile: read back the reservations you hold (GET /api/v1/reservations/{id} or ?order_ref=); a 404 means the reservation was lost with the restore, and a reserve with its order_ref makes a new one.
#[derive(ToSchema)]
#[allow(dead_code)]
struct DatabaseRestoredDelivery {
    /// stable across retries: deduplicate on it; from the reservation events' sequence, after the advance
    event_id: i64,
    #[serde(rename = "type")]
    #[schema(schema_with = restored_type)]
    kind: String,
    occurred_at: chrono::DateTime<chrono::Utc>,
    /// the organization's slug
    organization: String,
    #[schema(inline)]
    restore: RestoreFacts,
}

fn restored_type() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["database.restored"]))
}

#[derive(ToSchema)]
#[allow(dead_code)]
struct RestoreFacts {
    /// what told the new incarnation apart (timeline, database oid, ...)
    reason: String,
    /// every sequence was advanced to at least this value
    first_new_id: i64,
    /// the newest reservation event the restored database has: events after it that you received were lost
    #[schema(required = true)]
    last_kept_event_id: Option<i64>,
}
