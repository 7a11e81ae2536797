-- R15: a held machine is always a ready machine that matches its order.
-- When a machine under a live hold leaves `ready`, or its hardware changes
-- so that it no longer matches the order's frozen spec (site, profile, the
-- vendor the order named), in the same transaction (a trigger, so that the
-- API, the dashboard and any other writer of machines pass through it) the
-- hold moves to an equivalent machine of the order's frozen spec, found by
-- the allocator's walk; or, when there is none, the whole order is
-- cancelled, in words, by whoever changed the machine.
--
-- The actor is read from the transaction's setting `poolkeeper.actor` (set
-- by the writer with set_config(..., true)); a writer that sets none is
-- recorded as 'machine status change'.
--
-- Locks, in the lock order of sql/locks.sql: the changed machine's row is
-- locked by the UPDATE that fired us (a rack's, all of them, in id order
-- before it: src/healing.rs); then the rows of every order with a live hold
-- on it, in id order (lock_orders_on); then candidates one at a time with
-- SKIP LOCKED (R3/R4: never a wait on another order's machine).

-- R15's match: machine p_m can carry a hold of spec p_spec.
CREATE OR REPLACE FUNCTION machine_fits_hold(p_m machines, p_spec jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_m.status = 'ready' AND p_m.site = p_spec->>'site' AND p_m.profile = p_spec->>'profile'
           AND (p_spec->>'vendor' IS NULL OR p_m.vendor = p_spec->>'vendor')
$$;

-- How many candidates the walk looks at, at most (R7: bounded).
CREATE OR REPLACE FUNCTION healing_walk_limit() RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT 32 $$;

-- Moves live hold p_hold (locked) off machine p_old (as it is now; p_went
-- says what happened to it, machine_change_words) to an equivalent ready
-- machine; returns the new machine's verdict, or NULL when none is free.
DROP FUNCTION IF EXISTS heal_hold(reservations, machines, text);
CREATE OR REPLACE FUNCTION heal_hold(p_hold reservations, p_old machines, p_went text, p_actor text)
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
    -- R18: never into headroom kept for another segment.
    IF NOT healing_may_take(p_hold) THEN
        RETURN NULL;
    END IF;
    FOR v_cand IN SELECT * FROM machine_candidates(p_hold.org_id, v_site, v_profile, v_vendor, healing_walk_limit())
    LOOP
        CONTINUE WHEN v_cand.id = p_old.id;
        -- R3/R4: one candidate locked at a time, by its key; locked by
        -- someone else is skipped. Status re-checked on the newest version.
        PERFORM 1 FROM machines WHERE id = v_cand.id AND status = 'ready' FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        -- A fresh reading under the lock: no live link, no holder at all.
        -- An overdue holder (the sweep's to expire, R11) is skipped too: the
        -- arbiter (R1) would refuse the move onto it. Nothing else can put a
        -- hold on this machine while we hold its row (every writer of a
        -- hold locks the machine first), so the UPDATE below cannot meet a
        -- unique violation and needs no subtransaction of its own.
        SELECT * INTO v_now FROM machine_verdicts(p_hold.org_id, v_site, v_profile, v_vendor) v
         WHERE v.id = v_cand.id;
        CONTINUE WHEN NOT FOUND OR v_now.exclusion IS NOT NULL;
        CONTINUE WHEN EXISTS (SELECT 1 FROM reservations r WHERE r.machine_id = v_cand.id AND r.state = 'held');
        v_reason := format('%s (%s, %s, %s, %s) matched site %s, profile %s, %s: replaced %s, which %s',
                           v_now.asset_tag, v_now.site, v_now.vendor, v_now.profile, v_now.status,
                           v_site, v_profile,
                           CASE WHEN v_vendor IS NULL THEN 'any vendor' ELSE 'vendor ' || v_vendor END,
                           p_old.asset_tag,
                           CASE WHEN p_old.status <> 'ready' THEN 'went ' || p_went ELSE p_went END);
        IF p_hold.quantity > 1 THEN
            v_reason := v_reason || format('; machine %s of %s of the order', p_hold.slot, p_hold.quantity);
        END IF;
        v_reason := v_reason || format('; held for %s s', p_hold.hold_seconds);
        UPDATE reservations r
           SET machine_id = v_now.id,
               machine_snapshot = jsonb_build_object('asset_tag', v_now.asset_tag, 'site', v_now.site,
                                                     'vendor', v_now.vendor, 'profile', v_now.profile,
                                                     'status', v_now.status, 'updated_at', v_now.updated_at),
               reason = v_reason
         WHERE r.id = p_hold.id;
        INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail,
                                        replaced_machine_id)
        VALUES (p_hold.id, 'machine_replaced', 'held', 'held', p_actor,
                format('machine %s %s; moved to %s (was: %s)', p_old.asset_tag, p_went, v_now.asset_tag,
                       p_hold.reason),
                p_old.id);
        RETURN v_now;
    END LOOP;
    RETURN NULL;
END
$$;

-- What happened to machine p_new (was p_old), in words that follow its
-- tag: "maintenance" (its new status), "changed (site par1 to ams9, vendor
-- dell to hpe)", or "maintenance and changed (...)".
CREATE OR REPLACE FUNCTION machine_change_words(p_old machines, p_new machines) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN changes IS NULL THEN p_new.status
                WHEN p_new.status <> 'ready' THEN format('%s and changed (%s)', p_new.status, changes)
                ELSE format('changed (%s)', changes) END
      FROM (SELECT nullif(concat_ws(', ',
                   CASE WHEN p_old.site <> p_new.site THEN format('site %s to %s', p_old.site, p_new.site) END,
                   CASE WHEN p_old.vendor <> p_new.vendor THEN format('vendor %s to %s', p_old.vendor, p_new.vendor) END,
                   CASE WHEN p_old.profile <> p_new.profile
                        THEN format('profile %s to %s', p_old.profile, p_new.profile) END), '') AS changes) c
$$;

-- R15 with R18: why live hold p_hold found no machine to move to, in words
-- that follow "; ": the machines of its pool left are kept for other
-- segments (there is one, but not for this order), or there is none.
CREATE OR REPLACE FUNCTION healing_refusal_words(p_hold reservations) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_site     text := p_hold.spec->>'site';
    v_profile  text := p_hold.spec->>'profile';
    v_own      text[] := array_remove(ARRAY[p_hold.segment,
                                            (SELECT o.repairs_segment FROM organizations o
                                              WHERE o.id = p_hold.org_id)], NULL);
    v_segments text[];
BEGIN
    IF EXISTS (SELECT 1 FROM machine_candidates(p_hold.org_id, v_site, v_profile, p_hold.spec->>'vendor', 1))
       AND NOT healing_may_take(p_hold) THEN
        SELECT array_agg(h.segment ORDER BY h.segment) INTO v_segments FROM headroom h
         WHERE h.org_id = p_hold.org_id AND h.site = v_site AND h.profile = v_profile
           AND h.machines > 0 AND NOT (h.segment = ANY (v_own));
        RETURN format('the equivalent machines left in %s are kept for %s %s', v_site,
                      CASE WHEN cardinality(v_segments) = 1 THEN 'segment' ELSE 'segments' END,
                      array_to_string(v_segments, ', '));
    END IF;
    RETURN format('no equivalent machine in %s', v_site);
END
$$;

-- AFTER UPDATE OF status, site, vendor, profile ON machines, for a machine
-- that left `ready` or whose hardware changed.
CREATE OR REPLACE FUNCTION machines_heal_holds() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_actor  text := coalesce(nullif(current_setting('poolkeeper.actor', true), ''), 'machine status change');
    v_hold   reservations;
    v_member reservations;
    v_moved  machine_verdict;
    v_went   text;
    v_words  text;
BEGIN
    -- The lock order: after the machine, the turn of its hold's pool (R18,
    -- where it keeps headroom), then the rows of the order in id order,
    -- then our member again under the lock.
    PERFORM pool_turns_of(ARRAY[NEW.id]);
    PERFORM lock_orders_on(ARRAY[NEW.id]);
    SELECT * INTO v_hold FROM reservations r
     WHERE r.machine_id = NEW.id AND r.state = 'held' AND r.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RETURN NULL;  -- no live hold (an overdue one is the sweep's, R11)
    END IF;
    IF machine_fits_hold(NEW, v_hold.spec) THEN
        RETURN NULL;  -- still ready and still what the order asked (a vendor it did not name changed)
    END IF;
    v_went := machine_change_words(OLD, NEW);
    v_moved := heal_hold(v_hold, NEW, v_went, v_actor);
    IF v_moved.id IS NOT NULL THEN
        RETURN NULL;
    END IF;
    -- R20: a declared substitute of the profile asked, before the order
    -- is cancelled (sql/substitutes.sql says which orders and locks).
    v_moved := heal_hold_onto_substitutes(v_hold, NEW, v_went, v_actor);
    IF v_moved.id IS NOT NULL THEN
        RETURN NULL;
    END IF;
    -- R13: no equivalent machine; the order stays whole by ending whole.
    v_words := format('machine %s %s; %s', NEW.asset_tag, v_went, healing_refusal_words(v_hold));
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
    AFTER UPDATE OF status, site, vendor, profile ON machines
    FOR EACH ROW
    WHEN ((OLD.status = 'ready' AND NEW.status <> 'ready')
          OR (OLD.status = 'ready' AND (OLD.site, OLD.vendor, OLD.profile)
                                       IS DISTINCT FROM (NEW.site, NEW.vendor, NEW.profile)))
    EXECUTE FUNCTION machines_heal_holds();
