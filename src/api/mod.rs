//! The JSON API of docs/api.md, under `/api/v1`.

pub mod caller;
pub mod capacity;
pub mod json;
pub mod machines;
pub mod openapi;
pub mod planning;
pub mod reservations;
pub mod schemas;
pub mod services;
pub mod webhook;
pub mod write;

use actix_web::web;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::scope("/api/v1")
            .app_data(crate::error::json_config())
            .app_data(crate::error::path_config())
            .app_data(crate::error::query_config())
            .configure(capacity::configure)
            .configure(machines::configure)
            .configure(planning::configure)
            .configure(reservations::configure)
            .configure(services::configure)
            .configure(webhook::configure),
    );
}
