-- The allocator in the database: each API decision in one round trip.
--
-- src/allocator.rs says what R3-R9 and R13 are and calls these functions;
-- the rules themselves live here, each tied to its number. Every function is VOLATILE
-- (the default) and runs in READ COMMITTED, so each statement inside takes a
-- fresh snapshot: the re-check under a lock (R3) and the second R9 ask see
-- what neighbours committed a moment ago, as separate statements from the
-- application did.
--
-- Plans: these functions keep their statements' plans for the life of a
-- connection. A plan made while `reservations` was small (a fresh database,
-- analyzed empty) would scan the table, and keep doing so as it grows.
-- `SET enable_seqscan = off` on the functions that probe per candidate keeps
-- every such plan on an index whatever the statistics said when it was made;
-- the probes are written so that exactly one index answers each of them (the
-- partial unique indexes of R1 and R10), and the held-by-deadline index of the
-- sweep is declared so that it cannot serve a probe (the migration
-- 20261203000001_allocator.sql redeclares it; see there).
-- Every function that steers its plans so also declares `SET jit = off`: a
-- disabled node the planner must keep (a sort no index can replace) costs
-- 10^10, far past jit_above_cost, and JIT then compiles that statement at
-- every execution, half a second each (seen in a reserve with substitutes).
-- These are single-row statements; compiling never pays for them.

-- R7, the one definition: every machine of org p_org with why it is not a
-- candidate for (p_site, p_profile, p_vendor NULL = any), checked in the
-- order of `allocator::Exclusion`. An overdue hold does not exclude (R11: it
-- expires at the point of use). A plain SQL function: the planner inlines
-- it into each caller's query (the dashboard's explanation, the counts, the
-- candidates, the re-check), so the callers' filters reach the indexes.
--
-- The two probes are single-row lookups of the partial unique indexes
-- `service_links_one_live_per_machine` and `reservations_one_holder_per_machine`
-- (LIMIT 1 changes nothing, the indexes allow one row, but keeps each a
-- per-machine probe). The held probe's predicate is exactly the arbiter's;
-- whether the hold is overdue is judged on the row it found.
--
-- p_unsold_only leaves out the machines whose copy says they are in service
-- (`machines.in_service`, sql/services.sql) before any probe: pass one's
-- walk, so that it steps over no sold machine (`machines_sellable_idx`).
-- The copy only narrows the walk; the live link probe still decides, so a
-- machine with a live link is never a candidate whatever its copy says.
CREATE OR REPLACE FUNCTION machine_verdicts_among(p_org bigint, p_site text, p_profile text, p_vendor text,
                                                  p_unsold_only boolean)
RETURNS SETOF machine_verdict
LANGUAGE sql STABLE AS $$
    SELECT m.id, m.asset_tag, m.site, m.vendor, m.profile, m.status, m.created_at, m.updated_at,
           CASE WHEN m.site <> p_site THEN 'wrong_site'
                WHEN p_vendor IS NOT NULL AND m.vendor <> p_vendor THEN 'wrong_vendor'
                WHEN m.profile <> p_profile THEN 'wrong_profile'
                WHEN m.status <> 'ready' THEN 'not_ready'
                WHEN live.service_ref IS NOT NULL THEN 'in_service'
                WHEN hold.live THEN 'held'
           END,
           live.service_ref,
           CASE WHEN hold.live THEN hold.id END,
           CASE WHEN hold.live THEN hold.expires_at END
      FROM machines m
      LEFT JOIN LATERAL (
           SELECT s.service_ref FROM service_links s
            WHERE s.machine_id = m.id AND s.ended_at IS NULL LIMIT 1) live ON true
      LEFT JOIN LATERAL (
           SELECT r.id, r.expires_at, r.expires_at > clock_timestamp() AS live FROM reservations r
            WHERE r.machine_id = m.id AND r.state = 'held' LIMIT 1) hold ON true
     WHERE m.org_id = p_org AND (p_unsold_only IS NOT TRUE OR NOT m.in_service)
$$;

-- R7's verdicts of every machine, sold ones included (the explanation, the
-- re-checks, the counts): inlined in turn, so the callers' filters still
-- reach the indexes.
CREATE OR REPLACE FUNCTION machine_verdicts(p_org bigint, p_site text, p_profile text, p_vendor text)
RETURNS SETOF machine_verdict
LANGUAGE sql STABLE AS $$
    SELECT * FROM machine_verdicts_among(p_org, p_site, p_profile, p_vendor, false)
$$;

-- R7: a refusal's counts of the asked pool, by exclusion key, and how many
-- machines are free (the refusals of the allocator and of the substitutes'
-- walk tell the same counts).
CREATE OR REPLACE FUNCTION verdict_counts(p_org bigint, p_site text, p_profile text, p_vendor text,
                                          OUT counts jsonb, OUT free bigint)
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
               'wrong_site',    count(*) FILTER (WHERE v.exclusion = 'wrong_site'),
               'wrong_vendor',  count(*) FILTER (WHERE v.exclusion = 'wrong_vendor'),
               'wrong_profile', count(*) FILTER (WHERE v.exclusion = 'wrong_profile'),
               'not_ready',     count(*) FILTER (WHERE v.exclusion = 'not_ready'),
               'in_service',    count(*) FILTER (WHERE v.exclusion = 'in_service'),
               'held',          count(*) FILTER (WHERE v.exclusion = 'held')),
           count(*) FILTER (WHERE v.exclusion IS NULL)
      FROM machine_verdicts(p_org, p_site, p_profile, p_vendor) v
