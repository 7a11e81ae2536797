-- The delivery worker's poll reads, for each organization with a webhook,
-- one page of its pending deliveries in due order (webhooks::outbox's
-- DUE_SQL). The index it replaces, on next_attempt_at alone, made the poll
-- rank every due delivery of every organization: a cost that grew with the
-- backlog, paid once per finished delivery, so that a worker behind grew
-- slower the further behind it was.
CREATE INDEX webhook_deliveries_due_by_org_idx
    ON webhook_deliveries (org_id, next_attempt_at, event_id) WHERE state = 'pending';
DROP INDEX webhook_deliveries_due_idx;
