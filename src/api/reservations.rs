//! Order endpoints (scope `orders`): reserve (one machine or an order of
//! several, R13), read, convert, cancel, extend (R14); and the same actions
//! on a whole order under `/orders/{order_ref}`.

use crate::api::write::{Shape, write};
use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::Instrument;
use utoipa::openapi::RefOr;
use utoipa::{IntoParams, PartialSchema, ToSchema};

use std::collections::BTreeMap;

use crate::allocator::{
    self, Alternative, ExcludedCounts, HoldSeconds, OrderSpec, Quantity, ReserveOutcome,
    ReserveRequest,
};
use crate::api::caller::{ApiClient, BearerToken};
use crate::api::json;
use crate::api::schemas::{
    Forbidden, IdPath, IdempotencyMismatchError, Invalid, NotFound, OrderRefInPath, ReserveRefused,
    TransitionError as TransitionRefused, Unauthorized, Unavailable, WriteUnavailable,
};
use crate::domain::{
    CustomerRef, OrderRef, Profile, ReservationState, Scope, Segment, ServiceRef, Site,
    SubstitutesMode, Vendor, count_of,
};
use crate::error::{ApiError, conflict, invalid, not_found};
use crate::metrics::Metrics;
use crate::reservations::{
    self, Named, OrderAction, OrderAfter, Reservation, ServiceLink, Transition, TransitionError,
};
use crate::settings::Settings;
use crate::tokens::CallerRefusal;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/reservations")
            .route(web::post().to(reserve))
            .route(web::get().to(by_order_ref)),
    )
    .service(web::resource("/reservations/{id}").route(web::get().to(get)))
    .service(web::resource("/reservations/{id}/events").route(web::get().to(events)))
    .service(web::resource("/reservations/{id}/convert").route(web::post().to(convert)))
    .service(web::resource("/reservations/{id}/cancel").route(web::post().to(cancel)))
    .service(web::resource("/reservations/{id}/extend").route(web::post().to(extend)))
    .service(web::resource("/orders/{order_ref}").route(web::get().to(get_order)))
    .service(web::resource("/orders/{order_ref}/convert").route(web::post().to(convert_order)))
    .service(web::resource("/orders/{order_ref}/cancel").route(web::post().to(cancel_order)))
    .service(web::resource("/orders/{order_ref}/extend").route(web::post().to(extend_order)));
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReserveBody {
    order_ref: OrderRef,
    site: Site,
    profile: Profile,
    /// absent or null: any vendor
    #[serde(default)]
    vendor: Option<Vendor>,
    /// default POOLKEEPER_HOLD_SECONDS (900) when absent or null; 900 and 900.0 are the same integer. At most this deployment's cap on a hold, POOLKEEPER_HOLD_MAX_SECONDS (default 3600; the served document gives the deployment's value as maximum): above it, 400 naming the cap
    #[serde(default, deserialize_with = "json::hold_seconds")]
    #[schema(minimum = 1, maximum = 3600)]
    hold_seconds: Option<i64>,
    /// R13: how many machines, reserved together or not at all (absent or null: 1). An order of one answers with a Reservation, an order of several with an Order
    #[serde(default, deserialize_with = "json::quantity")]
    #[schema(minimum = 1, maximum = 16)]
    quantity: Option<i64>,
    /// R18: the order's segment; it may take the headroom kept for it. Absent or null: no segment
    #[serde(default)]
    segment: Option<Segment>,
    /// R19: the end customer, whose live holds the organization may cap. Absent or null: none
    #[serde(default)]
    customer_ref: Option<CustomerRef>,
    /// R20: "allowed" lets the declared substitutes of the profile serve the whole order when its own pool cannot (all machines of one profile); absent, null or "none": the profile asked only
    #[serde(default)]
    #[schema(value_type = Option<SubstitutesMode>)]
    substitutes: Option<SubstitutesMode>,
}

/// Bodies and path ids are parsed in the handler, after the module check,
/// so that with the module off every request is refused the same way (R12);
/// anything malformed is `400 invalid` and writes nothing.
///
/// Every body is a JSON object: serde would also fill a struct from an
/// array of its fields by position, which the published contract (objects,
/// no additional properties) does not allow.
pub(crate) fn json_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    match bytes
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        Some(b'{') => {}
        Some(_) => return Err(invalid("invalid JSON body: the body must be a JSON object")),
        None => return Err(invalid("invalid JSON body: the body is empty")),
    }
    serde_json::from_slice(bytes).map_err(|e| invalid(format!("invalid JSON body: {e}")))
}

/// The largest request body the orders API reads, as for inventory.
const MAX_BODY: usize = 64 * 1024;

