//! The staff dashboard (issue 5): server-rendered pages over the pool, with
//! plain HTML forms. Every page works without JavaScript; `static/app.js`
//! only adds the live countdown.

pub mod assets;
pub mod csrf;
pub mod error;
pub mod gate;
pub mod jobs;
pub mod machines;
pub mod org_settings;
pub mod outcome;
pub mod overview;
pub mod reservations;
pub mod search;
pub mod session;
pub mod view;
pub mod why_not;

use actix_web::web;

pub use error::DashError;
pub use session::Staff;

/// The dashboard's routes. Registered after the API and ops routes; every
/// path here is explicit, so none shadows another module's.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(error::form_config())
        .app_data(error::query_config())
        .app_data(error::path_config())
        .configure(assets::configure)
        .configure(session::configure)
        .configure(overview::configure)
        .configure(machines::configure)
        .configure(reservations::configure)
        .configure(search::configure)
        .configure(why_not::configure)
        .configure(jobs::configure)
        .configure(org_settings::configure)
        .default_service(web::to(not_found));
}

/// Unknown paths get the dashboard's 404 page; under /api/ the answer stays
/// the bare 404 the API had (its own handlers speak JSON).
async fn not_found(req: actix_web::HttpRequest) -> actix_web::HttpResponse {
    if req.path().starts_with("/api/") {
        return actix_web::HttpResponse::NotFound().finish();
    }
    actix_web::ResponseError::error_response(&DashError::NotFound("page"))
}
