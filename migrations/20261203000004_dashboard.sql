-- Issue 12: the overview's 24-hour chart counts reservations created per
-- hour and per site; ended ones already have reservations_ended_recently_idx.
-- Without this index that count reads the whole history of the organization.
CREATE INDEX reservations_created_recently_idx ON reservations (org_id, created_at);
