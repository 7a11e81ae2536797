-- R15: a hold whose machine leaves `ready` moves to an equivalent machine;
-- that move is an event of its own.
ALTER TABLE reservation_events
    DROP CONSTRAINT reservation_events_kind_known,
    ADD CONSTRAINT reservation_events_kind_known
        CHECK (kind IN ('created', 'converted', 'cancelled', 'expired', 'extended', 'machine_replaced'));