$$;

-- R7 pass one's candidates: at most p_limit machines with no exclusion, in
-- id order. The filters repeat what `exclusion IS NULL` implies (site,
-- profile, vendor, ready, not in service) only so that the planner walks
-- `machines_sellable_idx`; the verdict itself is machine_verdicts'.
CREATE OR REPLACE FUNCTION machine_candidates(p_org bigint, p_site text, p_profile text, p_vendor text, p_limit bigint)
RETURNS SETOF machine_verdict
LANGUAGE sql STABLE AS $$
    SELECT v.* FROM machine_verdicts_among(p_org, p_site, p_profile, p_vendor, true) v
     WHERE v.site = p_site AND v.profile = p_profile AND (p_vendor IS NULL OR v.vendor = p_vendor)
       AND v.status = 'ready' AND v.exclusion IS NULL
     ORDER BY v.id LIMIT p_limit
$$;

-- The same candidates after machine p_after (in id order): pass one
-- widened where its first batch ran out (reserve_walk_slots).
CREATE OR REPLACE FUNCTION machine_candidates_after(p_org bigint, p_site text, p_profile text, p_vendor text,
                                                    p_after bigint, p_limit bigint)
RETURNS SETOF machine_verdict
LANGUAGE sql STABLE AS $$
    SELECT v.* FROM machine_verdicts_among(p_org, p_site, p_profile, p_vendor, true) v
     WHERE v.site = p_site AND v.profile = p_profile AND (p_vendor IS NULL OR v.vendor = p_vendor)
       AND v.status = 'ready' AND v.exclusion IS NULL AND v.id > p_after
     ORDER BY v.id LIMIT p_limit
$$;

-- R4: pass one's first batch for an order of p_quantity machines. Without
-- contention the first candidate is taken, so the walk starts with a few
-- and widens, once, to the whole bound of 24 + N when they run out.
CREATE OR REPLACE FUNCTION first_batch(p_quantity integer) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT 4 + p_quantity $$;

