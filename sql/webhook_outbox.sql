-- Reservation events for the order service (an outbox and
-- signed webhooks).
--
-- Why a trigger writes the outbox, not the application:
--   Every state change of a reservation is a row of reservation_events, but
--   those rows are written by several code paths (the allocator, convert and
--   cancel, the point-of-use expiries, the sweep's batch statements, and the
--   PL/pgSQL functions that are replacing some of them). An AFTER INSERT
--   trigger on reservation_events is the one place every writer passes
--   through, so no writer added next year can forget the outbox, and the
--   delivery row commits (or rolls back) with the change it reports, in the
--   same transaction.
--
-- Why not read reservation_events by id with a cursor ("everything after
-- the last id I delivered"):
--   ids come from a sequence when a row is inserted, not when it commits. A
--   transaction that took id 10 can commit after one that took id 11; a
--   reader that saw 11 and moved its cursor past it never sees 10. The
--   outbox has no cursor: a delivery row is pending until a delivery of it
--   is recorded, so a row that commits late is picked up by the next poll.
--
-- Order: the events of one reservation are written one transaction after
-- the other (each transition locks the reservation row, and `created`
-- commits before anything else can see the reservation), so within one
-- reservation event ids follow commit order. The worker never sends event
-- N+1 of a reservation while an earlier one of it is pending.

-- Statement level, with the statement's new rows as a transition table:
-- one call per INSERT, however many events it writes (the sweep writes
-- up to 500 at a time). Without any webhook in the deployment the call is
-- one indexed probe of the tiny webhooks table and nothing else. Otherwise
-- each event costs the reservation by its primary key and the webhook by
-- its primary key; an organization without a webhook gets no row. The
-- reservation is fetched per event (OFFSET 0 keeps the subquery from being
-- flattened): the plan PL/pgSQL caches then stays an index probe per row
-- whatever batch size came first, never a scan of reservations.
CREATE OR REPLACE FUNCTION reservation_events_to_outbox() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhooks) THEN
        RETURN NULL;
    END IF;
    INSERT INTO webhook_deliveries (event_id, org_id, reservation_id, payload)
    SELECT e.id, r.org_id, r.id,
           jsonb_build_object(
               'event_id', e.id,
               'type', 'reservation.' || e.kind,
               'occurred_at', to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'organization', o.slug,
               'reservation', jsonb_build_object(
                   'id', r.id,
                   'order_ref', r.order_ref,
                   -- The state this event moved it to (the row may be
                   -- updated after the event in the same transaction).
                   'state', e.to_state,
                   'fence', r.fence,
                   'expires_at', to_char(r.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                   'machine', r.machine_snapshot,
                   -- R20: the profile asked beside the machine's, served.
                   'profile_asked', coalesce(r.profile_asked, r.machine_snapshot->>'profile', ''),
                   'substituted', r.profile_asked IS NOT NULL),
               'event', jsonb_build_object(
                   'kind', e.kind,
                   'from_state', e.from_state,
                   'to_state', e.to_state,
                   'actor', e.actor,
                   'detail', e.detail,
                   'replica', e.replica,
                   'lease_fence', e.lease_fence))
      FROM inserted e
      CROSS JOIN LATERAL (
          SELECT rr.id, rr.org_id, rr.order_ref, rr.fence, rr.expires_at, rr.machine_snapshot, rr.profile_asked
            FROM reservations rr WHERE rr.id = e.reservation_id OFFSET 0
      ) r
      JOIN webhooks w ON w.org_id = r.org_id
      JOIN organizations o ON o.id = r.org_id
     ORDER BY e.id;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS reservation_events_outbox ON reservation_events;
CREATE TRIGGER reservation_events_outbox
    AFTER INSERT ON reservation_events
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION reservation_events_to_outbox();
