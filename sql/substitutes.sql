-- R20: an order is served, not refused, while a declared substitute can
-- fill it (docs/rules.md). A reserve that allows substitutes
-- (reserve_order_request, `substitutes` 'allowed') and whose profile has a
-- declaration that applies to its segment is decided here, in the
-- reserve's own statement: the asked pool first, then each substitute in
-- the declared order, the first pool that can fill the whole order taking
-- it. Each pool is tried exactly as a reserve of that profile would be
-- (R4-R8 in the walk, R13 all or nothing, R18 its headroom), so the rules
-- hold for a substitute as for the asked pool; R19's cap was checked by
-- the caller, over every profile. An order of one whose asked pool keeps
-- no headroom has walked that pool already, as a plain reserve (the
-- caller's fast path), and comes here only when the walk took nothing.
--
-- Locks (the lock order of docs/rules.md): after the customer's turn
-- (R19, taken by the caller), the declaration's turn, shared
-- (substitutes_for), then every turn the order could need, over all of
-- its pools, up front and by key:
-- the headroom turns (R18, class 18) of the pools that keep headroom,
-- then, for an order of several, the turns of orders of several (R13,
-- class 13). Never in the order of preference: two orders whose lists
-- name the same pools in opposite orders take their turns in the same
-- order and queue instead of deadlocking. After the turns, only SKIP
-- LOCKED on machines, as any reserve.
--
-- The declaration's turn (class 20, per profile) is held shared until the
-- reserve commits; a change of the list takes it exclusive first
-- (substitutes_turn, from capacity::set_substitutes), so it waits for
-- every reserve that read the list, and a reserve that comes after it
-- waits for its commit and then reads the new list (a statement of its
-- own, so a snapshot taken after the wait). So every hold's profile was
-- allowed by the list in force when its reserve committed. A shared
-- advisory lock, not a row lock: it writes nothing (a FOR SHARE would
-- write the row's locker, and a MultiXact under concurrency, at every
-- reserve), and it covers a declaration that does not exist yet.

-- R20: the declaration's turn of profile p_profile of org p_org,
-- exclusive: what a change of the list takes before it reads or writes
-- the row. Class 20, apart from the other turns' classes.
CREATE OR REPLACE FUNCTION substitutes_turn(p_org bigint, p_profile text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(20, hashtext(p_org::text || '/' || p_profile))
$$;

-- R20: the substitutes of profile p_profile of org p_org for an order of
-- segment p_segment (NULL: none), in the declared order; empty when there
-- is no declaration or it is kept for other segments. Takes the
-- declaration's turn shared (above) whether or not one applies.
CREATE OR REPLACE FUNCTION substitutes_for(p_org bigint, p_profile text, p_segment text) RETURNS text[]
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_list     text[];
    v_segments text[];
BEGIN
    PERFORM pg_advisory_xact_lock_shared(20, hashtext(p_org::text || '/' || p_profile));
    -- A statement of its own: its snapshot is taken after the wait.
    SELECT s.substitutes, s.segments INTO v_list, v_segments FROM substitutes s
     WHERE s.org_id = p_org AND s.profile = p_profile;
    IF NOT FOUND THEN
        RETURN '{}';
    END IF;
    IF cardinality(v_segments) > 0 AND (p_segment IS NULL OR NOT p_segment = ANY (v_segments)) THEN
        RETURN '{}';
    END IF;
    RETURN v_list;
END
$$;

-- The turns of an order of p_quantity machines at site p_site that may
-- be served by any of p_profiles: R18's for each pool that keeps headroom,
-- then R13's for each pool when p_quantity > 1, each class by key (the
-- lock order above). Returns whether any turn was taken (then R9 asks
-- again: an order with the same key may have committed while we waited).
CREATE OR REPLACE FUNCTION substitute_turns(p_org bigint, p_site text, p_profiles text[], p_quantity integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_profile text;
    v_taken   boolean := false;
BEGIN
    FOR v_profile IN SELECT x.p FROM (SELECT DISTINCT p FROM unnest(p_profiles) p
                                        WHERE EXISTS (SELECT 1 FROM headroom h
                                                       WHERE h.org_id = p_org AND h.site = p_site AND h.profile = p)) x
                      ORDER BY hashtext(p_org::text || '/' || p_site || '/' || x.p), x.p
    LOOP
        PERFORM pool_turn(p_org, p_site, v_profile);
        v_taken := true;
    END LOOP;
    IF p_quantity > 1 THEN
        FOR v_profile IN SELECT x.p FROM (SELECT DISTINCT p FROM unnest(p_profiles) p) x
                          ORDER BY hashtext(p_org::text || '/' || p_site || '/' || x.p), x.p
        LOOP
            -- The same key as reserve_order_request's turn of orders of
            -- several (class 13).
            PERFORM pg_advisory_xact_lock(13, hashtext(p_org::text || '/' || p_site || '/' || v_profile));
            v_taken := true;
        END LOOP;
    END IF;
    RETURN v_taken;
END
$$;

-- R20, R21: an order served by a substitute is demand of the asked pool,
-- with its own code: one row per order, the order's site, the ASKED
-- profile, the order's quantity, and the profile that served it.
CREATE OR REPLACE FUNCTION record_substitution(p_org bigint, p_req reserve_request, p_served text)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO reservation_refusals (org_id, reason, site, profile, vendor, excluded, quantity, segment,
                                      customer_ref, profile_served)
    VALUES (p_org, 'substituted', p_req.site, p_req.profile, p_req.vendor, jsonb_build_object('served', p_served),
            p_req.quantity, p_req.segment, p_req.customer_ref, p_served)
$$;

-- R20: the reserve of p_req (its R9 first ask and R19's cap already done
-- by reserve_order_request) over the asked pool and then p_list, the
-- substitutes in the declared order (substitutes_for, which holds the
-- declaration). Answers as reserve_order_request does: the order's rows
-- ('created' or 'existing'), or one refusal row, recorded as lost demand
-- of the asked pool. The refusal is 'contended' when a pool tried had
-- enough matching machines but they could not be locked now, else
-- 'reserved' when one had them but kept for other segments (R18), else
-- 'unavailable' with the asked pool's counts.
CREATE OR REPLACE FUNCTION reserve_substituting(p_org bigint, p_actor text, p_req reserve_request, p_list text[])
RETURNS SETOF reserve_answer
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_sort = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_pools      text[] := ARRAY[p_req.profile] || p_list;
    v_profile    text;
    v_try        reserve_request;
    v_kept       integer;
    v_reserved   boolean;
    v_candidates bigint[];
    v_rows       reserve_answer[];
    v_result     reserve_answer;
    v_walked     reserve_answer := reserve_answer_of('nothing', NULL, 0, 0, 0, 0);
    v_contended  text;
    v_kept_by    text;
    v_kept_n     integer;
    v_free       bigint;
    v_counts     jsonb;
BEGIN
    IF substitute_turns(p_org, p_req.site, v_pools, p_req.quantity) THEN
        RETURN QUERY SELECT x.* FROM reservations r,
                            LATERAL reserve_answer_of('existing', r, 0, 0, 0, 0) x
                       WHERE r.org_id = p_org AND r.order_ref = p_req.order_ref ORDER BY r.slot;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    FOREACH v_profile IN ARRAY v_pools LOOP
        v_try := p_req;
        v_try.profile := v_profile;
        v_try.profile_asked := CASE WHEN v_profile <> p_req.profile THEN p_req.profile END;
        -- R18 for this pool, in its turn (taken above where it keeps headroom).
        v_kept := 0;
        v_reserved := false;
        IF EXISTS (SELECT 1 FROM headroom h WHERE h.org_id = p_org AND h.site = p_req.site AND h.profile = v_profile) THEN
            v_kept := pool_kept_for_others(p_org, p_req.site, v_profile, ARRAY[p_req.segment]);
            v_reserved := v_kept > 0
                AND (SELECT count(*) FROM machine_candidates(p_org, p_req.site, v_profile, NULL, v_kept + p_req.quantity))
                    < v_kept + p_req.quantity;
        END IF;
        v_candidates := ARRAY(SELECT c.id FROM machine_candidates(p_org, p_req.site, v_profile, p_req.vendor,
                                                                  first_batch(p_req.quantity)) c);
        IF cardinality(v_candidates) >= p_req.quantity AND NOT v_reserved THEN
            IF p_req.quantity = 1 THEN
                v_rows := ARRAY(SELECT w FROM reserve_walk_slots(p_org, p_actor, v_try, v_candidates) w);
            ELSE
                v_rows := ARRAY(SELECT w FROM reserve_order_walk(p_org, p_actor, v_try, v_candidates) w);
            END IF;
            v_result := v_rows[1];
            IF v_result.outcome = 'created' AND v_try.profile_asked IS NOT NULL THEN
                PERFORM record_substitution(p_org, p_req, v_profile);
            END IF;
            IF v_result.outcome <> 'nothing' THEN
                FOREACH v_result IN ARRAY v_rows LOOP
                    RETURN NEXT v_result;
                END LOOP;
                RETURN;
            END IF;
            -- The walk's counters add up over the pools tried.
            v_walked.scanned := v_walked.scanned + v_result.scanned;
            v_walked.locked_by_others := v_walked.locked_by_others + v_result.locked_by_others;
            v_walked.gone := v_walked.gone + v_result.gone;
            v_walked.attempts := v_walked.attempts + v_result.attempts;
        END IF;
        -- Why this pool did not serve, read now (R7): enough matching
        -- machines not yet held is contended; kept for others is reserved.
        IF v_contended IS NULL AND NOT v_reserved
           AND (SELECT count(*) FROM machine_verdicts(p_org, p_req.site, v_profile, p_req.vendor) v
                 WHERE v.site = p_req.site AND v.profile = v_profile AND v.status = 'ready'
                   AND v.exclusion IS NULL) >= p_req.quantity THEN
            v_contended := v_profile;
        END IF;
        IF v_kept_by IS NULL AND v_reserved THEN
            v_kept_by := v_profile;
            v_kept_n := v_kept;
        END IF;
    END LOOP;
    -- R9, second ask, right before refusing.
    RETURN QUERY SELECT x.* FROM reservations r,
                        LATERAL reserve_answer_of('existing', r, v_walked.scanned, v_walked.locked_by_others,
                                          v_walked.gone, v_walked.attempts) x
                   WHERE r.org_id = p_org AND r.order_ref = p_req.order_ref ORDER BY r.slot;
    IF FOUND THEN
        RETURN;
    END IF;
    -- The asked pool's counts, as any refusal of it tells them.
    SELECT c.counts, c.free INTO v_counts, v_free
      FROM verdict_counts(p_org, p_req.site, p_req.profile, p_req.vendor) c;
    v_result := v_walked;
    v_result.org_id := p_org;
    IF v_contended IS NOT NULL THEN
        v_result.outcome := 'contended';
        v_result.candidates := greatest(v_free, p_req.quantity);
        v_result.excluded := jsonb_build_object('candidates', v_result.candidates, 'pool', v_contended);
    ELSIF v_kept_by IS NOT NULL THEN
        v_result.outcome := 'reserved';
        v_result.candidates := v_free;
        v_result.excluded := v_counts || jsonb_build_object('kept_for_others', v_kept_n, 'pool', v_kept_by,
                                 'kept', (SELECT jsonb_object_agg(h.segment, h.machines) FROM headroom h
                                           WHERE h.org_id = p_org AND h.site = p_req.site AND h.profile = v_kept_by
                                             AND h.segment IS DISTINCT FROM p_req.segment));
    ELSE
        v_result.outcome := 'unavailable';
        v_result.candidates := v_free;
        v_result.excluded := v_counts;
    END IF;
    PERFORM record_refusal(p_org, v_result.outcome, p_req.site, p_req.profile, p_req.vendor, v_result.excluded,
                           p_req.quantity, p_req.segment, p_req.customer_ref);
    RETURN NEXT v_result;
END
$$;

-- R17 with R20: what the substitutes of pool (p_site, p_profile) could
-- serve now to an order of segment p_segment (and vendor p_vendor), in the
-- declared order, as [{"profile", "available"}]; empty when the profile
-- has no declaration for that segment. Each `available` is R17's for that
-- pool (0 when it has no machine of the vendor).
CREATE OR REPLACE FUNCTION capacity_substitutes(p_org bigint, p_site text, p_profile text, p_vendor text,
                                                p_segment text)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('profile', l.p, 'available', coalesce(c.available, 0))
                              ORDER BY l.i), '[]'::jsonb)
      FROM substitutes s
     CROSS JOIN LATERAL unnest(s.substitutes) WITH ORDINALITY AS l(p, i)
      LEFT JOIN LATERAL (SELECT c.available FROM capacity_pools(p_org, p_site, l.p, p_vendor, p_segment) c) c ON true
     WHERE s.org_id = p_org AND s.profile = p_profile
       AND (cardinality(s.segments) = 0 OR p_segment = ANY (s.segments))
