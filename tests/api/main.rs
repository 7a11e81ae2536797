//! One integration binary: every test gets its own freshly migrated database
//! on one private PostgreSQL per run (see helpers/mod.rs); the fixtures
//! every file uses are in helpers/fixtures.rs.

mod alerting;
mod allocator;
mod bad_input;
mod browser;
mod capacity;
mod contract;
mod dashboard;
mod definitions;
mod demand;
mod deploy_unit;
mod embedded;
mod expiry_warning;
mod extensions;
mod failover;
mod guardrails;
#[path = "../ha/cluster.rs"]
mod ha_cluster;
mod headroom;
mod healing;
mod helpers;
mod hostile_forms;
mod inventory;
mod lease;
mod lock_order;
mod lost_commits;
mod machines_list;
mod metrics;
mod migrations;
mod openapi;
mod orders;
mod orders_of_several;
mod pgbouncer;
mod privilege;
mod rolling;
mod schema;
mod soak;
mod status_changes;
mod sweep;
mod tls;
mod traces;
mod webhooks;
mod writes;