/// Reads the body (after the module check, see `json_body`); too large is
/// `400 invalid` like any other bad body.
pub(crate) async fn read_body(mut payload: web::Payload) -> Result<web::BytesMut, ApiError> {
    use futures_util::StreamExt;
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| invalid(format!("could not read the body: {e}")))?;
        if body.len() + chunk.len() > MAX_BODY {
            return Err(invalid("the body is larger than 64 KiB"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A numeric id from the path: digits, from 1 (see `json::path_id`).
pub(crate) fn path_id(raw: &str) -> Result<i64, ApiError> {
    json::path_id(raw).map_err(|e| invalid(e.to_string()))
}

/// The API's view of a reservation: the row (with its frozen machine, R8)
/// and, once converted, its service link.
async fn body(pool: &Db, org_id: i64, r: &Reservation) -> Result<Value, ApiError> {
    let link = if r.state == ReservationState::Converted {
        reservations::service_of(pool, org_id, r.id).await?
    } else {
        None
    };
    body_with(r, link)
}

/// `body` when the service link (if any) is already known.
fn body_with(r: &Reservation, link: Option<ServiceLink>) -> Result<Value, ApiError> {
    let mut value = serde_json::to_value(r).map_err(anyhow::Error::from)?;
    if let Some(link) = link
        && let Value::Object(map) = &mut value
    {
        map.insert(
            "service".into(),
            serde_json::to_value(link).map_err(anyhow::Error::from)?,
        );
    }
    Ok(value)
}

/// A caller refused by `api_caller`, as the bearer extractor and
/// `ApiClient::module_call` would have refused it.
fn caller_refused(refusal: CallerRefusal) -> ApiError {
    match refusal {
        CallerRefusal::Unauthorized => ApiError::Unauthorized("unknown or revoked token"),
        CallerRefusal::Forbidden => ApiError::Forbidden(format!(
            "this token lacks the {} scope",
            Scope::Orders.as_str()
        )),
        CallerRefusal::ModuleOffDeployment => ApiError::ModuleDisabled("on this deployment"),
        CallerRefusal::ModuleOffOrganization => ApiError::ModuleDisabled("for this organization"),
    }
}

/// The order endpoints parse the request first and check the token in the
/// same statement as the decision (one round trip). A request that does not
/// parse never reaches that statement, so its token, scope and module
/// switches (R12) are checked here first, in the API's order (401, 403,
/// 403 module, then `400 invalid`): with the module off every request is
/// refused the same way, parsed or not.
async fn parsed<T>(
    parsed: Result<T, ApiError>,
    token: &BearerToken,
    pool: &Db,
    settings: &Settings,
) -> Result<T, ApiError> {
    match parsed {
        Ok(value) => Ok(value),
        Err(invalid) => {
            token
                .resolve(pool)
                .await?
                .module_call(settings, Scope::Orders)?;
            Err(invalid)
        }
    }
}

fn reserve_request(bytes: &[u8], settings: &Settings) -> Result<ReserveRequest, ApiError> {
    let b: ReserveBody = json_body(bytes)?;
    let hold = HoldSeconds::new(b.hold_seconds.unwrap_or(i64::from(settings.hold_seconds)))
        .map_err(|e| invalid(e.to_string()))?;
    // R14: the cap is on the whole hold, from creation, as for extensions.
    if hold.get() > settings.hold_max_seconds {
        return Err(invalid(format!(
            "hold_seconds: {} is above this deployment's cap on a hold, {} seconds \
             (POOLKEEPER_HOLD_MAX_SECONDS); ask for at most {} and extend later if needed",
            hold.get(),
            settings.hold_max_seconds,
            settings.hold_max_seconds
        )));
    }
    let quantity = Quantity::new(b.quantity.unwrap_or(1)).map_err(|e| invalid(e.to_string()))?;
    Ok(ReserveRequest {
        quantity,
        order_ref: b.order_ref,
        spec: OrderSpec {
            site: b.site,
            profile: b.profile,
            vendor: b.vendor,
        },
        hold,
        // api_reserve names the token as the actor.
        actor: String::new(),
        segment: b.segment,
        customer_ref: b.customer_ref,
        substitutes: b.substitutes.unwrap_or_default(),
    })
}

/// `POST /api/v1/reservations`: parse, reserve in one statement, count,
/// answer (`Reserved` and `Refused` say how).
#[utoipa::path(
    post,
    path = "/api/v1/reservations",
    operation_id = "reserve",
    summary = "Reserve a machine for an order (scope orders)",
    description = "order_ref is the idempotency key of the whole order, unique per organization: replaying it returns the existing order (200), whatever its state. quantity (1 to 16) reserves that many machines together, or none (R13).",
    request_body = ReserveBody,
    responses(
        (status = 200, description = "the order was already written: a Reservation for an order of one, an Order (every reservation, one deadline) for an order of several", body = inline(ReserveAnswer)),
        (status = 201, description = "a new order: a Reservation for an order of one, an Order (every reservation, one deadline) for an order of several", body = inline(ReserveAnswer)),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 409, description = "contended (at least quantity machines match but fewer could be taken now; has Retry-After), unavailable (fewer than quantity match: buy hardware; has excluded counts and candidates, no Retry-After), reserved (they match, but the sellable ones left are kept for other segments, R18) or customer_limit (the customer is at the organization's cap, R19). Nothing is held in any case; all but customer_limit carry alternatives", body = inline(ReserveRefused),
            headers(("Retry-After" = i64, description = "only with error contended"))),
        (status = 422, description = "idempotency_mismatch: this order_ref was first used with another request; fields names what differs (site, profile, vendor, quantity, hold_seconds, segment, customer_ref). The original order stands; nothing written", body = IdempotencyMismatchError),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn reserve(
    token: BearerToken,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    metrics: web::Data<Metrics>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(payload).await;
    let req = bytes.and_then(|b| reserve_request(&b, &settings));
    let req = parsed(req, &token, &pool, &settings).await?;
    // The reserve's span: what was asked and what came of it.
    let span = tracing::info_span!(
        "reserve",
        order_ref = req.order_ref.as_str(),
        quantity = i64::from(req.quantity.get()),
        outcome = tracing::field::Empty,
        candidates = tracing::field::Empty,
        candidates_locked_by_others = tracing::field::Empty,
    );
    // F3: a lost connection once sent is `outcome_unknown`, and the replay
    // with this order_ref says what happened.
    let mut outcome = write(&pool, Shape::Statement, async |conn| {
        allocator::reserve_for_token(conn, token.digest(), settings.datacenter_module, &req).await
    })
    .instrument(span.clone())
    .await?
    .map_err(|e| {
        span.record("outcome", "refused");
        caller_refused(e)
    })?;
    if let Some((org_id, alternatives)) = outcome.alternatives_mut() {
        *alternatives = allocator::alternatives(&**pool, org_id, &req).await?;
    }
    refuse_another_request(&pool, &outcome, &req).await?;
    record_outcome(&span, &outcome);
    metrics
        .reservations
        .with_label_values(&[outcome.label()])
        .inc();
    // Lost demand, labelled by the inventory's sites and profiles.
    crate::demand::count_refusal(&metrics, &pool, &outcome, &req.spec).await;
    crate::demand::count_served(&metrics, &pool, &outcome).await;
    Reserved::try_from(Answered {
        outcome,
        quantity: req.quantity.get(),
    })?
    .respond(&pool)
    .await
}

/// R6: a replay answers the original order only when it is the same
/// request; the same `order_ref` with another one (an order service whose
/// reference scheme repeats) is `422 idempotency_mismatch` naming the
/// fields, and the original stands. Read only on a replay.
async fn refuse_another_request(
    pool: &Db,
    outcome: &ReserveOutcome,
    req: &ReserveRequest,
) -> Result<(), ApiError> {
    let ReserveOutcome::Existing { reservation, .. } = outcome else {
        return Ok(());
    };
    let Some(first) =
        allocator::asked_with(pool, reservation.org_id, req.order_ref.as_str()).await?
    else {
        return Ok(());
    };
    let fields = req.differs_from(&first);
    if fields.is_empty() {
        Ok(())
    } else {
        Err(ApiError::Mismatch { fields })
    }
}

/// The span's fields of what came of a reserve.
fn record_outcome(span: &tracing::Span, outcome: &ReserveOutcome) {
    span.record("outcome", outcome.label());
    match outcome {
        ReserveOutcome::Created { walk, .. } => {
            span.record("candidates", walk.scanned as i64);
            span.record("candidates_locked_by_others", walk.locked_by_others as i64);
        }
        ReserveOutcome::Contended {
            walk, candidates, ..
        } => {
            span.record("candidates", *candidates);
            span.record("candidates_locked_by_others", walk.locked_by_others as i64);
        }
        ReserveOutcome::Unavailable { .. } | ReserveOutcome::CustomerLimit { .. } => {
            span.record("candidates", 0_i64);
        }
        ReserveOutcome::Reserved { candidates, .. } => {
            span.record("candidates", *candidates);
        }
        ReserveOutcome::Existing { .. } => {}
    }
}

/// What the allocator answered to an order of `quantity` machines.
struct Answered {
    outcome: ReserveOutcome,
    quantity: u8,
}

/// A reserve that holds its machines: a new order (201) or one already
/// written, whatever its state (200, R9). An order of one answers as a
/// reservation, as it always did; an order of several with all of its
/// reservations (R13).
enum Reserved {
    Created(Vec<Reservation>),
    Existing(Vec<Reservation>),
}

/// A refusal is the error the API answers with (docs/api.md's codes).
impl TryFrom<Answered> for Reserved {
    type Error = ApiError;

    fn try_from(a: Answered) -> Result<Reserved, ApiError> {
        let n = a.quantity;
        match a.outcome {
            ReserveOutcome::Created {
                reservation,
                others,
                ..
            } => Ok(Reserved::Created(
                std::iter::once(reservation).chain(others).collect(),
            )),
            ReserveOutcome::Existing {
                reservation,
                others,
            } => Ok(Reserved::Existing(
                std::iter::once(reservation).chain(others).collect(),
            )),
            ReserveOutcome::Contended {
                walk,
                candidates,
                alternatives,
                ..
            } => Err(contended(n, walk.scanned, candidates, &alternatives)),
            ReserveOutcome::Unavailable {
                excluded,
                alternatives,
                ..
            } => Err(unavailable(n, &excluded, &alternatives)),
            ReserveOutcome::Reserved {
                candidates,
                kept,
                alternatives,
                ..
            } => Err(reserved(n, candidates, &kept, &alternatives)),
            ReserveOutcome::CustomerLimit { limit, holds, .. } => {
                Err(customer_limit(n, limit, holds))
            }
        }
    }
}

impl Reserved {
    async fn respond(self, pool: &Db) -> Result<HttpResponse, ApiError> {
        match self {
            Reserved::Created(order) if order.len() == 1 => {
                Ok(HttpResponse::Created().json(body_with(&order[0], None)?))
            }
            Reserved::Created(order) => {
                let order: OrderAfter = order.into_iter().map(|r| (r, None)).collect();
                Ok(HttpResponse::Created().json(order_body(&order)?))
            }
            Reserved::Existing(order) if order.len() == 1 => {
                let r = &order[0];
                Ok(HttpResponse::Ok().json(body(pool, r.org_id, r).await?))
            }
            Reserved::Existing(order) => {
                let r = order.first().ok_or(not_found("order"))?;
                let order = read_order(pool, r.org_id, &r.order_ref).await?;
                Ok(HttpResponse::Ok().json(order_body(&order)?))
            }
        }
    }
}

/// 409 `contended`: machines match but faster orders are taking them.
fn contended(n: u8, scanned: usize, candidates: i64, alternatives: &[Alternative]) -> ApiError {
    let message = if n == 1 {
        "machines match this order but faster orders are taking them; retry in a moment".to_owned()
    } else {
        format!(
            "{} this order of {n} but faster orders are taking them; retry in a moment",
            count_of(candidates, "machine matches", "machines match")
        )
    };
    conflict("contended", message)
        .with("scanned", json!(scanned))
        .with("candidates", json!(candidates))
        .with("quantity", json!(n))
        .with("alternatives", json!(alternatives))
        .retry_after(allocator::RETRY_AFTER_SECONDS)
}

/// 409 `unavailable`: fewer machines match than the order asks for.
fn unavailable(n: u8, excluded: &ExcludedCounts, alternatives: &[Alternative]) -> ApiError {
    let message = if n == 1 {
        "no machine matches this order; more hardware is needed".to_owned()
    } else {
        format!(
            "only {} of the {n} machines of this order match; more hardware is needed",
            excluded.candidates
        )
    };
    conflict("unavailable", message)
        .with("excluded", json!(excluded))
        .with("candidates", json!(excluded.candidates))
        .with("quantity", json!(n))
        .with("alternatives", json!(alternatives))
}

/// 409 `reserved` (R18): what is left is kept for other segments.
fn reserved(
    n: u8,
    candidates: i64,
    kept: &BTreeMap<String, i64>,
    alternatives: &[Alternative],
) -> ApiError {
    conflict(
        "reserved",
        format!(
            "{} this order of {n}, but the sellable machines left \
             are kept for {}; nothing more can be sold to orders outside those segments",
            count_of(candidates, "machine matches", "machines match"),
            kept.keys().cloned().collect::<Vec<_>>().join(", ")
        ),
    )
    .with("kept", json!(kept))
    .with("candidates", json!(candidates))
    .with("quantity", json!(n))
    .with("alternatives", json!(alternatives))
}

/// 409 `customer_limit` (R19): the customer is at its cap.
fn customer_limit(n: u8, limit: i64, holds: i64) -> ApiError {
    conflict(
        "customer_limit",
        format!(
            "this customer holds {} and the organization caps one customer's live \
             holds at {limit}; an order of {n} more is refused",
            count_of(holds, "machine", "machines")
        ),
    )
    .with("limit", json!(limit))
    .with("holds", json!(holds))
    .with("quantity", json!(n))
}

/// Every reservation of an order with its service link once converted.
async fn read_order(pool: &Db, org_id: i64, order_ref: &str) -> Result<OrderAfter, ApiError> {
    let order = reservations::order_of(pool, org_id, order_ref).await?;
    let links = if order.iter().any(|r| r.state == ReservationState::Converted) {
        reservations::services_of_order(pool, org_id, order_ref).await?
    } else {
        Vec::new()
    };
    Ok(order
        .into_iter()
        .map(|r| {
            let link = links.iter().find(|l| l.reservation_id == r.id).cloned();
            (r, link)
        })
        .collect())
}

/// an order of several machines (R13): every reservation of it, in slot order, with one deadline
#[derive(Debug, Serialize, ToSchema)]
pub struct Order {
    order_ref: String,
    #[schema(minimum = 1, maximum = 16)]
    quantity: i16,
    /// the order's one deadline
    expires_at: DateTime<Utc>,
    #[schema(value_type = Vec<Reservation>, min_items = 1, max_items = 16)]
    reservations: Vec<Value>,
}

/// The API's view of an order (R13): its ref, its size, its one deadline
/// and every reservation (each with its id, fence and machine).
fn order_body(order: &OrderAfter) -> Result<Order, ApiError> {
    let first = order.first().map(|(r, _)| r).ok_or(not_found("order"))?;
    let reservations = order
        .iter()
        .map(|(r, link)| body_with(r, link.clone()))
        .collect::<Result<Vec<Value>, ApiError>>()?;
    Ok(Order {
        order_ref: first.order_ref.clone(),
        quantity: first.quantity,
        expires_at: first.expires_at,
        reservations,
    })
}

#[utoipa::path(
    get,
    path = "/api/v1/reservations/{id}",
    operation_id = "getReservation",
    summary = "One reservation (scope orders)",
    params(IdPath),
    responses(
        (status = 200, description = "the reservation", body = Reservation),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    )
)]
pub(crate) async fn get(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Orders)?;
    let r = reservations::get(&pool, client.org_id, path_id(&path)?)
        .await?
        .ok_or(not_found("reservation"))?;
    Ok(HttpResponse::Ok().json(body(&pool, client.org_id, &r).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ByOrderRef {
    #[param(value_type = OrderRef, required = true)]
    order_ref: Option<String>,
}

#[utoipa::path(
    get,
    path = "/api/v1/reservations",
    operation_id = "findReservation",
    summary = "Find the reservation of an order (scope orders)",
    params(ByOrderRef),
    responses(
        (status = 200, description = "the reservation", body = Reservation),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    )
)]
pub(crate) async fn by_order_ref(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Orders)?;
    let query = web::Query::<ByOrderRef>::from_query(req.query_string())
        .map_err(|e| invalid(format!("invalid query string: {e}")))?;
    let order_ref = query
        .order_ref
        .as_deref()
        .ok_or_else(|| invalid("order_ref is required"))
        .and_then(|s| OrderRef::parse(s).map_err(|e| invalid(e.to_string())))?;
    let mut conn = pool.acquire().await?;
    let r = reservations::by_order_ref(&mut conn, client.org_id, order_ref.as_str())
        .await?
        .ok_or(not_found("reservation"))?;
    drop(conn);
    Ok(HttpResponse::Ok().json(body(&pool, client.org_id, &r).await?))
}

