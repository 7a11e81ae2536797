-- What a cancel or a convert of one reservation asks for, as one value
-- (read from the binary's jsonb with `jsonb_populate_record`), as
-- `reserve_request` and `order_request`: a field added to the request is an
-- attribute here and a key in the binary's JSON, never another argument.
CREATE TYPE transition_request AS (
    id          bigint,
    fence       bigint,
    action      text,
    reason      text,
    service_ref text
);
