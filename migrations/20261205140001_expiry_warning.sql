-- R16: the order service hears before a deadline passes. How long before,
-- per organization (0: never); and the deadline a hold was last warned
-- about, so that one deadline is warned about once and an extension (a new
-- deadline) re-arms the warning.
ALTER TABLE organizations
    ADD COLUMN expiry_warning_seconds integer NOT NULL DEFAULT 120,
    ADD CONSTRAINT organizations_expiry_warning_range CHECK (expiry_warning_seconds BETWEEN 0 AND 3600);

ALTER TABLE reservations ADD COLUMN warned_deadline timestamptz;

-- The warning is an event of its own (held to held), sent as the webhook
-- `reservation.expiring`.
ALTER TABLE reservation_events
    DROP CONSTRAINT reservation_events_kind_known,
    ADD CONSTRAINT reservation_events_kind_known
        CHECK (kind IN ('created', 'converted', 'cancelled', 'expired', 'extended', 'machine_replaced',
                        'expiring'));
