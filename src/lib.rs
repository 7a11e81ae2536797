//! poolkeeper: reserves dedicated bare-metal machines for customer orders,
//! with PostgreSQL as the arbiter, and a staff dashboard over the pool.

pub mod activity;
pub mod allocator;
pub mod api;
pub mod audit;
pub mod capacity;
pub mod cli;
pub mod dashboard;
pub mod db;
pub mod demand;
pub mod demo;
pub mod domain;
pub mod embedded_pg;
pub mod error;
pub mod forecast;
pub mod head;
pub mod healing;
pub mod holds;
pub mod inventory;
pub mod lease;
pub mod metrics;
pub mod ops;
pub mod orgs;
pub mod planning;
pub mod reservations;
pub mod security_headers;
pub mod serve;
pub mod settings;
pub mod sso;
pub mod staff;
pub mod startup;
pub mod sweep;
pub mod telemetry;
pub mod tokens;
pub mod webhooks;
