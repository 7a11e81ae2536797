//! Inventory endpoints (scope `inventory`).

use crate::api::write::{Shape, write};
use crate::db::Db;
use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use crate::api::json::integer_text;
use crate::domain::{AssetTag, MachineStatus, Profile, Scope, Site, Vendor, parse_label};
use crate::error::{ApiError, invalid};
use crate::inventory::{self, MachineFilter, MachineSpec, Upserted};
use crate::settings::Settings;
use crate::tokens::ApiClient;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/machines").route(web::get().to(list)))
        .service(
            web::resource("/machines/{asset_tag}")
                .route(web::put().to(put))
                .route(web::get().to(get)),
        );
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
    body: web::Json<MachineBody>,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Inventory)?;
    let tag = AssetTag::parse(&path).map_err(|e| invalid(e.to_string()))?;
    let body = body.into_inner();
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
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Inventory)?;
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
