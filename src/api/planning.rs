//! R21 for other programs (scope `orders` or `inventory`): each pool's
//! run-out forecast and its daily history.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::caller::ApiClient;
use crate::api::json::integer_text;
use crate::api::schemas::{
    Forbidden, Invalid, LabelFilter, Unauthorized, Unavailable, label_filter,
};
use crate::db::Db;
use crate::domain::{Profile, Scope, Site};
use crate::error::{ApiError, invalid};
use crate::forecast::{self, Forecast};
use crate::planning::{self, MAX_HISTORY_DAYS, PoolDay};
use crate::settings::Settings;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/forecast").route(web::get().to(get_forecast)))
        .service(web::resource("/pools/history").route(web::get().to(get_history)));
}

/// The days of history answered when `days` is absent.
const DEFAULT_DAYS: i32 = 90;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ForecastQuery {
    #[param(value_type = LabelFilter, required = false)]
    site: Option<String>,
    #[param(value_type = LabelFilter, required = false)]
    profile: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct HistoryQuery {
    #[param(value_type = LabelFilter, required = false)]
    site: Option<String>,
    #[param(value_type = LabelFilter, required = false)]
    profile: Option<String>,
    /// closed UTC days back from today, written in digits (default 90)
    #[param(value_type = i64, required = false, minimum = 1, maximum = 730)]
    days: Option<String>,
}

// The answer of `GET /pools/history`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = PoolHistory)]
pub(crate) struct HistoryAnswer {
    /// by site, profile and day; a pool without a row has no history yet
    days: Vec<PoolDay>,
}

/// Either scope reads the plan: the order service and the datacenter team.
fn may_read(client: &ApiClient, settings: &Settings) -> Result<(), ApiError> {
    client
        .require(Scope::Orders)
        .or_else(|_| client.require(Scope::Inventory))?;
    client.require_module(settings)
}

/// The site and profile filters both reads take.
fn pool_filter(
    site: &Option<String>,
    profile: &Option<String>,
) -> Result<(Option<Site>, Option<Profile>), ApiError> {
    Ok((
        label_filter(site, Site::parse)?,
        label_filter(profile, Profile::parse)?,
    ))
}

#[utoipa::path(
    get,
    path = "/api/v1/forecast",
    operation_id = "getForecast",
    summary = "When each pool runs out (scope orders or inventory)",
    description = "R21: per pool (site and profile) with machines or history: available now (R17, an order without a segment), the rate of true demand (sales of what was asked + machines refused for want of stock + orders served by a substitute, counted against the pool asked) fitted by least squares over the last 28 closed UTC days, days_left = available / rate, the run-out date with its band (run_out_low at the band's high rate, run_out_high at its low rate, null when that rate is 0), the site's lead time, order_by = run_out - lead time, and flagged when order_by is today or past. Soonest run-out first; days_left, run_out and order_by are null when the pool has no demand, demand_per_day null when it has no history yet.",
    params(ForecastQuery),
    responses(
        (status = 200, description = "the pools, soonest run-out first", body = Forecast),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 503, response = Unavailable),
    )
)]
pub(crate) async fn get_forecast(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    may_read(&client, &settings)?;
    let query = web::Query::<ForecastQuery>::from_query(req.query_string())
        .map_err(|e| invalid(format!("invalid query string: {e}")))?;
    let (site, profile) = pool_filter(&query.site, &query.profile)?;
    let answer = forecast::read_from(
        pool.get_ref(),
        client.org_id,
        site.as_ref(),
        profile.as_ref(),
    )
    .await?;
    Ok(HttpResponse::Ok().json(answer))
}

#[utoipa::path(
    get,
    path = "/api/v1/pools/history",
    operation_id = "getPoolHistory",
    summary = "Each pool's counts and flows per UTC day (scope orders or inventory)",
    description = "R21: one row per pool and closed UTC day (today is not closed), the last `days` days (default 90, at most 730): the machines at the day's end by state (total = sellable + held + sold + not_ready) and the day's flows: holds created, converted, expired and cancelled; machines refused by code; substituted_in (machines of this pool that served an order asking another profile) and substituted_out (machines asked of this pool, served by a substitute); machines added and retired; and demand, R21's true demand. Written once per day by the sweep's holder; a pool created today has no rows yet.",
    params(HistoryQuery),
    responses(
        (status = 200, description = "the days", body = HistoryAnswer),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 503, response = Unavailable),
    )
)]
pub(crate) async fn get_history(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    may_read(&client, &settings)?;
    let query = web::Query::<HistoryQuery>::from_query(req.query_string())
        .map_err(|e| invalid(format!("invalid query string: {e}")))?;
    let (site, profile) = pool_filter(&query.site, &query.profile)?;
    let days = match query.days.as_deref() {
        None => DEFAULT_DAYS,
        Some(s) => {
            let n = integer_text("days", s).map_err(|e| invalid(e.to_string()))?;
            if !(1..=i64::from(MAX_HISTORY_DAYS)).contains(&n) {
                return Err(invalid(format!(
                    "days: must be between 1 and {MAX_HISTORY_DAYS}"
                )));
            }
            i32::try_from(n).unwrap_or(DEFAULT_DAYS)
        }
    };
    let days = planning::history(
        pool.get_ref(),
        client.org_id,
        site.as_ref(),
        profile.as_ref(),
        days,
    )
    .await?;
    Ok(HttpResponse::Ok().json(HistoryAnswer { days }))
}
