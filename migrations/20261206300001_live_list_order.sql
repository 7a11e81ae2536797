-- The live list (/reservations) pages held reservations by (expires_at, id).
-- On the sweep's index of expires_at alone the planner could not walk the
-- page in order: it sorted every held reservation and hashed every machine
-- of the organization to join them, 11 ms at 50,000 machines and 1,000
-- holds, against 0.6 ms walking this index and probing 101 machines by
-- key (BENCHMARKS.md, item 5). The same entries, one column wider; the
-- sweep's `ORDER BY expires_at` reads it as before. Built before the old
-- one is dropped, and renamed to the old name, so that no moment lacks it.
CREATE INDEX reservations_held_by_deadline_id_idx
    ON reservations (expires_at, id) WHERE state = 'held' AND expires_at IS NOT NULL;
DROP INDEX reservations_held_by_deadline_idx;
ALTER INDEX reservations_held_by_deadline_id_idx RENAME TO reservations_held_by_deadline_idx;
