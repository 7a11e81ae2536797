-- R17: the machines of each pool by (org, site, profile, vendor, status,
-- in service), kept by the writes of machines (tables:
-- migrations/20261207500001_pool_figures.sql). A read sums pool_figures
-- and the deltas not yet folded (the view pool_machines), so its cost is
-- the number of pools, never of machines.
--
-- Why deltas and not one counter row per figure: a trigger that updated a
-- shared row per (pool, status) would make every writer of a pool wait for
-- the one before it to commit (two converts of one pool, two status changes
-- of one rack), and two statements touching two pools in opposite orders
-- could deadlock outside the lock order (sql/locks.sql). Appended deltas
-- lock nothing another writer needs. The fold (pool_figures_fold, the
-- sweep's job) is the only writer of pool_figures.
--
-- Held is not kept here: a reserve or a cancel never writes machines, and
-- the live holds are few, so R17 counts them at the read.

-- The changes of one statement on machines, summed per figure: statement
-- triggers with transition tables, so that a load of many machines appends
-- one row per figure, not one per machine. PostgreSQL allows transition
-- tables only on a trigger of one event without a column list, hence three
-- triggers on this one function; an UPDATE that changes no figure appends
-- nothing.
CREATE OR REPLACE FUNCTION pool_figures_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO pool_figure_deltas (org_id, site, profile, vendor, status, in_service, machines)
        SELECT n.org_id, n.site, n.profile, n.vendor, n.status, n.in_service, count(*)
          FROM pool_figures_new n
         GROUP BY 1, 2, 3, 4, 5, 6;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO pool_figure_deltas (org_id, site, profile, vendor, status, in_service, machines)
        SELECT o.org_id, o.site, o.profile, o.vendor, o.status, o.in_service, -count(*)
          FROM pool_figures_old o
         GROUP BY 1, 2, 3, 4, 5, 6;
    ELSE
        INSERT INTO pool_figure_deltas (org_id, site, profile, vendor, status, in_service, machines)
        SELECT c.org_id, c.site, c.profile, c.vendor, c.status, c.in_service, sum(c.d)
          FROM (SELECT n.org_id, n.site, n.profile, n.vendor, n.status, n.in_service, 1 AS d
                  FROM pool_figures_new n
                UNION ALL
                SELECT o.org_id, o.site, o.profile, o.vendor, o.status, o.in_service, -1
                  FROM pool_figures_old o) c
         GROUP BY 1, 2, 3, 4, 5, 6
        HAVING sum(c.d) <> 0;
    END IF;
    RETURN NULL;
END
$$;

-- A truncation of machines empties the figures with it.
CREATE OR REPLACE FUNCTION pool_figures_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM pool_figure_deltas;
    DELETE FROM pool_figures;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS machines_pool_figures_insert ON machines;
CREATE TRIGGER machines_pool_figures_insert
    AFTER INSERT ON machines REFERENCING NEW TABLE AS pool_figures_new
    FOR EACH STATEMENT EXECUTE FUNCTION pool_figures_count();
DROP TRIGGER IF EXISTS machines_pool_figures_update ON machines;
CREATE TRIGGER machines_pool_figures_update
    AFTER UPDATE ON machines REFERENCING OLD TABLE AS pool_figures_old NEW TABLE AS pool_figures_new
    FOR EACH STATEMENT EXECUTE FUNCTION pool_figures_count();
DROP TRIGGER IF EXISTS machines_pool_figures_delete ON machines;
CREATE TRIGGER machines_pool_figures_delete
    AFTER DELETE ON machines REFERENCING OLD TABLE AS pool_figures_old
    FOR EACH STATEMENT EXECUTE FUNCTION pool_figures_count();
DROP TRIGGER IF EXISTS machines_pool_figures_truncate ON machines;
CREATE TRIGGER machines_pool_figures_truncate
    AFTER TRUNCATE ON machines
    FOR EACH STATEMENT EXECUTE FUNCTION pool_figures_truncate();

-- The machines per figure as of the reader's snapshot: the folded figures
-- plus the deltas since. A filter on the key is pushed into both tables.
CREATE OR REPLACE VIEW pool_machines AS
    SELECT f.org_id, f.site, f.profile, f.vendor, f.status, f.in_service, sum(f.machines)::bigint AS machines
      FROM (SELECT p.org_id, p.site, p.profile, p.vendor, p.status, p.in_service, p.machines FROM pool_figures p
            UNION ALL
            SELECT d.org_id, d.site, d.profile, d.vendor, d.status, d.in_service, d.machines FROM pool_figure_deltas d) f
     GROUP BY f.org_id, f.site, f.profile, f.vendor, f.status, f.in_service
    HAVING sum(f.machines) <> 0;

-- The sweep's job: folds the deltas committed so far into pool_figures, in
-- one transaction (a reader sees them either all in the deltas or all
-- folded); returns how many delta rows it folded. Deltas of writers still
-- running are not visible to it and wait for the next fold. One fold at a
-- time (class 17 of the two-key advisory locks; another fold at the same
-- moment skips); writers never wait for it.
CREATE OR REPLACE FUNCTION pool_figures_fold() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_folded bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(17, 0) THEN
        RETURN 0;
    END IF;
    WITH taken AS (
        DELETE FROM pool_figure_deltas RETURNING *
    ), summed AS (
        SELECT t.org_id, t.site, t.profile, t.vendor, t.status, t.in_service,
               sum(t.machines)::bigint AS machines, count(*) AS n
          FROM taken t
         GROUP BY 1, 2, 3, 4, 5, 6
    ), folded AS (
        INSERT INTO pool_figures AS p (org_id, site, profile, vendor, status, in_service, machines)
        SELECT s.org_id, s.site, s.profile, s.vendor, s.status, s.in_service, s.machines
          FROM summed s
         WHERE s.machines <> 0
         ORDER BY 1, 2, 3, 4, 5, 6
        ON CONFLICT (org_id, site, profile, vendor, status, in_service)
        DO UPDATE SET machines = p.machines + EXCLUDED.machines
    )
    SELECT coalesce(sum(s.n), 0)::bigint INTO v_folded FROM summed s;
    DELETE FROM pool_figures p WHERE p.machines = 0;
    RETURN v_folded;
END
$$;

-- Attaching the triggers fills the figures from the machines, in the same
-- transaction: the DROP and CREATE TRIGGER above waited for every
-- transaction that wrote machines to end and hold new ones off until this
-- commits, so no change of a machine falls between this count and the
-- triggers.
DELETE FROM pool_figure_deltas;
DELETE FROM pool_figures;
INSERT INTO pool_figures (org_id, site, profile, vendor, status, in_service, machines)
SELECT m.org_id, m.site, m.profile, m.vendor, m.status, m.in_service, count(*)
  FROM machines m
 GROUP BY 1, 2, 3, 4, 5, 6;
