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
  of another profile, a fifth of them in maintenance), 1,000 held
  reservations of an hour and 25,000 machines in service (a converted
  reservation and a live service link each: a shop sells most of its
  pool). A viewer created with `poolkeeper::staff::create`
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
  execute, `COMMIT`).
- **11. Healing (R15).** A rack of 200 machines, each under a live hold,
  with 200 spares of the same site and profile among 20,000 other
  machines. One status change puts the rack into maintenance through
  `poolkeeper::healing::change_status` (what the API and the dashboard
  call): the trigger moves every hold to a spare in the same transaction.
  Timed from the first statement to the commit; the dry run (the same change
  rolled back, the dashboard's preview) beside it. Each run reloads the holds.
- **12. Tracing.** Item 1's cycle at 8 clients against two servers that
  take turns, run after run, on one database: tracing off (no OTLP
  variable), and OpenTelemetry on at a 1% sampler
  (`parentbased_traceidratio`, 0.01; the clients send no `traceparent`),
  exporting over OTLP/HTTP to a sink the bench runs on loopback. Each server
  is started fresh and stopped in order (which flushes its spans).
- **13. Headroom (R18).** Item 1's cycle at 8 clients on item 1's database
  and server, runs alternating: every pool keeping 1 machine for a segment
  the orders never name (each reserve then takes the pool's turn, a
  transaction-scoped advisory lock, and counts the pool's last sellable
  machines in its own transaction), and no headroom at all. The headroom
  never binds (a pool has 1,000 machines), so both sell the same machines;
  the ratio is the cost of the turn and the count. `BENCH_ONLY=headroom`.
- **14. Capacity (R17).** On item 5's organization (50,000 machines),
  `page_readers` clients read `GET /api/v1/capacity` of one pool (a site and
  profile) in a loop beside item 1's load at 8 clients; each run measures the
  load alone first, then the load with the readers, so that the reserve rate
  with readers is read against the rate without. `BENCH_ONLY=capacity`.
- **15. Statement by statement.** Item 1's cycle at 8 clients on item 1's
  database and server, one run with `pg_stat_statements.track = all` (set
  with `ALTER SYSTEM` and a reload, then set back), on pools without
  headroom and on pools keeping 1 machine for a segment (item 13's); the
  table gives each statement's calls, executor time, buffers and WAL per
  cycle, nested statements included, so that a regression names its
  statement. `BENCH_ONLY=statements`.";

const THROUGHPUT: &str = "### What limits item 1 (HTTP API against the database's ceiling)

The cluster is durable: every reserve and every cancel is a transaction
whose commit waits until its WAL is on disk (one 8 kB write and its
fdatasync take about 0.15 ms on this machine's disk, by `pg_test_fsync`);
transactions that commit together share one sync (group commit), which the
syncs per cycle show. The ceiling runs on the same cluster, database and
tables as the API and writes the same rows (their WAL records per cycle
are within a record of each other), so the ratio is what the HTTP path
costs beyond the same database work.

The ceiling runs two to three times faster than the API, and
PostgreSQL's CPU per cycle falls with the rate (commits share a flush, a
backend finds its next request waiting instead of sleeping): paced to
the API's rate the ceiling costs more per cycle than flat out (0.67 to
0.94 ms against 0.53 to 0.78 ms in nine runs of one day at 8
connections). At 8 clients the ceiling therefore also runs paced to each
HTTP run's rate, the same work at the same pace, in a row of its own:
the comparison that says what the API's statements cost beyond the
ceiling's. Neither holds still: on this machine each figure moves by
10 to 15% from run to run (a ratio of ×1.47 to ×2.08 paced, on one
code), more than the distance between the goal and the median; read the
medians of several runs, and the table of item 15 for what moved.

What the HTTP path adds is CPU: the server's (per request, in the table),
the clients' HTTP, and more PostgreSQL CPU per cycle than the ceiling's for
the same two decisions. Most of the PostgreSQL part is the functions:
inside the database `api_reserve_order` costs about twice the ceiling's
`bench_reserve` (0.58 against 0.30 ms a call at one connection, CPU only),
`api_transition` about 1.5 times `bench_cancel` (0.29 against 0.19 ms),
measured with pg_stat_statements (`track = all`). The reserve's extra is
spread: pass one through `machine_verdicts` (R7's one definition of a
verdict) 0.04 ms more than a plain query, the walk's bodies 0.10 ms (the
R9 lookup, the verdict checked again under the lock, the reason's words,
the counters), the result row 0.03, the token check 0.03, the function
frames 0.05, the wider insert and event 0.02. No part dominates. What
would close the gap: less work per call in the functions, a few
hundredths of a millisecond at a time (a pass one that asks only for
candidates, the result row built in place, one frame for an order of
one), with every concurrency test unchanged in what it asserts. The
token check was one: `api_caller` was a PL/pgSQL function called by a
statement of its own; as one SQL SELECT, PostgreSQL inlines it into its
caller's statement (its two statements per cycle, 38 to 43 µs before,
13 to 14 µs after, by pg_stat_statements at one pgbench connection with
synchronous_commit off, where a backend's CPU per cycle read 0.64 to
0.79 ms for the API's two calls and 0.45 to 0.46 ms for the ceiling's).
By the same count, what the API's functions do themselves, beyond the
statements they run, was about 0.24 ms a cycle (four frames for the
reserve and three for the cancel, the composite result rows passed up
through each, the savepoint, `SET` on four of them) against the
ceiling's 0.11 ms (two frames, the same savepoint). The result rows were
the largest part: built one field at a time (a PL/pgSQL step per field,
46 of them per cycle), then by one row constructor each, the backend's
CPU per cycle at one connection fell by 8% (median of three alternating
rounds, 758 to 695 µs). Tried and not kept, being within the noise:
`SET` removed from the two nested functions, and the cancel's end
written inline instead of in `reservation_end`'s frame.

