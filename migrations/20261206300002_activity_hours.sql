-- The overview's 24-hour chart, counted per hour as time passes instead of
-- at every view. Counting the reservations created or ended in the last 24
-- hours at each view costs what they number: 1.7 s at 300,000 (BENCHMARKS.md,
-- item 5, where item 1's load writes that many in minutes). The sweep's
-- holder adds what happened since `counted_until` (up to a minute ago, so
-- that the transactions that wrote it have committed) to these rows; the
-- overview reads 24 hours of them and says up to when they count.
CREATE TABLE activity_hours (
    org_id bigint      NOT NULL REFERENCES organizations (id),
    hour   timestamptz NOT NULL,
    site   text        NOT NULL,
    kind   text        NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (org_id, hour, site, kind),
    CONSTRAINT activity_hours_kind_known CHECK (kind IN ('created', 'converted', 'expired', 'cancelled')),
    CONSTRAINT activity_hours_whole_hour CHECK (hour = date_trunc('hour', hour))
);

-- One row: everything before `counted_until` is in activity_hours.
CREATE TABLE activity_counted (
    one           boolean     PRIMARY KEY DEFAULT true CHECK (one),
    counted_until timestamptz NOT NULL
);

-- What the chart shows today is counted once, here: the last 24 whole hours
-- up to a minute ago.
WITH t AS (
    SELECT date_trunc('hour', clock_timestamp()) - interval '23 hours' AS since,
           clock_timestamp() - interval '1 minute' AS until
), counted AS (
    INSERT INTO activity_counted (counted_until) SELECT until FROM t RETURNING counted_until
)
INSERT INTO activity_hours (org_id, hour, site, kind, n)
SELECT r.org_id, date_trunc('hour', e.at), m.site, e.kind, count(*)
  FROM t, reservations r
  JOIN machines m ON m.id = r.machine_id
 CROSS JOIN LATERAL (VALUES ('created', r.created_at), (r.state, r.ended_at)) e (kind, at)
 WHERE coalesce(r.ended_at, r.created_at) >= t.since AND e.at >= t.since AND e.at < t.until
 GROUP BY 1, 2, 3, 4;
