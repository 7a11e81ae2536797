-- Issue 15, part 2: reservation events for the order service (an outbox and
-- signed webhooks): the tables. The trigger that fills the outbox, and why
-- it is a trigger, is a definition: sql/webhook_outbox.sql.

-- One webhook per organization; a row here means "active". The secret is
-- kept in clear because the server signs with it (HMAC needs the key; a
-- digest, as for API tokens, could not sign). README: "Webhooks".
CREATE TABLE webhooks (
    org_id     bigint      PRIMARY KEY REFERENCES organizations (id),
    url        text        NOT NULL,
    secret     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_by text        NOT NULL,
    CONSTRAINT webhooks_url_http CHECK (url ~ '^https?://' AND length(url) <= 2048),
    CONSTRAINT webhooks_secret_length CHECK (length(secret) >= 32)
);

-- The outbox: one row per event of an organization that had a webhook when
-- the event was written. The payload is built at that moment, so that a
-- retry a day later sends what happened, not what the row says now.
CREATE TABLE webhook_deliveries (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        bigint      NOT NULL REFERENCES reservation_events (id),
    org_id          bigint      NOT NULL REFERENCES organizations (id),
    reservation_id  bigint      NOT NULL REFERENCES reservations (id),
    payload         jsonb       NOT NULL,
    state           text        NOT NULL DEFAULT 'pending',
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    attempts        integer     NOT NULL DEFAULT 0,
    last_status     integer,
    last_error      text,
    finished_at     timestamptz,
    CONSTRAINT webhook_deliveries_one_per_event UNIQUE (event_id),
    -- pending: to send; delivered: a 2xx was recorded; failed: retries ran
    -- out (24 h); dropped: the organization removed its webhook.
    CONSTRAINT webhook_deliveries_state_known
        CHECK (state IN ('pending', 'delivered', 'failed', 'dropped')),
    CONSTRAINT webhook_deliveries_end_recorded
        CHECK ((state = 'pending') = (finished_at IS NULL))
);
-- The worker's poll: pending rows in due order.
CREATE INDEX webhook_deliveries_due_idx
    ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
-- Per-reservation order: "is an earlier event of this reservation pending?"
CREATE INDEX webhook_deliveries_pending_by_reservation_idx
    ON webhook_deliveries (reservation_id, event_id) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_by_org_idx ON webhook_deliveries (org_id, id DESC);

-- Every attempt, with what came back: status (NULL when no answer), the
-- time it took, the error, and the replica and lease fence that sent it.
CREATE TABLE webhook_attempts (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id bigint      NOT NULL REFERENCES webhook_deliveries (id),
    org_id      bigint      NOT NULL REFERENCES organizations (id),
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    url         text        NOT NULL,
    status      integer,
    latency_ms  integer     NOT NULL,
    error       text,
    replica     text        NOT NULL,
    lease_fence bigint      NOT NULL,
    CONSTRAINT webhook_attempts_outcome CHECK (status IS NOT NULL OR error IS NOT NULL)
);
CREATE INDEX webhook_attempts_by_delivery_idx ON webhook_attempts (delivery_id, id);
CREATE INDEX webhook_attempts_failures_idx ON webhook_attempts (at DESC) WHERE error IS NOT NULL;
