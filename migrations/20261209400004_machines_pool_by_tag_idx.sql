-- R7's explanation (Why not?) lists a pool's machines in asset tag order,
-- a page at a time: its candidates, its held, sold and not-ready machines.
-- Without an index in that order the statement walked the organization's
-- asset tags (machines_asset_tag_unique_per_org) and kept one machine of a
-- pool in hundreds: 41,000 rows read for a page of 201 at 400,000 machines
-- in 600 pools (10 ms), where this index reads the page (BENCHMARKS.md
-- item 16). Keyed without the vendor, as machines_sellable_idx is: an
-- order naming its vendor filters the pool's other vendors on the way, and
-- the asset tag order holds whether or not one is named.
CREATE INDEX machines_pool_by_tag_idx ON machines (org_id, site, profile, asset_tag);
