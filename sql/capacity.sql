-- R17-R19: capacity that can be promised (docs/rules.md).
--
-- A pool is (site, profile) of one organization; headroom (R18) is kept per
-- pool, whatever the vendor. A machine of a pool is, in this order: sold (a
-- live service link), held (a live hold), sellable (ready; an overdue hold
-- does not count, R11: the allocator expires it at the point of use), or
-- not ready. Sellable is exactly what `machine_candidates` walks, so what
-- capacity says and what a reserve does agree about the rules.
--
-- Turns (transaction-scoped advisory locks), taken only where a cap or a
-- headroom applies, so that the other pools keep their path and speed: a
-- reserve takes a customer's turn (R19), then a pool's (R18), before any
-- row, and never waits for a machine row after (SKIP LOCKED); healing takes
-- the pools' turns after its machines and before its reservation rows (the
-- lock order of sql/locks.sql). So whoever holds reservation rows holds
-- every turn it needs, and no turn holder waits for a machine another
-- holds while waiting for that turn.

-- R18: the turn of pool (p_site, p_profile) of org p_org, for whoever
-- decides on its last sellable machines: a reserve into a pool with
-- headroom, healing into it, a change of its headroom. Two-key form, class
-- 18, apart from the migrations' 64-bit keys and R13's class 13.
CREATE OR REPLACE FUNCTION pool_turn(p_org bigint, p_site text, p_profile text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(18, hashtext(p_org::text || '/' || p_site || '/' || p_profile))
$$;

-- R19: the turn of customer p_customer of org p_org (class 19).
CREATE OR REPLACE FUNCTION customer_turn(p_org bigint, p_customer text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(19, hashtext(p_org::text || '/' || p_customer))
$$;

-- R18: the machines of pool (p_site, p_profile) kept for segments other than
-- p_segments (an order's own segment, and for healing the organization's
-- repairs segment too; NULLs, no segment, are left out): what an order of
-- those segments must leave. PL/pgSQL, not SQL: a SQL function with a FROM
-- cannot be inlined as a value, and PostgreSQL 15 plans such a function at
-- every statement that calls it (about 0.1 ms of CPU per reserve in a pool
-- with headroom, BENCHMARKS.md); PL/pgSQL keeps the plan for the session.
CREATE OR REPLACE FUNCTION pool_kept_for_others(p_org bigint, p_site text, p_profile text, p_segments text[])
RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(sum(h.machines), 0)::integer FROM headroom h
             WHERE h.org_id = p_org AND h.site = p_site AND h.profile = p_profile
               AND NOT (h.segment = ANY (array_remove(coalesce(p_segments, '{}'), NULL))));
END
$$;

-- R17: per pool of org p_org (filtered by site and profile when given; the
-- vendor, when given, narrows the machines counted), the machines by state,
-- the headroom kept per segment, and what an order of segment p_segment
-- (NULL: none) could take now: the sellable machines of the vendor asked,
-- but never into what the pool, of any vendor, keeps for other segments.
-- One statement: one snapshot, so total = sellable + held + sold + not_ready.
CREATE OR REPLACE FUNCTION capacity_pools(p_org bigint, p_site text, p_profile text, p_vendor text, p_segment text)
RETURNS TABLE (site text, profile text, total bigint, sellable bigint, held bigint, sold bigint,
               not_ready bigint, reserved jsonb, available bigint)
LANGUAGE sql STABLE AS $$
    -- Counted by pool, not per machine: the machines by vendor, status and
    -- in service (the machine's copy of its live link, sql/services.sql)
    -- come from the figures kept per pool (pool_machines,
    -- sql/pool_figures.sql), a few rows per pool; then the few live holds
    -- joined to their machines, each subtracted from what its machine's
    -- status counted. Both in this statement's one snapshot, and the
    -- figures are written in the transaction of every change of a machine,
    -- so the counts add up. `_any` counts every vendor (what the headroom
    -- is kept from), the others the vendor asked.
    WITH pools AS (
        SELECT f.site, f.profile,
               coalesce(sum(f.machines) FILTER (WHERE p_vendor IS NULL OR f.vendor = p_vendor), 0)::bigint AS total,
               coalesce(sum(f.machines) FILTER (WHERE f.status = 'ready' AND (p_vendor IS NULL OR f.vendor = p_vendor)), 0)::bigint AS ready,
               coalesce(sum(f.machines) FILTER (WHERE f.status = 'ready'), 0)::bigint AS ready_any,
               coalesce(sum(f.machines) FILTER (WHERE f.in_service AND (p_vendor IS NULL OR f.vendor = p_vendor)), 0)::bigint AS sold,
               coalesce(sum(f.machines) FILTER (WHERE f.in_service AND f.status = 'ready' AND (p_vendor IS NULL OR f.vendor = p_vendor)), 0)::bigint AS sold_ready,
               coalesce(sum(f.machines) FILTER (WHERE f.in_service AND f.status = 'ready'), 0)::bigint AS sold_ready_any
          FROM pool_machines f
         WHERE f.org_id = p_org AND (p_site IS NULL OR f.site = p_site)
           AND (p_profile IS NULL OR f.profile = p_profile)
         GROUP BY f.site, f.profile
    ), held AS (
        SELECT m.site, m.profile,
               count(*) FILTER (WHERE p_vendor IS NULL OR m.vendor = p_vendor) AS n,
               count(*) FILTER (WHERE m.status = 'ready' AND (p_vendor IS NULL OR m.vendor = p_vendor)) AS ready,
               count(*) FILTER (WHERE m.status = 'ready') AS ready_any
          FROM reservations r JOIN machines m ON m.id = r.machine_id
         WHERE r.org_id = p_org AND r.state = 'held' AND r.expires_at > clock_timestamp()
           AND (p_site IS NULL OR m.site = p_site) AND (p_profile IS NULL OR m.profile = p_profile)
           AND NOT m.in_service
         GROUP BY m.site, m.profile
    ), counted AS (
        SELECT p.site, p.profile, p.total,
               p.ready - coalesce(h.ready, 0) - p.sold_ready AS sellable,
               coalesce(h.n, 0) AS held,
               p.sold,
               p.ready_any - coalesce(h.ready_any, 0) - p.sold_ready_any AS sellable_any_vendor
          FROM pools p
          LEFT JOIN held h ON h.site = p.site AND h.profile = p.profile
    )
    SELECT c.site, c.profile, c.total, c.sellable, c.held, c.sold,
           c.total - c.sellable - c.held - c.sold,
           coalesce((SELECT jsonb_object_agg(h.segment, h.machines ORDER BY h.segment) FROM headroom h
                      WHERE h.org_id = p_org AND h.site = c.site AND h.profile = c.profile), '{}'::jsonb),
           greatest(least(c.sellable,
                          c.sellable_any_vendor
                          - pool_kept_for_others(p_org, c.site, c.profile, ARRAY[p_segment])), 0)
      FROM counted c
     WHERE c.total > 0
     ORDER BY c.site, c.profile
$$;

-- R17's alternatives: the other sites whose pool of profile p_profile (and
-- vendor p_vendor) could fill an order of p_quantity machines of segment
-- p_segment now, most available first, as [{"site", "profile",
-- "available"}] (the profile is the one asked; R20's alternatives name
-- substitutes too, sql/substitutes.sql).
CREATE OR REPLACE FUNCTION capacity_alternatives(p_org bigint, p_site text, p_profile text, p_vendor text,
                                                 p_segment text, p_quantity integer)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('site', c.site, 'profile', c.profile, 'available', c.available)
                              ORDER BY c.available DESC, c.site), '[]'::jsonb)
      FROM capacity_pools(p_org, NULL, p_profile, p_vendor, p_segment) c
     WHERE c.site <> p_site AND c.available >= p_quantity
