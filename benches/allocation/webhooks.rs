//! Item 19: the webhook delivery worker (`webhooks::run`, as `serve` runs
//! it) draining a backlog of one organization, small and large: how many
//! deliveries a second it records until the first `DRAINED` are
//! delivered, to a receiver on 127.0.0.1 that answers 200 at once, and its
//! poll's statement (`webhooks::due`) alone at each backlog. Each
//! reservation has two events, the second waiting for the first (in order
//! per reservation). The rate should not depend on the backlog: the worker
//! polls whenever deliveries finish.

use std::time::{Duration, Instant};

use actix_web::{App, HttpResponse, HttpServer, web};
use poolkeeper::metrics::Metrics;
use poolkeeper::settings::Settings;
use poolkeeper::webhooks::{CONCURRENCY, PER_ORG};
use tokio::sync::watch;

use crate::setup::{self, Db};
use crate::stats::{Latency, median};
use crate::webhook_history::CONVERTED_HISTORY_SQL;

/// Deliveries recorded per run, at every backlog.
pub const DRAINED: i64 = 2_000;

/// Pending deliveries at the start of a run.
pub const BACKLOGS: [i64; 2] = [4_000, 50_000];

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Run {
    pub pending: i64,
    pub delivered: i64,
    pub seconds: f64,
    pub per_s: f64,
    /// The poll's statement alone, before the worker starts.
    pub poll: Latency,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Result {
    pub runs: Vec<Run>,
}

impl Result {
    /// Median deliveries a second at `pending`.
    pub fn rate(&self, pending: i64) -> f64 {
        median(
            &self
                .runs
                .iter()
                .filter(|r| r.pending == pending)
                .map(|r| r.per_s)
                .collect::<Vec<_>>(),
        )
    }

    /// Median poll p50 at `pending`.
    pub fn poll_p50(&self, pending: i64) -> f64 {
        median(
            &self
                .runs
                .iter()
                .filter(|r| r.pending == pending)
                .map(|r| r.poll.p50_ms)
                .collect::<Vec<_>>(),
        )
    }
}

pub async fn run(db: &Db, cfg: &setup::Config) -> anyhow::Result<Result> {
    let org = setup::org(db, "webhooks").await?;
    setup::machines(db, org.id, "wh", 1, 1, setup::PROFILE, "ready").await?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let server = HttpServer::new(|| {
        App::new().default_service(web::to(|| async { HttpResponse::Ok().body("ok") }))
    })
    .workers(2)
    .disable_signals()
    .listen(listener)?
    .run();
    let receiver = server.handle();
    tokio::spawn(server);
    db.exec(&format!(
        "INSERT INTO webhooks (org_id, url, secret, updated_by)
         VALUES ({}, 'http://127.0.0.1:{port}/hooks', repeat('s', 32), 'bench')",
        org.id
    ))
    .await?;
    let pool = db.app_pool(8).await?;
    let mut settings = Settings::defaults();
    settings.replica = "bench-webhooks".to_owned();
    settings.webhook_allow_private = true;
    settings.webhook_poll = Duration::from_millis(100);
    settings.webhook_backoff_base = Duration::from_secs(1);
    settings.webhook_lease_duration = Duration::from_secs(10);
    settings.webhook_give_up = Duration::from_secs(86_400);

    let mut runs = Vec::new();
    for pending in BACKLOGS {
        for r in 0..cfg.runs {
            load(db, org.id, pending).await?;
            let mut polls = Vec::new();
            for _ in 0..50 {
                let t = Instant::now();
                let due =
                    poolkeeper::webhooks::due(&pool, &[], PER_ORG as i64, CONCURRENCY as i64 + 64)
                        .await?;
                polls.push(t.elapsed());
                anyhow::ensure!(due.len() == PER_ORG, "the poll found {} due", due.len());
            }
            let (stop, stopped) = watch::channel(false);
            let (worker_pool, worker_settings) = (pool.clone(), settings.clone());
            let start = Instant::now();
            let worker = tokio::spawn(async move {
                poolkeeper::webhooks::run(&worker_pool, &worker_settings, Metrics::new(), stopped)
                    .await
            });
            let deadline = start + Duration::from_secs(600);
            let delivered = loop {
                let n = db
                    .scalar_i64("SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'")
                    .await?;
                if n >= DRAINED {
                    break n;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "{n} of {DRAINED} delivered after 600 s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let seconds = start.elapsed().as_secs_f64();
            let _ = stop.send(true);
            worker.await?;
            let run = Run {
                pending,
                delivered,
                seconds,
                per_s: delivered as f64 / seconds,
                poll: Latency::of(&mut polls),
            };
            eprintln!(
                "  webhooks run {r}, {pending} pending: {delivered} delivered in {seconds:.2} s ({:.0}/s); poll p50 {:.2} ms",
                run.per_s, run.poll.p50_ms
            );
            runs.push(run);
        }
    }
    pool.close().await;
    receiver.stop(true).await;
    Ok(Result { runs })
}

/// `pending` deliveries of `org_id`: converted reservations of history,
/// each with its `created` and `converted` events written by one
/// statement, so that the outbox interleaves them.
async fn load(db: &Db, org_id: i64, pending: i64) -> anyhow::Result<()> {
    db.exec(
        "TRUNCATE webhook_attempts, webhook_deliveries, reservation_events, service_links,
                  reservations CASCADE",
    )
    .await?;
    sqlx::query(CONVERTED_HISTORY_SQL)
        .bind(org_id)
        .bind(pending / 2)
        .bind("WH-")
        .execute(&db.setup)
        .await?;
    db.exec("VACUUM ANALYZE").await?;
    Ok(())
}
