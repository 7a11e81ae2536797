-- The lock order (docs/rules.md, "Lock order"). Every transaction that
-- waits for row locks takes them in this order, so that no two of them can
-- wait for each other:
--
--   1. machine rows, in id order, in one statement;
--   2. the turns of the pools with headroom (R18, sql/capacity.sql), by key;
--   3. reservation rows, in id order, in one statement;
--   4. anything after that with SKIP LOCKED, never waited for (the
--      candidates of the allocator and of healing, R3/R4).
--
-- A reserve takes its turns (a customer's, R19, then a pool's) first and
-- then never waits for a machine row, so it cannot close a cycle with 1-3.
--
-- A transaction that holds reservation rows therefore holds every machine
-- it will wait for, and waits only for reservation rows of higher id. The
-- functions here are the steps 1 and 2 of every writer that needs both a
-- hold's machine and its row: a cancel, a convert, an extension
-- (sql/transitions.sql) and a status or hardware change (sql/healing.sql,
-- src/healing.rs). The allocator and the sweep never wait for a machine.

-- Step 1 for machines named up front (a status change names its rack).
CREATE OR REPLACE FUNCTION lock_machines(p_ids bigint[]) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    PERFORM 1 FROM machines m WHERE m.id = ANY (p_ids) ORDER BY m.id FOR UPDATE;
END
$$;

-- Steps 1 and 2 for reservations p_ids of org p_org (one reservation, or
-- every reservation of an order): their machines, then their rows, both in
-- id order; returns the rows, locked, in id order.
--
-- The machines are read before they are locked, so a hold that healing
-- moved in between sits on a machine this transaction does not hold, and
-- waiting for that machine now would break the order. Instead this raises
-- SQLSTATE 40PK1 ("hold moved"), having written nothing: the caller rolls
-- back (to a savepoint, or the statement) and calls again, which reads the
-- new machine. Once the machines under every hold are held, no hold can
-- move (healing moves a hold only off a machine it has locked).
CREATE OR REPLACE FUNCTION lock_holds(p_org bigint, p_ids bigint[]) RETURNS SETOF reservations
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_machines bigint[];
    v_row      reservations;
BEGIN
    -- org_id + 0: not an index condition, so only the primary key answers
    -- these lookups by id, whatever the statistics say.
    -- The machine ids as one array (an InitPlan), so that the lock is a
    -- lookup of the primary key whatever plan was cached on an empty table.
    v_machines := ARRAY(SELECT m.id FROM machines m
                         WHERE m.id = ANY (ARRAY(SELECT r.machine_id FROM reservations r
                                                  WHERE r.id = ANY (p_ids) AND r.org_id + 0 = p_org))
                         ORDER BY m.id FOR UPDATE);
    FOR v_row IN SELECT r.* FROM reservations r WHERE r.id = ANY (p_ids) AND r.org_id + 0 = p_org
                  ORDER BY r.id FOR UPDATE
    LOOP
        IF v_row.machine_id <> ALL (v_machines) THEN
            RAISE EXCEPTION USING ERRCODE = '40PK1',
                MESSAGE = format('reservation %s moved to another machine while it was being locked', v_row.id),
                HINT = 'nothing was written; run the transaction again';
        END IF;
        RETURN NEXT v_row;
    END LOOP;
END
$$;

-- lock_holds for one reservation (a cancel, a convert, an extension): the
-- same two steps and the same 40PK1, without the set and the arrays;
-- NULL when org p_org has no reservation p_id.
CREATE OR REPLACE FUNCTION lock_hold(p_org bigint, p_id bigint) RETURNS reservations
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_machine bigint;
    v_row     reservations;
BEGIN
    SELECT r.machine_id INTO v_machine FROM reservations r WHERE r.id = p_id AND r.org_id + 0 = p_org;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM machines m WHERE m.id = v_machine FOR UPDATE;
    SELECT r.* INTO v_row FROM reservations r WHERE r.id = p_id AND r.org_id + 0 = p_org FOR UPDATE;
    IF v_row.machine_id <> v_machine THEN
        RAISE EXCEPTION USING ERRCODE = '40PK1',
            MESSAGE = format('reservation %s moved to another machine while it was being locked', v_row.id),
            HINT = 'nothing was written; run the transaction again';
    END IF;
    RETURN v_row;
END
$$;

-- Step 2 for a status or hardware change of machines p_machines, which the
-- caller has locked (step 1): the rows of every order with a live hold on
-- one of them, in id order. Those are the rows healing may move or cancel
-- (R13: an order is cancelled whole). Holds on locked machines cannot
-- move or appear meanwhile, so nothing here can be stale.
CREATE OR REPLACE FUNCTION lock_orders_on(p_machines bigint[]) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    -- Each order's rows by its key, the orders read first (a lookup of the
    -- arbiter's index per machine), so that no cached plan walks the table.
    PERFORM 1 FROM reservations r
      WHERE r.id = ANY (ARRAY(
            SELECT o.id FROM reservations h
              JOIN LATERAL (SELECT x.id FROM reservations x
                             WHERE x.org_id = h.org_id AND x.order_ref = h.order_ref) o ON true
             WHERE h.machine_id = ANY (p_machines) AND h.state = 'held' AND h.expires_at > clock_timestamp()))
      ORDER BY r.id FOR UPDATE;
END
$$;