// A reservation's history.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventList {
    events: Vec<reservations::Event>,
}

#[utoipa::path(
    get,
    path = "/api/v1/reservations/{id}/events",
    operation_id = "reservationEvents",
    summary = "A reservation's history, oldest first: who did what (scope orders)",
    params(IdPath),
    responses(
        (status = 200, description = "the events", body = inline(EventList)),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    )
)]
pub(crate) async fn events(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Orders)?;
    let id = path_id(&path)?;
    reservations::get(&pool, client.org_id, id)
        .await?
        .ok_or(not_found("reservation"))?;
    let events = reservations::events(&pool, client.org_id, id).await?;
    Ok(HttpResponse::Ok().json(EventList { events }))
}

/// A refused transition, in docs/api.md's codes; `fields` are what a
/// replay of this action must repeat (named by an idempotency mismatch).
fn refusal(e: TransitionError, fields: Vec<&'static str>) -> ApiError {
    match e {
        TransitionError::NotFound => not_found("reservation"),
        TransitionError::StaleFence => conflict("stale_fence", e.to_string()),
        TransitionError::NotHeld { state } => conflict(
            "not_held",
            format!("the reservation has already ended: {state}"),
        )
        .with("state", json!(state)),
        TransitionError::Expired { expires_at } => conflict("expired", e.to_string())
            .with("expires_at", json!(expires_at))
            .with("state", json!(ReservationState::Expired)),
        TransitionError::PartOfOrder {
            ref order_ref,
            quantity,
            ..
        } => conflict("part_of_order", e.to_string())
            .with("order_ref", json!(order_ref))
            .with("quantity", json!(quantity)),
        TransitionError::Mismatch { ref ids } => {
            conflict("order_mismatch", e.to_string()).with("reservation_ids", json!(ids))
        }
        TransitionError::HoldCap {
            cap_seconds,
            latest,
        } => conflict("hold_cap_exceeded", e.to_string())
            .with("cap_seconds", json!(cap_seconds))
            .with("latest_expires_at", json!(latest)),
        TransitionError::MachineNotReady {
            reservation_id,
            machine_id,
            ref asset_tag,
        } => conflict("machine_not_ready", e.to_string())
            .with("reservation_id", json!(reservation_id))
            .with("machine_id", json!(machine_id))
            .with("asset_tag", json!(asset_tag)),
        TransitionError::IdempotencyMismatch => ApiError::ReplayMismatch { fields },
        TransitionError::Database(db) => db.into(),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConvertBody {
    #[serde(deserialize_with = "json::fence")]
    #[schema(schema_with = crate::api::schemas::fence)]
    fence: i64,
    service_ref: ServiceRef,
}

/// Cancel or convert through `api_transition_request`: one statement.
async fn transition(
    token: &BearerToken,
    settings: &Settings,
    pool: &Db,
    id: i64,
    fence: i64,
    what: Transition<'_>,
) -> Result<HttpResponse, ApiError> {
    // F3, as for reserve: the replay with the same fence says.
    let fields = what.replay_fields();
    let (r, link) = write(pool, Shape::Statement, async |conn| {
        reservations::transition_for_token(
            conn,
            token.digest(),
            settings.datacenter_module,
            id,
            fence,
            what,
        )
        .await
    })
    .await?
    .map_err(caller_refused)?
    .map_err(|e| refusal(e, fields))?;
    Ok(HttpResponse::Ok().json(body_with(&r, link)?))
}

#[utoipa::path(
    post,
    path = "/api/v1/reservations/{id}/convert",
    operation_id = "convert",
    summary = "Convert a held reservation into a service link (scope orders)",
    description = "",
    params(IdPath),
    request_body = ConvertBody,
    responses(
        (status = 200, description = "converted, with its service link; also the answer to this convert replayed unchanged (same fence and service_ref) after it took effect: the reservation as it left it", body = Reservation),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 409, description = "expired (past its deadline; the reservation is then expired), stale_fence (the fence is not this reservation's), not_held (it has already ended by another action than this one; state says how), or machine_not_ready (the machine under it is not ready at the commit; asset_tag names it, nothing is written)", body = TransitionRefused),
        (status = 422, description = "idempotency_mismatch: this caller already converted it with the same fence and another service_ref; fields names it. The reservation stays as the first request left it; nothing written", body = IdempotencyMismatchError),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn convert(
    token: BearerToken,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(payload).await;
    let request = path_id(&path).and_then(|id| {
        let b: ConvertBody = json_body(&bytes?)?;
        Ok((id, b))
    });
    let (id, b) = parsed(request, &token, &pool, &settings).await?;
    transition(
        &token,
        &settings,
        &pool,
        id,
        b.fence,
        Transition::Convert(&b.service_ref),
    )
    .await
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    #[serde(deserialize_with = "json::fence")]
    #[schema(schema_with = crate::api::schemas::fence)]
    fence: i64,
    #[serde(deserialize_with = "json::reason")]
    #[schema(schema_with = crate::api::schemas::reason)]
    reason: String,
}

#[utoipa::path(
    post,
    path = "/api/v1/reservations/{id}/cancel",
    operation_id = "cancel",
    summary = "Cancel a held reservation (scope orders)",
    params(IdPath),
    request_body = CancelBody,
    responses(
        (status = 200, description = "cancelled; also the answer to this cancel replayed unchanged (same fence, same token) after it took effect: the reservation as it left it", body = Reservation),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 409, description = "expired (past its deadline; the reservation is then expired), stale_fence (the fence is not this reservation's), or not_held (it has already ended by another action than this one; state says how)", body = TransitionRefused),
        (status = 422, description = "idempotency_mismatch: this caller already cancelled it with the same fence and another reason; fields names it. The reservation stays as the first request left it; nothing written", body = IdempotencyMismatchError),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn cancel(
    token: BearerToken,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(payload).await;
    let request = path_id(&path).and_then(|id| {
        let b: CancelBody = json_body(&bytes?)?;
        let reason = reservations::check_reason(&b.reason).map_err(invalid)?;
        Ok((id, b.fence, reason.to_owned()))
    });
    let (id, fence, reason) = parsed(request, &token, &pool, &settings).await?;
    transition(
        &token,
        &settings,
        &pool,
        id,
        fence,
        Transition::Cancel(&reason),
    )
    .await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendBody {
    #[serde(deserialize_with = "json::fence")]
    fence: i64,
    #[serde(default, deserialize_with = "json::seconds")]
    seconds: Option<i64>,
    #[serde(default)]
    until: Option<String>,
    #[serde(default, deserialize_with = "json::optional_reason")]
    reason: Option<String>,
}

/// The new deadline of an extension: `until` (RFC 3339, the deadline
/// asked for: the same request again answers the same deadline, F3) or
/// `seconds` from now (as a reserve's `hold_seconds`, 1 to 86400; the same
/// request again moves it again), exactly one of them. As `(seconds,
/// until)` for `OrderAction::Extend`.
fn extend_to(
    seconds: Option<i64>,
    until: Option<String>,
) -> Result<(u32, Option<DateTime<Utc>>), ApiError> {
    match (seconds, until) {
        (Some(seconds), None) => HoldSeconds::new(seconds)
            .map(|s| (s.get(), None))
            .map_err(|_| invalid("seconds: must be a whole number of seconds from 1 to 86400")),
        (None, Some(until)) => {
            let at = DateTime::parse_from_rfc3339(&until).map_err(|e| {
                invalid(format!(
                    "until: must be an RFC 3339 date and time with its offset, such as \
                     2026-12-05T14:30:00Z ({e})"
                ))
            })?;
            // The database keeps microseconds: the deadline answered, and
            // compared on a retry, is the one stored.
            let at = at.with_timezone(&Utc).trunc_subsecs(6);
            Ok((0, Some(at)))
        }
        (Some(_), Some(_)) => Err(invalid("give either seconds or until, not both")),
        (None, None) => Err(invalid(
            "until (the new deadline, RFC 3339) or seconds (from now) is required",
        )),
    }
}

/// An extension's optional reason, checked as a cancellation's.
fn extend_reason(reason: Option<String>) -> Result<Option<String>, ApiError> {
    reason
        .map(|r| {
            reservations::check_reason(&r)
                .map(str::to_owned)
                .map_err(|e| invalid(format!("reason: {e}")))
        })
        .transpose()
}

/// An order action through `api_order_request`: one statement.
async fn order_transition(
    token: &BearerToken,
    settings: &Settings,
    pool: &Db,
    order_ref: Option<&str>,
    named: &[Named],
    what: OrderAction<'_>,
) -> Result<OrderAfter, ApiError> {
    let fields = what.replay_fields();
    write(pool, Shape::Statement, async |conn| {
        reservations::order_transition_for_token(
            conn,
            token.digest(),
            settings.datacenter_module,
            order_ref,
            named,
            what,
        )
        .await
    })
    .await?
    .map_err(caller_refused)?
    .map_err(|e| refusal(e, fields))
}

/// `POST /reservations/{id}/extend` (R14): the reservation of an order of
/// one; a reservation of an order of several is `409 part_of_order`.
#[utoipa::path(
    post,
    path = "/api/v1/reservations/{id}/extend",
    operation_id = "extend",
    summary = "Extend a held reservation's deadline (scope orders, R14)",
    description = "",
    params(IdPath),
    request_body = ExtendBody,
    responses(
        (status = 200, description = "extended: the reservation with its new expires_at and the same fence", body = Reservation),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 409, description = "expired (past its deadline: it is then recorded expired, state expired), stale_fence, not_held (state says how it ended), hold_cap_exceeded (the new deadline would pass POOLKEEPER_HOLD_MAX_SECONDS from creation: cap_seconds and latest_expires_at say so), or part_of_order (it is one machine of an order of several: extend the order)", body = TransitionRefused),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn extend(
    token: BearerToken,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(payload).await;
    let request = path_id(&path).and_then(|id| {
        let b: ExtendBody = json_body(&bytes?)?;
        Ok((
            id,
            b.fence,
            extend_to(b.seconds, b.until)?,
            extend_reason(b.reason)?,
        ))
    });
    let (id, fence, (seconds, until), reason) = parsed(request, &token, &pool, &settings).await?;
    let order = order_transition(
        &token,
        &settings,
        &pool,
        None,
        &[Named { id, fence }],
        OrderAction::Extend {
            seconds,
            until,
            cap_seconds: settings.hold_max_seconds,
            reason: reason.as_deref(),
        },
    )
    .await?;
    let (r, link) = order.into_iter().next().ok_or(not_found("reservation"))?;
    Ok(HttpResponse::Ok().json(body_with(&r, link)?))
}

/// An order ref from the path, as a reserve body's.
fn path_order_ref(raw: &str) -> Result<OrderRef, ApiError> {
    if raw == "." || raw == ".." {
        // Not a path segment any client can send (the document says so).
        return Err(invalid("order_ref: cannot be \".\" or \"..\" in a path"));
    }
    OrderRef::parse(raw).map_err(|e| invalid(e.to_string()))
}

#[utoipa::path(
    get,
    path = "/api/v1/orders/{order_ref}",
    operation_id = "getOrder",
    summary = "Read an order, every reservation of it (scope orders)",
    params(OrderRefInPath),
    responses(
        (status = 200, description = "the order: every reservation of it, in slot order", body = Order),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    )
)]
pub(crate) async fn get_order(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Orders)?;
    let order_ref = path_order_ref(&path)?;
    let order = read_order(&pool, client.org_id, order_ref.as_str()).await?;
    if order.is_empty() {
        return Err(not_found("order"));
    }
    Ok(HttpResponse::Ok().json(order_body(&order)?))
}

