-- Issue 22: orders of several machines (R13) and extended holds (R14).
-- Tables, columns and constraints only; the functions that use them are
-- definitions (DESIGN.md, "Where SQL lives").
--
-- An order is the reservations of one organization that share an
-- order_ref. No `orders` table: every reservation carries the size of its
-- order and its slot in it, so that
--   - an order of one is exactly today's row (slot 1 of 1, the defaults):
--     the hot path writes one row and one index entry per machine, as before,
--     and an older binary keeps working against this schema during a roll;
--   - R9 stays one unique constraint under the name the allocator reads
--     (R6): (org_id, order_ref, slot). Every reserve inserts slot 1 first,
--     so two requests with one key collide on slot 1, before either holds
--     anything else, and the loser reads back the whole order;
--   - R1 is untouched: reservations_one_holder_per_machine stays the arbiter
--     of each machine, whatever order it belongs to.
-- The order's slots are written in one transaction (the allocator's), so a
-- reader sees all of them or none (R13); their deadline is one value, set
-- by one reading of the clock and moved together by an extension.

ALTER TABLE reservations
    ADD COLUMN quantity smallint NOT NULL DEFAULT 1,
    ADD COLUMN slot     smallint NOT NULL DEFAULT 1,
    -- R13's bound: at most 16 machines per order (the API says 400 past it).
    -- It bounds the savepoints of one reserve (R5: at most 16 + 4 inserts
    -- plus one for the whole order, under the 64 a backend caches) and the
    -- machine rows one transaction locks.
    ADD CONSTRAINT reservations_order_quantity_range CHECK (quantity BETWEEN 1 AND 16),
    ADD CONSTRAINT reservations_order_slot_range CHECK (slot BETWEEN 1 AND quantity);

-- R9 per order, not per reservation: the same name, a wider key. The lookups
-- by (org_id, order_ref) use its prefix, as they used the old index. No new
-- index: an order's slots are found through this one.
ALTER TABLE reservations
    DROP CONSTRAINT reservations_order_ref_unique_per_org,
    ADD CONSTRAINT reservations_order_ref_unique_per_org UNIQUE (org_id, order_ref, slot);

-- R14: an extension is an event of its own ('extended', held to held), with
-- its actor and, in its detail, the old and the new deadline and the reason.
ALTER TABLE reservation_events
    DROP CONSTRAINT reservation_events_kind_known,
    ADD CONSTRAINT reservation_events_kind_known
        CHECK (kind IN ('created', 'converted', 'cancelled', 'expired', 'extended'));

-- Lost demand records how many machines the refused order asked for.
ALTER TABLE reservation_refusals
    ADD COLUMN quantity smallint NOT NULL DEFAULT 1,
    ADD CONSTRAINT reservation_refusals_quantity_range CHECK (quantity BETWEEN 1 AND 16);

-- The functions' answers carry the order's size and the slot of each row
-- (NULL where no reservation is answered).
ALTER TYPE reserve_result ADD ATTRIBUTE quantity smallint, ADD ATTRIBUTE slot smallint;
ALTER TYPE transition_result ADD ATTRIBUTE quantity smallint, ADD ATTRIBUTE slot smallint;
