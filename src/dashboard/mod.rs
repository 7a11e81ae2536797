//! The staff dashboard: server-rendered pages over the pool, with
//! plain HTML forms. Every page works without JavaScript; `static/app.js`
//! only adds the live countdown.

pub mod admin;
pub mod assets;
pub mod csrf;
pub mod csv;
pub mod demand;
pub mod error;
pub mod gate;
pub mod input;
pub mod jobs;
pub mod layout;
pub mod login;
pub mod machines;
pub mod org_settings;
pub mod outcome;
pub mod overview;
pub mod reasons;
pub mod reservations;
pub mod search;
pub mod session;
pub mod sso;
pub mod status_changes;
pub mod throttle;
pub mod view;
pub mod why_not;

use actix_web::web;

pub use error::DashError;
pub use session::Staff;

/// Every dashboard route, in one table: the table registers the routes AND
/// exports `ROUTES` (path, methods), which the access matrix test compares
/// with its own rows, so a route added here without a matrix row fails.
/// Each path is one `web::resource`, so a method it does not serve is 405
/// (with an Allow header), never a 404. Every resource is wrapped in
/// `input::guard`: no handler sees a query, form or path segment that was
/// not checked.
macro_rules! routes {
    ($( $path:literal => [ $( $method:ident => $handler:path ),+ ] ),+ $(,)?) => {
        pub const ROUTES: &[(&str, &[&str])] = &[
            $( ($path, &[ $( stringify!($method) ),+ ]) ),+
        ];
        fn register(cfg: &mut web::ServiceConfig) {
            $(
                cfg.service(
                    web::resource($path)
                        $( .route(web::$method().to($handler)) )+
                        .default_service(web::to(method_not_allowed))
                        .wrap(actix_web::middleware::from_fn(input::guard)),
                );
            )+
        }
    };
}

routes! {
    "/" => [get => overview::overview],
    "/login" => [get => login::login_form, post => login::login],
    "/login/sso" => [get => sso::start],
    "/login/sso/callback" => [get => sso::callback],
    "/logout" => [post => login::logout],
    "/machines" => [get => machines::list],
    "/machines.csv" => [get => machines::export],
    "/machines/{asset_tag}" => [get => machines::detail],
    "/reservations" => [get => reservations::list],
    "/reservations.csv" => [get => reservations::export],
    "/reservations/{id}" => [get => reservations::detail],
    "/reservations/{id}/cancel" => [get => reservations::confirm_cancel, post => reservations::cancel],
    "/reservations/{id}/convert" => [get => reservations::confirm_convert, post => reservations::convert],
    "/reservations/{id}/extend" => [get => reservations::confirm_extend, post => reservations::extend],
    "/search" => [get => search::search],
    "/status-changes" => [get => status_changes::show, post => status_changes::apply],
    "/why-not" => [get => why_not::why_not],
    "/jobs" => [get => jobs::jobs],
    "/demand" => [get => demand::demand],
    "/demand.csv" => [get => demand::export],
    "/settings" => [get => org_settings::show, post => org_settings::save],
    "/settings/webhook" => [post => org_settings::save_webhook],
    "/settings/headroom" => [post => org_settings::save_headroom],
    "/audit" => [get => admin::audit_log],
    "/users" => [get => admin::users, post => admin::add_user],
    "/users/{id}/disable" => [post => admin::disable_user],
    "/tokens" => [get => admin::tokens, post => admin::add_token],
    "/tokens/{id}/revoke" => [post => admin::revoke_token],
    "/static/{path:.*}" => [get => assets::serve],
}

/// The dashboard's routes. Registered after the API and ops routes; every
/// path here is explicit, so none shadows another module's.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(error::form_config())
        .app_data(error::query_config())
        .app_data(error::path_config())
        .app_data(error::payload_config())
        .configure(register)
        .default_service(web::to(not_found));
}

/// A known path with a method it does not serve: 405 with the methods it
/// does, as a page (or a bare 405 under /api/).
async fn method_not_allowed(req: actix_web::HttpRequest) -> actix_web::HttpResponse {
    let allow = req
        .match_pattern()
        .and_then(|p| ROUTES.iter().find(|(path, _)| *path == p))
        .map(|(_, methods)| {
            methods
                .iter()
                .map(|m| m.to_ascii_uppercase())
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let mut resp = actix_web::ResponseError::error_response(&DashError::MethodNotAllowed);
    if let Ok(v) = actix_web::http::header::HeaderValue::from_str(&allow) {
        resp.headers_mut().insert(actix_web::http::header::ALLOW, v);
    }
    resp
}

/// Unknown paths get the dashboard's 404 page; under /api/ an empty 404, so
/// that an API client never receives the dashboard's HTML (the API's own
/// handlers speak JSON).
async fn not_found(req: actix_web::HttpRequest) -> actix_web::HttpResponse {
    if req.path().starts_with("/api/") {
        return actix_web::HttpResponse::NotFound().finish();
    }
    actix_web::ResponseError::error_response(&DashError::NotFound("page"))
}