// A reservation named in an order's body: its id and its fence.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NamedReservation)]
pub struct NamedBody {
    /// a reservation of the order
    #[serde(deserialize_with = "json::id")]
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    id: i64,
    #[serde(deserialize_with = "json::fence")]
    #[schema(schema_with = crate::api::schemas::fence)]
    fence: i64,
}

// A reservation named in an order's conversion, with its service.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConvertItem {
    /// a reservation of the order
    #[serde(deserialize_with = "json::id")]
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    id: i64,
    #[serde(deserialize_with = "json::fence")]
    #[schema(schema_with = crate::api::schemas::fence)]
    fence: i64,
    service_ref: ServiceRef,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConvertOrderBody {
    /// every reservation of the order, each once (otherwise 409 order_mismatch), each with its own service_ref
    #[schema(min_items = 1, max_items = 16)]
    reservations: Vec<ConvertItem>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelOrderBody {
    /// every reservation of the order, each once (otherwise 409 order_mismatch)
    #[schema(min_items = 1, max_items = 16)]
    reservations: Vec<NamedBody>,
    #[serde(deserialize_with = "json::reason")]
    #[schema(schema_with = crate::api::schemas::reason)]
    reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendOrderBody {
    reservations: Vec<NamedBody>,
    #[serde(default, deserialize_with = "json::seconds")]
    seconds: Option<i64>,
    #[serde(default)]
    until: Option<String>,
    #[serde(default, deserialize_with = "json::optional_reason")]
    reason: Option<String>,
}

impl utoipa::PartialSchema for ExtendBody {
    fn schema() -> RefOr<utoipa::openapi::Schema> {
        either("ExtendBodyUntil", "ExtendBodySeconds")
    }
}
impl ToSchema for ExtendBody {
    fn schemas(schemas: &mut Vec<(String, RefOr<utoipa::openapi::Schema>)>) {
        schemas.push(("ExtendBodyUntil".into(), ExtendBodyUntil::schema()));
        schemas.push(("ExtendBodySeconds".into(), ExtendBodySeconds::schema()));
    }
}

impl utoipa::PartialSchema for ExtendOrderBody {
    fn schema() -> RefOr<utoipa::openapi::Schema> {
        either("ExtendOrderBodyUntil", "ExtendOrderBodySeconds")
    }
}
impl ToSchema for ExtendOrderBody {
    fn schemas(schemas: &mut Vec<(String, RefOr<utoipa::openapi::Schema>)>) {
        schemas.push((
            "ExtendOrderBodyUntil".into(),
            ExtendOrderBodyUntil::schema(),
        ));
        schemas.push((
            "ExtendOrderBodySeconds".into(),
            ExtendOrderBodySeconds::schema(),
        ));
        <NamedBody as ToSchema>::schemas(schemas);
        schemas.push((NamedBody::name().into(), NamedBody::schema()));
    }
}

/// An extension names its deadline one way: `until` or `seconds`.
fn either(until: &str, seconds: &str) -> RefOr<utoipa::openapi::Schema> {
    use utoipa::openapi::schema::{OneOfBuilder, Ref, Schema};
    Schema::OneOf(
        OneOfBuilder::new()
            .item(Ref::from_schema_name(until))
            .item(Ref::from_schema_name(seconds))
            .description(Some("either until (the deadline asked for: safe to retry) or seconds (from now: not idempotent), not both"))
            .build(),
    )
    .into()
}

// `ExtendBody` and `ExtendOrderBody` read `until` and `seconds` as options
// and `extend_to` refuses both or neither; the document says it with two
// shapes each.

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct ExtendBodySeconds {
    #[schema(schema_with = crate::api::schemas::fence)]
    fence: i64,
    #[schema(schema_with = crate::api::schemas::seconds)]
    seconds: i64,
    #[schema(schema_with = crate::api::schemas::optional_reason, required = false)]
    reason: Option<String>,
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct ExtendBodyUntil {
    #[schema(schema_with = crate::api::schemas::fence)]
    fence: i64,
    #[schema(schema_with = crate::api::schemas::until)]
    until: String,
    #[schema(schema_with = crate::api::schemas::optional_reason, required = false)]
    reason: Option<String>,
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct ExtendOrderBodySeconds {
    /// every reservation of the order, each once (otherwise 409 order_mismatch)
    #[schema(min_items = 1, max_items = 16)]
    reservations: Vec<NamedBody>,
    #[schema(schema_with = crate::api::schemas::seconds)]
    seconds: i64,
    #[schema(schema_with = crate::api::schemas::optional_reason, required = false)]
    reason: Option<String>,
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct ExtendOrderBodyUntil {
    /// every reservation of the order, each once (otherwise 409 order_mismatch)
    #[schema(min_items = 1, max_items = 16)]
    reservations: Vec<NamedBody>,
    #[schema(schema_with = crate::api::schemas::until)]
    until: String,
    #[schema(schema_with = crate::api::schemas::optional_reason, required = false)]
    reason: Option<String>,
}

// A reserve's answer: a Reservation for an order of one, an Order for an
// order of several.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum ReserveAnswer {
    Reservation(Box<Reservation>),
    Order(Order),
}

/// The reservations an order's body names: 1 to 16 (an order's size), ids
/// from 1 (the document's bounds). Naming one twice, or not naming one of
/// the order's, is the order's answer: `409 order_mismatch`.
fn named(items: impl Iterator<Item = (i64, i64)>) -> Result<Vec<Named>, ApiError> {
    let named: Vec<Named> = items.map(|(id, fence)| Named { id, fence }).collect();
    if named.is_empty() || named.len() as i64 > Quantity::MAX {
        return Err(invalid(format!(
            "reservations: name every reservation of the order (1 to {})",
            Quantity::MAX
        )));
    }
    if named.iter().any(|n| n.id < 1) {
        return Err(invalid("reservations: ids are whole numbers from 1"));
    }
    Ok(named)
}

/// What an order action's body carries once parsed (its reservations are
/// apart): the one handler, `order_action`, runs each the same way.
trait OrderRequest: Sized {
    /// Parses the body: the reservations it names, and the rest.
    fn parse(bytes: &[u8]) -> Result<(Vec<Named>, Self), ApiError>;
    /// The action, borrowing what was parsed.
    fn action<'a>(&'a self, settings: &Settings) -> OrderAction<'a>;
}

struct ConvertOrder(Vec<ServiceRef>);
struct CancelOrder(String);
struct ExtendOrder {
    seconds: u32,
    until: Option<DateTime<Utc>>,
    reason: Option<String>,
}

impl OrderRequest for ConvertOrder {
    fn parse(bytes: &[u8]) -> Result<(Vec<Named>, Self), ApiError> {
        let b: ConvertOrderBody = json_body(bytes)?;
        let named = named(b.reservations.iter().map(|i| (i.id, i.fence)))?;
        let refs = b.reservations.into_iter().map(|i| i.service_ref).collect();
        Ok((named, ConvertOrder(refs)))
    }
    fn action<'a>(&'a self, _: &Settings) -> OrderAction<'a> {
        OrderAction::Convert {
            service_refs: &self.0,
        }
    }
}

impl OrderRequest for CancelOrder {
    fn parse(bytes: &[u8]) -> Result<(Vec<Named>, Self), ApiError> {
        let b: CancelOrderBody = json_body(bytes)?;
        let named = named(b.reservations.iter().map(|i| (i.id, i.fence)))?;
        let reason = reservations::check_reason(&b.reason).map_err(invalid)?;
        Ok((named, CancelOrder(reason.to_owned())))
    }
    fn action<'a>(&'a self, _: &Settings) -> OrderAction<'a> {
        OrderAction::Cancel { reason: &self.0 }
    }
}

