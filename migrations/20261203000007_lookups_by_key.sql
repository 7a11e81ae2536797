-- Lookups by key stay on their key's index when the plans were cached
-- while reservations was analyzed empty (a new deployment, before
-- autoanalyze comes by). On such a table every index led by org_id costs
-- the same as the key's, and the generic plans that the allocator's and the
-- transitions' functions cache per connection (plan_cache_mode =
-- force_generic_plan) took whichever came first: the R9 lookup by order_ref
-- went through reservations_created_recently_idx, the transitions' lookups
-- by id through reservations_order_ref_unique_per_org, each reading the
-- organization's whole history on every call until autoanalyze re-planned
-- them (found by bench item 8 on a small fresh database: the reserve rate
-- fell by a third in a few seconds and came back at once after ANALYZE;
-- tests/api/allocator.rs, plans_cached_on_an_empty_table_look_reservations_up_by_their_keys).

-- 1. The overview's chart index, partial, so that only queries bounding
-- created_at can use it (`created_at >= $2` implies the predicate; a lookup
-- by id or by order_ref does not), as reservations_ended_recently_idx is.
-- created_at is NOT NULL, so it holds every row as before. Building it
-- locks writes to reservations while it runs (about a second per million
-- rows here).
DROP INDEX reservations_created_recently_idx;
CREATE INDEX reservations_created_recently_idx ON reservations (org_id, created_at)
    WHERE created_at IS NOT NULL;

-- 2. The transitions' lookups by id: the organization is checked outside
-- the index conditions. Otherwise as in 20261203000006_transitions.sql.
CREATE OR REPLACE FUNCTION reservation_transition(p_org bigint, p_id bigint, p_fence bigint, p_actor text,
                                       p_action text, p_text text)
RETURNS transition_result
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
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
    -- first. The machine of a reservation never changes.
    -- org_id + 0: not an index condition, so only the primary key can
    -- answer these two lookups by id, whatever the statistics say.
    PERFORM 1 FROM machines
      WHERE id = (SELECT r.machine_id FROM reservations r WHERE r.id = p_id AND r.org_id + 0 = p_org)
      FOR UPDATE;
    -- R11: the deadline is judged by the database's clock, after the locks.
    SELECT * INTO v_row FROM reservations r WHERE r.id = p_id AND r.org_id + 0 = p_org FOR UPDATE;
    IF NOT FOUND THEN
        RETURN transition_result_of('not_found', NULL);
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