-- A reserve_result carrying reservation p_row (or none). PL/pgSQL, not
-- SQL: PostgreSQL 15 plans a SQL function that it cannot inline on every
-- call, and this one (a row of 24 columns) cannot be inlined. One row
-- constructor, in the type's column order, not an assignment per field:
-- each assignment to a field of a row variable is a step of its own
-- (BENCHMARKS.md measured the cycle's CPU 8% lower with this form).
CREATE OR REPLACE FUNCTION reserve_result_of(p_outcome text, p_row reservations,
                                  p_scanned integer, p_locked integer, p_gone integer, p_attempts integer)
RETURNS reserve_result LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    -- candidates, excluded and alternatives are the refusals' to fill.
    RETURN ROW(p_outcome, p_row.id, p_row.org_id, p_row.order_ref, p_row.machine_id, p_row.state,
               p_row.fence, p_row.reason, p_row.hold_seconds, p_row.created_at, p_row.expires_at,
               p_row.ended_at, p_row.ended_by, p_row.end_reason, p_row.machine_snapshot,
               p_scanned, p_locked, p_gone, p_attempts,
               NULL, NULL, p_row.quantity, p_row.slot, NULL)::reserve_result;
END
$$;

-- A reserve_answer carrying reservation p_row (or none), whole: a new
-- column of `reservations` needs nothing here. PL/pgSQL and one row
-- constructor, as reserve_result_of says why.
CREATE OR REPLACE FUNCTION reserve_answer_of(p_outcome text, p_row reservations,
                                  p_scanned integer, p_locked integer, p_gone integer, p_attempts integer)
RETURNS reserve_answer LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    -- candidates, excluded and alternatives are the refusals' to fill.
    RETURN ROW(p_outcome, p_row.org_id, p_scanned, p_locked, p_gone, p_attempts,
               NULL, NULL, NULL, p_row)::reserve_answer;
END
$$;

-- R3-R6, R8, R11 for the p_req.quantity slots of order p_req.order_ref of org
-- p_org: pass two over p_candidates (machine ids, in the order of pass
-- one). Lock one candidate at a time by its key, skip what others hold,
-- re-check what no constraint guards, try each insert in a savepoint, and
-- stop once the order has all its slots. Returns one 'created' row per slot
-- taken (possibly fewer than p_req.quantity: reserve_order_walk undoes such a
-- partial order), the order's 'existing' rows (it was written behind our
-- back), or one 'nothing' row; every row carries the walk's counters.
--
-- p_candidates is pass one's first batch (first_batch): when the walk has
-- tried all of them and still lacks machines, it reads the candidates after
-- the last one, up to the bound, once (R4 counts them all). A shorter list
-- (pass one found no more, or a test's chosen list) is walked as it is.
--
-- R4 for an order of N machines: at most 24 + N candidates scanned and
-- 4 + N insert attempts, i.e. the slack an order of one has (24 candidates
-- skipped or found gone besides the one taken; 4 insert races lost besides
-- the one won), whatever N. A bound that grew with N (25 per machine) would
-- let one order of 16 walk 400 rows while the others wait for its commit;
-- this one keeps an order's walk and its savepoints (R5: at most 4 + N
-- attempts plus reserve_order_walk's one, 21 for N = 16) well under the 64
-- subtransactions a backend caches.
CREATE OR REPLACE FUNCTION reserve_walk_slots(p_org bigint, p_actor text, p_req reserve_request,
                                              p_candidates bigint[])
RETURNS SETOF reserve_answer
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    max_scanned  CONSTANT integer := 24 + p_req.quantity;  -- R4, for N machines
    max_attempts CONSTANT integer := 4 + p_req.quantity;   -- R4, for N machines
    v_total      integer := coalesce(cardinality(p_candidates), 0);
    v_scanned    integer := 0;
    v_locked     integer := 0;
    v_gone       integer := 0;
    v_attempts   integer := 0;
    v_position   integer := 0;
    v_machine_id bigint;
    v_candidates bigint[] := coalesce(p_candidates, '{}');
    v_widened    boolean := false;
    v_verdict    machine_verdict;
    v_expired    reservations;
    v_reason     text;
    v_row        reservations;
    v_rows       reservations[] := '{}';
    v_at         timestamptz;
    v_constraint text;
    v_existing   boolean := false;
    v_siblings   integer;
BEGIN
    IF p_req.quantity IS NULL OR p_req.quantity NOT BETWEEN 1 AND 16 THEN
        RAISE EXCEPTION 'an order asks for 1 to 16 machines, not %', p_req.quantity;
    END IF;
    LOOP
        IF v_position = cardinality(v_candidates) THEN
            -- The first batch is spent (every candidate locked, gone or
            -- taken): the rest of pass one, once. A list shorter than a
            -- first batch is all there is.
            EXIT WHEN v_widened OR v_position < first_batch(p_req.quantity) OR v_position >= max_scanned
                      OR v_attempts >= max_attempts;
            v_widened := true;
            v_candidates := v_candidates || ARRAY(
                SELECT c.id FROM machine_candidates_after(p_org, p_req.site, p_req.profile, p_req.vendor,
                                                          v_candidates[v_position], max_scanned - v_position) c);
            v_total := cardinality(v_candidates);
            EXIT WHEN v_position = v_total;
        END IF;
        v_position := v_position + 1;
        v_machine_id := v_candidates[v_position];
        EXIT WHEN v_position > max_scanned OR v_attempts >= max_attempts;
        v_scanned := v_scanned + 1;
        -- R3/R4: lock this one row by its key; locked by someone else is
        -- skipped, not an attempt. The status is re-checked on the newest
        -- row version.
        PERFORM 1 FROM machines WHERE id = v_machine_id AND status = 'ready' FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            v_locked := v_locked + 1;
            CONTINUE;
        END IF;
        -- With the row lock held, this statement (a fresh snapshot) sees
        -- every conversion that committed before we got it, and none can
        -- start until we end (convert locks the machine first). A live
        -- service link has no constraint against a held reservation: this
        -- check is its guard (R10). `held` is left to the arbiter (R1): a
        -- holder that committed since pass one costs an attempt, never a
        -- second holder.
        SELECT * INTO v_verdict FROM machine_verdicts(p_org, p_req.site, p_req.profile, p_req.vendor) v
         WHERE v.id = v_machine_id;
        IF NOT FOUND OR (v_verdict.exclusion IS NOT NULL AND v_verdict.exclusion <> 'held') THEN
            v_gone := v_gone + 1;
            CONTINUE;
        END IF;
        v_attempts := v_attempts + 1;
        -- R5: a unique violation aborts the transaction; inside this block
        -- (a savepoint) only the block is lost.
        BEGIN
            -- R11: an overdue holder is expired at the point of use.
            UPDATE reservations
               SET state = 'expired', ended_at = clock_timestamp(), ended_by = 'allocator',
                   end_reason = 'its deadline had passed; expired at the point of use by order ' || p_req.order_ref
             WHERE machine_id = v_machine_id AND state = 'held' AND expires_at <= clock_timestamp()
            RETURNING * INTO v_expired;
            IF v_expired.id IS NOT NULL THEN
                INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail)
                VALUES (v_expired.id, 'expired', 'held', 'expired', 'allocator',
                        'its deadline had passed; expired at the point of use by order ' || p_req.order_ref);
                -- R13: the other slots of its order share its deadline and
                -- its fate, in this same transaction: every one of them or
                -- none. SKIP LOCKED: a slot that someone is converting,
                -- cancelling or expiring right now is theirs to finish (and
                -- this never waits, so it cannot deadlock with them); then
                -- this machine is left as locked, and the block's savepoint
                -- undoes the holder's expiry too (lock_not_available below).
                IF v_expired.quantity > 1 THEN
                    SELECT count(*) INTO v_siblings FROM reservations s
                     WHERE s.org_id = v_expired.org_id AND s.order_ref = v_expired.order_ref
                       AND s.state = 'held' AND s.id <> v_expired.id;
                    IF cardinality(ARRAY(SELECT s.id FROM reservations s
                                          WHERE s.org_id = v_expired.org_id AND s.order_ref = v_expired.order_ref
                                            AND s.state = 'held' AND s.id <> v_expired.id
                                            FOR UPDATE SKIP LOCKED)) < v_siblings THEN
                        RAISE EXCEPTION USING ERRCODE = 'lock_not_available',
                            MESSAGE = 'a slot of the overdue order is locked by another transaction';
                    END IF;
                    WITH slots AS (
                        SELECT s.id FROM reservations s
                         WHERE s.org_id = v_expired.org_id AND s.order_ref = v_expired.order_ref
                           AND s.state = 'held' AND s.id <> v_expired.id
                    ), ended AS (
                        UPDATE reservations r
                           SET state = 'expired', ended_at = clock_timestamp(), ended_by = 'allocator',
                               end_reason = 'its deadline had passed; expired at the point of use by order '
                                            || p_req.order_ref || ' with reservation ' || v_expired.id || ' of its order'
                          FROM slots WHERE r.id = slots.id
                        RETURNING r.id, r.end_reason
                    )
                    INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail)
                    SELECT ended.id, 'expired', 'held', 'expired', 'allocator', ended.end_reason FROM ended;
                END IF;
            END IF;
            -- R8: why this machine, in words that stay true after it changes.
            v_reason := format('%s (%s, %s, %s, %s) matched site %s, profile %s, %s: candidate %s of %s in pass one',
                               v_verdict.asset_tag, v_verdict.site, v_verdict.vendor, v_verdict.profile,
                               v_verdict.status, p_req.site, p_req.profile,
                               CASE WHEN p_req.vendor IS NULL THEN 'any vendor' ELSE 'vendor ' || p_req.vendor END,
                               v_position, v_total);
            IF p_req.quantity > 1 THEN
                v_reason := v_reason || format('; machine %s of %s of the order', cardinality(v_rows) + 1, p_req.quantity);
            END IF;
            IF v_locked > 0 OR v_attempts > cardinality(v_rows) + 1 OR v_gone > 0 THEN
                v_reason := v_reason || format('; before it, %s locked by other orders, %s taken by a faster order, %s no longer eligible',
                                               v_locked, v_attempts - 1 - cardinality(v_rows), v_gone);
            END IF;
            IF v_expired.id IS NOT NULL THEN
                v_reason := v_reason || format('; its previous reservation %s was overdue and expired at the point of use', v_expired.id);
            END IF;
            -- R20: served by a declared substitute of the profile asked.
            IF p_req.profile_asked IS NOT NULL THEN
                v_reason := v_reason || format('; a declared substitute for profile %s, whose pool could not fill the order',
                                               p_req.profile_asked);
            END IF;
            v_reason := v_reason || format('; held for %s s', p_req.hold_seconds);
            -- created_at and expires_at come from one reading of the clock,
            -- the first slot's: an order has one deadline (R13).
            v_at := coalesce(v_at, clock_timestamp());
            -- Slot 1 first: two requests with one key collide there (R9),
            -- before either holds any other machine.
            -- R18/R19: the order's segment and customer, frozen with it.
            INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason,
                                      hold_seconds, created_at, expires_at, quantity, slot,
                                      segment, customer_ref, profile_asked)
            SELECT p_org, p_req.order_ref, m.id,
                   -- R20: the spec is the pool that serves (R15 heals
                   -- within it); what was asked is `profile_asked`.
                   jsonb_build_object('site', p_req.site, 'profile', p_req.profile, 'vendor', p_req.vendor, 'hold_seconds', p_req.hold_seconds,
                                      'quantity', p_req.quantity, 'profile_asked', p_req.profile_asked,
                                      'substitutes', p_req.substitutes),
                   jsonb_build_object('asset_tag', m.asset_tag, 'site', m.site, 'vendor', m.vendor,
                                      'profile', m.profile, 'status', m.status, 'updated_at', m.updated_at),
                   v_reason, p_req.hold_seconds, v_at, v_at + make_interval(secs => p_req.hold_seconds), p_req.quantity, cardinality(v_rows) + 1,
                   p_req.segment, p_req.customer_ref, p_req.profile_asked
              FROM machines m
             WHERE m.id = v_machine_id AND m.org_id = p_org
            RETURNING * INTO v_row;
            INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail)
            VALUES (v_row.id, 'created', NULL, 'held', p_actor,
                    CASE WHEN p_req.quantity = 1 THEN format('order %s on %s', p_req.order_ref, v_verdict.asset_tag)
                         ELSE format('order %s on %s (machine %s of %s)', p_req.order_ref, v_verdict.asset_tag,
                                     v_row.slot, p_req.quantity) END
                    || CASE WHEN p_req.profile_asked IS NOT NULL
                            THEN format(', served by %s, asked %s', p_req.profile, p_req.profile_asked) ELSE '' END);
            v_rows := v_rows || v_row;
        EXCEPTION WHEN lock_not_available THEN
            -- R13: the overdue order on this machine is being ended by
            -- someone else right now (above): this machine is locked.
            v_locked := v_locked + 1;
            CONTINUE;
        WHEN unique_violation THEN
            -- R6: the constraint's name says which of the two rules it was.
            GET STACKED DIAGNOSTICS v_constraint = CONSTRAINT_NAME;
            IF v_constraint = 'reservations_one_holder_per_machine' THEN
                CONTINUE;  -- this machine is taken: next candidate
            ELSIF v_constraint = 'reservations_order_ref_unique_per_org' THEN
                v_existing := true;  -- this order is already written: here it is
                EXIT;
            ELSE
                RAISE;
            END IF;
        END;
        EXIT WHEN cardinality(v_rows) = p_req.quantity;
    END LOOP;
    IF v_existing THEN
        -- Only slot 1 can collide (it is always inserted first), so this
        -- walk holds nothing of its own.
        RETURN QUERY SELECT x.* FROM reservations r,
                            LATERAL reserve_answer_of('existing', r, v_scanned, v_locked, v_gone, v_attempts) x
                       WHERE r.org_id = p_org AND r.order_ref = p_req.order_ref ORDER BY r.slot;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'order % collided on its key but cannot be read', p_req.order_ref;
        END IF;
        RETURN;
    END IF;
    IF cardinality(v_rows) = 0 THEN
        RETURN NEXT reserve_answer_of('nothing', NULL, v_scanned, v_locked, v_gone, v_attempts);
        RETURN;
    END IF;
    -- A row at a time: RETURN NEXT of an expression is no statement, so
    -- there is no plan to start, where a query over unnest(v_rows) would
    -- start one at every reserve.
    FOREACH v_row IN ARRAY v_rows LOOP
        RETURN NEXT reserve_answer_of('created', v_row, v_scanned, v_locked, v_gone, v_attempts);
    END LOOP;