impl OrderRequest for ExtendOrder {
    fn parse(bytes: &[u8]) -> Result<(Vec<Named>, Self), ApiError> {
        let b: ExtendOrderBody = json_body(bytes)?;
        let named = named(b.reservations.iter().map(|i| (i.id, i.fence)))?;
        let (seconds, until) = extend_to(b.seconds, b.until)?;
        let reason = extend_reason(b.reason)?;
        Ok((
            named,
            ExtendOrder {
                seconds,
                until,
                reason,
            },
        ))
    }
    fn action<'a>(&'a self, settings: &Settings) -> OrderAction<'a> {
        OrderAction::Extend {
            seconds: self.seconds,
            until: self.until,
            cap_seconds: settings.hold_max_seconds,
            reason: self.reason.as_deref(),
        }
    }
}

#[utoipa::path(
    post,
    path = "/api/v1/orders/{order_ref}/convert",
    operation_id = "convertOrder",
    summary = "Convert every reservation of an order, or none (scope orders, R13)",
    params(OrderRefInPath),
    request_body = ConvertOrderBody,
    responses(
        (status = 200, description = "converted: every reservation with its service link", body = Order),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 409, description = "order_mismatch (the body does not name every reservation of the order once), stale_fence (a fence is not its reservation's), not_held (one has ended; state says how), expired (past the order's deadline: every reservation of it is then recorded expired). Nothing else is written. Or machine_not_ready (a machine under the order is not ready at the commit; asset_tag names it), and nothing is written", body = TransitionRefused),
        (status = 422, description = "idempotency_mismatch: this caller already converted it with the same fence and another service_ref; fields names it. The reservation stays as the first request left it; nothing written", body = IdempotencyMismatchError),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn convert_order(
    token: BearerToken,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    order_action::<ConvertOrder>(token, settings, pool, path, payload).await
}

