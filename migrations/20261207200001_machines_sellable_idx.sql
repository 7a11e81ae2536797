-- Pass one's walk (`machine_candidates`, sql/allocator.sql): the machines a
-- reserve may take, of one pool, in id order. Sold machines stay `ready`,
-- so an index on `status = 'ready'` alone made every reserve step over
-- each machine in service ahead of the first sellable one, with two probes
-- each; and a shop's oldest machines, the lowest ids, are the ones it has
-- sold. With 900 sold ahead of 100 sellable the candidate list took 5.3 ms,
-- against 0.15 ms on this index (BENCHMARKS.md item 3).
--
-- Keyed without the vendor: the walk's plan is generic (the allocator's
-- functions force it), where "any vendor, or this one" cannot be an index
-- condition, so the id has to follow (site, profile) for the walk to be in
-- id order. An order naming its vendor filters the pool's other vendors on
-- the way; the index this one replaces, keyed on the vendor before the id,
-- could not give a generic plan the id order at all.
CREATE INDEX machines_sellable_idx
    ON machines (org_id, site, profile, id) WHERE status = 'ready' AND NOT in_service;
DROP INDEX machines_candidates_idx;