END
$$;

-- R13: all of an order of several machines or nothing (reserve_order
-- calls the walk itself for an order of one). The walk runs in a
-- savepoint of its own: if it ends with fewer machines than asked, the
-- savepoint is rolled back (the slots it took, their events and any expiry
-- it wrote with them) and the answer is 'nothing'. Nothing of a partial
-- order was ever committed, so no reader saw it.
CREATE OR REPLACE FUNCTION reserve_order_walk(p_org bigint, p_actor text, p_req reserve_request,
                                              p_candidates bigint[])
RETURNS SETOF reserve_answer
LANGUAGE plpgsql
AS $$
DECLARE
    v_rows reserve_answer[];
    v_last reserve_answer;
BEGIN
    BEGIN
        v_rows := ARRAY(SELECT w FROM reserve_walk_slots(p_org, p_actor, p_req, p_candidates) w);
        v_last := v_rows[cardinality(v_rows)];
        IF v_last.outcome = 'created' AND cardinality(v_rows) < p_req.quantity THEN
            RAISE EXCEPTION USING ERRCODE = 'PK013', MESSAGE = 'partial order';
        END IF;
    EXCEPTION WHEN SQLSTATE 'PK013' THEN
        -- Undone: the order could not have every machine now.
        RETURN NEXT reserve_answer_of('nothing', NULL, v_last.scanned, v_last.locked_by_others,
                                      v_last.gone, v_last.attempts);
        RETURN;
    END;
    RETURN QUERY SELECT * FROM unnest(v_rows);
