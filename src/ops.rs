//! Operations endpoints, without a token: liveness, readiness, metrics, and
//! the OpenAPI document of the JSON API.

use actix_web::{HttpResponse, web};
use sqlx::PgPool;

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

/// 200 when the database answers and every migration is applied.
async fn readyz(pool: web::Data<PgPool>) -> HttpResponse {
    match crate::db::migrations_current(&pool).await {
        Ok(true) => HttpResponse::Ok()
            .content_type("text/plain; charset=utf-8")
            .body("ready\n"),
        Ok(false) => HttpResponse::ServiceUnavailable().body("migrations pending\n"),
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            HttpResponse::ServiceUnavailable().body("database unavailable\n")
        }
    }
}

async fn metrics(metrics: web::Data<Metrics>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(metrics.render())
}

/// The OpenAPI document of the JSON API, kept beside the handlers it
/// describes; a test checks it against what the server answers.
pub const OPENAPI: &str = include_str!("api/openapi.json");

async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(OPENAPI)
}
