-- Issue 23 (BENCHMARKS.md item 5): the counts per pool state above
-- /machines read every machine of the filter. On the heap that was a bitmap
-- heap scan of the filter's machines plus, for each held reservation of the
-- organization, a heap probe of its machine: 7-8 ms of the page's
-- time at 50,000 machines (site filter), twice that under the allocation
-- load. Two covering indexes make both parts index-only (2.5-3 ms):
-- the filter's machines by status, and a held or sold machine's filter
-- columns by id. Machines are written by inventory changes only, never by
-- reserve or cancel (those lock machine rows, which writes no index entry),
-- so the hot path pays nothing for them.
CREATE INDEX machines_pool_counts_idx ON machines (org_id, site, profile, vendor, status);
CREATE INDEX machines_pool_probe_idx ON machines (id, org_id) INCLUDE (site, profile, vendor, status);