END
$$;

-- R7/R9/R13: a whole reserve of the request's quantity machines. R9 asks for the
-- order first and again right before refusing; pass one picks at most
-- 24 + N candidates (R4), pass two walks them; a refusal is 'contended'
-- (pass one found at least N: retry) or 'unavailable' (fewer than N match:
-- buy hardware), with the counts of every machine of the organization by
-- verdict, read now, and `candidates` saying how many do match.
--
-- Orders of several machines of one site and profile take turns (a
-- transaction-scoped advisory lock, held for this one statement): with
-- SKIP LOCKED alone, five orders of two on five machines can each lock one
-- machine, find the rest locked, and all give up, so that nobody gets the
-- machines that were there. Taking turns, the first takes two, the next
-- two, the last finds one. Inside its turn an order still locks one
-- candidate at a time and skips what others hold (R3): orders of one never
-- take the turn (the hot path is unchanged) and may still be faster, which
-- makes an order of several 'contended', honestly.
CREATE OR REPLACE FUNCTION reserve_order_request(p_org bigint, p_actor text, p_request jsonb)
RETURNS SETOF reserve_answer
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    -- The request, one value: a key it lacks reads NULL (or its default
    -- below), so a new optional field never changes this signature.
    v_req        reserve_request := jsonb_populate_record(NULL::reserve_request, p_request);
    v_rows       reserve_answer[];
    v_result     reserve_answer;
    v_candidates bigint[];
    v_counts     jsonb;
    v_free       bigint;
    v_cap        integer;
    v_live       bigint;
    v_kept       integer := 0;
    v_reserved   boolean := false;
    v_keeps      boolean;
    v_list       text[];
