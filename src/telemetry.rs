//! Structured logs with tracing. `RUST_LOG` filters (default `info`);
//! `POOLKEEPER_LOG_FORMAT=json` prints one JSON object per line.

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,actix_server=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let json = std::env::var("POOLKEEPER_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    // try_init: tests may initialise more than once.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.compact().try_init()
    };
}
