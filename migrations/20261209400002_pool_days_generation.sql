-- R21: a number that changes with every write of pool_days (a statement
-- trigger, sql/planning.sql), so that a reader may keep what it computed
-- from the history (the fitted rates, src/forecast.rs) until it does.
ALTER TABLE pool_days_written ADD COLUMN generation bigint NOT NULL DEFAULT 0;
