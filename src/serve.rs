//! `poolkeeper serve`: the HTTP server and the background workers, with an
//! orderly shutdown on SIGTERM or Ctrl-C.

use std::time::Duration;

use crate::db::Db;
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::startup::{AppState, Application};

pub async fn serve(settings: Settings, pool: Db) -> anyhow::Result<()> {
    let metrics = Metrics::new();
    let state = AppState::new(settings.clone(), pool.clone(), metrics.clone());
    let readiness = state.readiness.clone();
    let app = Application::build(state)?;
    let handle = app.handle();
    tracing::info!(
        address = %format!("http://{}:{}", settings.bind.ip(), app.port()),
        replica = %settings.replica,
        datacenter_module = settings.datacenter_module,
        "poolkeeper is serving"
    );
    let mut server = tokio::spawn(app.run_until_stopped());
    // The sweep runs on every replica; the lease keeps it on one (R11, L1-L6).
    let (stop_sweep, sweep_stopped) = watch::channel(false);
    let sweeper = {
        let (pool, settings, metrics) = (pool.clone(), settings.clone(), metrics.clone());
        tokio::spawn(
            async move { crate::sweep::run(&pool, &settings, metrics, sweep_stopped).await },
        )
    };
    // The webhook delivery worker: its own lease (key `webhooks`), pool and
    // task, so a slow receiver never delays the sweep.
    let (stop_webhooks, webhooks_stopped) = watch::channel(false);
    let deliverer = {
        let (pool, settings, metrics) = (pool.clone(), settings.clone(), metrics.clone());
        tokio::spawn(async move {
            crate::webhooks::run(&pool, &settings, metrics, webhooks_stopped).await
        })
    };

    let mut server_done = tokio::select! {
        _ = wait_for_shutdown_signal() => None,
        r = &mut server => Some(r),
    };
    tracing::info!(
        drain_seconds = settings.shutdown_drain.as_secs(),
        "shutting down: /readyz answers 503 while requests drain"
    );
    // Order matters: /readyz turns 503 first, so that a load balancer stops
    // sending new requests while this replica still serves them; the sweep
    // stops and releases its lease at once, so that another replica takes
    // the sweep over (L3); only after the drain does the listener close,
    // and in-flight requests still finish (actix's graceful stop).
    readiness.begin_shutdown();
    let _ = stop_sweep.send(true);
    let _ = stop_webhooks.send(true);
    let sweep_stopped = async {
        match tokio::time::timeout(Duration::from_secs(30), sweeper).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "sweep worker task failed"),
            Err(_) => tracing::error!("sweep worker did not stop within 30 s"),
        }
        match tokio::time::timeout(Duration::from_secs(30), deliverer).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "webhook worker task failed"),
            Err(_) => tracing::error!("webhook worker did not stop within 30 s"),
        }
    };
    let drained = async {
        if server_done.is_none() {
            tokio::select! {
                _ = tokio::time::sleep(settings.shutdown_drain) => {}
                r = &mut server => server_done = Some(r),
            }
        }
    };
    tokio::join!(sweep_stopped, drained);
    // Let the requests in flight finish while every worker still runs:
    // actix stops idle workers first, and each worker has its own runtime,
    // so a pooled connection opened on a stopped worker's runtime fails
    // ("Tokio context is being shutdown") in a request still running on
    // another worker, which would answer 503 (seen in tests/components/rolling.rs).
    tracing::info!(
        in_flight = readiness.in_flight(),
        "drain over; stopping once the requests in flight are done"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server_done.is_none()
        && readiness.in_flight() > 0
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if let Some(result) = server_done {
        pool.close().await;
        return match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(anyhow::anyhow!("server task failed: {e}")),
        };
    }
    handle.stop(true).await;
    if let Err(e) = server.await {
        tracing::error!(error = %e, "server task failed");
    }
    pool.close().await;
    Ok(())
}

async fn wait_for_shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {},
                _ = term.recv() => {},
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the server");
            let _ = ctrl_c.await;
        }
    }
}