#[utoipa::path(
    post,
    path = "/api/v1/orders/{order_ref}/cancel",
    operation_id = "cancelOrder",
    summary = "Cancel every reservation of an order, or none (scope orders, R13)",
    params(OrderRefInPath),
    request_body = CancelOrderBody,
    responses(
        (status = 200, description = "cancelled, all of it", body = Order),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 409, description = "order_mismatch (the body does not name every reservation of the order once), stale_fence (a fence is not its reservation's), not_held (one has ended; state says how), or expired (past the order's deadline: every reservation of it is then recorded expired). Nothing else is written", body = TransitionRefused),
        (status = 422, description = "idempotency_mismatch: this caller already cancelled it with the same fence and another reason; fields names it. The reservation stays as the first request left it; nothing written", body = IdempotencyMismatchError),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn cancel_order(
    token: BearerToken,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    order_action::<CancelOrder>(token, settings, pool, path, payload).await
}

#[utoipa::path(
    post,
    path = "/api/v1/orders/{order_ref}/extend",
    operation_id = "extendOrder",
    summary = "Extend an order's one deadline (scope orders, R13, R14)",
    params(OrderRefInPath),
    request_body = ExtendOrderBody,
    responses(
        (status = 200, description = "extended: every reservation with the new expires_at and its same fence", body = Order),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 409, description = "order_mismatch (the body does not name every reservation of the order once), stale_fence (a fence is not its reservation's), not_held (one has ended; state says how), or expired (past the order's deadline: every reservation of it is then recorded expired). Nothing else is written; or hold_cap_exceeded", body = TransitionRefused),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn extend_order(
    token: BearerToken,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    order_action::<ExtendOrder>(token, settings, pool, path, payload).await
}

/// `POST /orders/{order_ref}/convert|cancel|extend` (R13): the whole order
/// in one statement, through the one write path.
async fn order_action<R: OrderRequest>(
    token: BearerToken,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(payload).await;
    let request = path_order_ref(&path).and_then(|order_ref| {
        let (named, parsed) = R::parse(&bytes?)?;
        Ok((order_ref, named, parsed))
    });
    let (order_ref, named, request) = parsed(request, &token, &pool, &settings).await?;
    let order = order_transition(
        &token,
        &settings,
        &pool,
        Some(order_ref.as_str()),
        &named,
        request.action(&settings),
    )
    .await?;
    Ok(HttpResponse::Ok().json(order_body(&order)?))
}
