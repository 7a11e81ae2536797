//! `Db`, the application's database handle: a pool, and how its
//! statements must run through whatever sits in front of PostgreSQL
//! (direct, or pinned in transactions for a transaction-mode pooler).

use futures_util::future::{BoxFuture, TryFutureExt};
use futures_util::stream::{BoxStream, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{
    PgConnectOptions, PgPool, PgPoolOptions, PgQueryResult, PgRow, PgStatement, PgTypeInfo,
};
use sqlx::{Either, Execute, Executor, PgConnection, Postgres, SqlStr, Transaction};

use super::errors::connection_trouble;
use super::read_only::{note_read_only, primary_only};

/// For `/metrics`: the wait for a pooled connection (through BEGIN when
/// pinned).
pub static ACQUIRE_WAIT: std::sync::LazyLock<prometheus::Histogram> =
    std::sync::LazyLock::new(|| {
        prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "poolkeeper_db_acquire_seconds",
                "Time the API waited for a pooled connection (through BEGIN when pinned)",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
        )
        .expect("static metric definition")
    });

/// `BEGIN` for a pinned transaction: the statement that follows `BEGIN`
/// drops whatever prepared statements an earlier client of the pooler left
/// on this server session, so that sqlx's names (`sqlx_s_N`, numbered per
/// client connection) cannot collide with them. One round trip: both run
/// as one simple query.
const PINNED_BEGIN: &str = "BEGIN; DEALLOCATE ALL";

/// The application's database: a pool, and how its statements must run
/// through whatever sits in front of PostgreSQL.
///
/// Direct, or behind a pooler that keeps a client's server session (or
/// tracks prepared statements), statements run as sqlx runs them: prepared
/// once per connection, then one round trip each.
///
/// *Pinned* (`POOLKEEPER_DB_STATEMENT_CACHE=off`), for a transaction-mode
/// pooler that passes prepared statements through to shared server
/// sessions (PgBouncer 1.18): sqlx prepares a statement in one round trip
/// and executes it in the next, and such a pooler may hand each round trip
/// to a different server session, where another client's statement of the
/// same name runs instead (`tests/components/pgbouncer.rs`). So every statement
/// runs inside an explicit transaction, which keeps one server session for
/// the client until it ends, begun by `PINNED_BEGIN`; and nothing is cached
/// (`statement_cache_capacity(0)`), so no statement is ever executed in a
/// later transaction than the one that prepared it. A statement on `&Db`
/// is its own transaction, committed before the call returns.
#[derive(Clone, Debug)]
pub struct Db {
    pool: PgPool,
    pinned: bool,
}

impl Db {
    /// Statements run as sqlx runs them (a direct connection, or a pooler
    /// that keeps sessions or tracks prepared statements).
    pub fn direct(pool: PgPool) -> Db {
        Db {
            pool,
            pinned: false,
        }
    }

    /// Pinned (see the type's documentation) or direct, as `pinned` says;
    /// pinned, `pool`'s options must have the statement cache off.
    pub fn new(pool: PgPool, pinned: bool) -> Db {
        Db { pool, pinned }
    }

