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
- **A durable cluster.** The bench starts its own PostgreSQL with the
  durability settings it ships with (`fsync`, `synchronous_commit`,
  `full_page_writes` on; the machine table prints them), its data on the
  machine's disk: every commit of a reservation waits for its WAL to reach
  the disk, as in production. It sets only `pg_stat_statements` (item 7),
  `log_lock_waits` and a `deadlock_timeout` of 1 ms (so that every lock wait
  longer than 1 ms is written to its log and counted). `BENCH_DURABLE=0`
  runs the same items on a throwaway cluster (all three off): what is left is
  CPU cost only; such a run writes under target/bench/, never here.
- **Running part of it.** `BENCH_ONLY=throughput BENCH_CLIENTS=8` runs item 1
  (and 7) at 8 clients only; `BENCH_QUICK=1` runs every item at small
  sizes; `BENCH_PG_SET='commit_delay=100;commit_siblings=5'` sets server
  settings (ALTER SYSTEM) before the runs; `POOLKEEPER_DB_MAX_CONNECTIONS`
  sizes the server's pool. Any of these writes
  target/bench/BENCHMARKS-partial.md, not this file.
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
  migration. HTTP and ceiling runs alternate, on the same database and
  cluster. CPU per reservation is read
  from /proc (utime+stime) for the server process, the bench process and
  every PostgreSQL process. Per cycle, each run also reads the cluster's
  `pg_stat_wal` (WAL records, bytes, full-page images, syncs) and the
  database's `pg_stat_database.xact_commit` before and after, waiting
  `BENCH_SETTLE` seconds (10.5) after the run so that the idle backends
  have reported their last counters (PostgreSQL 15 flushes an idle
  backend's statistics up to 10 s late), and counts the `still waiting
  for` lines that `log_lock_waits` wrote to the server's log during the run.
  These counters hardly depend on the load of the machine; the rates do.
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

Since issue 21 the cluster is durable. Every reserve and every cancel is a
transaction whose commit waits until its WAL is on disk (one 8 kB write and
its fdatasync take about 0.15 ms on this machine's disk, by
`pg_test_fsync`); transactions that commit at the same moment share one
sync (group commit), which the syncs per cycle of the table show. The
ceiling runs on the same cluster, the same database and the same tables
as the API, so both write the same rows: their WAL records per cycle are
within a record of each other in the table. The issue's first figures (27
records against 10) compared the API with a ceiling that wrote lighter
rows; here the ratio is what the HTTP path costs beyond the same database
work, and the section below says what that work was cut to.

What the HTTP path adds is CPU: the server (its CPU per request is in the
table), the clients' HTTP, and more PostgreSQL CPU per cycle than the
ceiling's for the same two statements (the CPU columns). Most of that
PostgreSQL part is the functions. Measured on 2026-12-04 (item 1's
database on a private cluster, pgbench, 8 connections, prepared
statements, the two pairs alternating), `api_reserve_order` +
`api_transition` ran at 0.53 to 0.65 times the rate of the ceiling's pair
(1,028 against 1,925 cycles/s, 1,125 against 1,774, 986 against 1,506), not
the 0.8 to 0.9 of 2026-12-03: orders of several machines (R13) added frames
to the path of an order of one. Where the time goes, at one connection
with asynchronous commit (CPU only; pg_stat_statements with `track = all`
over 4,726 cycles): inside PostgreSQL `api_reserve_order` took 0.58 ms a
call against 0.30 ms for `bench_reserve`, `api_transition` 0.29 ms against
0.19 ms for `bench_cancel`. Of the reserve's 0.29 ms more: pass one through
`machine_verdicts` (R7's one definition of a verdict, its probes as
lateral joins) 0.07 ms against the ceiling's plain query 0.03; the bodies
of `reserve_order` and the walk 0.20 ms against 0.10 (the R9 ask, the
verdict checked again under the lock, the reason's words, the counters);
the result row built by `reserve_result_of` 0.03; the token check 0.03; the
frames of `api_reserve_order` and `reserve_order_walk` 0.05; the wider
insert and event 0.02. No one part dominates. A function's `SET` clauses
cost 1.3 to 2 µs a call (100,000 calls of an empty function with and
without three of them), not what matters, and calling the walk directly
for an order of one without its `SET` clauses left the ratio within the
noise (API over ceiling per cycle, 1 connection, 6 alternations each:
median ×1.58 against ×1.62), so it was not shipped. What would close the
gap: less work per call in the functions, a few hundredths of a
millisecond at a time (a pass one that asks only for candidates instead of
every verdict, the result row built in place, one frame for an order of
one), with every concurrency test unchanged in what it asserts.
The rest comes with the pool: a request goes to whichever pooled connection is
free, so successive statements wake different backends (sqlx hands idle
connections out in turn), and each backend sleeps and wakes between
requests while the HTTP exchange happens. At 1 client on a quiet machine
(2026-12-03 20:49, load average 0.4) PostgreSQL's CPU per cycle was 1.03 to
1.06 ms over HTTP with the default pool against 0.52 to 0.59 ms in the
ceiling, and 0.92 to 0.99 ms with a pool of 2: the rotation through idle
connections is a small part; the rest is per request (waking the backend
for each statement, the wider result row the API returns, the functions'
extra work above). On the loaded machine of the afternoon the same
figure was 1.75 ms: a backend woken after a wait for a CPU costs more.

The pool, measured at 8 clients on the durable cluster
(`POOLKEEPER_DB_MAX_CONNECTIONS`, quick runs of 2026-12-03 with a load
average of 6 to 14 from other work): with 8 connections PostgreSQL's CPU
per cycle fell from 1.2-1.3 ms to 0.9-1.05 ms, but the rate moved within
the noise; with 4 connections the syncs per cycle rose from 0.65 to 1.1
and the rate fell by half or more: with fewer connections than requests in
flight, commits stop sharing syncs and requests queue for a connection
while a commit waits for the disk. Under durable commits the pool should
hold at least as many connections as requests in flight; the default (20)
stays, and docs/configuration.md says why.

`commit_delay` (a committing backend waits that long for others to join
its sync when at least `commit_siblings` other transactions are active):
with `BENCH_PG_SET='commit_delay=200'` the ceiling's syncs per cycle fell
from 0.55 to 0.44, the API's stayed at 0.64. The API's transactions are
seldom five at once inside the database (the rest of each request is HTTP
and the server), so the condition rarely holds and the delay buys nothing
for it. Not recommended from these figures; docs/testing.md says so.

The first version of the bench (2026-12-02) found the HTTP path at 16% of
the ceiling at 8 clients, from round trips: a reserve+cancel cycle was 24
round trips to PostgreSQL. Each decision is now one statement (item 7
counts them): the reserve is `api_reserve`, the cancel and the convert
`api_transition`, with the token check in the same statement; the rules
are in `sql/allocator.sql` and `sql/transitions.sql`, tied to their
numbers, and
`src/allocator.rs` says where each one lives. The ceiling is still the
bench's own pair of functions, never the shipped path.";

const LATENCY8: &str = "The p99 at 8 clients. In the runs of 2026-12-03 (quick runs and
one item-1 run, load average 6 to 14 from other work on 2 CPUs) the API's
reserve p99 ranged from 17 to 100 ms and the ceiling's from 11 to 56 ms,
moving together with the load; single calls of 150 to 230 ms appeared on
both sides. The tail is mostly time spent waiting for a CPU: 8 clients,
the server's threads and 8 or more backends share 2 CPUs with whatever else
runs. The API's tail is longer than the ceiling's because a request is
three processes in turn (client, server, backend), each of which can wait
for a CPU, against two. One stall the bench itself caused is gone: it
loaded its data (10,000 machines, 20,000 ended reservations, VACUUM
ANALYZE) and measured at once, so the checkpoint owed for the load (4,319
buffers, 1.1 s of fsync over 456 files, in the server's log) landed in
the first runs; the bench now runs CHECKPOINT before the server starts. A
timed checkpoint (`checkpoint_timeout`, 5 minutes) still falls in some runs
of a full bench, as it would in production; the full-page images per cycle
show it. At 32 clients the 3 or 4 clients of each site walk past each
other's locked first candidates (the lock waits of that row are a cancel
waiting for an order that locked the same machine in its walk); over HTTP
the server's pool of 20 connections queues the requests.";

const WRITES: &str = "### What each cycle writes (issue 21)

Measured with `pg_walinspect` (`pg_get_wal_stats` between two LSNs) on a
durable cluster of this machine, 8 connections calling the shipped
`api_reserve` + `api_transition` through pgbench, per reserve+cancel cycle
(the bench's ceiling writes the same rows and measured the same counts):

| | before (2026-12-03, migrations up to 20261203000007) | after (20261203200001_hot_path_locks.sql) |
| --- | --- | --- |
| WAL records | 33.1 | 22.9 |
| WAL bytes | 3.4 kB | 2.7 kB |
| btree insertions (Btree/INSERT_LEAF) | 15.0 | 12.0 |
| row locks (Heap/LOCK) | 8.1 | 4.1 |
| MultiXacts created (MultiXact/CREATE_ID) | 3.2 | 0 |
| heap inserts, updates, commits | 3, 1, 2 | 3, 1, 2 |

Where the difference came from:

- **Foreign key checks on rows every order shares.** A foreign key check
  locks the row it finds (`FOR KEY SHARE`): a WAL record and a write to that
  row's page. Half the row locks of a cycle were such checks on rows that
  every order touches whatever its machine: the organization's row (each
  reserve) and the rows `held` and `cancelled` of `reservation_states`
  (each reserve, each cancel, each event). With several orders at once
  each new locker of such a row creates a MultiXact (3.2 per cycle): orders
  for different machines met on one page. Now a reservation names \"the
  machine of the organization\" with one key, `(machine_id, org_id)` to
  `machines (id, org_id)`, whose check finds the machine row already locked
  `FOR UPDATE` by the allocator or the transition and writes nothing (it is
  stricter too: a reservation's organization is its machine's), and the
  state columns check their values with a CHECK that
  `tests/api/schema.rs` compares with `reservation_states` (R2's table stays
  the one list of states and of which hold capacity).
- **Indexes.** Every index entry is a WAL record, and the end of a
  reservation is a non-HOT update (its `state` is in the arbiter's
  predicate, R1), so each index that is not partial on `held` gets a second
  entry on every cancel, convert or expiry. Each index, what needs it, and
  its entries per reserve + end:

| index | needed by | entries per cycle |
| --- | --- | --- |
| `reservations_pkey` (id) | every lookup by id: cancel, convert, GET, the reservation's page | 2 |
| `reservations_order_ref_unique_per_org` | R9 (the order's key) | 2 |
| `reservations_one_holder_per_machine` (partial: held) | R1's arbiter, the allocator's held probe | 1 |
| `reservations_held_by_deadline_idx` (partial: held) | the sweep (R11) | 1 |
| `reservations_by_machine_idx` (machine_id, created_at) | the machine's page: its reservations, newest first | 2 |
| `reservations_recent_activity_idx` (org_id, later of created_at and ended_at) | the overview's 24-hour chart; it replaces `reservations_created_recently_idx` and `reservations_ended_recently_idx` (3 entries per cycle) | 2 |
| `reservation_events_pkey` (reservation_id, id) | the reservation's page (its events in order); it replaces the primary key on id and `reservation_events_by_reservation_idx` (4 entries per cycle): nothing reads an event by its id alone, and the outbox names an event by the pair | 2 |

  The two chart indexes became one because a reservation created or ended
  since an instant is exactly one whose later time is since that instant:
  one range of one index holds both series (`src/dashboard/overview.rs`;
  EXPLAIN with 1,000,000 ended reservations and 50,000 machines: a bitmap
  scan of that index, generic plan included).

What is left: 4 row locks (the machine on reserve and on cancel, the
reservation on cancel, the new reservation by its `created` event's key,
all of the order's own rows), 12 index entries, and the end of a
reservation rewriting its whole row (about 530 bytes of its 2.7 kB: the
frozen reason and machine snapshot are copied into the new row version).
What would shrink that last part: the frozen account in a table of its own,
written once at creation, so that the row that changes state is narrow;
that changes every reader of a reservation and was not done here.";

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
reservation is a non-HOT update (its state is in the arbiter's predicate,
`ended_at` in the recent-activity key) so 4 index insertions (primary key,
order, machine, recent activity), plus an event row with 1 index insertion
and 1 foreign key check (its reservation, already locked by the update, so
it writes nothing). Before issue 21 it was 5 index insertions, 2 for the
event, and 4 foreign key checks (the states against `reservation_states`
are CHECK constraints now; see item 1's section). On a durable cluster each
batch's commit also waits for its WAL to reach the disk. That is 30 to 45 µs per reservation on one CPU of this machine, hence about
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
once). Measured alone in psql (100,000 expiries in batches of 500), the
trigger costs about 5%. The overview's chart index that came with it
(about 3%) is gone again: the chart's two indexes are one since issue 21.
What would widen the margin further: a third batch statement at a time.";

const PAGES: &str = "### What limits item 5 (pages)

Measured with pg_stat_statements (2026-12-04, 50,000 machines, site
filter): a `/machines` view ran the counts per pool state (2.5 to 3 ms
alone in psql, 4 to 4.7 ms a view from the server, one reader; index-only on `machines_pool_counts_idx` and
`machines_pool_probe_idx`; 7.8 ms before those indexes), the page of
machines (0.8 to 1 ms), the filters' selects (0.3 ms) and the session check
(0.06 ms). Until issue 23's follow-up the session check was an UPDATE of
`last_seen_at` on every view: a durable commit per page, and the 8 readers,
who share one session, queued on its row (5.2 ms mean under load); it now
writes at most once per tenth of the idle timeout. Each statement is
written for the filters the page sets, with its limit written in (the
page's size, a constant of the code), so that PostgreSQL can keep one
plan: with `($2 IS NULL OR m.site = $2)` it planned the counts and the
list again at every view (0.8 ms each), and a `LIMIT $n`, which a generic
plan takes for a tenth of the rows, kept the order spec's list of
verdicts (`allocator::explain`) planned at every view (0.77 ms of planning
for 0.87 ms of execution; now 0.78 ms and no planning). Some statements
are still planned at every view because their custom plans, which see the
values, always cost less than a generic one: the list with a site and a
status (0.7 ms of planning), and the counts with a site and a profile
(0.6 ms) on this skewed inventory (4 machines in 5 of one profile). The column \"one reader, no load\" is the page's
own time. Under load, the rest is waiting for a CPU: 8 readers in a closed
loop, 8 ordering clients, the server and PostgreSQL share 2 CPUs, so a
page's latency is about the work of every request in flight over 2, and
the readers take CPU from the orders as much as the reverse (the
allocation rate during the page runs is in the table). The CPU speed check
in the machine table says how fast the machine was: the same loop took
1.6 times as long within one hour on this shared machine, and the page
times follow it. What would lower the p99 further in the pages: the counts
are the largest part left (they read every machine of the filter, index
only); a count kept per site and state would make them constant, at the
price of a write on every reserve and cancel, which the hot path does not
pay today. The live page (`src/dashboard/reservations.rs`, 100 rows a
page) counts every hold of the organization for its header (0.65 ms at
1,000 holds).";

/// For each target of item 1 this run missed: by how much, why, and what
/// would close it (from the figures of the run and the notes above).
fn missed(results: &Results) -> String {
    let mut out = String::new();
    let w = &mut out;
    let mut any = false;
    for t in &results.throughput {
        let target = match t.clients {
            1 => 0.35,
            8 | 32 => 0.5,
            _ => continue,
        };
        if t.ratio >= target {
            continue;
        }
        any = true;
        let http_cpu = t.http_cpu.server_ms + t.http_cpu.postgres_ms + t.http_cpu.client_ms;
        let _ = writeln!(
            w,
            "- **{} client{}: HTTP at {:.0}% of the ceiling, {:.0} point{} short of {:.0}%.** CPU per cycle over HTTP {:.2} ms (server {:.2}, clients {:.2}, PostgreSQL {:.2}) against {:.2} ms in the ceiling; WAL syncs per cycle {:.2} against {:.2}. {}",
            t.clients,
            if t.clients == 1 { "" } else { "s" },
            t.ratio * 100.0,
            (target - t.ratio) * 100.0,
            if ((target - t.ratio) * 100.0).round() == 1.0 {
                ""
            } else {
                "s"
            },
            target * 100.0,
            http_cpu,
            t.http_cpu.server_ms,
            t.http_cpu.client_ms,
            t.http_cpu.postgres_ms,
            t.db_cpu.total_ms,
            t.http_wal.syncs,
            t.db_wal.syncs,
            if t.clients == 1 {
                "One client waits for every commit alone (no group commit on either side), so the rate is one over the time of a cycle: the HTTP exchange and the server's work add to each of the two commits' waits. What would close it: less CPU per request in the server, the client and above all PostgreSQL (the CPU columns: inside the database the API's functions cost about twice the ceiling's, see above for where), not less WAL."
            } else {
                "The machine is busy during both runs, so the ratio is about CPU per cycle. What would close it: less PostgreSQL CPU per call, first from the functions (pgbench puts the API's pair at 0.53 to 0.65 times the ceiling's rate inside the database, see above for where), then fewer backend wake-ups per request (a pool that hands out the most recently used connection first, which sqlx's pool cannot be told to do) and less server CPU per request."
            }
        );
    }
    if let Some(t8) = results.throughput.iter().find(|t| t.clients == 8) {
        if t8.http_reserve.p99_ms >= 25.0 {
            any = true;
            let _ = writeln!(
                w,
                "- **Reserve p99 at 8 clients: {:.1} ms against < 25 ms ({:.1} ms over).** The ceiling's reserve p99 in the same runs: {:.1} ms; the load average is in the machine table. When the ceiling's tail is as long, the time is spent waiting for a CPU (see above); what would close it is a machine not shared with other work, or fewer processes per CPU (clients, server and PostgreSQL here share 2).",
                t8.http_reserve.p99_ms,
                t8.http_reserve.p99_ms - 25.0,
                t8.db_reserve.p99_ms
            );
        }
        let cpu_http = t8.http_cpu.server_ms + t8.http_cpu.postgres_ms;
        if cpu_http > 2.0 * t8.db_cpu.postgres_ms {
            any = true;
            let _ = writeln!(
                w,
                "- **CPU per reservation at 8 clients (issue 11's target): ×{:.2} the ceiling's, against ≤ ×2.** Server {:.2} ms and PostgreSQL {:.2} ms per cycle against PostgreSQL {:.2} ms in the ceiling: the PostgreSQL part is most of it (the functions' work per call first, then the backends woken per request, see above). What would close it: less work per call in the allocator's functions (see above for where; not done here), and the pool handing out its most recently used connection first.",
                cpu_http / t8.db_cpu.postgres_ms.max(1e-9),
                t8.http_cpu.server_ms,
                t8.http_cpu.postgres_ms,
                t8.db_cpu.postgres_ms
            );
        }
        let (h, d) = (&t8.http_wal, &t8.db_wal);
        if h.lock_waits + d.lock_waits > 0 {
            any = true;
            let _ = writeln!(
                w,
                "- **Lock waits at 8 clients: {} over HTTP, {} in the ceiling, of which {} and {} on a table's extension** (the others waited on a row or a transaction; the examples in the table say which). An extension wait is PostgreSQL adding a page to a table (`reservations`, `reservation_events`): one backend at a time holds that lock while it adds the page, and a backend that loses its CPU while holding it makes the others wait longer than `deadlock_timeout` (1 ms). What would close it: fewer new pages per cycle (narrower rows: the end of a reservation copies its frozen reason and snapshot into the new row version), a quieter machine; PostgreSQL 16 extends tables by many pages at once under contention.",
                h.lock_waits, d.lock_waits, h.extension_waits, d.extension_waits
            );
        }
    }
    if any {
        format!("### Targets of item 1 missed in this run\n\n{out}")
    } else {
        String::new()
    }
}

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
        let (h, d) = (&t8.http_wal, &t8.db_wal);
        let _ = writeln!(
            w,
            "Per cycle at 8 clients: {:.1} WAL records, {:.0} bytes, {:.2} full-page images, {:.2} WAL syncs and {:.2} commits over HTTP, against {:.1}, {:.0}, {:.2}, {:.2} and {:.2} in the ceiling.\n",
            h.records,
            h.bytes,
            h.fpi,
            h.syncs,
            h.commits,
            d.records,
            d.bytes,
            d.fpi,
            d.syncs,
            d.commits
        );
        let _ = writeln!(w, "{THROUGHPUT}\n");
        let _ = writeln!(w, "{LATENCY8}\n");
        let _ = writeln!(w, "{WRITES}\n");
        let _ = writeln!(w, "{}", missed(results));
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
        let shipped = median(
            &results
                .sweep
                .iter()
                .filter(|r| r.parallel == 2)
                .map(|r| r.total_ms / 1000.0)
                .collect::<Vec<_>>(),
        );
        if shipped >= 3.0 {
            let _ = writeln!(
                w,
                "**Missed in this run: {shipped:.2} s against < 3 s ({:.2} s over).** {} What would close it on such a machine: a third batch statement at a time where there is a CPU for it (two at once gained ×{:.2} here), or fewer index entries per expired reservation.\n",
                shipped - 3.0,
                speed(results),
                per(1) / per(2).max(f64::MIN_POSITIVE),
            );
        }
    }
    if let Some(p) = &results.pages {
        let _ = writeln!(w, "{PAGES}\n");
        let worst = p
            .pages
            .iter()
            .map(|(_, _, _, l)| l.p99_ms)
            .fold(0.0, f64::max);
        if worst >= 50.0 {
            let alone = p.alone.iter().map(|l| l.p50_ms).fold(0.0, f64::max);
            let _ = writeln!(
                w,
                "**Missed in this run: the slowest page's p99 is {worst:.1} ms against < 50 ms ({:.1} ms over).** Its own time is at most {alone:.1} ms (p50, one reader, no load); the rest is waiting for a CPU behind the other 15 clients. {} What would close it: less work per page (above), or a machine whose CPUs are not shared.\n",
                worst - 50.0,
                speed(results),
            );
        }
    }
    out
}

/// The run of 2026-12-03 21:48 UTC (Intel Xeon, 2 CPUs), which met the
/// sweep's target (1.73 s): its database ceiling at 1 connection.
const REFERENCE_CEILING_1: f64 = 1048.0;

/// How fast this run's machine was, against the reference run, by a yardstick
/// that no change of ours moves: the database's ceiling at one connection
/// (PL/pgSQL created by the bench, on the same cluster settings).
fn speed(results: &Results) -> String {
    let Some(t) = results.throughput.iter().find(|t| t.clients == 1) else {
        return "(No 1-client ceiling in this run to compare the machine's speed with.)".to_owned();
    };
    format!(
        "The database's own ceiling at 1 connection ran {:.0}/s in this run, against {REFERENCE_CEILING_1:.0}/s in the run of 2026-12-03 21:48 UTC (Intel Xeon; the sweep 1.73 s, the pages' p99 49.6 to 60.7 ms): PL/pgSQL that no change of ours touches, so the machine did the same work ×{:.2} as fast (see the CPU model and the CPU speed check in the machine table).",
        t.db_cycles_per_s,
        t.db_cycles_per_s / REFERENCE_CEILING_1,
    )
}
