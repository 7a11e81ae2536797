-- F5: after a restore, nothing handed out before it matches anything
-- handed out after it.
--
-- A restore rewinds every sequence: a reservation's id and fence, an event
-- id, a lease fence handed out after the backup would be handed out again,
-- and an old (id, fence) would act on a new reservation. The table
-- `incarnation` (one row) records a fingerprint of the database it was
-- written in; every new connection of every pool compares it with the
-- database it reads it in (`incarnation_verify`, db::incarnation). What
-- differs after each kind of restore:
--
--   - a dump restored into another database, or into a database of the
--     same name created again: the database's oid and this table's oid
--     (a logical restore creates the table anew), and the row's xmin no
--     longer names the transaction that wrote it (COPY wrote it);
--   - a dump restored into another cluster: the system identifier too
--     (when the owner may read pg_control_system());
--   - a physical backup recovered to a point in time: the WAL timeline
--     (recovery always ends on a new one). A promotion does too: a
--     failover that may have lost commits is handled as a restore.
--
-- On a difference every sequence of the schema is advanced to the floor of
-- the current time, which nothing issued before can have reached: no memory
-- of the lost history is needed, so it holds whatever the backup missed.

-- F5: the floor at time t: (seconds since 2026-01-01 UTC, plus a day for
-- clocks that disagree) * 2^22. Every value a sequence issued before t is
-- below it as long as no sequence grew faster than 2^22 (about four
-- million) a second on average since the epoch or since its last advance
-- (the real rates are below a thousand). Values stay below 2^53, exact in
-- JSON and JavaScript, until the year 2094.
CREATE OR REPLACE FUNCTION incarnation_floor(p_at timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT (floor(extract(epoch FROM p_at))::bigint - 1767225600 + 86400) * 4194304
$$;

-- F5: what the row records, for the database the session is in. A value
-- the owner may not read is NULL (a managed service may revoke
-- pg_control_system()); the others still tell a restore apart.
CREATE OR REPLACE FUNCTION incarnation_fingerprint() RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_system bigint;
    v_timeline bigint;
BEGIN
    IF has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE') THEN
        SELECT system_identifier INTO v_system FROM pg_control_system();
    END IF;
    -- The current timeline, from the name of the WAL file being written
    -- (pg_control's checkpoint timeline lags a promotion until the next
    -- checkpoint).
    IF has_function_privilege('pg_catalog.pg_walfile_name(pg_lsn)', 'EXECUTE')
       AND has_function_privilege('pg_catalog.pg_current_wal_lsn()', 'EXECUTE') THEN
        v_timeline := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
    END IF;
    RETURN jsonb_build_object(
        'system_identifier', v_system,
        'timeline', v_timeline,
        'database_oid', (SELECT d.oid::bigint FROM pg_database d WHERE d.datname = current_database()),
        'table_oid', 'incarnation'::regclass::oid::bigint);
END
$$;

-- F5: the check every new connection runs (and `serve` at start-up).
-- NULL: this is the database the row was written in (one read, no lock, no
-- write). Otherwise, under the row's lock (one check at a time; the others
-- wait, then find the new fingerprint): on a new incarnation, or on the
-- first check of a database that already handed something out (a backup
-- taken before this table existed), every sequence of the schema goes to
-- at least `incarnation_floor(now)`, the change is logged in
-- `incarnation_changes`, every organization with a webhook gets a
-- `database.restored` event, and the new fingerprint is recorded; on the
-- first check of a database that never handed anything out, only the
-- fingerprint. Returns what it did, for the log.
--
-- SECURITY DEFINER: setval needs UPDATE on the sequences, which the
-- application role does not have (docs/production.md).
CREATE OR REPLACE FUNCTION incarnation_verify() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    v_now jsonb := incarnation_fingerprint();
    v_was jsonb;
    v_xmin xid;
    v_wrote xid8;
    v_recorded timestamptz;
    v_reasons text[] := '{}';
    v_key text;
    v_floor bigint;
    v_seq record;
    v_history boolean;
    v_event bigint;
