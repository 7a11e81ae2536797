-- R21, F5: the history's generation is drawn from a sequence, not counted
-- up from the row's own value. A restore sets the row back with the
-- history it numbers, and a count would then hand the next write a number
-- a running process may already keep for the history it replaced; a
-- sequence is advanced past every value issued before by the restore
-- check (sql/incarnation.sql), so no number is issued twice.
CREATE SEQUENCE pool_days_generation_seq AS bigint;
SELECT setval('pool_days_generation_seq', w.generation + 1, false) FROM pool_days_written w;
