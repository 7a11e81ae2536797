-- The allocator's types and the sweep's index. The allocator itself (R3-R9)
-- is a definition: sql/allocator.sql, which says why the index below is
-- declared as it is.

-- The sweep's index, redeclared: `expires_at IS NOT NULL` is always true
-- (the column is NOT NULL) and is implied by the sweep's `expires_at <= ...`,
-- but not by the allocator's held probe, which therefore can only use the
-- arbiter `reservations_one_holder_per_machine` (one entry per machine)
-- instead of walking every held reservation.
DROP INDEX reservations_held_by_deadline_idx;
CREATE INDEX reservations_held_by_deadline_idx
    ON reservations (expires_at) WHERE state = 'held' AND expires_at IS NOT NULL;

-- A machine and the allocator's verdict on it (exclusion NULL: a candidate).
CREATE TYPE machine_verdict AS (
    id bigint, asset_tag text, site text, vendor text, profile text, status text,
    created_at timestamptz, updated_at timestamptz,
    exclusion text, service_ref text, held_by bigint, held_until timestamptz
);

-- What a reserve answers: the outcome ('created', 'existing', 'nothing' from
-- the walk alone, 'contended', 'unavailable'), the reservation (created or
-- existing), the walk's counters, and for a refusal the counts of R7.
CREATE TYPE reserve_result AS (
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
    scanned          integer,
    locked_by_others integer,
    gone             integer,
    attempts         integer,
    candidates       bigint,
    excluded         jsonb
);
