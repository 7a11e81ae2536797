//! Order endpoints (scope `orders`): reserve, read, convert, cancel.

use crate::db::{Conn, Db};
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::allocator::{self, HoldSeconds, OrderSpec, ReserveOutcome, ReserveRequest};
use crate::api::json;
use crate::domain::{OrderRef, Profile, Scope, ServiceRef, Site, Vendor};
use crate::error::{ApiError, conflict, invalid, not_found};
use crate::metrics::Metrics;
use crate::reservations::{self, Reservation, ServiceLink, Transition, TransitionError};
use crate::settings::Settings;
use crate::tokens::{ApiClient, BearerToken, CallerRefusal};

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/reservations")
            .route(web::post().to(reserve))
            .route(web::get().to(by_order_ref)),
    )
    .service(web::resource("/reservations/{id}").route(web::get().to(get)))
    .service(web::resource("/reservations/{id}/events").route(web::get().to(events)))
    .service(web::resource("/reservations/{id}/convert").route(web::post().to(convert)))
    .service(web::resource("/reservations/{id}/cancel").route(web::post().to(cancel)));
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveBody {
    order_ref: OrderRef,
    site: Site,
    profile: Profile,
    #[serde(default)]
    vendor: Option<Vendor>,
    /// 40121 or 40121.0 (see `json`); null is absent.
    #[serde(default, deserialize_with = "json::hold_seconds")]
    hold_seconds: Option<i64>,
}

/// Bodies and path ids are parsed in the handler, after the module check,
/// so that with the module off every request is refused the same way (R12);
/// anything malformed is `400 invalid` and writes nothing.
pub(crate) fn json_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
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
    let link = if r.state == "converted" {
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
/// parse is answered as before the fold: the token, the scope and the
/// module switches (R12) are checked first, so that with the module off
/// every request is refused the same way, and only then `400 invalid`.
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
    Ok(ReserveRequest {
        order_ref: b.order_ref,
        spec: OrderSpec {
            site: b.site,
            profile: b.profile,
            vendor: b.vendor,
        },
        hold,
        // api_reserve names the token as the actor.
        actor: String::new(),
    })
}

async fn reserve(
    token: BearerToken,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    metrics: web::Data<Metrics>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(payload).await;
    let req = bytes.and_then(|b| reserve_request(&b, &settings));
    let req = parsed(req, &token, &pool, &settings).await?;
    // F3: the connection first (failing here, nothing was sent: 503
    // unavailable), then the one statement (failing there, the order may
    // exist: 503 outcome_unknown, and the replay with this order_ref says).
    let mut conn = pool.acquire().await?;
    let outcome =
        allocator::reserve_for_token(&mut *conn, token.digest(), settings.datacenter_module, &req)
            .await;
    let outcome = written(conn, outcome).await?.map_err(caller_refused)?;
    metrics
        .reservations
        .with_label_values(&[outcome.label()])
        .inc();
    // Issue 15: lost demand, labelled by the inventory's sites and profiles.
    crate::demand::count_refusal(&metrics, &pool, &outcome, &req.spec).await;
    match outcome {
        ReserveOutcome::Created { reservation, .. } => {
            Ok(HttpResponse::Created().json(body_with(&reservation, None)?))
        }
        ReserveOutcome::Existing(reservation) => {
            Ok(HttpResponse::Ok().json(body(&pool, reservation.org_id, &reservation).await?))
        }
        ReserveOutcome::Contended { walk, candidates } => Err(conflict(
            "contended",
            "machines match this order but faster orders are taking them; retry in a moment",
        )
        .with("scanned", json!(walk.scanned))
        .with("candidates", json!(candidates))
        .retry_after(allocator::RETRY_AFTER_SECONDS)),
        ReserveOutcome::Unavailable { excluded } => Err(conflict(
            "unavailable",
            "no machine matches this order; more hardware is needed",
        )
        .with("excluded", json!(excluded))),
    }
}

async fn get(
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByOrderRef {
    order_ref: Option<String>,
}

async fn by_order_ref(
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

async fn events(
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
    Ok(HttpResponse::Ok().json(json!({ "events": events })))
}

/// Ends a write's connection: on success keeps what was written (pinned,
/// commits); on failure closes a connection that reached a read-only
/// server (F2) and says whether the outcome is unknown (F3).
async fn written<T>(mut conn: Conn, outcome: Result<T, sqlx::Error>) -> Result<T, ApiError> {
    match outcome {
        Ok(value) => conn
            .finish()
            .await
            .map(|()| value)
            .map_err(ApiError::from_write),
        Err(e) => {
            conn.failed(&e);
            Err(ApiError::from_write(e))
        }
    }
}

/// A refused transition, in API.md's codes.
fn refusal(e: TransitionError) -> ApiError {
    match e {
        TransitionError::NotFound => not_found("reservation"),
        TransitionError::StaleFence => conflict("stale_fence", e.to_string()),
        TransitionError::NotHeld { state } => conflict(
            "not_held",
            format!("the reservation has already ended: {state}"),
        )
        .with("state", json!(state)),
        TransitionError::Expired { expires_at } => {
            conflict("expired", e.to_string()).with("expires_at", json!(expires_at))
        }
        TransitionError::Database(db) => db.into(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvertBody {
    #[serde(deserialize_with = "json::fence")]
    fence: i64,
    service_ref: ServiceRef,
}

/// Cancel or convert through `api_transition`: one statement.
async fn transition(
    token: &BearerToken,
    settings: &Settings,
    pool: &Db,
    id: i64,
    fence: i64,
    what: Transition<'_>,
) -> Result<HttpResponse, ApiError> {
    // F3, as for reserve: a lost connection after the statement was sent
    // is `outcome_unknown`, and the replay with the same fence says.
    let mut conn = pool.acquire().await?;
    let outcome = reservations::transition_for_token(
        &mut *conn,
        token.digest(),
        settings.datacenter_module,
        id,
        fence,
        what,
    )
    .await;
    let (r, link) = written(conn, outcome)
        .await?
        .map_err(caller_refused)?
        .map_err(refusal)?;
    Ok(HttpResponse::Ok().json(body_with(&r, link)?))
}

async fn convert(
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    #[serde(deserialize_with = "json::fence")]
    fence: i64,
    #[serde(deserialize_with = "json::reason")]
    reason: String,
}

async fn cancel(
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
