-- What a reserve asks for, as one value: the SQL functions take it as one
-- jsonb argument read into this type (`jsonb_populate_record`), so an
-- optional field added to the request is an attribute here and a key in
-- the binary's JSON, never another argument of a function (an older
-- binary's JSON lacks the key: the attribute reads NULL, its default).
CREATE TYPE reserve_request AS (
    order_ref    text,
    site         text,
    profile      text,
    vendor       text,
    hold_seconds integer,
    quantity     integer,
    segment      text,
    customer_ref text
);

-- What a reserve answers: the outcome ('created', 'existing', 'nothing'
-- from the walk alone, 'contended', 'unavailable', 'reserved',
-- 'customer_limit'), the organization (set on a refusal too, for R17's
-- alternatives), the walk's counters, a refusal's counts, and the
-- reservation whole, as the table's row type: a column added to
-- `reservations` reaches the binary with no change here or in the
-- functions that build the answer. (The flat `reserve_result` is what
-- binaries of the previous release read, through the entry points they
-- call; it is never extended.)
CREATE TYPE reserve_answer AS (
    outcome          text,
    org_id           bigint,
    scanned          integer,
    locked_by_others integer,
    gone             integer,
    attempts         integer,
    candidates       bigint,
    excluded         jsonb,
    alternatives     jsonb,
    reservation      reservations
);
