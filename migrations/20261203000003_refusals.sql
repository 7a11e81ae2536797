-- Lost demand (issue 15): every `409 unavailable` ("buy hardware") and every
-- `409 contended` ("capacity exists but is hot") of the reserve API, written
-- in the transaction that read the counts. The datacenter team reads them on
-- the overview and on /demand; the sweep worker purges rows older than
-- POOLKEEPER_REFUSAL_RETENTION_DAYS under its lease.
CREATE TABLE reservation_refusals (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    org_id   bigint      NOT NULL REFERENCES organizations (id),
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    reason   text        NOT NULL,
    site     text        NOT NULL,
    profile  text        NOT NULL,
    vendor   text,
    excluded jsonb       NOT NULL,   -- unavailable: API.md's excluded counts; contended: {"candidates": N}
    CONSTRAINT reservation_refusals_reason_known CHECK (reason IN ('unavailable', 'contended'))
);
-- The dashboard's reads: one organization's refusals of the last days.
CREATE INDEX reservation_refusals_by_org_at_idx ON reservation_refusals (org_id, at);
-- The retention purge: the oldest rows of every organization, in batches
-- (the index above cannot serve `at < cutoff` across organizations).
CREATE INDEX reservation_refusals_by_at_idx ON reservation_refusals (at);
