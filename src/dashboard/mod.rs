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
pub mod planning;
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
/// exports `ROUTES` (path, methods) and `ACCESS` (path, who may open it),
/// which the access matrix test compares with its own rows, so a route
/// added here without a matrix row fails. Each path is one `web::resource`,
/// so a method it does not serve is 405 (with an Allow header), never a
/// 404. Every resource is wrapped in `input::guard`: no handler sees a
/// query, form or path segment that was not checked. Every route then
/// passes `gate::check` with the path's `gate::Access`: session, CSRF on a
/// POST, role and R12's switches are declared here, not called by
/// handlers.
macro_rules! routes {
    ($( $path:literal => $access:ident [ $( $method:ident => $handler:path ),+ ] ),+ $(,)?) => {
        pub const ROUTES: &[(&str, &[&str])] = &[
            $( ($path, &[ $( stringify!($method) ),+ ]) ),+
        ];
        pub const ACCESS: &[(&str, gate::Access)] = &[
            $( ($path, gate::Access::$access) ),+
        ];
        fn register(cfg: &mut web::ServiceConfig) {
            $(
                cfg.service(
                    web::resource($path)
                        $( .route(
                            web::$method()
                                .to($handler)
                                .wrap(actix_web::middleware::from_fn(
                                    |req: actix_web::dev::ServiceRequest,
                                     next: actix_web::middleware::Next<actix_web::body::BoxBody>| {
                                        gate::check(gate::Access::$access, req, next)
                                    },
                                )),
                        ) )+
                        .default_service(web::to(method_not_allowed))
                        .wrap(actix_web::middleware::from_fn(input::guard)),
                );
            )+
        }
    };
}

routes! {
    "/" => Staff [get => overview::overview],
    "/login" => Public [get => login::login_form, post => login::login],
    "/login/sso" => Public [get => sso::start],
    "/login/sso/callback" => Public [get => sso::callback],
    "/logout" => Staff [post => login::logout],
    "/machines" => Datacenter [get => machines::list],
    "/machines.csv" => Datacenter [get => machines::export],
    "/machines/{asset_tag}" => Datacenter [get => machines::detail],
    "/reservations" => Staff [get => reservations::list],
    "/reservations.csv" => Staff [get => reservations::export],
    "/reservations/{id}" => Staff [get => reservations::detail],
    "/reservations/{id}/cancel" => DatacenterActor [get => reservations::confirm_cancel, post => reservations::cancel],
    "/reservations/{id}/convert" => DatacenterActor [get => reservations::confirm_convert, post => reservations::convert],
    "/reservations/{id}/extend" => DatacenterActor [get => reservations::confirm_extend, post => reservations::extend],
    "/search" => Staff [get => search::search],
    "/status-changes" => DatacenterActor [get => status_changes::show, post => status_changes::apply],
    "/why-not" => Datacenter [get => why_not::why_not],
    "/jobs" => Staff [get => jobs::jobs],
    "/demand" => Staff [get => demand::demand],
    "/demand.csv" => Staff [get => demand::export],
    "/planning" => Staff [get => planning::list],
    "/planning.csv" => Staff [get => planning::export],
    "/planning/pool" => Staff [get => planning::pool_page],
    "/settings" => Settings [get => org_settings::show, post => org_settings::save],
    "/settings/webhook" => Settings [post => org_settings::save_webhook],
    "/settings/headroom" => DatacenterSettings [post => org_settings::save_headroom],
    "/settings/substitutes" => DatacenterSettings [post => org_settings::save_substitutes],
    "/settings/lead-time" => Settings [post => planning::save_lead_time],
    "/audit" => Admin [get => admin::audit_log],
    "/users" => Admin [get => admin::users, post => admin::add_user],
    "/users/{id}/disable" => Admin [post => admin::disable_user],
    "/tokens" => Admin [get => admin::tokens, post => admin::add_token],
    "/tokens/{id}/revoke" => Admin [post => admin::revoke_token],
    "/static/{path:.*}" => Public [get => assets::serve],
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
