-- 018: no vacuum cuts off the empty pages of the other tables every completion writes (issue 11).
--
-- The same reason as 016 for the hot table: cutting off a table's empty tail takes an ACCESS
-- EXCLUSIVE lock. done_counts takes an upsert from every completing statement (the jobs_done
-- insert trigger) and unique_holds an insert from every completion of a unique job, so while
-- autovacuum held that lock every completion waited. done_counts stays small (the prune folds
-- it) and unique_holds reuses the space an expired slice frees, so neither needs the cut.
ALTER TABLE awa_fast.done_counts SET (vacuum_truncate = false);
ALTER TABLE awa_fast.unique_holds SET (vacuum_truncate = false);
