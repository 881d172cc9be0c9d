-- 008: awa's durable batch operations (ADR-030: set_priority, move_queue). An operation row
-- keeps its filter, spec, state and counts; its items freeze the eligible job ids at scan time
-- so the leader's runner accounts each exactly once (processed, skipped or errored), in the
-- transaction that changes the job.
\ir objects/008_batch_operations.sql
