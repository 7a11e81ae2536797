-- Reservations after creation, in the database: cancel and convert (R10,
-- R11) each in one statement, and the same for a whole order with its
-- extension (R13, R14: order_transition). src/reservations/transitions.rs
-- calls these and says what they guarantee; the API calls them through
-- api_transition and api_order_transition, with the token check in the same
-- statement.
--
-- Locks: the lock order of sql/locks.sql (machines, then reservations,
-- each in id order), through lock_holds. The allocator never waits for a
-- machine (SKIP LOCKED), so it cannot deadlock with a transition, and while
-- a transition holds a machine no new order can take it (R10).

-- A transition_result carrying reservation p_row and service link p_link
-- (or none): one row constructor in the type's column order, as
-- reserve_result_of (sql/allocator.sql) says why.
CREATE OR REPLACE FUNCTION transition_result_of(p_outcome text, p_row reservations,
                                     p_link service_links DEFAULT NULL)
RETURNS transition_result LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN ROW(p_outcome, p_row.id, p_row.org_id, p_row.order_ref, p_row.machine_id, p_row.state,
               p_row.fence, p_row.reason, p_row.hold_seconds, p_row.created_at, p_row.expires_at,
               p_row.ended_at, p_row.ended_by, p_row.end_reason, p_row.machine_snapshot,
               p_link.id, p_link.service_ref, p_link.created_at, p_row.quantity, p_row.slot,
               p_link.ended_at, p_link.ended_by)::transition_result;
END
$$;

-- Ends held reservation p_id (to 'expired', 'cancelled' or 'converted') with
-- its event. Returns the row, or NULL if no longer held. (PL/pgSQL, as every
-- function here that PostgreSQL cannot inline: its plans are kept.)
CREATE OR REPLACE FUNCTION reservation_end(p_id bigint, p_to_state text, p_ended_by text, p_end_reason text)
RETURNS reservations LANGUAGE plpgsql AS $$
DECLARE
    v_row reservations;
BEGIN
    UPDATE reservations
       SET state = p_to_state, ended_at = clock_timestamp(), ended_by = p_ended_by, end_reason = p_end_reason
     WHERE id = p_id AND state = 'held'
    RETURNING * INTO v_row;
    IF FOUND THEN
        INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail)
        VALUES (p_id, p_to_state, 'held', p_to_state, p_ended_by, p_end_reason);
    END IF;
    RETURN v_row;
END
$$;

-- Cancel (p_action 'cancel', with p_text the reason) or convert (p_action
-- 'convert', with p_text the service reference) reservation p_id of org
-- p_org, naming its fence. Fence, state and deadline are checked in that
-- order, under the locks. R11: a held reservation past its deadline is not
-- cancelled or converted: it is recorded as expired, ended by
-- 'cancellation' or 'conversion' (nobody decided in time, R2), that write
-- stays, and the answer is 'expired'.
--
-- The request is one value (`transition_request`); its fields are named
-- below as the arguments they were (p_text: the reason of a cancel, the
-- service reference of a convert).
CREATE OR REPLACE FUNCTION transition_request_of(p_org bigint, p_actor text, p_req transition_request)
RETURNS transition_result
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    p_id       bigint := p_req.id;
    p_fence    bigint := p_req.fence;
    p_action   text   := p_req.action;
    p_text     text   := CASE p_req.action WHEN 'cancel' THEN p_req.reason ELSE p_req.service_ref END;
    v_row      reservations;
    v_link     service_links;
    v_overdue  boolean;
    v_found_by text := CASE p_action WHEN 'cancel' THEN 'cancellation' ELSE 'conversion' END;
    v_deadline text;
