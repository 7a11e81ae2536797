-- R21: the history of each pool per UTC day (tables:
-- migrations/20261209200001_pool_days.sql). `pool_day_rows` computes one
-- day from the rows kept anyway (machine_changes, reservations, service
-- links, refusals), by their own times, so that a day computed as it
-- closes and the same day computed months later agree: a later change of a
-- machine or a reservation never moves a past day.

-- Every change of a machine's pool or status, dated at its `updated_at`
-- (its `created_at` for an insert; the clock when a writer left
-- `updated_at` as it was): statement triggers with transition tables, as
-- sql/pool_figures.sql, so a load of many machines is one insert. An
-- update that changes none of them logs nothing.
CREATE OR REPLACE FUNCTION machine_changes_log() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO machine_changes (machine_id, org_id, at, site, profile, status)
        SELECT n.id, n.org_id, n.created_at, n.site, n.profile, n.status
          FROM machine_changes_new n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO machine_changes (machine_id, org_id, at, site, profile, status)
        SELECT o.id, o.org_id, clock_timestamp(), NULL, NULL, NULL
          FROM machine_changes_old o;
    ELSE
        INSERT INTO machine_changes (machine_id, org_id, at, site, profile, status)
        SELECT n.id, n.org_id,
               CASE WHEN n.updated_at IS DISTINCT FROM o.updated_at THEN n.updated_at
                    ELSE clock_timestamp() END,
               n.site, n.profile, n.status
          FROM machine_changes_new n JOIN machine_changes_old o ON o.id = n.id
         WHERE (n.org_id, n.site, n.profile, n.status) IS DISTINCT FROM (o.org_id, o.site, o.profile, o.status);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS machines_changes_insert ON machines;
CREATE TRIGGER machines_changes_insert
    AFTER INSERT ON machines REFERENCING NEW TABLE AS machine_changes_new
    FOR EACH STATEMENT EXECUTE FUNCTION machine_changes_log();
DROP TRIGGER IF EXISTS machines_changes_update ON machines;
CREATE TRIGGER machines_changes_update
    AFTER UPDATE ON machines REFERENCING OLD TABLE AS machine_changes_old NEW TABLE AS machine_changes_new
    FOR EACH STATEMENT EXECUTE FUNCTION machine_changes_log();
DROP TRIGGER IF EXISTS machines_changes_delete ON machines;
CREATE TRIGGER machines_changes_delete
    AFTER DELETE ON machines REFERENCING OLD TABLE AS machine_changes_old
    FOR EACH STATEMENT EXECUTE FUNCTION machine_changes_log();

-- A truncation of machines empties their history with it.
CREATE OR REPLACE FUNCTION machine_changes_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM machine_changes;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS machines_changes_truncate ON machines;
CREATE TRIGGER machines_changes_truncate
    AFTER TRUNCATE ON machines
    FOR EACH STATEMENT EXECUTE FUNCTION machine_changes_truncate();

-- A machine that has no change yet (those from before the log) is logged
-- as it is now, dated at its creation, in the transaction that attaches the
-- triggers (they waited for every writer of machines), so none is missed.
INSERT INTO machine_changes (machine_id, org_id, at, site, profile, status)
SELECT m.id, m.org_id, m.created_at, m.site, m.profile, m.status
  FROM machines m
 WHERE NOT EXISTS (SELECT 1 FROM machine_changes c WHERE c.machine_id = m.id);

