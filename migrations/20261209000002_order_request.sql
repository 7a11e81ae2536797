-- What an order action asks for (R13, R14: cancel, convert or extend a
-- whole order, or extend one reservation), as one value: the SQL functions
-- take it as one jsonb argument read into this type
-- (`jsonb_populate_record`), as a reserve's `reserve_request`, so that an
-- optional field added to the request is an attribute here and a key in
-- the binary's JSON, never another argument of a function.
CREATE TYPE order_request AS (
    order_ref text,
    ids       bigint[],
    fences    bigint[],
    texts     text[],
    action    text,
    reason    text,
    seconds   integer,
    cap       integer,
    until     timestamptz
);
