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
    /// `/metrics` alone, on `POOLKEEPER_METRICS_BIND`.
    metrics_server: Option<(u16, Server)>,
}

/// Shared state every handler can extract.
#[derive(Clone)]
pub struct AppState {
    pub settings: web::Data<Settings>,
    pub pool: web::Data<Db>,
    pub metrics: web::Data<Metrics>,
    /// Shutting down or not, for `/readyz` (set by `serve` on SIGTERM).
    pub readiness: web::Data<crate::ops::Readiness>,
    /// R17's answers, kept `capacity_cache` per process.
    pub capacity: web::Data<crate::capacity::Cache>,
}

impl AppState {
    pub fn new(settings: Settings, pool: Db, metrics: Metrics) -> AppState {
        metrics
            .sweep_period
            .set(settings.sweep_period.as_secs_f64());
        let capacity = web::Data::new(crate::capacity::Cache::new(settings.capacity_cache));
        AppState {
            settings: web::Data::new(settings),
            capacity,
            pool: web::Data::new(pool),
            metrics: web::Data::new(metrics),
            readiness: web::Data::new(crate::ops::Readiness::default()),
        }
    }
}

/// Routes and state of the application, for each worker of
/// `Application::build`.
fn configure(state: AppState) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(state.settings)
            .app_data(state.pool)
            .app_data(state.metrics)
            .app_data(state.readiness)
            .app_data(state.capacity)
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
        let metrics_server = match state.settings.metrics_bind {
            Some(addr) => {
                let listener = TcpListener::bind(addr)?;
                let port = listener.local_addr()?.port();
                let (metrics, pool) = (state.metrics.clone(), state.pool.clone());
                let server = HttpServer::new(move || {
                    App::new()
                        .app_data(web::Data::new(crate::ops::MetricsListener))
                        .app_data(metrics.clone())
                        .app_data(pool.clone())
                        // HEAD as on the main listener: a probe's HEAD is a GET.
                        .wrap(actix_web::middleware::from_fn(crate::head::head_as_get))
                        .route(
                            "/metrics",
                            web::get().to(|m: web::Data<Metrics>, p: web::Data<Db>| async move {
                                crate::ops::metrics_text(&m, &p).await
                            }),
                        )
                })
                .disable_signals()
                .workers(1)
                .listen(listener)?
                .run();
                Some((port, server))
            }
            None => None,
        };
        let server = HttpServer::new(move || {
            let readiness = state.readiness.clone();
            let http = state.metrics.http.clone();
            App::new()
                // Requests in flight, so that `serve` stops the workers only
                // when none is left (serve.rs says why); and the request
                // series, by route template (never the raw path).
                .wrap_fn(move |req, srv| {
                    let guard = crate::ops::Readiness::enter(&readiness);
                    let started = std::time::Instant::now();
                    let method = req.method().as_str().to_owned();
                    let route = req.match_pattern();
                    http.in_flight.inc();
                    let fut = srv.call(req);
                    let http = http.clone();
                    async move {
                        let res = fut.await;
                        http.in_flight.dec();
                        let status = match &res {
                            Ok(r) => r.status().as_u16(),
                            Err(e) => e.as_response_error().status_code().as_u16(),
                        };
                        let seconds = started.elapsed().as_secs_f64();
                        http.observe(route.as_deref(), &method, status, seconds);
                        // The access line, inside the request's span: it
                        // carries the trace id (silence it with
                        // RUST_LOG=info,poolkeeper::access=warn).
                        tracing::info!(
                            target: "poolkeeper::access",
                            method = %method,
                            route = route.as_deref().unwrap_or("unmatched"),
                            status,
                            ms = (seconds * 1000.0).round(),
                            "answered"
                        );
                        drop(guard);
                        res
                    }
                })
                // Innermost: the log line still says HEAD.
                .wrap(actix_web::middleware::from_fn(crate::head::head_as_get))
                .wrap(tracing_actix_web::TracingLogger::<crate::telemetry::RootSpan>::new())
                .wrap(crate::security_headers::default_headers())
                .configure(configure(state.clone()))
        })
        // Signals are ours: the sweep must stop and release its lease first.
        .disable_signals()
        .shutdown_timeout(10)
        .listen(listener)?
        .run();
        Ok(Application {
            port,
            server,
            metrics_server,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the metrics-only listener, when there is one.
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics_server.as_ref().map(|(p, _)| *p)
    }

    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Runs until the main server stops; the metrics listener stops then.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let metrics = self.metrics_server.map(|(_, server)| {
            let handle = server.handle();
            (handle, tokio::spawn(server))
        });
        let result = self.server.await;
        if let Some((handle, task)) = metrics {
            handle.stop(true).await;
            let _ = task.await;
        }
        result
    }
}
