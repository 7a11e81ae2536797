//! The database, by concern: `connect` (the pools and their session
//! limits, the role checks), `lock_order` (a transition run again when a
//! hold moved while it took its locks), `handle` (`Db`: statements as sqlx runs them,
//! or pinned in transactions for a transaction-mode pooler), `read_only`
//! (F2: never a connection to a server that cannot write), `migrations`
//! (the migrations, the SQL definitions and the lease purge under one
//! advisory lock, with the rewritten legacy checksums) and `errors` (the one
//! place that reads database errors: constraint names, SQLSTATEs, what is a
//! 503 and what is an unknown outcome). Callers use `crate::db::...`.

mod connect;
mod errors;
mod handle;
pub mod lock_order;
mod migrations;
mod read_only;

pub use connect::*;
pub use errors::*;
pub use handle::*;
pub use migrations::*;
pub use read_only::*;
