-- 006: awa's CEL callback expressions (filter, on_complete, on_fail, transform), stored at
-- registration and read by resolve_callback. A side table, not columns of jobs, because the
-- DLQ copies a job row by position (jobs.* into dlq). One row per job at most (its latest
-- registration with expressions), read only while its callback_id is the job's current one;
-- no foreign key (TRUNCATE of jobs stays possible): the leader's prune pass deletes rows whose
-- callback is gone.
\ir objects/006_callback_expressions.sql
