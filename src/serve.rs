//! `poolkeeper serve`: the HTTP server and the background workers, with an
//! orderly shutdown on SIGTERM or Ctrl-C.

use sqlx::PgPool;

use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::startup::{AppState, Application};

pub async fn serve(settings: Settings, pool: PgPool) -> anyhow::Result<()> {
    let metrics = Metrics::new();
    let state = AppState::new(settings.clone(), pool.clone(), metrics.clone());
    let app = Application::build(state)?;
    let handle = app.handle();
    tracing::info!(
        address = %format!("http://{}:{}", settings.bind.ip(), app.port()),
        replica = %settings.replica,
        datacenter_module = settings.datacenter_module,
        "poolkeeper is serving"
    );
    let server = tokio::spawn(app.run_until_stopped());

    wait_for_shutdown_signal().await;
    tracing::info!("shutting down");
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
