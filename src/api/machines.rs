//! Inventory endpoints (scope `inventory`).

use crate::api::reservations::{json_body, read_body};
use crate::api::write::{Shape, write};
use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::caller::ApiClient;
use crate::api::json::integer_text;
use crate::api::schemas::{
    AssetTagPath, Forbidden, Invalid, LabelFilter, NotFound, StatusFilter, Unauthorized,
    Unavailable, UnknownMachinesError, WriteUnavailable, label_filter,
};
use crate::domain::{AssetTag, MachineStatus, Profile, Scope, Site, Vendor, parse_label};
use crate::error::{ApiError, invalid};
use crate::healing::{self, HoldOutcome, Refused, StatusChange};
use crate::inventory::{self, Machine, MachineFilter, MachineSpec, Upserted};
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

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MachineBody {
    site: Site,
    vendor: Vendor,
    profile: Profile,
    status: MachineStatus,
}

#[utoipa::path(
    put,
    path = "/api/v1/machines/{asset_tag}",
    operation_id = "putMachine",
    summary = "Create or update a machine (scope inventory)",
    params(AssetTagPath),
    request_body = MachineBody,
    responses(
        (status = 200, description = "updated", body = Machine),
        (status = 201, description = "created", body = Machine),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn put(
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

#[utoipa::path(
    get,
    path = "/api/v1/machines/{asset_tag}",
    operation_id = "getMachine",
    summary = "One machine (scope inventory)",
    params(AssetTagPath),
    responses(
        (status = 200, description = "the machine", body = Machine),
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
    client.module_call(&settings, Scope::Inventory)?;
    // A tag that cannot exist is a 400 like on PUT; a NUL in it would
    // otherwise reach PostgreSQL, which refuses it (a 500).
    let tag = AssetTag::parse(&path).map_err(|e| invalid(e.to_string()))?;
    let machine = inventory::by_tag(&pool, client.org_id, tag.as_str())
        .await?
        .ok_or(ApiError::NotFound("machine"))?;
    Ok(HttpResponse::Ok().json(machine))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    #[param(value_type = LabelFilter, required = false)]
    site: Option<String>,
    #[param(value_type = LabelFilter, required = false)]
    vendor: Option<String>,
    #[param(value_type = LabelFilter, required = false)]
    profile: Option<String>,
    #[param(value_type = StatusFilter, required = false)]
    status: Option<String>,
    /// asset tag to list after (keyset pagination: next_after of the previous page); empty means from the start
    #[param(value_type = LabelFilter, required = false)]
    after: Option<String>,
    /// written in digits
    #[param(value_type = i64, required = false, minimum = 1, maximum = 1000, default = 500)]
    limit: Option<String>,
}

// A page of `GET /machines`.
#[derive(Debug, Serialize, ToSchema)]
pub struct MachinePage {
    machines: Vec<Machine>,
    /// pass as `after` for the next page; null on the last page
    #[schema(required = true)]
    next_after: Option<String>,
}

#[utoipa::path(
    get,
    path = "/api/v1/machines",
    operation_id = "listMachines",
    summary = "List machines (scope inventory)",
    params(ListQuery),
    responses(
        (status = 200, description = "machines by asset tag", body = inline(MachinePage)),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 503, response = Unavailable),
    )
)]
pub(crate) async fn list(
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
        site: label_filter(&query.site, Site::parse)?,
        vendor: label_filter(&query.vendor, Vendor::parse)?,
        profile: label_filter(&query.profile, Profile::parse)?,
        status: label_filter(&query.status, MachineStatus::parse)?,
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
    let after = label_filter(&query.after, |s| parse_label("after", s, 64))?;
    let machines = inventory::list(&pool, client.org_id, &filter, after.as_deref(), limit).await?;
    let next = (machines.len() as i64 == limit)
        .then(|| machines.last().map(|m| m.asset_tag.clone()))
        .flatten();
    Ok(HttpResponse::Ok().json(MachinePage {
        machines,
        next_after: next,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusChangeBody {
    /// the machines to change, of the caller's organization; a tag named twice counts once
    #[schema(min_items = 1, max_items = 500, examples(json!(["PK-00011", "PK-00012"])))]
    asset_tags: Vec<AssetTag>,
    status: MachineStatus,
    /// answer what the change would do now, and write nothing
    #[serde(default)]
    #[schema(default = false)]
    dry_run: bool,
}

// The answer of a status change.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = StatusChange)]
pub struct StatusChangeAnswer {
    status: MachineStatus,
    dry_run: bool,
    /// the machines as they are after the change (or would be), by asset tag
    machines: Vec<Machine>,
    /// what the change did to each live hold on these machines and to the other members of their orders; empty when no live hold was on them, or on a retry of a change already made
    holds: Vec<HoldOutcome>,
}

/// R15 for many machines at once (a rack into maintenance): one
/// transaction, every hold healed or its order cancelled whole, or nothing
/// written. `dry_run` answers what the change would do now, and writes
/// nothing. A retry of the same change answers the machines as they are and
/// no holds: the first one moved them (the events say what and when).
#[utoipa::path(
    post,
    path = "/api/v1/status-changes",
    operation_id = "changeMachineStatus",
    summary = "Change the status of one or many machines at once (scope inventory)",
    description = "R15 for a rack: every machine is locked, its status written, and every live hold on a machine leaving ready moved to an equivalent machine or its order cancelled whole, in one transaction; or nothing is written. Each moved or cancelled hold also gets its event and webhook (reservation.machine_replaced, reservation.cancelled). With dry_run the same change is made and rolled back: the answer says what it would do now. A retry after 503 outcome_unknown answers the machines as they are, and holds empty when the first attempt committed.",
    request_body = StatusChangeBody,
    responses(
        (status = 200, description = "changed (or, with dry_run, what would change)", body = StatusChangeAnswer),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 422, description = "an asset tag names no machine of the organization (error unknown_machines); nothing written", body = UnknownMachinesError),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn change_status(
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
        Ok(changed) => Ok(HttpResponse::Ok().json(StatusChangeAnswer {
            status: body.status,
            dry_run: body.dry_run,
            machines: changed.machines,
            holds: changed.holds,
        })),
        Err(Refused::Unknown(tags)) => Err(ApiError::Unprocessable {
            code: "unknown_machines",
            message: format!(
                "no machine {} in this organization; nothing was changed",
                tags.join(", ")
            ),
        }),
    }
}
