-- R21: the links ended since a time, by an index. A day of history
-- (pool_day_rows, sql/planning.sql) counts the machines sold at the day's
-- end as the links live now plus those ended since, instead of reading
-- every link ever kept: the daily job holds the cursor and the lease
-- while it runs, so its cost must be a day's and the fleet's, never the
-- history's.
CREATE INDEX service_links_ended_idx ON service_links (ended_at) WHERE ended_at IS NOT NULL;
