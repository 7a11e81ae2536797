-- Reservations after creation: the answer of a transition. Cancel and
-- convert themselves (R10, R11) are definitions: sql/transitions.sql.

-- What a transition answers: 'ok', or why not ('not_found', 'stale_fence',
-- 'not_held', 'expired'), the reservation as it now is (for 'expired': as it
-- was, with its deadline), and for a conversion its service link.
CREATE TYPE transition_result AS (
    outcome          text,
    id               bigint,
    org_id           bigint,
    order_ref        text,
    machine_id       bigint,
    state            text,
    fence            bigint,
    reason           text,
    hold_seconds     integer,
    created_at       timestamptz,
    expires_at       timestamptz,
    ended_at         timestamptz,
    ended_by         text,
    end_reason       text,
    machine          jsonb,
    link_id          bigint,
    link_service_ref text,
    link_created_at  timestamptz
);
