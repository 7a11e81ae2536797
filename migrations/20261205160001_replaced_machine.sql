-- R15: a healed hold's event names the machine it left, as a key, so that
-- the old machine's page can show the hold that moved away and the live
-- list can say "replaced, was PK-00011" without parsing words.
ALTER TABLE reservation_events
    ADD COLUMN replaced_machine_id bigint REFERENCES machines (id);

-- A machine's history reads its replaced holds by this key; few events
-- have one, so the index is partial.
CREATE INDEX reservation_events_replaced_machine_idx
    ON reservation_events (replaced_machine_id, id) WHERE replaced_machine_id IS NOT NULL;
