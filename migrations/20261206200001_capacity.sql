-- R17-R19: capacity that can be promised.
--
-- R18: machines of a pool (site, profile) kept for a named segment. An
-- order outside the segment never takes one of the last `machines`
-- sellable machines of the pool; the decision is made under a lock of the
-- pool (sql/capacity.sql), taken only where a row of this table exists.
CREATE TABLE headroom (
    org_id     bigint      NOT NULL REFERENCES organizations (id),
    site       text        NOT NULL,
    profile    text        NOT NULL,
    segment    text        NOT NULL,
    machines   integer     NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_by text        NOT NULL,
    PRIMARY KEY (org_id, site, profile, segment),
    CONSTRAINT headroom_segment_format CHECK (segment ~ '^[a-z0-9][a-z0-9_-]{0,31}$'),
    CONSTRAINT headroom_machines_range CHECK (machines BETWEEN 1 AND 100000)
);

-- R19: the cap on one customer's live holds (0: none), and R18's segment
-- whose headroom healing (R15) may use for repairs (NULL: none).
ALTER TABLE organizations
    ADD COLUMN customer_hold_limit integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT organizations_customer_hold_limit_range CHECK (customer_hold_limit BETWEEN 0 AND 10000),
    ADD COLUMN repairs_segment text,
    ADD CONSTRAINT organizations_repairs_segment_format CHECK (repairs_segment ~ '^[a-z0-9][a-z0-9_-]{0,31}$');

-- The segment an order named (R18) and its end customer (R19), frozen
-- with the order.
ALTER TABLE reservations
    ADD COLUMN segment text,
    ADD COLUMN customer_ref text;

-- R19's count: a customer's live holds, by key.
CREATE INDEX reservations_held_by_customer_idx ON reservations (org_id, customer_ref)
    WHERE state = 'held' AND customer_ref IS NOT NULL;

-- Two refusals of their own, counted as lost demand.
ALTER TABLE reservation_refusals
    DROP CONSTRAINT reservation_refusals_reason_known,
    ADD CONSTRAINT reservation_refusals_reason_known
        CHECK (reason IN ('unavailable', 'contended', 'reserved', 'customer_limit')),
    ADD COLUMN segment text,
    ADD COLUMN customer_ref text;

-- The sites that could fill a refused order now (R17's alternatives).
ALTER TYPE reserve_result ADD ATTRIBUTE alternatives jsonb;