BEGIN
    IF p_action NOT IN ('cancel', 'convert') THEN
        RAISE EXCEPTION 'unknown transition %', p_action;
    END IF;
    -- R10: the machine row is the allocator's lock too; while we hold it no
    -- new order can lock this machine, and an order that holds it finishes
    -- first. lock_hold takes it, then the reservation row (the lock
    -- order); a hold that healing moved meanwhile is read on its new
    -- machine, locked (R15, sql/healing.sql).
    -- R11: the deadline is judged by the database's clock, after the locks.
    v_row := lock_hold(p_org, p_id);
    IF v_row.id IS NULL THEN
        RETURN transition_result_of('not_found', NULL);
    END IF;
    -- R13: a reservation of an order of several machines is cancelled or
    -- converted with its order (order_transition), never alone: alone, it
    -- would leave the order holding part of what it asked.
    IF v_row.quantity > 1 THEN
        RETURN transition_result_of('part_of_order', v_row);
    END IF;
    v_overdue := v_row.expires_at <= clock_timestamp();
    IF v_row.fence <> p_fence THEN
        RETURN transition_result_of('stale_fence', v_row);
    END IF;
    IF v_row.state <> 'held' THEN
        RETURN transition_result_of('not_held', v_row);
    END IF;
    v_deadline := to_char(v_row.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC';
    IF v_overdue THEN
        PERFORM reservation_end(p_id, 'expired', v_found_by,
            format('%s requested by %s after the deadline (%s); nobody decided in time',
                   CASE p_action WHEN 'cancel' THEN 'cancellation' ELSE 'conversion' END, p_actor, v_deadline));
        RETURN transition_result_of('expired', v_row);
    END IF;
    IF p_action = 'cancel' THEN
        RETURN transition_result_of('ok', reservation_end(p_id, 'cancelled', p_actor, p_text));
    END IF;
    -- R15: never sell a machine that is not ready or no longer matches the
    -- order's frozen spec. The machine row is locked (above), so a status or
    -- hardware change either committed before this reading or waits for
    -- our commit.
    IF NOT EXISTS (SELECT 1 FROM machines m WHERE m.id = v_row.machine_id AND machine_fits_hold(m, v_row.spec)) THEN
        RETURN transition_result_of('machine_not_ready', v_row);
    END IF;
    -- R10, promote, never release-then-write: the link is written first,
    -- while the reservation still holds the machine, then the reservation
    -- turns converted; at every instant another order sees one or the other.
    -- R11: the link's creation time and the deadline check are one reading
    -- of the clock, so no link is ever dated after the deadline.
    INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at)
    SELECT p_org, v_row.machine_id, p_id, p_text, t.at
      FROM (SELECT clock_timestamp() AS at) t
     WHERE v_row.expires_at > t.at
    RETURNING * INTO v_link;
    IF NOT FOUND THEN
        PERFORM reservation_end(p_id, 'expired', 'conversion',
            format('conversion requested by %s reached the deadline (%s); nobody decided in time',
                   p_actor, v_deadline));
        RETURN transition_result_of('expired', v_row);
    END IF;
    RETURN transition_result_of('ok',
        reservation_end(p_id, 'converted', p_actor, 'converted into service ' || p_text), v_link);
END
$$;

-- The previous release's entry point, by position: the same transition.
CREATE OR REPLACE FUNCTION reservation_transition(p_org bigint, p_id bigint, p_fence bigint, p_actor text,
                                                  p_action text, p_text text)
RETURNS transition_result
LANGUAGE sql AS $$
    SELECT transition_request_of(p_org, p_actor,
        ROW(p_id, p_fence, p_action,
            CASE p_action WHEN 'cancel' THEN p_text END,
            CASE p_action WHEN 'convert' THEN p_text END)::transition_request)
$$;