$$;

-- R17 with R20: the alternatives of an order of p_quantity machines of
-- (p_site, p_profile): first the substitutes at the same site that could
-- fill it now, in the declared order, then the other sites whose pool of
-- the profile could (capacity_alternatives), as [{"site", "profile",
-- "available"}].
CREATE OR REPLACE FUNCTION alternatives_with_substitutes(p_org bigint, p_site text, p_profile text, p_vendor text,
                                                         p_segment text, p_quantity integer)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT jsonb_agg(jsonb_build_object('site', p_site, 'profile', e->>'profile',
                                                         'available', (e->>'available')::bigint) ORDER BY t.o)
                       FROM jsonb_array_elements(capacity_substitutes(p_org, p_site, p_profile, p_vendor, p_segment))
                            WITH ORDINALITY AS t(e, o)
                      WHERE (e->>'available')::bigint >= p_quantity), '[]'::jsonb)
           || capacity_alternatives(p_org, p_site, p_profile, p_vendor, p_segment, p_quantity)
$$;

-- R15 with R20: hold p_hold (locked, of an order of one that allowed
-- substitutes) found no
-- equivalent machine in its own pool; move it to a machine of a declared
-- substitute of the profile its order asked (or back to the asked
-- profile itself), in the declared order, under the same rules: the
-- vendor the order named, the walk bounded and SKIP LOCKED (R3/R4), and a
-- pool's headroom (R18) left to its segments. Returns the new machine's
-- verdict, or NULL.
--
-- Locks: healing holds machine rows, its pool's turn and reservation rows
-- already, so it may not wait for another turn (the lock order): a
-- substitute pool that keeps headroom is tried only if its turn is free
-- now (pg_try_advisory_xact_lock), else passed over, and so is the
-- declaration's turn (shared, as a reserve takes it): while a change of
-- the list waits for it or holds it, the hold is not moved onto a
-- substitute (its order is cancelled as without substitutes).
--
-- An order of several is never moved here: its other machines would stay
-- of the profile they are, and an order is of one profile (R20); it is
-- cancelled whole as before (R13).
CREATE OR REPLACE FUNCTION heal_hold_onto_substitutes(p_hold reservations, p_old machines, p_went text,
                                                      p_actor text)
