//! Inventory endpoints (scope `inventory`).

use crate::api::reservations::{json_body, read_body};
use crate::api::write::{Shape, write};
use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use crate::api::caller::ApiClient;
use crate::api::json::integer_text;
use crate::domain::{AssetTag, MachineStatus, Profile, Scope, Site, Vendor, parse_label};
use crate::error::{ApiError, invalid};
use crate::healing::{self, Refused, StatusChange};
use crate::inventory::{self, MachineFilter, MachineSpec, Upserted};
use crate::settings::Settings;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/machines").route(web::get().to(list)))
        .service(
            web::resource("/machines/{asset_tag}")
                .route(web::put().to(put))
                .route(web::get().to(get)),
        )
        .service(web::resource("/status-changes").route(web::post().to(change_status)));
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineBody {
    site: Site,
    vendor: Vendor,
    profile: Profile,
    status: MachineStatus,
}

async fn put(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    // R12: the switch answers first; the body is read and parsed after it
    // (an extractor would answer a malformed body 400 before the check).
    client.module_call(&settings, Scope::Inventory)?;
    let tag = AssetTag::parse(&path).map_err(|e| invalid(e.to_string()))?;
    let body: MachineBody = json_body(&read_body(payload).await?)?;
    let spec = MachineSpec {
        site: body.site,
        vendor: body.vendor,
        profile: body.profile,
        status: body.status,
    };
    let (machine, how) = write(&pool, Shape::Statement, async |conn| {
        inventory::upsert(conn, client.org_id, &tag, &spec, &client.token_name).await
    })
    .await?;
    Ok(match how {
        Upserted::Created => HttpResponse::Created().json(machine),
        Upserted::Updated => HttpResponse::Ok().json(machine),
    })
}

async fn get(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Inventory)?;
    // A tag that cannot exist is a 400 like on PUT; a NUL in it would
    // otherwise reach PostgreSQL, which refuses it (a 500).
    let tag = AssetTag::parse(&path).map_err(|e| invalid(e.to_string()))?;
    let machine = inventory::by_tag(&pool, client.org_id, tag.as_str())
        .await?
        .ok_or(ApiError::NotFound("machine"))?;
    Ok(HttpResponse::Ok().json(machine))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    site: Option<String>,
    vendor: Option<String>,
    profile: Option<String>,
    status: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

/// Empty query values mean "no filter", as an HTML form would send them;
/// the document says so.
fn opt<T>(
    v: &Option<String>,
    parse: impl Fn(&str) -> Result<T, crate::domain::ParseError>,
) -> Result<Option<T>, ApiError> {
    match v.as_deref() {
        None | Some("") => Ok(None),
        Some(s) => parse(s).map(Some).map_err(|e| invalid(e.to_string())),
    }
}

async fn list(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Inventory)?;
    // Parsed after the switch (R12), as the bodies are.
    let query = web::Query::<ListQuery>::from_query(req.query_string())
        .map_err(|e| invalid(format!("invalid query string: {e}")))?;
    let filter = MachineFilter {
        site: opt(&query.site, Site::parse)?,
        vendor: opt(&query.vendor, Vendor::parse)?,
        profile: opt(&query.profile, Profile::parse)?,
        status: opt(&query.status, MachineStatus::parse)?,
        state: None,
    };
    let limit = match query.limit.as_deref() {
        None => 500,
        Some(s) => integer_text("limit", s).map_err(|e| invalid(e.to_string()))?,
    };
    if !(1..=1000).contains(&limit) {
        return Err(invalid("limit: must be between 1 and 1000"));
    }
    // `after` is an asset tag from `next_after`; empty means from the start.
    // Checked like a label, so that junk (a NUL) never reaches PostgreSQL.
    let after = opt(&query.after, |s| parse_label("after", s, 64))?;
    let machines = inventory::list(&pool, client.org_id, &filter, after.as_deref(), limit).await?;
    let next = (machines.len() as i64 == limit)
        .then(|| machines.last().map(|m| m.asset_tag.clone()))
        .flatten();
    Ok(HttpResponse::Ok().json(json!({ "machines": machines, "next_after": next })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusChangeBody {
    asset_tags: Vec<AssetTag>,
    status: MachineStatus,
    #[serde(default)]
    dry_run: bool,
}

/// R15 for many machines at once (a rack into maintenance): one
/// transaction, every hold healed or its order cancelled whole, or nothing
/// written. `dry_run` answers what the change would do now, and writes
/// nothing. A retry of the same change answers the machines as they are and
/// no holds: the first one moved them (the events say what and when).
async fn change_status(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Inventory)?;
    let body: StatusChangeBody = json_body(&read_body(payload).await?)?;
    if body.asset_tags.is_empty() || body.asset_tags.len() > healing::MAX_MACHINES {
        return Err(invalid(format!(
            "asset_tags: between 1 and {} machines",
            healing::MAX_MACHINES
        )));
    }
    let change = StatusChange {
        org_id: client.org_id,
        tags: &body.asset_tags,
        status: body.status,
        actor: &client.token_name,
    };
    let outcome = if body.dry_run {
        healing::preview(&pool, &change).await?
    } else {
        write(&pool, Shape::Transaction, async |conn| {
            healing::change_status(conn, &change).await
        })
        .await?
    };
    match outcome {
        Ok(changed) => Ok(HttpResponse::Ok().json(json!({
            "status": body.status.as_str(),
            "dry_run": body.dry_run,
            "machines": changed.machines,
            "holds": changed.holds,
        }))),
        Err(Refused::Unknown(tags)) => Err(ApiError::Unprocessable {
            code: "unknown_machines",
            message: format!(
                "no machine {} in this organization; nothing was changed",
                tags.join(", ")
            ),
        }),
    }
}
