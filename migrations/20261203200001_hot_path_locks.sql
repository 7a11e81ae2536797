-- Issue 21: what every reserve and cancel writes besides its own rows.
--
-- A foreign key check locks the referenced row (SELECT ... FOR KEY SHARE):
-- one WAL record (Heap/LOCK) and a write to the referenced row's page per
-- check. When several transactions hold such a lock on the same row, each
-- new one creates a MultiXact (another WAL record, and the MultiXact
-- buffers). Measured with pg_walinspect on a durable cluster, 8 connections
-- calling api_reserve + api_transition (and the bench's ceiling alike): 8.1
-- Heap/LOCK and 3.2 MultiXact/CREATE_ID records per reserve+cancel cycle,
-- of which only three locks are the allocator's own (the machine twice, the
-- reservation once). The rest were foreign key checks on rows that every
-- order shares, whatever its machine: the organization's row (each reserve)
-- and the rows of reservation_states ('held' on each reserve and each
-- event from it, 'cancelled' on each cancel). Orders for different machines
-- met there, on one page.

-- 1. A reservation's machine and organization, in one key: the machine of
-- the organization. The allocator and the transitions already hold the
-- machine's row FOR UPDATE when they write a reservation, a stronger lock
-- than the check's, so the check writes nothing; it no longer touches the
-- organization's row. It is also stricter than the two keys it replaces: a
-- reservation's organization is its machine's. The organization is still
-- protected: machines reference it (machines_org_id_fkey).
ALTER TABLE machines ADD CONSTRAINT machines_id_of_org_unique UNIQUE (id, org_id);
ALTER TABLE reservations
    ADD CONSTRAINT reservations_machine_of_org
        FOREIGN KEY (machine_id, org_id) REFERENCES machines (id, org_id) NOT VALID;
ALTER TABLE reservations VALIDATE CONSTRAINT reservations_machine_of_org;
ALTER TABLE reservations DROP CONSTRAINT reservations_org_id_fkey;
ALTER TABLE reservations DROP CONSTRAINT reservations_machine_id_fkey;

-- 2. R2's states: the table reservation_states stays the one list of the
-- states and of which hold capacity; the columns check membership with a
-- CHECK, which locks nothing. tests/api/schema.rs compares each CHECK with
-- the table, as it compares the arbiter's predicate, so a state added to
-- one and not the other fails there.
ALTER TABLE reservations
    ADD CONSTRAINT reservations_state_known
        CHECK (state IN ('held', 'converted', 'expired', 'cancelled'));
ALTER TABLE reservations DROP CONSTRAINT reservations_state_fkey;
ALTER TABLE reservation_events
    ADD CONSTRAINT reservation_events_states_known
        CHECK (from_state IN ('held', 'converted', 'expired', 'cancelled')
               AND to_state IN ('held', 'converted', 'expired', 'cancelled'));
ALTER TABLE reservation_events DROP CONSTRAINT reservation_events_from_state_fkey;
ALTER TABLE reservation_events DROP CONSTRAINT reservation_events_to_state_fkey;

-- 3. The overview's 24-hour chart had two indexes of its own, one on
-- created_at, one on ended_at, and a cancel (a non-HOT update: its state is
-- in the arbiter's predicate) added an entry to both. One index on the
-- later of the two times holds every reservation created or ended since
-- any instant in one range (src/dashboard/overview.rs): one entry per
-- reserve and one per end, one fewer per cycle than before, and one fewer
-- on each expiry of the sweep. Partial, as the index it replaces, so that
-- only a query bounding that time can use it (20261203000007).
DROP INDEX reservations_created_recently_idx;
DROP INDEX reservations_ended_recently_idx;
CREATE INDEX reservations_recent_activity_idx
    ON reservations (org_id, (coalesce(ended_at, created_at)))
    WHERE coalesce(ended_at, created_at) IS NOT NULL;

-- 4. reservation_events is read by reservation only (the reservation's page,
-- in id order), never by its id alone, yet every event went into two
-- btrees: the primary key on id and (reservation_id, id). The primary key
-- becomes (reservation_id, id): one btree insert per event, two fewer per
-- reserve+cancel cycle and one fewer per expiry of the sweep. The outbox
-- names an event by the same pair (it has both columns).
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_event_id_fkey;
ALTER TABLE reservation_events DROP CONSTRAINT reservation_events_pkey;
DROP INDEX reservation_events_by_reservation_idx;
ALTER TABLE reservation_events ADD CONSTRAINT reservation_events_pkey PRIMARY KEY (reservation_id, id);
ALTER TABLE webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_event_fkey
        FOREIGN KEY (reservation_id, event_id) REFERENCES reservation_events (reservation_id, id);
