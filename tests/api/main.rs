//! One integration binary: every test gets its own freshly migrated database
//! on one private PostgreSQL per run (see helpers.rs).

mod allocator;
mod embedded;
mod helpers;
mod inventory;
mod migrations;
mod orders;
mod schema;
