//! The tests that need only PostgreSQL, the default `cargo test`: every
//! test gets its own freshly migrated database on one private PostgreSQL
//! per run (see helpers/mod.rs); the fixtures every file uses are in
//! helpers/fixtures.rs. The tests of other components (PgBouncer, Patroni,
//! Chromium, Prometheus, systemd, the soak, rolling restarts, TLS) are the
//! `components` binary, tests/components/main.rs (docs/testing.md).

mod allocator;
mod bad_input;
mod capacity;
mod contract;
mod dashboard;
mod definitions;
mod demand;
mod embedded;
mod expiry_warning;
mod extensions;
mod guardrails;
mod headroom;
mod healing;
mod helpers;
mod hostile_forms;
mod in_service;
mod inventory;
mod lease;
mod lock_order;
mod login_throttle;
mod lost_commits;
mod machines_list;
mod metrics;
mod migrations;
mod openapi;
mod orders;
mod orders_of_several;
mod planning;
mod pool_figures;
mod privilege;
mod restore;
mod schema;
mod search;
mod status_changes;
mod substitutes;
mod sweep;
mod traces;
#[path = "../fixtures/webhook_history.rs"]
mod webhook_history;
mod webhooks;
mod writes;
