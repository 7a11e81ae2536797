//! What the figures mean and what limits them, written from the profiles
//! taken while building this bench (pg_stat_statements on a server started
//! with `BENCH_DATABASE_URL`, EXPLAIN (ANALYZE, BUFFERS), perf on the server
//! process), kept beside the code that produces the table. The paragraph on
//! a target is printed with the verdict of this run.

use std::fmt::Write as _;

use crate::Results;
use crate::stats::median;

const HOW: &str = "## How it is measured

- **One machine for everything.** The clients (this bench, tokio with 4
  worker threads), `poolkeeper serve` and PostgreSQL share the CPUs listed
  above. Nothing is pinned. The load average before and after the run says
  how quiet the machine was.
- **1. Throughput.** The database starts with 10,000 machines and a history
  of 20,000 ended reservations (see below why). Each client has its own
  keep-alive HTTP connection and
  orders on its own site (client *i* on site *i* mod 10, 1,000 ready
  machines per site, any vendor): `POST /api/v1/reservations`, then
  `POST /api/v1/reservations/{id}/cancel` with the fence, again and again for
  the length of a run. A reservation per second is one completed
  reserve+cancel cycle. Latency is from the request sent to the body read.
  The ceiling does the same work as two PL/pgSQL calls per cycle on plain
  connections, as many as there are HTTP clients: `bench_reserve` (the R9
  lookup, the candidates of the spec with the held and in-service probes, one
  candidate locked at a time with `FOR UPDATE SKIP LOCKED` on its key, the
  expiry of an overdue holder at the point of use, the insert with its frozen
  snapshot and reason and the `created` event in a `BEGIN ... EXCEPTION`
  block, i.e. a savepoint) and `bench_cancel` (machine then reservation
  locked, fence, state and deadline checked, the update and the `cancelled`
  event). They are created by the bench in its own database, never by a
  migration. HTTP and ceiling runs alternate. CPU per reservation is read
  from /proc (utime+stime) for the server process, the bench process and
  every PostgreSQL process.
- **2. Lost sales.** Each round, 8 tasks on 8 connections wait on a
  `tokio::sync::Barrier`, then order on a site of 3 ready machines. The
  article's first version selects every candidate `FOR UPDATE SKIP LOCKED`
  and inserts on the first row it got; ours is `poolkeeper::allocator::reserve`.
  A lost sale is a machine still unsold at the end of a round in which an
  order was refused. The two versions alternate round by round; every
  machine goes back to stock between rounds.
- **3. Growth.** One client calls `poolkeeper::allocator::reserve` directly
  (no HTTP: the database part is what could grow), cancelling each
  reservation afterwards (not timed). History is inserted with
  `INSERT ... SELECT generate_series`: ended reservations (converted with an
  ended service link, expired by the sweep, cancelled), each with its
  `created` and ending events, spread over the 10,000 machines, then
  `VACUUM ANALYZE` (what autovacuum does after a bulk insert, done here so
  that it does not run during the measurement). Each step has its own
  database, loaded before any is measured; the runs then alternate between
  the steps, so that a change of load on the machine hits every step alike.
- **4. Sweep.** 100,000 held reservations overdue, on 100,000 distinct
  machines of their own organization, with their `created` events, then
  `VACUUM ANALYZE`; the bench claims the sweep lease and runs
  `sweep::start_run`, `sweep::expire_batch` (the worker's own statement, with
  `sweep::BATCH_SIZE`) until a batch comes back short, and `sweep::finish_run`.
  Each batch is one autocommit statement, so the time of the statement seen
  from the client bounds how long it held its row locks.
- **5. Pages.** The organization of item 1 grows to 50,000 machines (40,000
  of another profile, a fifth of them in maintenance) and 1,000 held
  reservations of an hour. A viewer created with `poolkeeper::staff::create`
  logs in through the login form; 8 readers fetch the pages in turn (to the
  last byte) while the 8-client allocation load of item 1 runs against the
  same server. The time is seen from the client, so it includes HTTP and
  waiting for a CPU: an upper bound of the server's time.
- **6. A fresh deployment filling up.** Each run has its own database:
  migrated, 10,000 machines loaded, then `VACUUM ANALYZE` while
  `reservations` is empty, so that the statistics say \"empty\" as on a new
  deployment; then a fresh `poolkeeper serve` and 8 clients doing
  reserve+cancel cycles through HTTP (as in item 1) until the count is
  reached. The rate of the last tenth of the cycles is compared with the
  first tenth. No history is pre-loaded here: this is the case the history of
  item 1 would hide.