BEGIN
    FOR pass IN 1..2 LOOP
        IF pass = 1 THEN
            SELECT jsonb_build_object(
                       'system_identifier', i.system_identifier, 'timeline', i.timeline,
                       'database_oid', i.database_oid::bigint, 'table_oid', i.table_oid::bigint),
                   i.xmin, i.written_xid, i.recorded_at
              INTO v_was, v_xmin, v_wrote, v_recorded
              FROM incarnation i;
        ELSE
            SELECT jsonb_build_object(
                       'system_identifier', i.system_identifier, 'timeline', i.timeline,
                       'database_oid', i.database_oid::bigint, 'table_oid', i.table_oid::bigint),
                   i.xmin, i.written_xid, i.recorded_at
              INTO v_was, v_xmin, v_wrote, v_recorded
              FROM incarnation i
               FOR UPDATE;
        END IF;
        IF NOT FOUND THEN
            -- A restore still loading (its data not in yet): not served.
            RAISE EXCEPTION 'F5: the incarnation row is missing (a restore under way?)'
                USING ERRCODE = '55000';
        END IF;
        IF v_recorded IS NOT NULL AND v_was = v_now
           AND v_xmin::text = (v_wrote::text::numeric % 4294967296)::text THEN
            RETURN NULL;
        END IF;
    END LOOP;

    IF v_recorded IS NULL THEN
        v_history := EXISTS (SELECT 1 FROM reservations) OR EXISTS (SELECT 1 FROM leases)
            OR EXISTS (SELECT 1 FROM pg_sequences s
                        WHERE s.schemaname = (SELECT n.nspname FROM pg_class c
                                                JOIN pg_namespace n ON n.oid = c.relnamespace
                                               WHERE c.oid = 'incarnation'::regclass)
                          AND s.sequencename IN ('reservation_fence_seq', 'lease_fence_seq')
                          AND s.last_value IS NOT NULL);
        IF NOT v_history THEN
            UPDATE incarnation
               SET system_identifier = (v_now->>'system_identifier')::bigint,
                   timeline = (v_now->>'timeline')::bigint,
                   database_oid = (v_now->>'database_oid')::oid,
                   table_oid = (v_now->>'table_oid')::oid,
                   written_xid = pg_current_xact_id(),
                   recorded_at = clock_timestamp();
            RETURN 'recorded';
        END IF;
        v_reasons := ARRAY['first check of a database that has handed out identifiers'];
    ELSE
        FOR v_key IN SELECT jsonb_object_keys(v_now) ORDER BY 1 LOOP
            IF v_was->v_key IS DISTINCT FROM v_now->v_key THEN
                v_reasons := v_reasons || format('%s %s -> %s', v_key, v_was->v_key, v_now->v_key);
            END IF;
        END LOOP;
        IF v_xmin::text <> (v_wrote::text::numeric % 4294967296)::text THEN
            v_reasons := v_reasons || 'the row was copied in (its xmin is not its writer)'::text;
        END IF;
    END IF;

    v_floor := incarnation_floor(clock_timestamp());
    FOR v_seq IN
        SELECT s.schemaname, s.sequencename, s.last_value
          FROM pg_sequences s
         WHERE s.schemaname = (SELECT n.nspname FROM pg_class c
                                 JOIN pg_namespace n ON n.oid = c.relnamespace
                                WHERE c.oid = 'incarnation'::regclass)
         ORDER BY s.sequencename
    LOOP
        -- Never backwards: a sequence already past the floor keeps going.
        PERFORM setval(format('%I.%I', v_seq.schemaname, v_seq.sequencename),
                       greatest(v_floor, coalesce(v_seq.last_value, 0) + 1), false);
    END LOOP;

    INSERT INTO incarnation_changes (reason, floor, previous, current)
    VALUES (array_to_string(v_reasons, '; '), v_floor, v_was, v_now);

    -- The webhook stream says what it can: one event per organization with
    -- a webhook, in the id space of reservation events (past the floor), so
    -- that a consumer reconciles (docs/webhooks.md).
    IF EXISTS (SELECT 1 FROM webhooks) THEN
        v_event := nextval(pg_get_serial_sequence('reservation_events', 'id'));
        INSERT INTO webhook_deliveries (event_id, org_id, reservation_id, payload)
        SELECT NULL, w.org_id, NULL,
               jsonb_build_object(
                   'event_id', v_event,
                   'type', 'database.restored',
                   'occurred_at', to_char(clock_timestamp() AT TIME ZONE 'UTC',
                                          'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                   'organization', o.slug,
                   'restore', jsonb_build_object(
                       'reason', array_to_string(v_reasons, '; '),
                       'first_new_id', v_floor,
                       'last_kept_event_id', (SELECT max(e.id) FROM reservation_events e
                                               WHERE e.id < v_floor)))
          FROM webhooks w JOIN organizations o ON o.id = w.org_id
         ORDER BY w.org_id;
    END IF;

    UPDATE incarnation
       SET system_identifier = (v_now->>'system_identifier')::bigint,
           timeline = (v_now->>'timeline')::bigint,
           database_oid = (v_now->>'database_oid')::oid,
           table_oid = (v_now->>'table_oid')::oid,
           written_xid = pg_current_xact_id(),
           recorded_at = clock_timestamp();
    RETURN format('F5: a new incarnation of the database (%s): every sequence advanced to %s',
                  array_to_string(v_reasons, '; '), v_floor);
END
$$;

-- F5: for a restore the fingerprint cannot see: a data directory copied
-- back (a filesystem or volume snapshot, a cold copy) and started without
-- archive recovery stays on its timeline, with its oids and its row, like
-- a crash restart, which loses nothing. The operator says so before
-- serving (docs/operations.md): the recorded fingerprint is cleared of its
-- timeline, so the next check (this call, then every new connection)
-- treats the database as a new incarnation.
CREATE OR REPLACE FUNCTION incarnation_declare_restored() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE incarnation SET timeline = -1 WHERE recorded_at IS NOT NULL;
    RETURN coalesce(incarnation_verify(), 'nothing recorded yet: the first check advances');
END
$$;
