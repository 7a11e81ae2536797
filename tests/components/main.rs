//! The tests that run components besides PostgreSQL, or run for minutes:
//! PgBouncer, pgBackRest, Patroni with etcd and HAProxy, headless Chromium, Prometheus,
//! `systemd-analyze`, the soak, rolling restarts of `serve` and TLS to
//! PostgreSQL. Not part of the default `cargo test` (`test = false` in
//! Cargo.toml): `cargo test --test components`, or `scripts/test`, which
//! runs both binaries (docs/testing.md). The harness is the `api` binary's.

#[path = "../ha/cluster.rs"]
mod ha_cluster;
#[path = "../api/helpers/mod.rs"]
mod helpers;

mod alerting;
mod backups;
mod browser;
mod deploy_unit;
mod failover;
mod pgbouncer;
mod rolling;
mod soak;
mod sso;
mod tls;
