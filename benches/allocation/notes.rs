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
  waiting for a CPU: an upper bound of the server's time.";

const THROUGHPUT: &str = "### What limits item 1 (HTTP API against the database's ceiling)

On this machine the rate is CPU divided by CPU per reservation: every side
runs on the same few CPUs, and the machine is close to 100% busy during the
8- and 32-client runs. The CPU columns of the table say where it goes. Over
HTTP, PostgreSQL alone spends several times what it spends in the ceiling
for the same reservation, and the server and the clients come on top.

The reason is round trips, not slow SQL. A reserve+cancel cycle over HTTP is
2 HTTP exchanges and 24 round trips to PostgreSQL: 4 pings (sqlx checks a
pooled connection with a Sync before handing it out, `test_before_acquire`,
on by default) and 20 statements (per request the token lookup; for the
reserve BEGIN, the R9 lookup, the candidates, the lock, the re-check under
the lock, SAVEPOINT, the expiry at the point of use, the INSERT, its event,
RELEASE, COMMIT; for the cancel BEGIN, the reservation's machine, the machine
lock, the reservation lock, the UPDATE, its event, COMMIT). The ceiling is 2
calls. pg_stat_statements shows the statements themselves are cheap and
their plans cached (no re-planning): the candidate query about 0.23 ms, the
INSERT 0.25 ms, an event 0.12 ms. What costs is each round trip: a protocol
exchange, a snapshot and executor start-up per statement, and a process
wake-up on each side. perf on the server process (one profile, 8 clients)
put 55% of its CPU in the kernel (context switches, and the socket sends that wake the PostgreSQL
backend); the Rust code (actix, JSON, sqlx, tracing) is the rest.

So the 50% target is not reachable on this machine by tuning: the ceiling
needs well under a millisecond of CPU per reservation, the HTTP path several
times that. It is what the design costs: the rules live in Rust and run
statement by statement, each in the same transaction as the write it
guards. What would reduce the round trips, in files this bench does not own
(from the CPU columns, each round trip costs PostgreSQL about (HTTP minus
ceiling) / 22, some 0.05 ms here, plus the server's side of it):

0. `src/db.rs`, `connect`: `.test_before_acquire(false)` on the pool
   options: 4 round trips less per cycle. The cost: a connection broken
   while idle is found on its first statement (a 503, which
   `db::is_unavailable` already maps) instead of being replaced silently.
1. `src/allocator.rs`, `try_insert`: the INSERT and its `created` event as
   one statement (`WITH ins AS (INSERT ... RETURNING ...), ev AS (INSERT INTO
   reservation_events ... SELECT ... FROM ins) SELECT ... FROM ins`): one
   round trip less per reservation.
2. `src/reservations.rs`, `end` and `expire_overdue_on_machine`: the UPDATE
   and its event as one statement in the same way: one less per cancel (and
   per point-of-use expiry).
3. `src/reservations.rs`, `lock_for_transition`: the machine lookup and its
   lock in one statement (`SELECT id FROM machines WHERE id = (SELECT
   machine_id FROM reservations WHERE id = $1 AND org_id = $2) FOR UPDATE`;
   the machine of a reservation never changes): one less per cancel or
   conversion.

Together about 7 of 24 round trips: perhaps 20 to 30% more throughput, not
the several times the target asks for. Merging the lock with the re-check under it (`walk_candidates`)
is NOT one of them: the re-check must run in a statement that starts after
the lock is held, or a conversion that commits between the statement's
snapshot and the lock goes unseen (R10 has no constraint for that case).

Also seen while profiling, not a round trip: plans. The server's
connections prepare each statement once and, after a few executions, keep
a generic plan for their lifetime (until the table's statistics change).
On a freshly created database, whose `reservations` table was analyzed
empty, that generic plan for the allocator's held probe (`classified`) is a
sequential scan of `reservations`; every reservation written afterwards
makes it slower (auto_explain: 4 to 5 ms per call after 12,000 rows, the
HTTP rate falling run after run), until autoanalyze (every minute at best)
invalidates it. This bench therefore gives the database of items 1 and 5 a
history of 20,000 ended reservations before the server starts, as any
database in service has. With statistics that say what the table holds, the
probes go through the partial unique indexes and cost nothing as the table
grows (item 3). A deployment on an empty database meets this for its first
minutes only; `ALTER TABLE reservations SET (autovacuum_analyze_scale_factor
= 0.01)` in a migration would shorten it.";

const LATENCY8: &str = "The p99 at 8 clients is time spent waiting for a CPU: 8 clients, the
server's threads and 8 backends share the CPUs, and any other load on the
machine (see the load average) lands in the tail. At 32 clients the ceiling
itself falls below its 8-connection rate: 32 backends time-share the CPUs,
and the 3 or 4 clients of each site walk past each other's locked first
candidates; over HTTP the server's pool of 20 connections queues the
requests, which keeps PostgreSQL's concurrency at 20 and its ratio to the
ceiling higher.";

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
3 s target is thin on this 2-CPU machine and varies between runs.";

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
