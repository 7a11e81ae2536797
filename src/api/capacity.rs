//! Capacity (R17, scope `orders`): what each pool holds and what an order
//! may take now; headroom (R18, scope `inventory`): the machines of a pool
//! kept for a segment.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::api::caller::ApiClient;
use crate::api::json::{self, integer_text};
use crate::api::reservations::{json_body, read_body};
use crate::api::schemas::{
    CapacityAlternative, Forbidden, Invalid, LabelFilter, SegmentFilter, SubstitutesFilter,
    Unauthorized, Unavailable, UnknownPoolError, UnknownProfileError, WriteUnavailable,
    label_filter,
};
use crate::api::write::{Shape, write};
use crate::capacity::{self, Change, Filter, HeadroomSetting, MAX_HEADROOM};
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
        )
        .service(
            web::resource("/substitutes")
                .route(web::get().to(list_substitutes))
                .route(web::put().to(put_substitutes)),
        );
}

/// The most machines one capacity question may ask for (`quantity`), as
/// an order of several may (R13).
const MAX_QUANTITY: i64 = 16;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct CapacityQuery {
    #[param(value_type = LabelFilter, required = false)]
    site: Option<String>,
    #[param(value_type = LabelFilter, required = false)]
    profile: Option<String>,
    /// count only this vendor's machines (the headroom stays the pool's, whatever the vendor)
    #[param(value_type = LabelFilter, required = false)]
    vendor: Option<String>,
    /// the segment of the order asking (R18); empty or absent: an order without a segment
    #[param(value_type = SegmentFilter, required = false)]
    segment: Option<String>,
    /// machines the order needs, written in digits: with site and profile, asks for alternatives
    #[param(value_type = i64, required = false, minimum = 1, maximum = 16)]
    quantity: Option<String>,
    /// R20: allowed adds to each pool what its declared substitutes could serve, and names them first among the alternatives
    #[param(value_type = SubstitutesFilter, required = false)]
    substitutes: Option<String>,
}

// The answer of `GET /capacity`: the snapshot's JSON arrays as read.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Capacity)]
pub(crate) struct CapacityAnswer {
    /// the database's clock when it was read
    as_of: DateTime<Utc>,
    /// by site, then profile; pools without a machine (of the vendor asked) are absent
    #[schema(value_type = Vec<capacity::Pool>)]
    pools: Value,
    /// most available first, then by site
    #[schema(value_type = Vec<CapacityAlternative>)]
    alternatives: Value,
}

// The answer of `GET /headroom`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HeadroomList {
    headroom: Vec<capacity::Headroom>,
}

/// A shop front polls this on every page view: the ETag digests the pools
/// and alternatives (not `as_of`), so an unchanged capacity answers `304`
/// to a client that sends it back. Weak: two answers with one tag differ
/// in `as_of`.
#[utoipa::path(
    get,
    path = "/api/v1/capacity",
    operation_id = "getCapacity",
    summary = "Capacity of the organization's pools now: what each holds and what an order may take (scope orders)",
    description = "R17: per pool (site and profile, of the vendor when asked), read in one snapshot: total = sellable + held + sold + not_ready; reserved is the headroom kept per segment (R18); available is what an order of the asked segment (none: an order without a segment) could take now, the sellable machines less what the pool keeps for other segments. With site, profile and quantity, alternatives lists the other sites whose pool of that profile (and vendor) has available >= quantity, most available first; otherwise it is empty. The answer carries a weak ETag over pools and alternatives (not as_of): send it back in If-None-Match and an unchanged capacity answers 304 with no body. A reserve decides in its own transaction; capacity read before it can differ only by what happened between the two.",
    params(CapacityQuery),
    responses(
        (status = 200, description = "the pools now", body = CapacityAnswer,
            headers(("ETag" = String, description = "weak; the same while pools and alternatives are"))),
        (status = 304, description = "If-None-Match names the current ETag: capacity is unchanged (no body)",
            headers(("ETag" = String))),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 503, response = Unavailable),
    )
)]
pub(crate) async fn get_capacity(
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
        site: label_filter(&query.site, Site::parse)?,
        profile: label_filter(&query.profile, Profile::parse)?,
        vendor: label_filter(&query.vendor, Vendor::parse)?,
        segment: label_filter(&query.segment, Segment::parse)?,
        quantity,
        substitutes: match query.substitutes.as_deref() {
            None | Some("" | "none") => false,
            Some("allowed") => true,
            Some(other) => {
                return Err(invalid(format!(
                    "substitutes: allowed or none, not {other:?}"
                )));
            }
        },
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
        .json(CapacityAnswer {
            as_of: snap.as_of,
            pools: snap.pools,
            alternatives: snap.alternatives,
        }))
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