-- POST /api/v1/reservations/{id}/cancel and .../convert in one statement:
-- the caller (api_caller, scope orders), then the transition.
--
-- F3: the same request again answers what it did. A caller whose answer was
-- lost (503 outcome_unknown, or no answer) retries unchanged; when the
-- first attempt had committed, the reservation has already ended by this
-- very action, and the retry answers 'ok' with the reservation as that
-- action left it instead of 'not_held': a cancel of a reservation this
-- token cancelled (ended_by is the token's name), a convert of one
-- converted into the same service_ref (with its link). The fence was
-- checked first (reservation_transition answers 'stale_fence' before
-- 'not_held'). Anything else that ended it (an expiry, another action,
-- another actor, another service) stays 'not_held'. The dashboard calls
-- reservation_transition directly: a second submit there is still refused.
-- ROWS: it answers one row (the planner's default of 1,000 made the
-- binary's join of the reservation by id a hash of the whole table).
CREATE OR REPLACE FUNCTION api_transition_request(p_token_hash bytea, p_module_on boolean, p_request jsonb)
RETURNS TABLE (caller text, result transition_result)
LANGUAGE plpgsql ROWS 1 AS $$
DECLARE
    v_req    transition_request := jsonb_populate_record(NULL::transition_request, p_request);
    p_id     bigint := v_req.id;
    p_action text   := v_req.action;
    p_text   text   := CASE v_req.action WHEN 'cancel' THEN v_req.reason ELSE v_req.service_ref END;
    v_caller record;
    v_result transition_result;
    v_link   service_links;
BEGIN
    SELECT * INTO v_caller FROM api_caller(p_token_hash, 'orders', p_module_on);
    IF v_caller.status <> 'ok' THEN
        RETURN QUERY SELECT v_caller.status, NULL::transition_result;
        RETURN;
    END IF;
    v_result := transition_request_of(v_caller.org_id, v_caller.actor, v_req);
    IF v_result.outcome = 'not_held' THEN
        IF p_action = 'cancel' AND v_result.state = 'cancelled' AND v_result.ended_by = v_caller.actor THEN
            -- The same key (id, fence) with another reason is another
            -- request: refused, never answered as the original.
            v_result.outcome := CASE WHEN v_result.end_reason IS NOT DISTINCT FROM p_text
                                     THEN 'ok' ELSE 'idempotency_mismatch' END;
        ELSIF p_action = 'convert' AND v_result.state = 'converted' THEN
            SELECT * INTO v_link FROM service_links s
             WHERE s.reservation_id = p_id AND s.org_id = v_caller.org_id AND s.service_ref = p_text;
            IF FOUND THEN
                v_result.outcome := 'ok';
                v_result.link_id := v_link.id;
                v_result.link_service_ref := v_link.service_ref;
                v_result.link_created_at := v_link.created_at;
                v_result.link_ended_at := v_link.ended_at;
                v_result.link_ended_by := v_link.ended_by;
            ELSIF v_result.ended_by = v_caller.actor THEN
                -- Converted by this caller into another service.
                v_result.outcome := 'idempotency_mismatch';
            END IF;
        END IF;
    END IF;
    RETURN QUERY SELECT 'ok'::text, v_result;
END
$$;

-- The previous release's entry point, by position: the same statement.
CREATE OR REPLACE FUNCTION api_transition(p_token_hash bytea, p_module_on boolean, p_id bigint, p_fence bigint,
                                          p_action text, p_text text)
RETURNS TABLE (caller text, result transition_result)
LANGUAGE sql AS $$
    SELECT * FROM api_transition_request(p_token_hash, p_module_on,
        to_jsonb(ROW(p_id, p_fence, p_action,
                     CASE p_action WHEN 'cancel' THEN p_text END,
                     CASE p_action WHEN 'convert' THEN p_text END)::transition_request))
$$;

-- R13/R14: cancel, convert or extend a whole order in one transaction, or
-- none of it. The order is p_order_ref of org p_org; with p_order_ref NULL,
-- the order of reservation p_ids[1], which must be an order of one (the
-- single-reservation endpoint: 'part_of_order' otherwise). The caller names
-- every reservation of the order once (p_ids, with p_fences in the same
-- order, and for a conversion p_texts, one service reference each).
--
-- Checked in this order, under the locks, and nothing is written unless
-- every check passes: the order exists ('not_found'), the ids are exactly
-- its reservations ('mismatch'), each fence is its reservation's
-- ('stale_fence'), each is held ('not_held'), none is past the deadline
-- (R11: otherwise every held one is recorded as expired, ended by
-- 'cancellation', 'conversion' or 'extension', that write stays, and the
-- answer is 'expired'), and for an extension the cap on the whole hold
-- ('hold_cap': the new deadline would be more than p_cap seconds after
-- creation). Returns one row per reservation, in slot order.
--
-- Locks: every machine of the order, then its reservation rows, in the
-- lock order (lock_holds, sql/locks.sql); holding the machines, no new
-- order can take one of them while the order is converted (R10) or
-- extended.
--
-- Extension (R14): the deadline becomes p_until, or without it p_seconds
-- from now by the database's clock; asking for no later than the deadline
-- changes and writes nothing (an extension never shortens a hold), so an
-- extension to p_until retried after it took effect answers 'ok' with that
-- same deadline (F3); the fence does not change (the holder does not);
-- every slot gets the same deadline and an 'extended' event with the
-- actor, the old and new deadline and the reason.
DROP FUNCTION IF EXISTS order_transition(bigint, text, bigint[], bigint[], text[], text, text, text,
                                         integer, integer);
--
-- The request is one value (`order_request`, read from the binary's jsonb
-- by api_order_request or given whole): its fields are named below as the
-- arguments they were.
CREATE OR REPLACE FUNCTION order_request_transition(p_org bigint, p_actor text, p_req order_request)
RETURNS SETOF transition_result
LANGUAGE plpgsql
ROWS 16
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    p_order_ref text        := p_req.order_ref;
    p_ids       bigint[]    := p_req.ids;
    p_fences    bigint[]    := p_req.fences;
    p_texts     text[]      := p_req.texts;
    p_action    text        := p_req.action;
    p_reason    text        := p_req.reason;
    p_seconds   integer     := p_req.seconds;
    p_cap       integer     := p_req.cap;
    p_until     timestamptz := p_req.until;
    v_ref      text := p_req.order_ref;
    v_rows     reservations[];
    v_row      reservations;
    v_link     service_links;
    v_at       timestamptz;
    v_new      timestamptz;
    v_i        integer;
    v_found_by text := CASE p_action WHEN 'cancel' THEN 'cancellation'
                                     WHEN 'convert' THEN 'conversion' ELSE 'extension' END;
    v_deadline text;
    v_outcome  text;
BEGIN
    IF p_action NOT IN ('cancel', 'convert', 'extend') THEN
        RAISE EXCEPTION 'unknown transition %', p_action;
    END IF;
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_fences)
       OR (p_action = 'convert' AND cardinality(p_ids) IS DISTINCT FROM cardinality(p_texts)) THEN
        RAISE EXCEPTION 'order_transition: one fence (and for convert one service reference) per id';
    END IF;
    IF v_ref IS NULL THEN
        -- org_id + 0: not an index condition, so only the primary key can
        -- answer this lookup by id, whatever the statistics say.
        SELECT r.order_ref INTO v_ref FROM reservations r WHERE r.id = p_ids[1] AND r.org_id + 0 = p_org;
        IF NOT FOUND THEN
            RETURN NEXT transition_result_of('not_found', NULL);
            RETURN;
        END IF;
    END IF;
    -- R10: the machine rows first, then the reservations (see above). An
    -- order's reservations are all written when it is created (R13), so
    -- their ids, read here without a lock, do not change.
    v_rows := ARRAY(SELECT h FROM lock_holds(p_org, ARRAY(SELECT r.id FROM reservations r
                                                           WHERE r.org_id = p_org AND r.order_ref = v_ref)) h
                     ORDER BY h.slot);
    IF cardinality(v_rows) = 0 THEN
        RETURN NEXT transition_result_of('not_found', NULL);
        RETURN;
    END IF;
    IF p_order_ref IS NULL AND v_rows[1].quantity > 1 THEN
        v_outcome := 'part_of_order';
    ELSIF (SELECT array_agg(x ORDER BY x) FROM unnest(p_ids) x)
          IS DISTINCT FROM (SELECT array_agg(r.id ORDER BY r.id) FROM unnest(v_rows) r) THEN
        v_outcome := 'mismatch';
    ELSIF EXISTS (SELECT 1 FROM unnest(v_rows) r JOIN unnest(p_ids, p_fences) g(id, fence) ON g.id = r.id
                   WHERE r.fence <> g.fence) THEN
        v_outcome := 'stale_fence';
    ELSIF EXISTS (SELECT 1 FROM unnest(v_rows) r WHERE r.state <> 'held') THEN
        v_outcome := 'not_held';
    END IF;
    IF v_outcome IS NOT NULL THEN
        RETURN QUERY SELECT x.* FROM unnest(v_rows) r, LATERAL transition_result_of(v_outcome, r) x;
        RETURN;
    END IF;
    -- R11: the deadline is judged by the database's clock, after the locks,
    -- once for the whole order (one deadline). The links of a conversion
    -- are dated with this same reading, so none is dated after it.
    v_at := clock_timestamp();
    v_deadline := to_char(v_rows[1].expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC';
    IF EXISTS (SELECT 1 FROM unnest(v_rows) r WHERE r.expires_at <= v_at) THEN
        FOREACH v_row IN ARRAY v_rows LOOP
            PERFORM reservation_end(v_row.id, 'expired', v_found_by,
                format('%s requested by %s after the deadline (%s); nobody decided in time',
                       CASE p_action WHEN 'cancel' THEN 'cancellation' WHEN 'convert' THEN 'conversion'
                                     ELSE 'extension' END, p_actor, v_deadline));
        END LOOP;
        RETURN QUERY SELECT x.* FROM unnest(v_rows) r, LATERAL transition_result_of('expired', r) x;
        RETURN;
    END IF;
    IF p_action = 'extend' THEN
        v_new := coalesce(p_until, v_at + make_interval(secs => p_seconds));
        -- An extension never shortens a hold: asking for less than is left
        -- changes nothing and writes nothing (the answer is the order as it
        -- is, 'unchanged': a success that the dashboard does not audit).
        IF v_new <= v_rows[1].expires_at THEN
            RETURN QUERY SELECT x.* FROM unnest(v_rows) r, LATERAL transition_result_of('unchanged', r) x;
            RETURN;
        END IF;
        -- R14: the cap is on the whole hold, from creation.
        IF v_new > v_rows[1].created_at + make_interval(secs => p_cap) THEN
            RETURN QUERY SELECT x.* FROM unnest(v_rows) r, LATERAL transition_result_of('hold_cap', r) x;
            RETURN;
        END IF;
        RETURN QUERY
        WITH moved AS (
            UPDATE reservations r SET expires_at = v_new
             WHERE r.id = ANY (p_ids) AND r.state = 'held'
            RETURNING r.*
        ), events AS (
            INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail)
            SELECT moved.id, 'extended', 'held', 'held', p_actor,
                   format('deadline moved from %s to %s (%s s from now, %s s from creation)%s',
                          v_deadline,
                          to_char(v_new AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC',
                          floor(extract(epoch FROM v_new - v_at))::bigint,
                          floor(extract(epoch FROM v_new - moved.created_at))::bigint,
                          CASE WHEN p_reason IS NULL THEN '' ELSE ': ' || p_reason END)
              FROM moved
        )
        SELECT x.* FROM moved, LATERAL transition_result_of('ok', moved::reservations) x ORDER BY moved.slot;
        RETURN;
    END IF;
    IF p_action = 'cancel' THEN
        -- In FROM (LATERAL), so that reservation_end runs once per row.
        RETURN QUERY SELECT x.* FROM unnest(v_rows) r,
                            LATERAL reservation_end(r.id, 'cancelled', p_actor, p_reason) e,
                            LATERAL transition_result_of('ok', e) x
                      ORDER BY r.slot;
        RETURN;
    END IF;
    -- R15: no member is sold unless every machine is ready and matches the
    -- order's spec (all locked).
    SELECT r.* INTO v_row FROM unnest(v_rows) r JOIN machines m ON m.id = r.machine_id
     WHERE NOT machine_fits_hold(m, r.spec) ORDER BY r.slot LIMIT 1;
    IF FOUND THEN
        RETURN NEXT transition_result_of('machine_not_ready', v_row);
        RETURN;
    END IF;
    -- R10 per machine, promote, never release-then-write: each link is
    -- written while its reservation still holds the machine, then the
    -- reservation turns converted; the machine rows stay locked throughout.
    FOR v_i IN 1 .. cardinality(v_rows) LOOP
        v_row := v_rows[v_i];
        INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at)
        SELECT p_org, v_row.machine_id, v_row.id, g.service_ref, v_at
          FROM unnest(p_ids, p_texts) g(id, service_ref)
         WHERE g.id = v_row.id
        RETURNING * INTO v_link;
        RETURN NEXT transition_result_of('ok',
            reservation_end(v_row.id, 'converted', p_actor, 'converted into service ' || v_link.service_ref), v_link);
    END LOOP;
END
$$;

-- The previous release's entry point, by position: the same transition.
CREATE OR REPLACE FUNCTION order_transition(p_org bigint, p_order_ref text, p_ids bigint[], p_fences bigint[],
                                 p_texts text[], p_actor text, p_action text, p_reason text,
                                 p_seconds integer, p_cap integer, p_until timestamptz DEFAULT NULL)
RETURNS SETOF transition_result
LANGUAGE sql AS $$
    SELECT * FROM order_request_transition(p_org, p_actor,
        ROW(p_order_ref, p_ids, p_fences, p_texts, p_action, p_reason, p_seconds, p_cap, p_until)::order_request)
$$;

-- The API's order actions and the extension of one reservation, in one
-- statement: the caller (api_caller, scope orders), then order_transition.
--
-- F3, as api_transition for one reservation: an order cancel or convert
-- retried unchanged after it committed answers 'ok' with the order as that
-- action left it instead of 'not_held': every reservation cancelled by this
-- token, or every one converted into the service_ref named for it (with its
-- link as it is now). The ids and fences were checked first ('mismatch',
-- 'stale_fence' come before 'not_held'). Anything else stays 'not_held'.
DROP FUNCTION IF EXISTS api_order_transition(bytea, boolean, text, bigint[], bigint[], text[], text, text,
                                             integer, integer);
-- ROWS: an order has at most 16 reservations (R13), as for
-- order_request_transition.
CREATE OR REPLACE FUNCTION api_order_request(p_token_hash bytea, p_module_on boolean, p_request jsonb)
RETURNS TABLE (caller text, result transition_result)
LANGUAGE plpgsql ROWS 16 AS $$
DECLARE
    v_req    order_request := jsonb_populate_record(NULL::order_request, p_request);
    p_ids    bigint[]      := v_req.ids;
    p_texts  text[]        := v_req.texts;
    p_action text          := v_req.action;
    p_reason text          := v_req.reason;
    v_outcome text;
    v_caller record;
    v_rows   transition_result[];
BEGIN
    SELECT * INTO v_caller FROM api_caller(p_token_hash, 'orders', p_module_on);
    IF v_caller.status <> 'ok' THEN
        RETURN QUERY SELECT v_caller.status, NULL::transition_result;
        RETURN;
    END IF;
    v_rows := ARRAY(SELECT t FROM order_request_transition(v_caller.org_id, v_caller.actor, v_req) t);
    IF v_rows[1].outcome = 'not_held' AND p_action = 'cancel'
       AND NOT EXISTS (SELECT 1 FROM unnest(v_rows) r
                        WHERE r.state <> 'cancelled' OR r.ended_by IS DISTINCT FROM v_caller.actor) THEN
        -- Cancelled by this caller with another reason: another request.
        v_outcome := CASE WHEN EXISTS (SELECT 1 FROM unnest(v_rows) r WHERE r.end_reason IS DISTINCT FROM p_reason)
                          THEN 'idempotency_mismatch' ELSE 'ok' END;
        RETURN QUERY SELECT 'ok'::text, x
            FROM unnest(v_rows) r JOIN reservations res ON res.id = r.id,
                 LATERAL transition_result_of(v_outcome, res) x
           ORDER BY res.slot;
        RETURN;
    END IF;
    IF v_rows[1].outcome = 'not_held' AND p_action = 'convert'
       AND NOT EXISTS (SELECT 1 FROM unnest(v_rows) r
                        WHERE r.state <> 'converted'
                           OR NOT EXISTS (SELECT 1 FROM service_links s JOIN unnest(p_ids, p_texts) g(id, service_ref)
                                                     ON g.id = s.reservation_id
                                           WHERE s.reservation_id = r.id AND s.org_id = v_caller.org_id
                                             AND s.service_ref = g.service_ref)) THEN
        RETURN QUERY SELECT 'ok'::text, x
            FROM unnest(v_rows) r JOIN reservations res ON res.id = r.id
                 JOIN service_links s ON s.reservation_id = r.id AND s.org_id = v_caller.org_id,
                 LATERAL transition_result_of('ok', res, s) x
           ORDER BY res.slot;
        RETURN;
    END IF;
    -- Converted whole by this caller, into other services than these.
    IF v_rows[1].outcome = 'not_held' AND p_action = 'convert'
       AND NOT EXISTS (SELECT 1 FROM unnest(v_rows) r
                        WHERE r.state <> 'converted' OR r.ended_by IS DISTINCT FROM v_caller.actor) THEN
        RETURN QUERY SELECT 'ok'::text, x
            FROM unnest(v_rows) r JOIN reservations res ON res.id = r.id,
                 LATERAL transition_result_of('idempotency_mismatch', res) x
           ORDER BY res.slot;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'ok'::text, r FROM unnest(v_rows) r;
END
$$;

-- The previous release's entry point, by position: the same statement.
CREATE OR REPLACE FUNCTION api_order_transition(p_token_hash bytea, p_module_on boolean, p_order_ref text,
                                     p_ids bigint[], p_fences bigint[], p_texts text[], p_action text,
                                     p_reason text, p_seconds integer, p_cap integer,
                                     p_until timestamptz DEFAULT NULL)
RETURNS TABLE (caller text, result transition_result)
LANGUAGE sql AS $$
    SELECT * FROM api_order_request(p_token_hash, p_module_on,
        to_jsonb(ROW(p_order_ref, p_ids, p_fences, p_texts, p_action, p_reason, p_seconds, p_cap,
                     p_until)::order_request))
$$;
