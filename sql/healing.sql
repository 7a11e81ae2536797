-- R15: a held machine is always a ready machine. When a machine under a
-- live hold leaves `ready`, in the same transaction (a trigger, so that the
-- API, the dashboard and any other writer of machines.status all pass
-- through it) the hold moves to an equivalent machine of the order's frozen
-- spec, found by the allocator's walk; or, when there is none, the whole
-- order is cancelled, in words, by whoever changed the status.
--
-- The actor is read from the transaction's setting `poolkeeper.actor` (set
-- by the writer with set_config(..., true)); a writer that sets none is
-- recorded as 'machine status change'.
--
-- Locks: the changed machine's row is locked by the UPDATE that fired us.
-- Then every reservation row of its order, in slot order (two status
-- changes of two machines of one order queue there instead of
-- deadlocking), then candidates one at a time with SKIP LOCKED (R3/R4:
-- never a wait on another order's machine).

-- How many candidates the walk looks at, at most (R7: bounded).
CREATE OR REPLACE FUNCTION healing_walk_limit() RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT 32 $$;

-- Moves live hold p_hold (locked) off machine p_old to an equivalent ready
-- machine; returns the new machine's verdict, or NULL when none is free.
CREATE OR REPLACE FUNCTION heal_hold(p_hold reservations, p_old machines, p_actor text)
RETURNS machine_verdict
LANGUAGE plpgsql AS $$
DECLARE
    v_site    text := p_hold.spec->>'site';
    v_profile text := p_hold.spec->>'profile';
    v_vendor  text := p_hold.spec->>'vendor';
    v_cand    machine_verdict;
    v_now     machine_verdict;
    v_reason  text;
BEGIN
    FOR v_cand IN SELECT * FROM machine_candidates(p_hold.org_id, v_site, v_profile, v_vendor, healing_walk_limit())
    LOOP
        CONTINUE WHEN v_cand.id = p_old.id;
        -- R3/R4: one candidate locked at a time, by its key; locked by
        -- someone else is skipped. Status re-checked on the newest version.
        PERFORM 1 FROM machines WHERE id = v_cand.id AND status = 'ready' FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        -- A fresh reading under the lock: no live link, no live holder.
        SELECT * INTO v_now FROM machine_verdicts(p_hold.org_id, v_site, v_profile, v_vendor) v
         WHERE v.id = v_cand.id;
        CONTINUE WHEN NOT FOUND OR v_now.exclusion IS NOT NULL;
        v_reason := format('%s (%s, %s, %s, %s) matched site %s, profile %s, %s: replaced %s, which went %s',
                           v_now.asset_tag, v_now.site, v_now.vendor, v_now.profile, v_now.status,
                           v_site, v_profile,
                           CASE WHEN v_vendor IS NULL THEN 'any vendor' ELSE 'vendor ' || v_vendor END,
                           p_old.asset_tag, p_old.status);
        IF p_hold.quantity > 1 THEN
            v_reason := v_reason || format('; machine %s of %s of the order', p_hold.slot, p_hold.quantity);
        END IF;
        v_reason := v_reason || format('; held for %s s', p_hold.hold_seconds);
        BEGIN
            -- R1: the arbiter stays the unique index; an overdue holder of
            -- the candidate (the sweep's to expire) makes this one taken.
            UPDATE reservations r
               SET machine_id = v_now.id,
                   machine_snapshot = jsonb_build_object('asset_tag', v_now.asset_tag, 'site', v_now.site,
                                                         'vendor', v_now.vendor, 'profile', v_now.profile,
                                                         'status', v_now.status, 'updated_at', v_now.updated_at),
                   reason = v_reason
             WHERE r.id = p_hold.id;
        EXCEPTION WHEN unique_violation THEN
            CONTINUE;
        END;
        INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail,
                                        replaced_machine_id)
        VALUES (p_hold.id, 'machine_replaced', 'held', 'held', p_actor,
                format('machine %s %s; moved to %s (was: %s)', p_old.asset_tag, p_old.status, v_now.asset_tag,
                       p_hold.reason),
                p_old.id);
        RETURN v_now;
    END LOOP;
    RETURN NULL;
END
$$;

-- AFTER UPDATE OF status ON machines, for a machine that left `ready`.
CREATE OR REPLACE FUNCTION machines_heal_holds() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_actor  text := coalesce(nullif(current_setting('poolkeeper.actor', true), ''), 'machine status change');
    v_hold   reservations;
    v_member reservations;
    v_moved  machine_verdict;
    v_words  text;
BEGIN
    SELECT * INTO v_hold FROM reservations r
     WHERE r.machine_id = NEW.id AND r.state = 'held' AND r.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RETURN NULL;  -- no live hold (an overdue one is the sweep's, R11)
    END IF;
    -- The whole order, in slot order, then our member again under the lock.
    PERFORM 1 FROM reservations r
      WHERE r.org_id = v_hold.org_id AND r.order_ref = v_hold.order_ref
      ORDER BY r.slot FOR UPDATE;
    SELECT * INTO v_hold FROM reservations r
     WHERE r.id = v_hold.id AND r.machine_id = NEW.id AND r.state = 'held' AND r.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_moved := heal_hold(v_hold, NEW, v_actor);
    IF v_moved.id IS NOT NULL THEN
        RETURN NULL;
    END IF;
    -- R13: no equivalent machine; the order stays whole by ending whole.
    v_words := format('machine %s %s; no equivalent machine in %s', NEW.asset_tag, NEW.status, v_hold.spec->>'site');
    FOR v_member IN SELECT * FROM reservations r
                     WHERE r.org_id = v_hold.org_id AND r.order_ref = v_hold.order_ref AND r.state = 'held'
                     ORDER BY r.slot
    LOOP
        PERFORM reservation_end(v_member.id, 'cancelled', v_actor, v_words);
    END LOOP;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS machines_heal_holds ON machines;
CREATE TRIGGER machines_heal_holds
    AFTER UPDATE OF status ON machines
    FOR EACH ROW
    WHEN (OLD.status = 'ready' AND NEW.status <> 'ready')
    EXECUTE FUNCTION machines_heal_holds();
