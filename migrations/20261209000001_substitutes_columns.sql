-- R20: what an order asked and what served it. `profile_asked` is the
-- profile the order named when a declared substitute served it (the
-- machine's profile is the one served); NULL when the asked profile served.
ALTER TABLE reservations ADD COLUMN profile_asked text;

-- R20, R21: an order served by a substitute is demand of the asked pool,
-- recorded beside the refusals with its own code; `profile_served` names
-- the substitute that served it (NULL for every other code).
ALTER TABLE reservation_refusals
    DROP CONSTRAINT reservation_refusals_reason_known,
    ADD CONSTRAINT reservation_refusals_reason_known
        CHECK (reason IN ('unavailable', 'contended', 'reserved', 'customer_limit', 'substituted')),
    ADD COLUMN profile_served text,
    ADD CONSTRAINT reservation_refusals_served_only_substituted
        CHECK ((reason = 'substituted') = (profile_served IS NOT NULL));