-- R21: one UTC day of every pool, from the rows as they are now, each
-- counted by its own times:
-- - the counts at the day's end, as R17 counts them: each machine as its
--   last change before the end left it; sold with a service link live at
--   the end, held with a hold live at the end (created before, ended and
--   due after), sellable when ready, not ready otherwise;
-- - reservations created in the day, and those converted, expired or
--   cancelled in it (by `ended_at`), under their machine's pool at the
--   day's end; `substituted_in` the ones created in the day whose order
--   asked another profile;
-- - refusals of the day by code (machines asked), `substituted_out` the
--   orders of the asked pool served by a substitute;
-- - machines added (in the pool and not retired at the end, not at the
--   start) and retired (the other way round: retired, deleted or moved);
-- - demand: converted of what was asked + refused for want of stock
--   (unavailable, reserved, customer_limit) + substituted_out.
--
-- Its cost is a day's rows, not the history's: the sweep's holder runs it
-- under a statement_timeout of seconds, holding the cursor and the lease,
-- and a year of 2,000 holds a day made the per-machine probes of every
-- reservation and link kept take seconds (the benchmark's planning item).
-- - A machine with no change since the day's start is at both ends as it
--   is now (its row is its last change: the triggers log every change),
--   so only the others (a day's changes, and later ones), looked up one
--   by one, can be added or retired.
-- - Held at the end: the holds live now, and those ended since the end
--   (reservations_recent_activity_idx); sold: the links live at the end,
--   those live now and those ended since (service_links_ended_idx).
-- - jit off: the estimates of the CTEs' joins are far off, and compiling
--   the plan cost more than running it.
CREATE OR REPLACE FUNCTION pool_day_rows(p_day date)
RETURNS TABLE (org_id bigint, site text, profile text, total bigint, sellable bigint, held bigint,
               sold bigint, not_ready bigint, created bigint, converted bigint, expired bigint,
               cancelled bigint, refused_unavailable bigint, refused_contended bigint,
               refused_reserved bigint, refused_customer_limit bigint, substituted_in bigint,
               substituted_out bigint, added bigint, retired bigint, demand bigint)
LANGUAGE sql STABLE SET jit = off AS $$
    WITH b AS MATERIALIZED (
        SELECT p_day::timestamp AT TIME ZONE 'UTC' AS s, (p_day + 1)::timestamp AT TIME ZONE 'UTC' AS e
    ), recent AS MATERIALIZED (
        SELECT DISTINCT c.machine_id FROM machine_changes c, b WHERE c.at >= b.s
    ), end_changed AS MATERIALIZED (
        SELECT p.machine_id, p.org_id, p.site, p.profile, p.status
          FROM recent r, b,
               LATERAL (SELECT c.machine_id, c.org_id, c.site, c.profile, c.status FROM machine_changes c
                         WHERE c.machine_id = r.machine_id AND c.at < b.e
                         ORDER BY c.at DESC, c.id DESC LIMIT 1) p
    ), start_changed AS MATERIALIZED (
        SELECT p.machine_id, p.org_id, p.site, p.profile, p.status
          FROM recent r, b,
               LATERAL (SELECT c.machine_id, c.org_id, c.site, c.profile, c.status FROM machine_changes c
                         WHERE c.machine_id = r.machine_id AND c.at < b.s
                         ORDER BY c.at DESC, c.id DESC LIMIT 1) p
    ), at_end AS MATERIALIZED (
        SELECT m.id AS machine_id, m.org_id, m.site, m.profile, m.status
          FROM machines m WHERE NOT EXISTS (SELECT 1 FROM recent r WHERE r.machine_id = m.id)
        UNION ALL
        SELECT * FROM end_changed
    ), held_end AS MATERIALIZED (
        SELECT r.machine_id FROM b, reservations r
         WHERE r.state = 'held' AND r.expires_at > b.e AND r.created_at < b.e
        UNION
        SELECT r.machine_id FROM b, organizations o JOIN reservations r ON r.org_id = o.id
         WHERE coalesce(r.ended_at, r.created_at) >= b.e AND r.ended_at >= b.e
           AND r.created_at < b.e AND r.expires_at > b.e
    ), sold_end AS MATERIALIZED (
        -- The links live now (the arbiter's partial index), and those
        -- ended since the end (service_links_ended_idx).
        SELECT l.machine_id FROM b, service_links l
         WHERE l.ended_at IS NULL AND l.created_at < b.e
        UNION
        SELECT l.machine_id FROM b, service_links l
         WHERE l.ended_at >= b.e AND l.created_at < b.e
    ), states AS (
        SELECT m.org_id, m.site, m.profile, count(*) AS total,
               count(*) FILTER (WHERE m.machine_id IN (SELECT so.machine_id FROM sold_end so)) AS sold,
               count(*) FILTER (WHERE m.machine_id IN (SELECT h.machine_id FROM held_end h)
                                  AND m.machine_id NOT IN (SELECT so.machine_id FROM sold_end so)) AS held,
               count(*) FILTER (WHERE m.status = 'ready'
                                  AND m.machine_id NOT IN (SELECT h.machine_id FROM held_end h)
                                  AND m.machine_id NOT IN (SELECT so.machine_id FROM sold_end so)) AS sellable
          FROM at_end m
         WHERE m.status IS NOT NULL
         GROUP BY 1, 2, 3
    ), moves AS (
        -- A machine not changed since the day's start is the same at both
        -- ends: neither added nor retired.
        SELECT e.org_id, e.site, e.profile, 1 AS added, 0 AS retired
          FROM end_changed e LEFT JOIN start_changed s USING (machine_id)
         WHERE coalesce(e.status <> 'retired', false)
           AND NOT coalesce(s.status <> 'retired' AND (s.org_id, s.site, s.profile) = (e.org_id, e.site, e.profile), false)
        UNION ALL
        SELECT s.org_id, s.site, s.profile, 0, 1
          FROM start_changed s LEFT JOIN end_changed e USING (machine_id)
         WHERE coalesce(s.status <> 'retired', false)
           AND NOT coalesce(e.status <> 'retired' AND (s.org_id, s.site, s.profile) = (e.org_id, e.site, e.profile), false)
    ), moved AS (
        SELECT mv.org_id, mv.site, mv.profile, sum(mv.added)::bigint AS added, sum(mv.retired)::bigint AS retired
          FROM moves mv GROUP BY 1, 2, 3
    ), flows AS (
        -- One range of reservations_recent_activity_idx per organization:
        -- a reservation created or ended in the day has the later of the
        -- two at or after the day's start.
        SELECT m.org_id, m.site, m.profile,
               count(*) FILTER (WHERE r.created_at >= b.s) AS created,
               count(*) FILTER (WHERE r.state = 'converted' AND r.ended_at >= b.s AND r.ended_at < b.e) AS converted,
               count(*) FILTER (WHERE r.state = 'converted' AND r.ended_at >= b.s AND r.ended_at < b.e
                                  AND r.profile_asked IS NULL) AS converted_asked,
               count(*) FILTER (WHERE r.state = 'expired' AND r.ended_at >= b.s AND r.ended_at < b.e) AS expired,
               count(*) FILTER (WHERE r.state = 'cancelled' AND r.ended_at >= b.s AND r.ended_at < b.e) AS cancelled,
               count(*) FILTER (WHERE r.created_at >= b.s AND r.profile_asked IS NOT NULL) AS substituted_in
          FROM b, organizations o
          JOIN reservations r ON r.org_id = o.id
          JOIN at_end m ON m.machine_id = r.machine_id
         WHERE coalesce(r.ended_at, r.created_at) >= b.s
           AND r.created_at < b.e
           AND (r.created_at >= b.s OR r.ended_at < b.e)
           AND m.status IS NOT NULL
         GROUP BY 1, 2, 3
    ), refused AS (
        SELECT f.org_id, f.site, f.profile,
               coalesce(sum(f.quantity) FILTER (WHERE f.reason = 'unavailable'), 0)::bigint AS unavailable,
               coalesce(sum(f.quantity) FILTER (WHERE f.reason = 'contended'), 0)::bigint AS contended,
               coalesce(sum(f.quantity) FILTER (WHERE f.reason = 'reserved'), 0)::bigint AS reserved,
               coalesce(sum(f.quantity) FILTER (WHERE f.reason = 'customer_limit'), 0)::bigint AS customer_limit,
               coalesce(sum(f.quantity) FILTER (WHERE f.reason = 'substituted'), 0)::bigint AS substituted
          FROM b, reservation_refusals f
         WHERE f.at >= b.s AND f.at < b.e
         GROUP BY 1, 2, 3
    ), pools AS (
        SELECT k.org_id, k.site, k.profile FROM states k
        UNION SELECT k.org_id, k.site, k.profile FROM moved k
        UNION SELECT k.org_id, k.site, k.profile FROM flows k
        UNION SELECT k.org_id, k.site, k.profile FROM refused k
    )
    SELECT p.org_id, p.site, p.profile,
           coalesce(st.total, 0), coalesce(st.sellable, 0), coalesce(st.held, 0), coalesce(st.sold, 0),
           coalesce(st.total - st.sellable - st.held - st.sold, 0),
           coalesce(fl.created, 0), coalesce(fl.converted, 0), coalesce(fl.expired, 0),
           coalesce(fl.cancelled, 0),
           coalesce(rf.unavailable, 0), coalesce(rf.contended, 0), coalesce(rf.reserved, 0),
           coalesce(rf.customer_limit, 0), coalesce(fl.substituted_in, 0), coalesce(rf.substituted, 0),
           coalesce(mv.added, 0), coalesce(mv.retired, 0),
           coalesce(fl.converted_asked, 0) + coalesce(rf.unavailable, 0) + coalesce(rf.reserved, 0)
             + coalesce(rf.customer_limit, 0) + coalesce(rf.substituted, 0)
      FROM pools p
      LEFT JOIN states st USING (org_id, site, profile)
      LEFT JOIN moved mv USING (org_id, site, profile)
      LEFT JOIN flows fl USING (org_id, site, profile)
      LEFT JOIN refused rf USING (org_id, site, profile)
$$;

-- R21: every statement that writes pool_days moves
-- pool_days_written.generation on, in its own transaction: the forecast's
-- readers keep their fitted rates while it stays put (src/forecast.rs).
-- The daily job holds that row already (its cursor); any other writer (a
-- rewrite of the history, a restore's tooling, a test) is counted the same.
-- F5: a new number from the sequence, never the row's plus one, so that a
-- restored row's next write cannot repeat a number issued before the
-- restore.
CREATE OR REPLACE FUNCTION pool_days_generation_next() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pool_days_written SET generation = nextval('pool_days_generation_seq');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS pool_days_generation ON pool_days;
CREATE TRIGGER pool_days_generation
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pool_days
    FOR EACH STATEMENT EXECUTE FUNCTION pool_days_generation_next();
