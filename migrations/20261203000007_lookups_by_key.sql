-- Lookups by key stay on their key's index when the plans were cached
-- while reservations was analyzed empty (a new deployment, before
-- autoanalyze comes by). On such a table every index led by org_id costs
-- the same as the key's, and the generic plans that the allocator's and the
-- transitions' functions cache per connection (plan_cache_mode =
-- force_generic_plan) took whichever came first: the R9 lookup by order_ref
-- went through reservations_created_recently_idx, the transitions' lookups
-- by id through reservations_order_ref_unique_per_org, each reading the
-- organization's whole history on every call until autoanalyze re-planned
-- them (found by bench item 8 on a small fresh database: the reserve rate
-- fell by a third in a few seconds and came back at once after ANALYZE;
-- tests/api/allocator.rs, plans_cached_on_an_empty_table_look_reservations_up_by_their_keys).

-- 1. The overview's chart index, partial, so that only queries bounding
-- created_at can use it (`created_at >= $2` implies the predicate; a lookup
-- by id or by order_ref does not), as reservations_ended_recently_idx is.
-- created_at is NOT NULL, so it holds every row as before. Building it
-- locks writes to reservations while it runs (about a second per million
-- rows here).
DROP INDEX reservations_created_recently_idx;
CREATE INDEX reservations_created_recently_idx ON reservations (org_id, created_at)
    WHERE created_at IS NOT NULL;

-- 2. The transitions' lookups by id check the organization outside the
-- index conditions: sql/transitions.sql, reservation_transition.