$$;

-- R18 for healing (R15), the turns of every pool with headroom that a live
-- hold on machines p_machines belongs to, in one order (by key). Healing
-- takes them after the machines and before the rows (the lock order): the
-- machines are locked, so no hold can appear on them meanwhile, and a
-- reserve, which holds a turn, never waits for a machine row.
CREATE OR REPLACE FUNCTION pool_turns_of(p_machines bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v record;
BEGIN
    FOR v IN SELECT DISTINCT h.org_id, h.spec->>'site' AS site, h.spec->>'profile' AS profile,
                    hashtext(h.org_id::text || '/' || (h.spec->>'site') || '/' || (h.spec->>'profile')) AS key
               FROM reservations h
              WHERE h.machine_id = ANY (p_machines) AND h.state = 'held' AND h.expires_at > clock_timestamp()
                AND EXISTS (SELECT 1 FROM headroom k WHERE k.org_id = h.org_id AND k.site = h.spec->>'site'
                                                       AND k.profile = h.spec->>'profile')
              ORDER BY key
    LOOP
        PERFORM pool_turn(v.org_id, v.site, v.profile);
    END LOOP;
END
$$;

-- R18 for healing: whether hold p_hold may move to one more sellable
-- machine of its pool, in the pool's turn (pool_turns_of took it). It may
-- use the headroom of its own segment and of the organization's repairs
-- segment, never another's.
CREATE OR REPLACE FUNCTION healing_may_take(p_hold reservations) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_site    text := p_hold.spec->>'site';
    v_profile text := p_hold.spec->>'profile';
    v_kept    integer;
BEGIN
    v_kept := pool_kept_for_others(p_hold.org_id, v_site, v_profile,
                                   ARRAY[p_hold.segment,
                                         (SELECT o.repairs_segment FROM organizations o WHERE o.id = p_hold.org_id)]);
    RETURN v_kept = 0
        OR (SELECT count(*) FROM machine_candidates(p_hold.org_id, v_site, v_profile, NULL, v_kept + 1)) > v_kept;
END
$$;