RETURNS machine_verdict
LANGUAGE plpgsql AS $$
DECLARE
    v_site    text := p_hold.spec->>'site';
    v_vendor  text := p_hold.spec->>'vendor';
    v_asked   text := coalesce(p_hold.profile_asked, p_hold.spec->>'profile');
    v_list    text[];
    v_profile text;
    v_kept    integer;
    v_cand    machine_verdict;
    v_now     machine_verdict;
    v_reason  text;
BEGIN
    -- Only an order that allowed substitutes: one that asked for the exact
    -- hardware is cancelled rather than moved to other hardware.
    IF p_hold.quantity > 1 OR p_hold.spec->>'substitutes' IS DISTINCT FROM 'allowed' THEN
        RETURN NULL;
    END IF;
    IF NOT pg_try_advisory_xact_lock_shared(20, hashtext(p_hold.org_id::text || '/' || v_asked)) THEN
        RETURN NULL;
    END IF;
    v_list := substitutes_for(p_hold.org_id, v_asked, p_hold.segment);
    IF cardinality(v_list) = 0 THEN
        RETURN NULL;
    END IF;
    FOREACH v_profile IN ARRAY ARRAY[v_asked] || v_list LOOP
        CONTINUE WHEN v_profile = p_hold.spec->>'profile';  -- its own pool: heal_hold tried it
        IF EXISTS (SELECT 1 FROM headroom h WHERE h.org_id = p_hold.org_id AND h.site = v_site
                                               AND h.profile = v_profile) THEN
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(18, hashtext(p_hold.org_id::text || '/' || v_site
                                                                    || '/' || v_profile));
            v_kept := pool_kept_for_others(p_hold.org_id, v_site, v_profile,
                                           ARRAY[p_hold.segment,
                                                 (SELECT o.repairs_segment FROM organizations o
                                                   WHERE o.id = p_hold.org_id)]);
            CONTINUE WHEN v_kept > 0
                AND (SELECT count(*) FROM machine_candidates(p_hold.org_id, v_site, v_profile, NULL, v_kept + 1))
                    <= v_kept;
        END IF;
        FOR v_cand IN SELECT * FROM machine_candidates(p_hold.org_id, v_site, v_profile, v_vendor,
                                                       healing_walk_limit())
        LOOP
            CONTINUE WHEN v_cand.id = p_old.id;
            PERFORM 1 FROM machines WHERE id = v_cand.id AND status = 'ready' FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
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
            IF v_profile <> v_asked THEN
                v_reason := v_reason || format('; a declared substitute for profile %s, whose pool had no equivalent machine',
                                               v_asked);
            END IF;
            v_reason := v_reason || format('; held for %s s', p_hold.hold_seconds);
            UPDATE reservations r
               SET machine_id = v_now.id,
                   machine_snapshot = jsonb_build_object('asset_tag', v_now.asset_tag, 'site', v_now.site,
                                                         'vendor', v_now.vendor, 'profile', v_now.profile,
                                                         'status', v_now.status, 'updated_at', v_now.updated_at),
                   reason = v_reason,
                   -- The pool that serves now (R15 heals within it), and
                   -- what the order asked when that is another profile.
                   spec = r.spec || jsonb_build_object('profile', v_profile,
                                                       'profile_asked', CASE WHEN v_profile <> v_asked THEN v_asked END),
                   profile_asked = CASE WHEN v_profile <> v_asked THEN v_asked END
             WHERE r.id = p_hold.id;
            INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail,
                                            replaced_machine_id)
            VALUES (p_hold.id, 'machine_replaced', 'held', 'held', p_actor,
                    format('machine %s %s; moved to %s, %s (was: %s)', p_old.asset_tag, p_went, v_now.asset_tag,
                           CASE WHEN v_profile <> v_asked
                                THEN format('served by %s, asked %s: no equivalent machine of its own pool', v_profile, v_asked)
                                ELSE format('back to the profile asked, %s', v_asked) END,
                           p_hold.reason),
                    p_old.id);
            RETURN v_now;
        END LOOP;
    END LOOP;
    RETURN NULL;
END
$$;