- **7. Round trips.** The bench's cluster preloads `pg_stat_statements`.
  For each kind of call, the statistics are reset, one client makes the
  calls in a row through HTTP, and the top-level statements the server ran
  are added up and divided by the calls (the statements inside a PL/pgSQL
  function are not top-level: they cost no round trip; the sweep's and the
  lease's statements are left out by their text).
- **8. Through PgBouncer.** A database set up as item 1's (its machines
  and its history, then `VACUUM ANALYZE`). One `pgbouncer` (Debian's) in
  front of the bench cluster serves it in session mode and in transaction
  mode. 8 clients call `allocator::reserve_for_token` then
  `reservations::transition_for_token` (the API handlers' calls, without
  HTTP) on their own site, on one pool of 8 connections per path: direct
  over the Unix socket, through the session pool with the statement cache
  on, and through the transaction pool pinned (`POOLKEEPER_DB_STATEMENT_CACHE
  =off`). The three paths take turns, run after run. Statements per cycle
  are pg_stat_statements' count over 100 cycles by one client (`BEGIN` and
  `COMMIT` count, `DEALLOCATE` is not tracked). Round trips are not
  counted by the database; by the protocol, a lone statement is one round
  trip direct or cached, and four pinned (`BEGIN; DEALLOCATE ALL`, prepare,
  execute, `COMMIT`).";

const THROUGHPUT: &str = "### What limits item 1 (HTTP API against the database's ceiling)

On this machine the rate is CPU divided by CPU per reservation: every side
runs on the same few CPUs, and the machine is close to 100% busy during the
8- and 32-client runs. The CPU columns of the table say where it goes.

The first version of the bench (2026-12-02) found the HTTP path at 16% of
the ceiling at 8 clients, and the cause: round trips, not slow SQL. A
reserve+cancel cycle was 2 HTTP exchanges and 24 round trips to PostgreSQL
(4 pool pings; per request the token lookup; for the reserve BEGIN, the R9
lookup, the candidates, the lock, the re-check under the lock, SAVEPOINT,
the expiry at the point of use, the INSERT, its event, RELEASE, COMMIT; for
the cancel BEGIN, the reservation's machine, the machine lock, the
reservation lock, the UPDATE, its event, COMMIT). Each round trip cost a
protocol exchange, a snapshot and executor start-up, and a process wake-up
on each side; perf put 55% of the server's CPU in the kernel.

