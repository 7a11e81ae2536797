//! Builds the HTTP application and its background workers from `Settings`.

use std::net::TcpListener;

use crate::db::Db;
use actix_web::dev::{Server, ServerHandle, Service};
use actix_web::{App, HttpServer, web};

use crate::metrics::Metrics;
use crate::settings::Settings;

/// A bound, not yet running server.
pub struct Application {
    port: u16,
    server: Server,
}

/// Shared state every handler can extract.
#[derive(Clone)]
pub struct AppState {
    pub settings: web::Data<Settings>,
    pub pool: web::Data<Db>,
    pub metrics: web::Data<Metrics>,
    /// Shutting down or not, for `/readyz` (set by `serve` on SIGTERM).
    pub readiness: web::Data<crate::ops::Readiness>,
}

impl AppState {
    pub fn new(settings: Settings, pool: Db, metrics: Metrics) -> AppState {
        AppState {
            settings: web::Data::new(settings),
            pool: web::Data::new(pool),
            metrics: web::Data::new(metrics),
            readiness: web::Data::new(crate::ops::Readiness::default()),
        }
    }
}

/// Routes and state of the application; also used by in-process tests.
pub fn configure(state: AppState) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(state.settings)
            .app_data(state.pool)
            .app_data(state.metrics)
            .app_data(state.readiness)
            .configure(crate::ops::configure)
            .configure(crate::api::configure)
            // The dashboard and its /static/ assets: explicit paths only,
            // after the API so that nothing under /api is shadowed.
            .configure(crate::dashboard::configure);
    }
}

impl Application {
    /// Binds `settings.bind` (port 0 picks a free port).
    pub fn build(state: AppState) -> anyhow::Result<Application> {
        let listener = TcpListener::bind(state.settings.bind)?;
        let port = listener.local_addr()?.port();
        let server = HttpServer::new(move || {
            let readiness = state.readiness.clone();
            App::new()
                // Requests in flight, so that `serve` stops the workers only
                // when none is left (serve.rs says why).
                .wrap_fn(move |req, srv| {
                    let guard = crate::ops::Readiness::enter(&readiness);
                    let fut = srv.call(req);
                    async move {
                        let res = fut.await;
                        drop(guard);
                        res
                    }
                })
                // Innermost: the log line still says HEAD (issue 15, part 3).
                .wrap(actix_web::middleware::from_fn(crate::head::head_as_get))
                .wrap(tracing_actix_web::TracingLogger::default())
                .wrap(crate::security_headers::default_headers())
                .configure(configure(state.clone()))
        })
        // Signals are ours: the sweep must stop and release its lease first.
        .disable_signals()
        .shutdown_timeout(10)
        .listen(listener)?
        .run();
        Ok(Application { port, server })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}