pg_stat_statements leaves out the start of each statement's plan, which is
where most of the functions' own time goes. `perf` on the backend at one
pgbench connection (synchronous_commit off, 10,000 machines, without
headroom; shares of the backend's CPU turned into µs with the CPU per
cycle of the same hour, about 790 µs for the API's two calls and 470 for
the ceiling's): starting plans (`standard_ExecutorStart`) takes 18% of
the API's (about 145 µs a cycle) against 13% of the ceiling's (about 60):
each statement the functions run, however small (the verdict checked
again under the lock, the result rows handed from frame to frame), builds
its executor state afresh. PL/pgSQL's expressions are set up once per
transaction (`ExecInitExprWithParams`, 3.2% against 0.5%, about 25 µs).
Both sides pay about 60 to 70 µs a cycle for the tables' CHECK
constraints: PostgreSQL 15 reads and plans them again at each INSERT and
UPDATE (`ExecConstraints`, 9 to 13%); that is the same work on both
sides and does not move the ratio. The issue's first lead, expiring at the
point of use only a candidate found overdue, was measured at its bound
first: with the expiry's UPDATE removed from the walk altogether, CPU per
cycle read 677, 694 and 698 µs against 669, 675 and 733 µs with it
(alternated), within the noise; it was not pursued, since it would also
have widened the verdict's type, which R7 shares with the dashboard.

Fewer statements, then, each measured as backend CPU per cycle at one
pgbench connection (synchronous_commit off, 10,000 machines, without
headroom, the forms alternated). Kept: the walk hands its rows up one
`RETURN NEXT` at a time instead of by a query over `unnest` of them, and
`reserve_order` likewise for an order it took, which leaves two plans
fewer to start per reserve: 597 µs median of six rounds against 630
(581 to 628 against 577 to 727). Tried and not kept: the token checked by
the server's own statement, `api_caller` joined to `reserve_order` with
a one-time filter instead of through `api_reserve_order`'s frame, cost
more (685 to 813 µs against 653 to 708; 693 to 721 with a generic plan
forced): the client's statement then plans and starts the join itself;
the walk as a function returning an array, called as an expression
rather than by a query, read the same (597 to 706 against 599 to 635);
and the cancel's answer by `RETURN NEXT` instead of a query, within the
noise (619 to 806 against 602 to 711).

The rest comes with the pool: a request goes to whichever pooled
connection is free, so successive statements wake different backends, and
each backend sleeps and wakes between requests while the HTTP exchange
happens. On a quiet machine PostgreSQL's CPU per cycle at 1 client is
about 1.05 ms over HTTP against 0.55 ms in the ceiling, and 0.95 ms with a
pool of 2: the rotation through idle connections is a small part, the rest
is per request. A backend woken after waiting for a CPU costs more, so the
figure grows with the load.

The pool must hold at least as many connections as requests in flight:
with 4 connections for 8 clients, commits stop sharing syncs (syncs per
cycle 0.65 to 1.1) and requests queue for a connection while a commit
waits for the disk, and the rate falls by half; 8 connections change the
rate within the noise. The default (20) stays; docs/configuration.md says
why. `commit_delay` buys nothing for the API: its transactions are seldom
five at once inside the database (the rest of each request is HTTP and the
server), so the delay's condition rarely holds; docs/testing.md says so.

Each decision is one statement (item 7 counts them): the reserve is
`api_reserve_order`, the cancel and the convert `api_transition`, with
the token checked in the same statement; the rules are in
`sql/allocator.sql` and `sql/transitions.sql`, tied to their numbers. The
ceiling is the bench's own pair of functions, never the shipped path.

In a pool that keeps headroom (item 13) a reserve also takes the pool's
turn (an advisory lock held to the commit), asks R9 once more in the turn,
sums what the pool keeps for other segments and counts the pool's last
sellable machines. The sum was a SQL function, which PostgreSQL 15 cannot
inline as a value (its body has a FROM) and so planned again at every
reserve; as PL/pgSQL its plan is kept for the session. Backend CPU per
cycle at one pgbench connection (synchronous_commit off, the two forms
alternated three times): 906 µs median with the SQL form, 811 with
PL/pgSQL, 647 to 662 without headroom in the same hour. Nothing else on
the reserve's or the cancel's path is a SQL function left to plan at each
call: the others (`machine_candidates`, `machine_verdicts`, `api_caller`,
`first_batch`, `pool_turn`) are inlined into the statement that calls
them, which pg_stat_statements shows (an uninlined SQL function's body
appears there as a statement of its own).

On Debian's stock cluster (the same PostgreSQL 15 binaries, its own
`postgresql.conf`, TLS on as Debian ships it), reached over TCP with
`BENCH_DATABASE_URL`, item 1 at 8 clients reads about as it does on the
bench's cluster over its Unix socket. Six partial runs taking turns in one
hour (each the median of 3 runs; PostgreSQL's CPU per cycle, API and
ceiling paced to its rate): the bench's cluster 1.36 ms over 0.76 (×1.78)
and 1.38 over 1.01 (×1.37); stock over TCP with TLS 1.43 over 1.00
(×1.43) and 1.52 over 0.87 (×1.74); stock over TCP without TLS 1.48 over
1.00 (×1.48) and 1.29 over 0.80 (×1.60). The API's share of the ceiling
by CPU was 0.44, 0.58; 0.55, 0.45; 0.53, 0.50. Where the difference goes:
TCP and TLS cost PostgreSQL about 0.1 ms per cycle (1.48 against 1.37,
the pairs' means), the same in the ceiling's statements, which cross the
same socket; TLS costs the server about 0.03 ms per cycle (0.39 to 0.40
against 0.36 over the socket; its sqlx connections encrypt each message).
Both are within one run's noise, which on the same cluster moved the ratio
from ×1.37 to ×1.78 within the hour, mostly by the paced ceiling's own CPU
per cycle (0.76 to 1.01 ms). The API sends each statement as one message
batch per round trip (one statement per call, item 7), so nothing of ours
is left to merge there. An earlier reading of the stock cluster (1.51 to
1.67 ms for the API against 0.95 to 1.07 on the bench's cluster) was of
older code, at another time; taken in turns with the current code, the
difference is the one above.";

const LATENCY8: &str = "The p99 at 8 clients is mostly time spent waiting for a CPU: 8 clients,
the server's threads and 8 or more backends share 2 CPUs with whatever
else runs, and a request is three processes in turn (client, server,
backend), each of which can wait, against two in the ceiling, so the API's
tail is the longer and both move with the load average. The bench runs
CHECKPOINT after loading its data, so that the checkpoint owed for the
load does not land in the first runs; a timed checkpoint
(`checkpoint_timeout`, 5 minutes) may still fall in a run, as in
production, and the full-page images per cycle show it. At 32 clients the
3 or 4 clients of each site walk past each other's locked first
candidates, and over HTTP the server's pool of 20 connections queues the
requests.";

const WRITES: &str = "### What each cycle writes

Measured on 2026-12-03 with `pg_walinspect` (`pg_get_wal_stats` between
two LSNs) on a durable cluster of this machine, 8 connections calling the
API's reserve and cancel functions of that day through pgbench, per
reserve+cancel cycle (the bench's ceiling writes the same rows and measures
the same counts; item 1's WAL records and bytes per cycle, above, are this
run's):

| per reserve+cancel cycle | |
| --- | --- |
| WAL records | 22.9 |
| WAL bytes | 2.7 kB |
| btree insertions (Btree/INSERT_LEAF) | 12.0 |
| row locks (Heap/LOCK) | 4.1 |
| MultiXacts created (MultiXact/CREATE_ID) | 0 |
| heap inserts, updates, commits | 3, 1, 2 |

Why it is no more than that:

- **No foreign key check on rows every order shares.** A foreign key
  check locks the row it finds (`FOR KEY SHARE`): a WAL record, and with
  several orders at once a MultiXact on a page every order meets (the
  organization's row, the rows of `reservation_states`). A reservation
  names \"the machine of the organization\" with one key, `(machine_id, org_id)` to
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
| `reservations_recent_activity_idx` (org_id, later of created_at and ended_at) | the overview's 24-hour chart, both of its series | 2 |
| `reservation_events_pkey` (reservation_id, id) | the reservation's page (its events in order); nothing reads an event by its id alone, and the outbox names an event by the pair | 2 |

  One chart index serves both series because a reservation created or
  ended since an instant is exactly one whose later time is since that
  instant: one range of one index holds both (`src/dashboard/overview.rs`;
  EXPLAIN with 1,000,000 ended reservations and 50,000 machines: a bitmap
  scan of that index, generic plan included).

What is left: 4 row locks (the machine on reserve and on cancel, the
reservation on cancel, the new reservation by its `created` event's key,
all of the order's own rows), 12 index entries, and the end of a
reservation rewriting its whole row (about 530 bytes of its 2.7 kB: the
frozen reason and machine snapshot are copied into the new row version).
What would shrink that last part: the frozen account in a table of its own,
written once at creation, so that the row that changes state is narrow;
that changes every reader of a reservation.";

const FILL: &str = "### Item 6 (a fresh deployment filling up)

Each connection keeps the plans of its statements for its whole life, so a
plan made while `reservations` looked empty must stay good as the table
grows. The allocator's and the transitions' functions carry `SET
enable_seqscan = off`, so such a plan cannot be a sequential scan, and each
probe has exactly one index that answers it with an index condition (the
held probe's predicate is exactly the arbiter's,
`reservations_one_holder_per_machine`; the sweep's deadline index is
declared `WHERE state = 'held' AND expires_at IS NOT NULL`, which the
sweep's own condition implies and the probe's does not). The lookups by
order ref and by id keep the organization out of their index conditions,
so that no index led by `org_id` can be taken for them on an empty-looking
table. Tests cache the plans on an analyzed-empty table, add 5,000
reservations, and check the plans and the buffers a reserve and a cancel
read. Item 6 runs with no pre-loaded history: the rate of its last tenth
against its first is the measure.";

const GROWTH: &str = "### Item 3 (growth)

Reserve never reads the ended history. The held-or-not probe of each
candidate goes through the partial unique index of held reservations, the
in-service probe through the partial unique index of live service links, the
idempotency lookup through the unique (org_id, order_ref) index, one level
deeper at a million rows. EXPLAIN (ANALYZE, BUFFERS) with 1,000,000 ended
reservations: the candidate query touches the site's machines and a single
page of reservations, the R9 lookup 7 pages. What grows is the cost of the
inserts into the btrees of `reservations` and `reservation_events`,
logarithmic.

Sold machines stay `ready`, and a shop sells its oldest machines first, the
lowest ids. Pass one walked an index of every ready machine in id order,
so each reserve stepped over every sold machine ahead of the first
sellable one, probing its live link and its hold: by EXPLAIN (ANALYZE,
BUFFERS) of the generic plan on a copy of item 5's pool with 900 sold
machines ahead of 100 sellable, the candidate list took 5.3 ms (6,300
buffers); in a pool whose sold machines are spread out, 0.43 to 0.46 ms
by pgbench. The walk now leaves out the machines whose copy says they are
in service (`machines.in_service`, item 5) on an index of the sellable
ones, `machines_sellable_idx` (org, site, profile, id) where ready and not
in service: 0.15 ms and 20 buffers on the same copy. The live link probe
still decides each candidate. The row with 9 in 10 of every pool sold, the
lowest ids, measures it through `allocator::reserve` against the step
with no history: in a partial run of this item with the definitions from
before the change applied over the new ones (`BENCH_SQL_FILES`), reserve
took 3.87 ms at p50 and 6.28 ms at p99 there, against 0.86 and 2.64 ms
with none sold (×4.5); with the change, 0.83 and 1.63 ms against 0.88
and 2.65 ms.";

const GROWTH_MISSED: &str = "If the ratio is above the target in this run while p50 stays within
a few tenths of a millisecond, it is noise: each step is measured after
loading and vacuuming hundreds of megabytes, on a machine shared with other
work; the plans do not change (see above).";

const SWEEP: &str = "### What limits item 4 (the sweep)

A batch of 500 is one statement: find 500 overdue rows in deadline order on
the partial index of held reservations, update them, write 500 `expired`
events, and return the count. The rows it finds are first slots, locked as
they are found; an order of one is nothing more, so only orders of several
look up and lock their other slots (a probe of the order's key per row
before, 23-25 against 25-26 ms a batch in psql). EXPLAIN (ANALYZE, BUFFERS) of one batch: the
scan and locking take under 1 ms; the rest is per row. Each expired
reservation is a non-HOT update (its state is in the arbiter's predicate,
`ended_at` in the recent-activity key), so 4 index insertions (primary
key, order, machine, recent activity), plus an event row with 1 index
insertion and 1 foreign key check (its reservation, already locked by the
update, so it writes nothing); the webhook outbox trigger runs once per
statement (about 5% of the sweep's time). On a durable cluster each
batch's commit also waits for its WAL. That is 30 to 45 µs per
reservation on one CPU of this machine.

The shipped sweep runs two batch statements at a time on the worker's two
connections (`sweep::expire_two_batches`): `SKIP LOCKED` gives them
disjoint rows, each checks the fence in the same statement, and the run's
count is added up by the worker and written once by `finish_run`, so the
two never wait for each other. The one-at-a-time row is there for
comparison. A larger `BATCH_SIZE` would not help: the cost is per row, and
a batch of 2,000 would hold its locks four times as long. On 2 CPUs the
margin under the 3 s target is thin and moves with the machine's speed;
what would widen it: a third batch statement at a time where there is a
CPU for it, or fewer index entries per expired reservation.";

const PAGES: &str = "### What limits item 5 (pages)

Measured with pg_stat_statements (50,000 machines, site filter): a
`/machines` view runs the counts per pool state (2.5 to 3 ms alone in
psql, 4 to 4.7 ms a view from the server, index-only on
`machines_pool_counts_idx` and `machines_pool_probe_idx`), the page of
machines (0.8 to 1 ms), the filters' selects (0.3 ms) and the session
check (0.06 ms; the session's `last_seen_at` is written at most once per
tenth of the idle timeout, so readers sharing a session do not queue on
its row). Each statement is written for the filters the page sets, with
its limit written in (the page's size, a constant of the code), so that
PostgreSQL keeps one plan; a few are planned at every view because their
custom plans always cost less than a generic one (the list with a site and
a status, 0.7 ms of planning; the counts with a site and a profile,
0.6 ms, on this skewed inventory). The column \"one reader, no load\" is
the page's own time. Under load the rest is waiting for a CPU: 8 readers
in a closed loop, 8 ordering clients, the server and PostgreSQL share 2
CPUs, so a page's latency is about the work of every request in flight
over 2, and the page times follow the machine's speed (the CPU speed
check in the machine table). A page's independent reads (its rows, its
counts, the filters' values; with an order spec, the headroom kept for
others) run together, each on a pooled connection: in line, the page
waited for a CPU once per read; together, once. In partial runs of this
item (medians of 3 runs) `/machines?site&status` went from 58.4 ms at
p99 to 38.3 and 55.3 ms, the spec view from 67.0 to 43.4 and 49.5 ms,
`/reservations` from 47.4 to 39.0 and 41.2 ms, and the overview (the
day's chart in one statement beside the demand table) from 51.4 to 32.9
and 34.8 ms; alone, `/machines` from 4.6 to 3.2 ms at p50; the load's
rate did not fall. What would lower the p99: the counts are the largest
part left and now the page's longest read (2.0 ms by pgbench on a copy
of this inventory, 2.3 with 300,000 ended reservations beside: the machines of
the filter, index only, then one probe of `machines_pool_probe_idx` per
hold of the organization, 1,000 probes of 3 buffers each). Joined the
other way (the filter's machines, with their ids, against a hash of the
holds and of the services) they cost as much (2.2 against 2.0 ms), so
that was not kept. A count kept per site and state would make them
constant, at the price of a write on every reserve and cancel, which the
hot path does not pay today. The counts also probed one machine per live
service of the organization (`service_links`, then
`machines_pool_probe_idx`), which this item's pool hid while none of its
machines was in service. With 25,000 of the 50,000 in service the counts
cost 51 to 52 ms by pgbench on a copy, and in a partial run of this item
`/machines?site&status` read 43.7 ms at p50 alone and 478 ms at p99 under
load, the spec view 41.2 and 448 ms. Each machine now carries a copy of
whether it has a live link (`machines.in_service`, written by a trigger on
`service_links` in the transaction that changes the link,
`sql/services.sql`), included in both covering indexes, so what is sold is
counted in the scan that counts the filter's machines (2.4 ms by pgbench on
the same copy; in the next partial run 4.6 and 57.6 ms, and 4.2 and
44.8 ms). A convert and the end of a service write the machine's row once
more; a reserve and a cancel write nothing new. R17's pools
(`capacity_pools`) count what is sold the same way. The server's own CPU for a `/machines`
view is about 1.3 ms (0.86 user, 0.42 system, by /proc at one reader):
a third of it decodes the page's 101 rows of 14 columns, a tenth renders
the HTML.

The page's own time also follows the database it reads. Run alone
(`BENCH_ONLY=pages`) on a fresh database, `/machines?site&status` took
3.0 ms at p50 with one reader and 41.0 ms at p99 under load; after
items 1, 13, 14 and 15 in the same database, as a full run does (280,000
reservations, 27,000 of them dead rows not yet vacuumed, no autovacuum
running when the pages began), 4.1 and 54.9 ms on the same hour's
machine. The hold counts read from the arbiter's index alone (every
organization's holds, index only, the machine's probe keeping the
organization's) instead of filtered by organization on the heap were
tried and not kept: by pgbench on a copy of this inventory with 200,000
ended reservations, 1.57 to 2.19 ms against 1.64 to 2.06, the holds being
packed into a few heap pages either way. Nor is the server's pool what
the pages wait for, although a page takes up to four of its connections
at once: with 40 connections instead of 20, alternated twice in runs of
this item alone, `/machines?site&status` read 42.5 and 43.6 ms at p99
against 42.3 and 44.3, the spec view 42.8 and 46.0 against 47.4 and
44.9.
The live page (100 rows a page) counts every hold of the organization for
its header (0.65 ms at 1,000 holds), then chooses its page of holds on
`reservations_held_by_deadline_idx`, on (expires_at, id), and only then
probes each row's machine by key (0.5 to 1.2 ms; joined before the limit,
PostgreSQL sorted every hold over a hash of every machine, 8 to 12 ms).
The overview's 24-hour chart reads the hours that the sweep's holder
counts each period into `activity_hours` (0.05 ms); it used to count the
day's reservations at each view, 1.7 s at 300,000 (the previous run of
this item read the overview at 942 ms alone, 6 s under load: item 1
writes that many reservations in minutes). The overview's pools are one
reading of every pool (`capacity_pools`, R17's counts, index-only: about
10 ms at 50,000 machines), the capacity API's own snapshot, kept
`POOLKEEPER_CAPACITY_CACHE_MS` (1 s) per process and shared with the
shop front's reads; the site tables, the headroom and the lost demand's
stock come from it. The overview used to join every machine three times
for them (about 80 ms), then, read once per view, 16 ms alone and 183 ms
at p99 under this load; then, from the snapshot, 92 ms at p99: the view
that found the snapshot expired counted every pool in its request. Past
half its period the snapshot is now read again by a task behind the
answers, so under steady reads no view waits for the count (45 ms at
p99 in the first run after that change, 4.9 ms alone at p99 against
14.8). Counting a pool reads one index entry per machine;
counts kept per pool would make it constant, but sold and held change on
every convert, cancel and reserve, which would then write a counter row
that every order of the pool shares.

Two builds of the server, each measured by a partial run of this item
(`BENCH_ONLY=pages`, medians of 3 runs) right after one of the shipped
server, say what the two `/machines` views wait for. Without the counts
at all (the header's four numbers not read):
`/machines?site&status` 41.8 ms at p99 against 69.1 ms, the spec view 50.3
against 60.7 ms; alone, 2.5 against 4.7 ms and 3.1 against 4.3 ms at
p50. With the session's check answered from memory (no statement before
the page's reads): 64.0 against 57.0 ms and 60.4 against 59.3 ms, no
gain. So it is the CPU of each view, not its round trips: under this load
every page pays about 30 ms at p99 whatever it does (the overview, 1.1 ms
alone, reads 37 ms) and about 9 ms more per millisecond of its own work.
The counts are the view's largest part: about 1.2 ms to count the
filter's machines (one index entry each) and 1.1 to 1.3 ms to probe the
machine of each of the organization's 1,000 holds. Counts kept per pool
for the machines alone (written when a machine changes, by a convert or
the end of a service, never by a reserve or a cancel) would take the
first part away; the holds' part changes with every reserve and cancel.
Neither build is shipped.";

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
                "The machine is busy during both runs, so the ratio is about CPU per cycle. What would close it: less PostgreSQL CPU per call, first from the functions (inside the database the API's functions cost about twice the ceiling's, see above for where), then fewer backend wake-ups per request (a pool that hands out the most recently used connection first, which sqlx's pool cannot be told to do) and less server CPU per request."
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
                "- **CPU per reservation at 8 clients: ×{:.2} the ceiling's, against ≤ ×2.** Server {:.2} ms and PostgreSQL {:.2} ms per cycle against PostgreSQL {:.2} ms in the ceiling: the PostgreSQL part is most of it (the functions' work per call first, then the backends woken per request, see above). What would close it: less work per call in the allocator's functions (see above for where; not done here), and the pool handing out its most recently used connection first.",
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
    let longest = results
        .growth
        .iter()
        .filter(|s| s.sold == 0)
        .max_by_key(|s| s.history);
    if let (Some(first), Some(last)) = (results.growth.first(), longest) {
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

/// How fast this run's machine was: its own yardstick, the CPU speed check
/// and the database's ceiling at one connection (PL/pgSQL that no change of
/// the server touches), both in the table.
fn speed(results: &Results) -> String {
    match results.throughput.iter().find(|t| t.clients == 1) {
        Some(t) => format!(
            "The database's own ceiling at 1 connection ran {:.0}/s in this run, and the CPU speed check is in the machine table: on a slower or busier machine the same work takes proportionally longer.",
            t.db_cycles_per_s
        ),
        None => {
            "The CPU speed check in the machine table says how fast the machine was.".to_owned()
        }
    }
}
