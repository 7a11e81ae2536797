//! Operations endpoints: liveness, readiness and the OpenAPI document of
//! the JSON API without a token; metrics with a `metrics` token (or on a
//! listener of their own, `POOLKEEPER_METRICS_BIND`, without one).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::db::Db;
use actix_web::{FromRequest as _, HttpResponse, web};

use crate::api::caller::ApiClient;
use crate::domain::Scope;
use crate::error::ApiError;
use crate::metrics::Metrics;

pub fn configure(cfg: &mut web::ServiceConfig) {
    // One resource per path: another method is 405, not 404.
    cfg.service(web::resource("/healthz").route(web::get().to(healthz)))
        .service(web::resource("/readyz").route(web::get().to(readyz)))
        .service(web::resource("/metrics").route(web::get().to(metrics)))
        .service(web::resource("/api/openapi.json").route(web::get().to(openapi)));
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body("ok\n")
}

/// What `/readyz` knows besides the database: whether this replica is
/// shutting down (set by `serve` on SIGTERM, before the drain period); and
/// how many requests are being handled, so that `serve` stops the server
/// only when none is left.
#[derive(Debug, Default)]
pub struct Readiness {
    shutting_down: AtomicBool,
    in_flight: AtomicUsize,
}

/// Counts one request in flight while it lives.
pub struct InFlight(web::Data<Readiness>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Readiness {
    pub fn enter(this: &web::Data<Readiness>) -> InFlight {
        this.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(this.clone())
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}

/// 200 when the replica is not shutting down, the database answers and
/// every migration is applied; else 503 with the reason in the body, so
/// that a load balancer drains the replica and an operator sees why.
async fn readyz(pool: web::Data<Db>, readiness: web::Data<Readiness>) -> HttpResponse {
    if readiness.shutting_down() {
        return HttpResponse::ServiceUnavailable()
            .content_type("text/plain; charset=utf-8")
            .body("shutting down\n");
    }
    match crate::db::migrations_current(&pool).await {
        Ok(true) => HttpResponse::Ok()
            .content_type("text/plain; charset=utf-8")
            .body("ready\n"),
        Ok(false) => HttpResponse::ServiceUnavailable()
            .content_type("text/plain; charset=utf-8")
            .body("migrations pending\n"),
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            HttpResponse::ServiceUnavailable()
                .content_type("text/plain; charset=utf-8")
                .body("database unavailable\n")
        }
    }
}

/// `/metrics` on the main address: only for a token of the `metrics`
/// scope (401 without one, 403 for another scope), since the pool gauges
/// name every organization's sites, profiles and stock. 404 when
/// `POOLKEEPER_METRICS_BIND` gives it an address of its own, token or not.
async fn metrics(
    metrics: web::Data<Metrics>,
    pool: web::Data<Db>,
    settings: web::Data<crate::settings::Settings>,
    req: actix_web::HttpRequest,
) -> Result<HttpResponse, ApiError> {
    if settings.metrics_bind.is_some() && req.app_data::<MetricsListener>().is_none() {
        return Ok(HttpResponse::NotFound()
            .content_type("text/plain; charset=utf-8")
            .body("not found\n"));
    }
    // An operator's credential: the token's organization does not narrow
    // what it reads (one Prometheus per deployment scrapes every series).
    ApiClient::extract(&req).await?.require(Scope::Metrics)?;
    Ok(metrics_text(&metrics, &pool).await)
}

/// Marks the application of the metrics-only listener.
#[derive(Clone, Copy)]
pub struct MetricsListener;

pub async fn metrics_text(metrics: &Metrics, pool: &Db) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(metrics.scrape(pool).await)
}

/// The OpenAPI document of the JSON API, generated from its types and
/// handlers (`api::openapi`); tests check it against what the server
/// answers.
async fn openapi(settings: web::Data<crate::settings::Settings>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(openapi_for(settings.hold_max_seconds))
}

/// The document as this deployment answers (see `api::openapi::document`).
pub fn openapi_for(hold_max_seconds: u32) -> String {
    crate::api::openapi::document(hold_max_seconds).to_string()
}