#[utoipa::path(
    get,
    path = "/api/v1/headroom",
    operation_id = "listHeadroom",
    summary = "The headroom the organization keeps, by pool and segment (scope inventory)",
    responses(
        (status = 200, description = "every pool's headroom, by site, profile and segment", body = HeadroomList),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 503, response = Unavailable),
    )
)]
pub(crate) async fn list_headroom(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Inventory)?;
    let rows = capacity::list(pool.get_ref(), client.org_id).await?;
    Ok(HttpResponse::Ok().json(HeadroomList { headroom: rows }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct HeadroomBody {
    site: Site,
    profile: Profile,
    segment: Segment,
    /// machines to keep; 0 removes the headroom
    #[serde(deserialize_with = "json::machines")]
    #[schema(minimum = 0, maximum = 100000)]
    machines: i64,
}

/// R18: sets one pool's headroom for one segment, audited in the same
/// transaction. The same PUT again answers `200` with the same row and
/// writes nothing (F3's retry).
#[utoipa::path(
    put,
    path = "/api/v1/headroom",
    operation_id = "putHeadroom",
    summary = "Keep machines of a pool for a segment (scope inventory)",
    description = "R18: an order outside the segment never takes one of the last `machines` sellable machines of the pool (site and profile, whatever the vendor); 0 removes the headroom. Decided under the pool's turn, so a change and the reserves into the pool take turns. Each change is audited. The same PUT again (a retry after 503 outcome_unknown) answers 200 with the same row and writes nothing.",
    request_body = HeadroomBody,
    responses(
        (status = 200, description = "the pool's headroom for the segment now (machines 0, updated_at and updated_by null: removed)", body = capacity::Headroom),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 422, description = "no machine of the organization is of this site and profile (error unknown_pool): headroom there would keep nothing; nothing written", body = UnknownPoolError),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn put_headroom(
    req: HttpRequest,
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Inventory)?;
    let body: HeadroomBody = json_body(&read_body(payload).await?)?;
    let setting = HeadroomSetting::new(body.site, body.profile, body.segment, body.machines)
        .ok_or_else(|| invalid(format!("machines: must be between 0 and {MAX_HEADROOM}")))?;
    let machines = setting.machines;
    let actor = format!("token:{}", client.token_name);
    let source = crate::dashboard::session::source_addr(&req);
    let (row, change) = write(&pool, Shape::Transaction, async |tx| {
        let (row, change) = capacity::set(tx, client.org_id, &setting, &client.token_name).await?;
        let Some((action, detail)) = change.audit(machines, &setting.segment) else {
            return Ok((row, change));
        };
        crate::audit::record(
            tx,
            &crate::audit::Entry {
                org_id: Some(client.org_id),
                actor: &actor,
                action,
                object: &format!("pool:{}/{}", setting.site, setting.profile),
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
                setting.site, setting.profile
            ),
        });
    }
    Ok(HttpResponse::Ok().json(row))
}

// The answer of `GET /substitutes`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SubstituteLists {
    /// by profile
    substitutes: Vec<capacity::Substitutes>,
}

