-- A machine's copy of whether it is in service (`machines.in_service`,
-- migrations/20261207100001_machines_in_service.sql): true exactly when
-- the machine has a live service link. service_links is the truth; the
-- copy lets the figures per pool (sql/pool_figures.sql, whose triggers
-- count this column's changes) say what is sold, instead of one probe per
-- live service, and lets pass one walk only the machines not in service
-- (`machines_sellable_idx`, sql/allocator.sql), which still probes each
-- candidate's link.
--
-- The trigger writes the copy in the transaction that changes a link, so
-- every snapshot sees both agree. Every writer of a link (a convert, the
-- end of a service) holds the machine's row already (the lock order,
-- sql/locks.sql), so this UPDATE waits for nothing new. The copy is read
-- again from service_links rather than from the changed row: an insert,
-- an end, a delete or a link moved to another machine all come out right.
CREATE OR REPLACE FUNCTION machines_in_service_sync() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- OLD is NULL on an insert and NEW on a delete; an update names both
    -- machines (the same one unless the link moved).
    UPDATE machines m
       SET in_service = NOT m.in_service
     WHERE m.id IN (OLD.machine_id, NEW.machine_id)
       AND m.in_service IS DISTINCT FROM EXISTS (SELECT 1 FROM service_links l
                                                  WHERE l.machine_id = m.id AND l.ended_at IS NULL);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS service_links_in_service ON service_links;
CREATE TRIGGER service_links_in_service
    AFTER INSERT OR DELETE OR UPDATE OF machine_id, ended_at ON service_links
    FOR EACH ROW
    EXECUTE FUNCTION machines_in_service_sync();

-- Attaching the trigger brings the copy up to date, in the same
-- transaction: the DROP and CREATE TRIGGER above waited for every
-- transaction that wrote links to end, and hold new ones off until this
-- commits, so no change of a link falls between this reading and the
-- trigger.
UPDATE machines m
   SET in_service = NOT m.in_service
 WHERE m.in_service IS DISTINCT FROM EXISTS (SELECT 1 FROM service_links l
                                              WHERE l.machine_id = m.id AND l.ended_at IS NULL);
