-- Whether a machine has a live service link, on the machine's row, so that
-- the counts per pool state (the /machines header, R17's pools) read what
-- is sold in the same index-only scan that counts the filter's machines.
-- Probing one machine per live service of the organization instead costs
-- about 50 ms per count with 25,000 live services among 50,000 machines
-- (BENCHMARKS.md item 5), and a shop sells most of its pool.
--
-- service_links stays the truth (its partial unique index is the arbiter);
-- `in_service` is a copy written in the same transaction as every change
-- of a link by the trigger of sql/services.sql, which also brings the copy
-- up to date when it is attached. Only a convert or the end of a service
-- writes it, never a reserve or a cancel.
ALTER TABLE machines ADD COLUMN in_service boolean NOT NULL DEFAULT false;

-- The copy in both covering indexes of the counts: counted with the
-- filter's machines, and read on the probe of a held machine.
DROP INDEX machines_pool_counts_idx;
CREATE INDEX machines_pool_counts_idx ON machines (org_id, site, profile, vendor, status) INCLUDE (in_service);
DROP INDEX machines_pool_probe_idx;
CREATE INDEX machines_pool_probe_idx ON machines (id, org_id) INCLUDE (site, profile, vendor, status, in_service);