#[utoipa::path(
    get,
    path = "/api/v1/substitutes",
    operation_id = "listSubstitutes",
    summary = "The substitutes declared per profile (scope inventory)",
    responses(
        (status = 200, description = "every declaration, by profile: the substitutes in order of preference and the segments they serve", body = SubstituteLists),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 503, response = Unavailable),
    )
)]
pub(crate) async fn list_substitutes(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Inventory)?;
    let rows = capacity::list_substitutes(pool.get_ref(), client.org_id).await?;
    Ok(HttpResponse::Ok().json(SubstituteLists { substitutes: rows }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubstitutesBody {
    profile: Profile,
    #[schema(schema_with = crate::api::schemas::substitute_profiles)]
    substitutes: Vec<Profile>,
    /// the segments whose orders they may serve (at most 16; a repeat counts once); absent, null or empty: orders of any segment or none
    #[serde(default)]
    #[schema(max_items = 16)]
    segments: Option<Vec<Segment>>,
}

/// R20: declares the substitutes of one profile, audited in the same
/// transaction. The same PUT again answers `200` with the same row and
/// writes nothing (F3's retry).
#[utoipa::path(
    put,
    path = "/api/v1/substitutes",
    operation_id = "putSubstitutes",
    summary = "Declare the profiles that may serve a profile's orders (scope inventory)",
    description = "R20: a reserve with substitutes allowed takes the asked profile's pool first and, when it cannot fill the whole order, the first of these, in this order, that can; every machine of an order is of one profile. Equal or better is the declaration's, not judged. An empty list removes the declaration. The profile itself, a duplicate or more than 8 is 400 and writes nothing; a profile of which the organization has no machine is 422 unknown_profile and writes nothing. A change waits for the reserves that are using the list, so each hold was allowed by the list in force when it committed. Each change is audited; the same PUT again answers 200 and writes nothing.",
    request_body = SubstitutesBody,
    responses(
        (status = 200, description = "the declaration now (substitutes empty, updated_at and updated_by null: removed)", body = capacity::Substitutes),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 422, description = "a profile named has no machine in the organization (error unknown_profile; the message lists them); nothing written", body = UnknownProfileError),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn put_substitutes(
    req: HttpRequest,
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Inventory)?;
    let body: SubstitutesBody = json_body(&read_body(payload).await?)?;
    let asked = body.segments.unwrap_or_default();
    // The document's bound is on the list as sent, repeats included.
    if asked.len() > capacity::MAX_SUBSTITUTE_SEGMENTS {
        return Err(invalid(format!(
            "segments: at most {}, not {}",
            capacity::MAX_SUBSTITUTE_SEGMENTS,
            asked.len()
        )));
    }
    let mut segments: Vec<Segment> = Vec::new();
    for s in asked {
        if !segments.contains(&s) {
            segments.push(s);
        }
    }
    if let Some(problem) =
        capacity::substitutes_problem(&body.profile, &body.substitutes, &segments)
    {
        return Err(invalid(problem));
    }
    let actor = format!("token:{}", client.token_name);
    let source = crate::dashboard::session::source_addr(&req);
    let (row, change) = write(&pool, Shape::Transaction, async |tx| {
        let (row, change) = capacity::set_substitutes(
            tx,
            client.org_id,
            &body.profile,
            &body.substitutes,
            &segments,
            &client.token_name,
        )
        .await?;
        if let Some((action, detail)) = change.audit(&row) {
            crate::audit::record(
                tx,
                &crate::audit::Entry {
                    org_id: Some(client.org_id),
                    actor: &actor,
                    action,
                    object: &format!("profile:{}", body.profile),
                    source_addr: &source,
                    detail: Some(&detail),
                },
            )
            .await?;
        }
        Ok((row, change))
    })
    .await?;
    match change {
        capacity::SubstitutesChange::Refused(problem) => return Err(invalid(problem)),
        // 422, not 400: the request is well formed; a profile it names
        // has no machine (as headroom's unknown_pool).
        capacity::SubstitutesChange::UnknownProfiles(message) => {
            return Err(ApiError::Unprocessable {
                code: "unknown_profile",
                message,
            });
        }
        _ => {}
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