The shape of the hot path changed, not its details. Each decision is now one
statement (item 7 counts them): the reserve is `api_reserve` (the token, its
scope and the module switches, R9 asked twice, pass one, pass two with one
candidate locked at a time and a `BEGIN ... EXCEPTION` block per insert
attempt, R7's counts on a refusal), the cancel and the convert
`api_transition`; the pool no longer pings a connection before handing it
out. The rules did not move out of sight: `src/allocator.rs` says where
each one lives, and the SQL is in `sql/allocator.sql` and
`sql/transitions.sql`, tied to the rule numbers.
The ceiling is still the bench's own pair of functions, never the shipped
path, so the ratio still compares the HTTP API with the database alone;
because the shipped path is now PL/pgSQL as well, the table also gives the
server's CPU per request and the round trips per call, so that the gain is
visible and not just moved into PostgreSQL.

What is left between the two, measured while writing this (pgbench on one
connection, the same prepared statements the server sends, the backend's
CPU read from /proc): at the database alone, `api_reserve` + `api_transition`
cost 0.74 ms of PostgreSQL CPU per cycle against 0.51 ms for the ceiling's
pair (x1.45). That part is what the shipped functions do beyond the
ceiling: the token check in the same statement, the frozen reason's words,
the walk's counters returned as a row, nested PL/pgSQL calls each with its
`SET` clauses, and, on every insert, the webhook outbox trigger and one more
index on `reservations` (the overview's 24-hour chart). Through HTTP the
PostgreSQL CPU per cycle roughly doubles again (the CPU columns above): the
same two statements arrive one at a time on a pool of 20 connections that
sqlx hands out in turn, so each request wakes a different, cold backend
rather than one hot one. Quick runs with `POOLKEEPER_DB_MAX_CONNECTIONS=4`
measured 1.06 to 1.36 ms of PostgreSQL CPU per cycle against 1.5 to 1.7 ms
with the default 20 (and 983 against 878 cycles/s at 8 clients), so the
pool accounts for part of it. What would close the rest: fewer, hotter
backends (a smaller pool, or a pool that hands out the most recently used
connection first, which sqlx's pool cannot be told to do), one PL/pgSQL frame
per call instead of four nested ones with their `SET` clauses, and a server
that sends less per request (its CPU per request was 0.15 to 0.3 ms when
this was written, against about 0.4 ms before; the table gives this run's).";

const LATENCY8: &str = "The p99 at 8 clients is time spent waiting for a CPU: 8 clients, the
server's threads and 8 backends share the CPUs, and any other load on the
machine (see the load average) lands in the tail. At 32 clients the ceiling
itself falls below its 8-connection rate: 32 backends time-share the CPUs,
and the 3 or 4 clients of each site walk past each other's locked first
candidates; over HTTP the server's pool of 20 connections queues the
requests, which keeps PostgreSQL's concurrency at 20 and its ratio to the
ceiling higher.";

const FILL: &str = "### Item 6 (a fresh deployment filling up)

The first bench saw the HTTP rate fall run after run on a database whose
`reservations` table had been analyzed empty: each connection keeps the
plans of its statements for its whole life, and the generic plan of the
allocator's held probe, made while the table was a page or two, was a
sequential scan of `reservations` (auto_explain: 4 to 5 ms per call after
12,000 rows), until autoanalyze came by. It pre-loaded a history to hide it.
The cause is fixed in the schema, not in the bench: the allocator's and the
transitions' functions carry `SET enable_seqscan = off`, so a plan made on
an empty-looking table cannot be a sequential scan, and each probe has
exactly one index that answers it with an index condition (the held probe's
predicate is exactly the arbiter's, `reservations_one_holder_per_machine`;
the sweep's deadline index is declared `WHERE state = 'held' AND expires_at
IS NOT NULL`, which the sweep's own `expires_at <= ...` implies and the
probe does not, so it cannot be picked to walk every held reservation). A
test caches the plans on an analyzed-empty table, adds 5,000 reservations
and checks the plans; it fails without the functions' setting. Item 6 runs
with no pre-loaded history: the rate of its last tenth against its first is
the measure.

A later look (bench item 8 on a small fresh database, 2026-12-03) found two
more lookups that a plan cached on an empty table sent through the wrong
index: on such a table every index led by `org_id` costs the same, and the
R9 lookup by order_ref took the overview's `(org_id, created_at)` index,
the transitions' lookups by id the order_ref index, each reading the
organization's whole history on every call. Migration
`20261203000007_lookups_by_key.sql` made the overview's index partial and
keeps the organization out of those lookups' index conditions; a test
checks the buffers a reserve and a cancel read. The first tenth of item 6
got faster with it (1397/s in the 13:18 run, 1099/s at 12:52 before the
fix), so the ratio of the last tenth to the first is smaller than before
(×1.05 against ×1.51): the slow start it measured is gone.";

const GROWTH: &str = "### Item 3 (growth)

Reserve never reads the ended history. The held-or-not probe of each
candidate goes through the partial unique index of held reservations, the
in-service probe through the partial unique index of live service links, the
idempotency lookup through the unique (org_id, order_ref) index, one level
deeper at a million rows. EXPLAIN (ANALYZE, BUFFERS) with 1,000,000 ended
reservations: the candidate query touches the site's machines and a single
page of reservations, the R9 lookup 7 pages. What grows is the cost of the
inserts into the btrees of `reservations` and `reservation_events`,
logarithmic.";

const GROWTH_MISSED: &str = "If the ratio is above the target in this run while p50 stays within
a few tenths of a millisecond, it is noise: each step is measured after
loading and vacuuming hundreds of megabytes, on a machine shared with other
work; the plans do not change (see above).";

const SWEEP: &str = "### What limits item 4 (the sweep)

A batch of 500 is one statement: find 500 overdue rows in deadline order on
the partial index of held reservations, update them, write 500 `expired`
events, and return the count. EXPLAIN (ANALYZE, BUFFERS) of one batch:
the scan and locking take under 1 ms; the rest is per row. Each expired
reservation is a non-HOT update (its state and `ended_at` are in index
predicates and keys) so 4 index insertions (primary key, order, machine,
recently ended), plus an event row with 2 index insertions, plus 4 foreign
key checks run as triggers (the new state against `reservation_states`; the
event's reservation, from-state and to-state), about 40% of the statement.
That is 30 to 45 µs per reservation on one CPU of this machine, hence about
3 to 4.5 s for 100,000 one batch at a time, depending on what else runs.
The batch itself stays short (the longest batch is in the table).

The statement uses one CPU; the database has more. The shipped sweep runs
two batch statements at a time on the worker's two connections
(`sweep::expire_two_batches`): `SKIP LOCKED` gives them disjoint rows. Each
batch still checks the fence
in the same statement. The one-at-a-time row is there for comparison. A
larger `BATCH_SIZE` would not help: the cost
is per row, and a batch of 2,000 would hold its locks four times as long.

Two at a time first scaled poorly (run of 2026-12-02 16:43: 40.4 µs against
38.0 µs per reservation): each batch statement also added its count to the
run's `sweep_runs` row and held that row lock until it committed, so the two
statements took turns. The count is now added up by the worker and written
once by `finish_run`; with that, `BENCH_ONLY=sweep` measured 2.2 to 2.4 s
for 100,000 two at a time, against 3.6 to 3.9 s before. The margin under the
3 s target is thin on this 2-CPU machine and varies between runs.

Since 2026-12-03 every expired reservation also costs the webhook outbox
trigger (one call per batch statement: it reads the statement's new events
and, when no organization has a webhook, probes the empty `webhooks` table
once) and one more index entry (`reservations_created_recently_idx`, for the
overview's 24-hour chart). Measured alone in psql (100,000 expiries in
batches of 500), the trigger costs about 5% and the index about 3%. The two
full runs of that day measured 3.51 s (09:37 UTC, a miss) and the figure in
the table: the margin under 3 s is thinner than before. What would widen
it: the chart reading its counts from `reservation_events` instead of an
index of its own, or a third batch statement at a time.";

const PAGES: &str = "### What limits item 5 (pages)

The queries behind the pages are small: pg_stat_statements puts the live
reservations query at about 2 to 3 ms (1,000 held, the first 500 shown, each
joined to its machine), the machine list at about 0.3 ms, the list with a
verdict per machine at about 0.6 ms, and the session check (an UPDATE of
`last_seen_at` on every page view) at about 0.13 ms. The column \"one reader,
no load\" is the page's own time. Under load, the rest is waiting for a
CPU: 8 readers, 8 ordering clients, the server and PostgreSQL share them,
and the readers take CPU from the orders as much as the reverse (the
allocation rate during the page runs is in the table). The live page is the
heaviest: 500 rows with their frozen reasons, hundreds of kilobytes of HTML
to render and send (a browser asking for gzip adds the compression). On
this machine the p99 follows the load, not the page; what would lower it in
the page itself (`src/dashboard/reservations.rs`, not changed here): a
smaller first page (e.g. 100 rows with a \"next\" link, as `/machines`
does) and the reason shown on the reservation's own page rather than in
every row.";

pub fn notes(results: &Results) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "{HOW}\n");
    let _ = writeln!(w, "## What limits what\n");
    if let Some(t8) = results.throughput.iter().find(|t| t.clients == 8) {
        let _ = writeln!(
            w,
            "In this run, at 8 clients: {:.2} ms of CPU per reservation over HTTP (server {:.2}, clients {:.2}, PostgreSQL {:.2}) against {:.2} ms in the ceiling (PostgreSQL {:.2}); the machine was {:.0}% busy during the HTTP runs.\n",
            t8.http_cpu.total_ms,
            t8.http_cpu.server_ms,
            t8.http_cpu.client_ms,
            t8.http_cpu.postgres_ms,
            t8.db_cpu.total_ms,
            t8.db_cpu.postgres_ms,
            t8.http_cpu.machine_busy * 100.0
        );
        let _ = writeln!(w, "{THROUGHPUT}\n");
        let _ = writeln!(w, "{LATENCY8}\n");
    }
    if let (Some(first), Some(last)) = (results.growth.first(), results.growth.last()) {
        let _ = writeln!(w, "{GROWTH}\n");
        if last.reserve.p50_ms / first.reserve.p50_ms > 1.2 {
            let _ = writeln!(w, "{GROWTH_MISSED}\n");
        }
    }
    if !results.fill.is_empty() {
        let _ = writeln!(w, "{FILL}\n");
    }
    if !results.sweep.is_empty() {
        let _ = writeln!(w, "{SWEEP}\n");
        let per = |parallel: usize| {
            median(
                &results
                    .sweep
                    .iter()
                    .filter(|r| r.parallel == parallel)
                    .map(|r| r.total_ms * 1000.0 / r.expired.max(1) as f64)
                    .collect::<Vec<_>>(),
            )
        };
        let _ = writeln!(
            w,
            "In this run: {:.1} µs per expired reservation one batch at a time, {:.1} µs two at once.\n",
            per(1),
            per(2)
        );
    }
    if results.pages.is_some() {
        let _ = writeln!(w, "{PAGES}\n");
    }
    out
}