BEGIN
    v_req.quantity := coalesce(v_req.quantity, 1);
    -- Only the allocator says which profile was asked (R20).
    v_req.profile_asked := NULL;
    IF v_req.quantity NOT BETWEEN 1 AND 16 THEN
        RAISE EXCEPTION 'an order asks for 1 to 16 machines, not %', v_req.quantity;
    END IF;
    IF v_req.order_ref IS NULL OR v_req.site IS NULL OR v_req.profile IS NULL OR v_req.hold_seconds IS NULL THEN
        RAISE EXCEPTION 'a reserve names its order_ref, site, profile and hold_seconds: %', p_request;
    END IF;
    -- R9, first ask: a replay gets its order back.
    RETURN QUERY SELECT x.* FROM reservations r,
                        LATERAL reserve_answer_of('existing', r, 0, 0, 0, 0) x
                   WHERE r.org_id = p_org AND r.order_ref = v_req.order_ref ORDER BY r.slot;
    IF FOUND THEN
        RETURN;
    END IF;
    -- R19: a customer's orders take turns where the organization caps
    -- them, and the count of its live holds is read in the turn: two
    -- orders of one customer at the cap minus one cannot both see room.
    IF v_req.customer_ref IS NOT NULL THEN
        SELECT o.customer_hold_limit INTO v_cap FROM organizations o WHERE o.id = p_org;
    END IF;
    IF v_cap > 0 THEN
        PERFORM customer_turn(p_org, v_req.customer_ref);
        RETURN QUERY SELECT x.* FROM reservations r,
                            LATERAL reserve_answer_of('existing', r, 0, 0, 0, 0) x
                       WHERE r.org_id = p_org AND r.order_ref = v_req.order_ref ORDER BY r.slot;
        IF FOUND THEN
            RETURN;
        END IF;
        SELECT count(*) INTO v_live FROM reservations r
         WHERE r.org_id = p_org AND r.customer_ref = v_req.customer_ref AND r.state = 'held'
           AND r.expires_at > clock_timestamp();
        IF v_live + v_req.quantity > v_cap THEN
            v_result := reserve_answer_of('customer_limit', NULL, 0, 0, 0, 0);
            v_result.org_id := p_org;
            v_result.excluded := jsonb_build_object('limit', v_cap, 'holds', v_live);
            PERFORM record_refusal(p_org, 'customer_limit', v_req.site, v_req.profile, v_req.vendor, v_result.excluded,
                                   v_req.quantity, v_req.segment, v_req.customer_ref);
            RETURN NEXT v_result;
            RETURN;
        END IF;
    END IF;
    -- R20: a reserve that allows substitutes, of a profile that has some
    -- for its segment, is decided over the asked pool and its substitutes
    -- (sql/substitutes.sql), which holds the declaration until commit.
    v_keeps := EXISTS (SELECT 1 FROM headroom h WHERE h.org_id = p_org AND h.site = v_req.site
                                                  AND h.profile = v_req.profile);
    IF v_req.substitutes = 'allowed' THEN
        v_list := substitutes_for(p_org, v_req.profile, v_req.segment);
        -- An order of one whose pool keeps no headroom takes no turn: it
        -- walks its pool below as a plain reserve, at a plain reserve's
        -- cost, and tries the substitutes only if that walk took nothing.
        -- Any other takes every turn it could need up front, by key.
        IF cardinality(v_list) > 0 AND (v_req.quantity > 1 OR v_keeps) THEN
            RETURN QUERY SELECT * FROM reserve_substituting(p_org, p_actor, v_req, v_list);
            RETURN;
        END IF;
    END IF;
    -- R18: where the pool keeps headroom, its orders take turns, and an
    -- order outside a segment leaves that segment's machines: checked in
    -- the turn, in this transaction, never counted beforehand. A pool with
    -- no headroom takes no turn (today's path).
    IF v_keeps THEN
        PERFORM pool_turn(p_org, v_req.site, v_req.profile);
        RETURN QUERY SELECT x.* FROM reservations r,
                            LATERAL reserve_answer_of('existing', r, 0, 0, 0, 0) x
                       WHERE r.org_id = p_org AND r.order_ref = v_req.order_ref ORDER BY r.slot;
        IF FOUND THEN
            RETURN;
        END IF;
        v_kept := pool_kept_for_others(p_org, v_req.site, v_req.profile, ARRAY[v_req.segment]);
        -- At most v_kept + N candidates of the pool (any vendor) are read:
        -- bounded by the headroom, not the pool.
        v_reserved := v_kept > 0
            AND (SELECT count(*) FROM machine_candidates(p_org, v_req.site, v_req.profile, NULL, v_kept + v_req.quantity))
                < v_kept + v_req.quantity;
    END IF;
    IF v_req.quantity > 1 THEN
        -- The turn of orders of several machines on this site and profile
        -- (the vendor is left out: "any vendor" and "dell" compete for the
        -- same machines). Two-key form, class 13 (R13): apart from the
        -- 64-bit keys of the migrations.
        PERFORM pg_advisory_xact_lock(13, hashtext(p_org::text || '/' || v_req.site || '/' || v_req.profile));
        -- R9 again: an order with this key may have committed while we waited.
        RETURN QUERY SELECT x.* FROM reservations r,
                            LATERAL reserve_answer_of('existing', r, 0, 0, 0, 0) x
                       WHERE r.org_id = p_org AND r.order_ref = v_req.order_ref ORDER BY r.slot;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- R7, pass one: its first batch; the walk widens it when it runs out
    -- and never looks beyond 24 + N (R4). The batch holds at least N
    -- whenever pass one would.
    v_candidates := ARRAY(SELECT c.id FROM machine_candidates(p_org, v_req.site, v_req.profile, v_req.vendor,
                                                              first_batch(v_req.quantity)) c);
    IF cardinality(v_candidates) >= v_req.quantity AND NOT v_reserved THEN
        -- An order of one is the walk itself (it takes one machine or none).
        IF v_req.quantity = 1 THEN
            v_rows := ARRAY(SELECT w FROM reserve_walk_slots(p_org, p_actor, v_req, v_candidates) w);
        ELSE
            v_rows := ARRAY(SELECT w FROM reserve_order_walk(p_org, p_actor, v_req, v_candidates) w);
        END IF;
        v_result := v_rows[1];
        IF v_result.outcome <> 'nothing' THEN
            -- As the walk answers, a row at a time, without a query.
            FOREACH v_result IN ARRAY v_rows LOOP
                RETURN NEXT v_result;
            END LOOP;
            RETURN;
        END IF;
    ELSE
        v_result := reserve_answer_of('nothing', NULL, 0, 0, 0, 0);
    END IF;
    -- R20: nothing taken from the asked pool; the substitutes are tried
    -- from the start (their turns, the asked pool again, then each in
    -- order). Nothing is held from the walk: its savepoints released what
    -- it tried.
    IF cardinality(v_list) > 0 THEN
        RETURN QUERY SELECT * FROM reserve_substituting(p_org, p_actor, v_req, v_list);
        RETURN;
    END IF;
    -- R9, second ask, right before refusing: a neighbour with the same key
    -- may have committed since the first (this statement's snapshot is new).
    RETURN QUERY SELECT x.* FROM reservations r,
                        LATERAL reserve_answer_of('existing', r, v_result.scanned, v_result.locked_by_others,
                                          v_result.gone, v_result.attempts) x
                   WHERE r.org_id = p_org AND r.order_ref = v_req.order_ref ORDER BY r.slot;
    IF FOUND THEN
        RETURN;
    END IF;
    -- R7: the counts are read now, so a machine a neighbour just took counts
    -- as held, and a candidate still being fought over makes it contended.
    SELECT c.counts, c.free INTO v_counts, v_free
      FROM verdict_counts(p_org, v_req.site, v_req.profile, v_req.vendor) c;
    -- R13: fewer matching machines than the order asks for is "buy
    -- hardware", even if some match; enough of them, but kept for other
    -- segments, is "reserved" (R18); enough, but not lockable now, is
    -- "retry".
    v_result.outcome := CASE WHEN v_free < v_req.quantity THEN 'unavailable'
                             WHEN v_reserved THEN 'reserved' ELSE 'contended' END;
    v_result.candidates := v_free;
    v_result.excluded := CASE WHEN v_reserved AND v_free >= v_req.quantity
                              THEN v_counts || jsonb_build_object('kept_for_others', v_kept,
                                   'kept', (SELECT jsonb_object_agg(h.segment, h.machines) FROM headroom h
                                             WHERE h.org_id = p_org AND h.site = v_req.site AND h.profile = v_req.profile
                                               AND h.segment IS DISTINCT FROM v_req.segment))
                              ELSE v_counts END;
    -- The organization, for R17's alternatives: the caller reads them in a
    -- statement of its own, after this one has released its turns.
    v_result.org_id := p_org;
    -- Lost demand, recorded by the statement that read the
    -- counts. When this transaction has written nothing else (no
    -- transaction id yet: the API's autocommit call), its commit need not
    -- wait for the disk: a crash may lose the last refusals, never a
    -- reservation.
    PERFORM record_refusal(p_org, v_result.outcome, v_req.site, v_req.profile, v_req.vendor,
                           CASE WHEN v_free < v_req.quantity THEN v_counts
                                WHEN v_reserved THEN v_result.excluded
                                ELSE jsonb_build_object('candidates', v_free) END,
                           v_req.quantity, v_req.segment, v_req.customer_ref);
    RETURN NEXT v_result;
END
$$;

-- Lost demand, recorded by the statement that refused. When this
-- transaction has written nothing else (no transaction id yet: the API's
-- autocommit call), its commit need not wait for the disk: a crash may
-- lose the last refusals, never a reservation.
CREATE OR REPLACE FUNCTION record_refusal(p_org bigint, p_reason text, p_site text, p_profile text, p_vendor text,
                                          p_excluded jsonb, p_quantity integer, p_segment text, p_customer text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    INSERT INTO reservation_refusals (org_id, reason, site, profile, vendor, excluded, quantity, segment,
                                      customer_ref)
    VALUES (p_org, p_reason, p_site, p_profile, p_vendor, p_excluded, p_quantity, p_segment, p_customer);
END
$$;

-- POST /api/v1/reservations in one statement: the caller, then reserve.
CREATE OR REPLACE FUNCTION api_reserve_order_request(p_token_hash bytea, p_module_on boolean, p_request jsonb)
RETURNS TABLE (caller text, answer reserve_answer)
LANGUAGE plpgsql AS $$
DECLARE
    v_caller record;
BEGIN
    SELECT * INTO v_caller FROM api_caller(p_token_hash, 'orders', p_module_on);
    IF v_caller.status <> 'ok' THEN
        RETURN QUERY SELECT v_caller.status, NULL::reserve_answer;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'ok'::text, o FROM reserve_order_request(v_caller.org_id, v_caller.actor, p_request) o;
END
$$;

-- The entry points of 10 arguments, which binaries of the previous
-- release call while a deployment rolls: the reserve above, answered in
-- their flat `reserve_result`. Nothing else calls them; a later set drops
-- them (with reserve_result_of and reserve_result_of_answer), and no
-- entry point takes the request field by field again.
CREATE OR REPLACE FUNCTION reserve_result_of_answer(p reserve_answer, p_quantity integer)
RETURNS reserve_result LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v reserve_result;
BEGIN
    v := reserve_result_of(p.outcome, p.reservation, p.scanned, p.locked_by_others, p.gone, p.attempts);
    v.org_id := coalesce(v.org_id, p.org_id);
    v.candidates := p.candidates;
    v.excluded := p.excluded;
    v.alternatives := p.alternatives;
    v.quantity := coalesce(v.quantity, p_quantity::smallint);
    RETURN v;
END
$$;

CREATE OR REPLACE FUNCTION reserve_order(p_org bigint, p_actor text, p_order_ref text, p_site text, p_profile text,
                              p_vendor text, p_hold integer, p_quantity integer, p_segment text,
                              p_customer text)
RETURNS SETOF reserve_result
LANGUAGE sql AS $$
    SELECT r.* FROM reserve_order_request(p_org, p_actor,
                                  jsonb_build_object('order_ref', p_order_ref, 'site', p_site, 'profile', p_profile,
                                                     'vendor', p_vendor, 'hold_seconds', p_hold,
                                                     'quantity', p_quantity, 'segment', p_segment,
                                                     'customer_ref', p_customer)) a,
                   LATERAL reserve_result_of_answer(a, p_quantity) r
$$;

CREATE OR REPLACE FUNCTION api_reserve_order(p_token_hash bytea, p_module_on boolean, p_order_ref text, p_site text,
                                  p_profile text, p_vendor text, p_hold integer, p_quantity integer,
                                  p_segment text, p_customer text)
RETURNS TABLE (caller text, result reserve_result)
LANGUAGE sql AS $$
    SELECT c.caller, CASE WHEN c.caller = 'ok' THEN reserve_result_of_answer(c.answer, p_quantity) END
      FROM api_reserve_order_request(p_token_hash, p_module_on,
                             jsonb_build_object('order_ref', p_order_ref, 'site', p_site, 'profile', p_profile,
                                                'vendor', p_vendor, 'hold_seconds', p_hold,
                                                'quantity', p_quantity, 'segment', p_segment,
                                                'customer_ref', p_customer)) c
$$;

-- The entry points of orders of one, which the release before orders of
-- several called; that release's binaries are gone once a deployment has
-- rolled through set 6, which no longer needed them (sql/VERSIONS).
DROP FUNCTION IF EXISTS api_reserve(bytea, boolean, text, text, text, text, integer);
DROP FUNCTION IF EXISTS reserve_machine(bigint, text, text, text, text, text, integer);
DROP FUNCTION IF EXISTS reserve_walk(bigint, text, text, text, text, text, integer, bigint[]);
-- The entry points of the release before segments and customers (R18,
-- R19), of 8 arguments: kept through set 11 while deployments rolled, gone
-- from set 16 (sql/VERSIONS).
DROP FUNCTION IF EXISTS api_reserve_order(bytea, boolean, text, text, text, text, integer, integer);
DROP FUNCTION IF EXISTS reserve_order(bigint, text, text, text, text, text, integer, integer);
-- The one-value entry points under the old names, as a development set
-- named them before they were told apart from the wrappers above.
DROP FUNCTION IF EXISTS api_reserve_order(bytea, boolean, jsonb);
DROP FUNCTION IF EXISTS reserve_order(bigint, text, jsonb);
-- The walks of the previous release, which took the request field by
-- field: only its reserve_order called them.
DROP FUNCTION IF EXISTS reserve_walk_slots(bigint, text, text, text, text, text, integer, bigint[], integer);
DROP FUNCTION IF EXISTS reserve_order_walk(bigint, text, text, text, text, text, integer, bigint[], integer);