    /// Connections open, idle, and the pool's limit (for `/metrics`).
    pub fn pool_sizes(&self) -> (u32, u32, u32) {
        let idle = u32::try_from(self.pool.num_idle()).unwrap_or(u32::MAX);
        (
            self.pool.size(),
            idle,
            self.pool.options().get_max_connections(),
        )
    }

    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// A transaction; pinned, it first clears the server session's
    /// leftover prepared statements (`PINNED_BEGIN`).
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let _wait = ACQUIRE_WAIT.start_timer();
        if self.pinned {
            self.pool.begin_with(PINNED_BEGIN).await
        } else {
            self.pool.begin().await
        }
        .map_err(connection_trouble)
    }

    /// A connection for several statements in a row. Pinned, it is a
    /// transaction: what it wrote is kept only by `finish`, and dropping it
    /// unfinished rolls back, as a transaction would.
    pub async fn acquire(&self) -> Result<Conn, sqlx::Error> {
        if self.pinned {
            Ok(Conn::Pinned(self.begin().await?))
        } else {
            let _wait = ACQUIRE_WAIT.start_timer();
            Ok(Conn::Direct(
                self.pool.acquire().await.map_err(connection_trouble)?,
            ))
        }
    }

    /// A background worker's own small pool (the sweep's, the webhook
    /// worker's), lazily connecting and pinned as this one is, so that the
    /// HTTP load cannot starve the worker. It waits for a connection no
    /// longer than the worker's call bound, and each session gets the
    /// worker's shorter `statement_timeout` (both from its lease timings).
    /// Not through a transaction-mode pooler: there a session-level SET
    /// would stay on the server session and reach other clients'
    /// transactions, so the worker keeps the role's limits and relies on its
    /// client-side call bound.
    pub fn worker_pool(
        &self,
        application_name: &str,
        max_connections: u32,
        call_timeout: std::time::Duration,
        statement_timeout: std::time::Duration,
        transaction_pooler: bool,
    ) -> Db {
        let options = (*self.pool.connect_options())
            .clone()
            .application_name(application_name);
        let builder = |statement_timeout| {
            primary_only(PgPoolOptions::new(), statement_timeout)
                .max_connections(max_connections)
                .min_connections(0)
                .acquire_timeout(call_timeout)
        };
        if transaction_pooler {
            return Db::new(builder(None).connect_lazy_with(options), self.pinned);
        }
        let pool = builder(Some(statement_timeout)).connect_lazy_with(options);
        Db::new(pool, self.pinned)
    }

    pub async fn close(&self) {
        self.pool.close().await
    }

    pub fn connect_options(&self) -> std::sync::Arc<PgConnectOptions> {
        self.pool.connect_options()
    }
}

/// A connection from `Db::acquire`: the pool's connection, or, pinned, a
/// transaction on it.
pub enum Conn {
    Direct(PoolConnection<Postgres>),
    Pinned(Transaction<'static, Postgres>),
}

impl Conn {
    /// After `err` on this connection: when the server turned out read-only
    /// (F2), the connection is closed instead of going back to the pool,
    /// and so are the pool's older ones (`note_read_only`).
    pub fn failed(&mut self, err: &sqlx::Error) {
        if note_read_only(err)
            && let Conn::Direct(c) = self
        {
            c.close_on_drop();
        }
    }

    /// Keeps what was written: pinned, commits; direct, each statement
    /// already committed on its own.
    pub async fn finish(self) -> Result<(), sqlx::Error> {
        match self {
            Conn::Direct(_) => Ok(()),
            Conn::Pinned(tx) => tx.commit().await,
        }
    }
}

impl std::ops::Deref for Conn {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match self {
            Conn::Direct(c) => c,
            Conn::Pinned(t) => t,
        }
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Conn::Direct(c) => c,
            Conn::Pinned(t) => t,
        }
    }
}

impl<'c> Executor<'c> for &'c Db {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pinned {
            return Box::pin(
                self.pool
                    .fetch_many(query)
                    .map_err(connection_trouble)
                    .inspect_err(|e| {
                        note_read_only(e);
                    }),
            );
        }
        // Pinned: the whole answer is read inside the transaction, which
        // commits before the first row is handed out.
        Box::pin(
            futures_util::stream::once(async move {
                let mut tx = self.begin().await?;
                let steps: Vec<_> = (&mut *tx).fetch_many(query).try_collect().await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(futures_util::stream::iter(steps.into_iter().map(Ok)))
            })
            .try_flatten(),
        )
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pinned {
            return Box::pin(
                self.pool
                    .fetch_optional(query)
                    .map_err(connection_trouble)
                    .inspect_err(|e| {
                        note_read_only(e);
                    }),
            );
        }
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let row = (&mut *tx).fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.prepare_with(sql, parameters)
    }

    fn describe<'e>(
        self,
        sql: SqlStr,
    ) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.describe(sql)
    }
}
