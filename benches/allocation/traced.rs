//! Item 12: what tracing costs. The item 1 cycle (reserve then cancel
//! through the API) at 8 clients, against a server with tracing off (no
//! OTLP variable) and one exporting to a local OTLP/HTTP sink at a 1%
//! sampler (`parentbased_traceidratio`, 0.01; the clients send no
//! `traceparent`, so 1% of requests are traced). The two alternate, run
//! after run, on the same database, each on a freshly started server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use actix_web::{App, HttpResponse, HttpServer, web};

use crate::cpu::Meter;
use crate::server::Server;
use crate::setup::{self, Cluster, Config, PROFILE};
use crate::stats::median;
use crate::throughput::{self, Run};

pub const CLIENTS: usize = 8;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Result {
    pub off: Vec<Run>,
    pub on: Vec<Run>,
    /// Export requests and bytes the sink received over all "on" runs.
    pub exports: u64,
    pub exported_bytes: u64,
}

impl Result {
    /// Median cycles/s with tracing on over off.
    pub fn ratio(&self) -> f64 {
        let m = |runs: &[Run]| median(&runs.iter().map(|r| r.cycles_per_s).collect::<Vec<_>>());
        m(&self.on) / m(&self.off)
    }
}

/// A sink that accepts OTLP/HTTP exports and counts them.
async fn sink() -> anyhow::Result<(
    u16,
    Arc<AtomicU64>,
    Arc<AtomicU64>,
    actix_web::dev::ServerHandle,
)> {
    let (requests, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (r, b) = (requests.clone(), bytes.clone());
    let server = HttpServer::new(move || {
        let (r, b) = (r.clone(), b.clone());
        App::new().route(
            "/v1/traces",
            web::post().to(move |body: web::Bytes| {
                let (r, b) = (r.clone(), b.clone());
                async move {
                    r.fetch_add(1, Ordering::Relaxed);
                    b.fetch_add(body.len() as u64, Ordering::Relaxed);
                    HttpResponse::Ok()
                        .content_type("application/x-protobuf")
                        .finish()
                }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")?;
    let port = server.addrs()[0].port();
    let server = server.run();
    let handle = server.handle();
    tokio::spawn(server);
    Ok((port, requests, bytes, handle))
}

pub async fn run(cluster: &Cluster, cfg: &Config) -> anyhow::Result<Result> {
    let db = cluster.database("bench_traced").await?;
    let org = setup::org(&db, "traced").await?;
    setup::machines(&db, org.id, "m", cfg.machines, cfg.sites, PROFILE, "ready").await?;
    crate::growth::add_history(&db, org.id, 0, cfg.api_history).await?;
    db.exec("VACUUM ANALYZE").await?;
    db.exec("CHECKPOINT").await?;
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&db.setup)
        .await?;
    let (port, requests, bytes, handle) = sink().await?;
    let on_env = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        ),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio".to_owned()),
        ("OTEL_TRACES_SAMPLER_ARG", "0.01".to_owned()),
    ];
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for r in 0..cfg.runs {
        for traced in [false, true] {
            let env: &[(&str, String)] = if traced { &on_env } else { &[] };
            let server = Server::start_with(&db.url, &cluster.dir, &cfg.server_log, env).await?;
            let meter = Meter::new(server.pid(), backend);
            let tag = format!("tr{r}{}", if traced { "on" } else { "off" });
            let run = throughput::http_run(
                &meter,
                &server.base,
                &org.token,
                cfg.sites,
                CLIENTS,
                cfg.run_seconds,
                &tag,
            )
            .await;
            // The orderly stop flushes the spans still buffered.
            server.stop().await;
            let run = run?;
            eprintln!(
                "  tracing {} run {r}: {:.0}/s, reserve p50 {:.2} ms, p99 {:.2} ms",
                if traced { "on (1%)" } else { "off" },
                run.cycles_per_s,
                run.reserve.p50_ms,
                run.reserve.p99_ms
            );
            if traced { on.push(run) } else { off.push(run) }
        }
    }
    handle.stop(false).await;
    db.setup.close().await;
    crate::drop_database(cluster, &db.name).await?;
    Ok(Result {
        off,
        on,
        exports: requests.load(Ordering::Relaxed),
        exported_bytes: bytes.load(Ordering::Relaxed),
    })
}
