-- F5: which copy of the database this is. A restore (a logical dump, or a
-- physical backup recovered to a point in time) rewinds every sequence, so
-- ids and fences handed out after the backup would be handed out again.
-- The one row below records a fingerprint of the database it was written
-- in; `incarnation_verify()` (sql/incarnation.sql) compares it with the
-- database it is read in, and on a difference advances every sequence past
-- anything the lost history can have issued. NULL columns: never recorded
-- (a database migrated but never served).
CREATE TABLE incarnation (
    one               boolean     PRIMARY KEY DEFAULT true,
    -- pg_control_system(): another cluster (a dump restored elsewhere,
    -- pg_upgrade). NULL when the owner may not read it (some managed
    -- services).
    system_identifier bigint,
    -- The WAL timeline: a recovery to a point in time, or a promotion.
    timeline          bigint,
    -- pg_database.oid and this table's pg_class.oid: a dump restored into
    -- another database, or the same name created again.
    database_oid      oid,
    table_oid         oid,
    -- The transaction that wrote this row: the row's xmin says the same
    -- unless the row was copied in by a restore (COPY writes a new xmin).
    written_xid       xid8,
    recorded_at       timestamptz,
    CONSTRAINT incarnation_one_row CHECK (one)
);
INSERT INTO incarnation (one) VALUES (true);

-- Every new incarnation seen: when, what differed, and the floor every
-- sequence was advanced to.
CREATE TABLE incarnation_changes (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    reason   text        NOT NULL,
    floor    bigint      NOT NULL,
    previous jsonb       NOT NULL,
    current  jsonb       NOT NULL
);

-- F5: the webhook event that marks a new incarnation (`database.restored`,
-- docs/webhooks.md) belongs to no reservation and to no reservation event:
-- its event id, in the payload, is drawn from the events' sequence.
ALTER TABLE webhook_deliveries
    ALTER COLUMN event_id DROP NOT NULL,
    ALTER COLUMN reservation_id DROP NOT NULL,
    ADD CONSTRAINT webhook_deliveries_event_or_restore CHECK (
        (event_id IS NOT NULL AND reservation_id IS NOT NULL)
        OR (event_id IS NULL AND reservation_id IS NULL
            AND payload->>'type' = 'database.restored'));
