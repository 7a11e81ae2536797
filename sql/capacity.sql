-- R17-R19: capacity that can be promised (docs/rules.md).
--
-- A pool is (site, profile) of one organization; headroom (R18) is kept per
-- pool, whatever the vendor. A machine of a pool is, in this order: sold (a
-- live service link), held (a live hold), sellable (ready; an overdue hold
-- does not count, R11: the allocator expires it at the point of use), or
-- not ready. Sellable is exactly what `machine_candidates` walks, so what
-- capacity says and what a reserve does agree about the rules.
--
-- Locks (the lock order of sql/locks.sql, step 0, before any row): a
-- customer's turn (R19), then a pool's turn (R18), each a transaction-scoped
-- advisory lock, taken only where a cap or a headroom applies, so that the
-- other pools keep their path and speed.

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
-- repairs segment too): what an order of those segments must leave.
CREATE OR REPLACE FUNCTION pool_kept_for_others(p_org bigint, p_site text, p_profile text, p_segments text[])
RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(h.machines), 0)::integer FROM headroom h
     WHERE h.org_id = p_org AND h.site = p_site AND h.profile = p_profile
       -- An order of no segment passes {NULL}: `= ANY` is then NULL, not
       -- false, and must still count every segment's headroom.
       AND NOT coalesce(h.segment = ANY (p_segments), false)
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
    WITH states AS (
        SELECT m.site, m.profile, m.vendor,
               CASE WHEN EXISTS (SELECT 1 FROM service_links s WHERE s.machine_id = m.id AND s.ended_at IS NULL)
                    THEN 'sold'
                    WHEN EXISTS (SELECT 1 FROM reservations r WHERE r.machine_id = m.id AND r.state = 'held'
                                    AND r.expires_at > clock_timestamp())
                    THEN 'held'
                    WHEN m.status = 'ready' THEN 'sellable'
                    ELSE 'not_ready' END AS state
          FROM machines m
         WHERE m.org_id = p_org
           AND (p_site IS NULL OR m.site = p_site)
           AND (p_profile IS NULL OR m.profile = p_profile)
    ), pools AS (
        SELECT s.site, s.profile,
               count(*) FILTER (WHERE p_vendor IS NULL OR s.vendor = p_vendor) AS total,
               count(*) FILTER (WHERE s.state = 'sellable' AND (p_vendor IS NULL OR s.vendor = p_vendor)) AS sellable,
               count(*) FILTER (WHERE s.state = 'held' AND (p_vendor IS NULL OR s.vendor = p_vendor)) AS held,
               count(*) FILTER (WHERE s.state = 'sold' AND (p_vendor IS NULL OR s.vendor = p_vendor)) AS sold,
               count(*) FILTER (WHERE s.state = 'not_ready' AND (p_vendor IS NULL OR s.vendor = p_vendor)) AS not_ready,
               count(*) FILTER (WHERE s.state = 'sellable') AS sellable_any_vendor
          FROM states s
         GROUP BY s.site, s.profile
    )
    SELECT p.site, p.profile, p.total, p.sellable, p.held, p.sold, p.not_ready,
           coalesce((SELECT jsonb_object_agg(h.segment, h.machines ORDER BY h.segment) FROM headroom h
                      WHERE h.org_id = p_org AND h.site = p.site AND h.profile = p.profile), '{}'::jsonb),
           greatest(least(p.sellable,
                          p.sellable_any_vendor
                          - pool_kept_for_others(p_org, p.site, p.profile, ARRAY[p_segment])), 0)
      FROM pools p
     WHERE p.total > 0
     ORDER BY p.site, p.profile
$$;

-- R17's alternatives: the other sites whose pool of profile p_profile (and
-- vendor p_vendor) could fill an order of p_quantity machines of segment
-- p_segment now, most available first, as [{"site", "available"}].
CREATE OR REPLACE FUNCTION capacity_alternatives(p_org bigint, p_site text, p_profile text, p_vendor text,
                                                 p_segment text, p_quantity integer)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('site', c.site, 'available', c.available)
                              ORDER BY c.available DESC, c.site), '[]'::jsonb)
      FROM capacity_pools(p_org, NULL, p_profile, p_vendor, p_segment) c
     WHERE c.site <> p_site AND c.available >= p_quantity
$$;
