//! Capacity (R17, scope `orders`): what each pool holds and what an order
//! may take now; headroom (R18, scope `inventory`): the machines of a pool
//! kept for a segment.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use crate::api::caller::ApiClient;
use crate::api::json::{self, integer_text};
use crate::api::reservations::{json_body, read_body};
use crate::api::write::{Shape, write};
use crate::capacity::{self, Change, Filter, MAX_HEADROOM};
use crate::db::Db;
use crate::domain::{Profile, Scope, Segment, Site, Vendor};
use crate::error::{ApiError, invalid};
use crate::settings::Settings;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/capacity").route(web::get().to(get_capacity)))
        .service(
            web::resource("/headroom")
                .route(web::get().to(list_headroom))
                .route(web::put().to(put_headroom)),
        );
}

/// The most machines one capacity question may ask for (`quantity`), as
/// an order of several may (R13).
const MAX_QUANTITY: i64 = 16;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CapacityQuery {
    site: Option<String>,
    profile: Option<String>,
    vendor: Option<String>,
    segment: Option<String>,
    quantity: Option<String>,
}

/// Empty query values mean "no filter", as on `GET /machines`.
fn opt<T>(
    v: &Option<String>,
    parse: impl Fn(&str) -> Result<T, crate::domain::ParseError>,
) -> Result<Option<T>, ApiError> {
    match v.as_deref() {
        None | Some("") => Ok(None),
        Some(s) => parse(s).map(Some).map_err(|e| invalid(e.to_string())),
    }
}

/// A shop front polls this on every page view: the ETag digests the pools
/// and alternatives (not `as_of`), so an unchanged capacity answers `304`
/// to a client that sends it back. Weak: two answers with one tag differ
/// in `as_of`.
async fn get_capacity(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    cache: web::Data<capacity::Cache>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Orders)?;
    // R12: parsed after the switch.
    let query = web::Query::<CapacityQuery>::from_query(req.query_string())
        .map_err(|e| invalid(format!("invalid query string: {e}")))?;
    // An integer is written in digits, as `limit` of `GET /machines`: empty
    // is not one.
    let quantity = match query.quantity.as_deref() {
        None => None,
        Some(s) => {
            let n = integer_text("quantity", s).map_err(|e| invalid(e.to_string()))?;
            if !(1..=MAX_QUANTITY).contains(&n) {
                return Err(invalid(format!(
                    "quantity: must be between 1 and {MAX_QUANTITY}"
                )));
            }
            i32::try_from(n).ok()
        }
    };
    let filter = Filter {
        site: opt(&query.site, Site::parse)?,
        profile: opt(&query.profile, Profile::parse)?,
        vendor: opt(&query.vendor, Vendor::parse)?,
        segment: opt(&query.segment, Segment::parse)?,
        quantity,
    };
    let snap = cache.read(pool.get_ref(), client.org_id, &filter).await?;
    let opaque = format!("\"{}\"", snap.tag);
    let fresh = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| names(v, &opaque));
    let etag = format!("W/{opaque}");
    // Capacity moves with every order: a cache keeps it only to revalidate.
    let cache = "private, no-cache";
    if fresh {
        return Ok(HttpResponse::NotModified()
            .insert_header((header::ETAG, etag))
            .insert_header((header::CACHE_CONTROL, cache))
            .finish());
    }
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, etag))
        .insert_header((header::CACHE_CONTROL, cache))
        .json(json!({
            "as_of": snap.as_of,
            "pools": snap.pools,
            "alternatives": snap.alternatives,
        })))
}

/// True when If-None-Match names the tag whose opaque part (quotes
/// included) is `opaque`, weak or not (the weak comparison of RFC 9110), or
/// is `*`.
fn names(if_none_match: &str, opaque: &str) -> bool {
    if_none_match
        .split(',')
        .map(|t| t.trim())
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == opaque)
}

async fn list_headroom(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Inventory)?;
    let rows = capacity::list(pool.get_ref(), client.org_id).await?;
    Ok(HttpResponse::Ok().json(json!({ "headroom": rows })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeadroomBody {
    site: Site,
    profile: Profile,
    segment: Segment,
    #[serde(deserialize_with = "json::machines")]
    machines: i64,
}

/// R18: sets one pool's headroom for one segment, audited in the same
/// transaction. The same PUT again answers `200` with the same row and
/// writes nothing (F3's retry).
async fn put_headroom(
    req: HttpRequest,
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Inventory)?;
    let body: HeadroomBody = json_body(&read_body(payload).await?)?;
    let machines = i32::try_from(body.machines)
        .ok()
        .filter(|n| (0..=MAX_HEADROOM).contains(n))
        .ok_or_else(|| invalid(format!("machines: must be between 0 and {MAX_HEADROOM}")))?;
    let actor = format!("token:{}", client.token_name);
    let source = crate::dashboard::session::source_addr(&req);
    let (row, change) = write(&pool, Shape::Transaction, async |tx| {
        let (row, change) = capacity::set(
            tx,
            client.org_id,
            &body.site,
            &body.profile,
            &body.segment,
            machines,
            &client.token_name,
        )
        .await?;
        let Some((action, detail)) = change.audit(machines, &body.segment) else {
            return Ok((row, change));
        };
        crate::audit::record(
            tx,
            &crate::audit::Entry {
                org_id: Some(client.org_id),
                actor: &actor,
                action,
                object: &format!("pool:{}/{}", body.site, body.profile),
                source_addr: &source,
                detail: Some(&detail),
            },
        )
        .await?;
        Ok((row, change))
    })
    .await?;
    if change == Change::NoSuchPool {
        // 422, not 400: the request is well formed (the contract's 400 is a
        // malformed request); the pool it names has no machine.
        return Err(ApiError::Unprocessable {
            code: "unknown_pool",
            message: format!(
                "no machine of this organization is at site {} with profile {}: headroom is kept only for a pool that has machines",
                body.site, body.profile
            ),
        });
    }
    Ok(HttpResponse::Ok().json(row))
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn if_none_match_compares_weakly_and_in_lists() {
        assert!(names("W/\"abc\"", "\"abc\""));
        assert!(names("\"abc\"", "\"abc\""));
        assert!(names("\"x\", W/\"abc\"", "\"abc\""));
        assert!(names("*", "\"abc\""));
        assert!(!names("W/\"abd\"", "\"abc\""));
        assert!(!names("", "\"abc\""));
    }
}
