-- The database's numbers for /metrics (machines per site, profile and pool
-- state; holds due; webhook backlog; sweep and leases), read by one replica
-- at a time and reused by every replica until they are older than the
-- scrape cache's age: ten replicas scraped together cost one read, not ten.
CREATE TABLE metrics_snapshot (
    id      boolean PRIMARY KEY DEFAULT true CONSTRAINT metrics_snapshot_one_row CHECK (id),
    read_at timestamptz NOT NULL,
    body    jsonb NOT NULL
);
