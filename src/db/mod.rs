//! The database, by concern: `connect` (the pools and their session
//! limits, the role checks), `lock_order` (a transition run again when a
//! hold moved while it took its locks), `handle` (`Db`: statements as sqlx runs them,
//! or pinned in transactions for a transaction-mode pooler), `read_only`
//! (F2: never a connection to a server that cannot write), `incarnation`
//! (F5: a restored copy of the database advances its sequences before any
//! connection to it is handed out), `definitions`
//! (the SQL definitions of `sql/`: their set, version and checksums, and
//! applying them), `migrations` (the migrations, the SQL definitions and the
//! lease purge under one advisory lock, with the rewritten legacy checksums)
//! and `errors` (the one
//! place that reads what the database said: `classify` walks an error's
//! cause chain once for its SQLSTATE, its constraint name and what it means,
//! a 503, an unknown outcome, a bad value; the API's and the dashboard's
//! error boundaries and the metrics use it). Callers use `crate::db::...`;
//! inside the folder the arrows run one way: `migrations` applies
//! `definitions`, which reads `errors`.

mod connect;
pub mod definitions;
pub mod errors;
mod handle;
pub mod incarnation;
pub mod lock_order;
mod migrations;
mod read_only;

pub use connect::*;
pub use errors::*;
pub use handle::*;
pub use migrations::*;
pub use read_only::*;
