-- The awa_fast schema's stored objects (types, tables, indexes, views, settings, seeded rows) as
-- migrations 001-029 leave them, created in one step on a fresh install (ADR 032). Its functions
-- and triggers are not here: they are the routines (routines/*.sql, ADR 043), which
-- awa_fast.schema.migrate() runs after this file in the same transaction; the two functions an
-- index or the partition key is built on (state_bit, done_slot) are stored objects and stay.
-- migrate() runs this file when the schema has no version recorded, then records every version
-- up to the one in this file's name; a schema with any version recorded is upgraded by the
-- numbered migrations beside it. A `\ir objects/NNN_*.sql` line is a definition migration NNN
-- made and this file shares with it (the runner, like psql, reads the file in its place); the
-- statements after it fold in what later migrations changed.
--
-- Keeping it current: a new migration NNN_*.sql is also folded in here (its statements appended
-- at the end, or edited into the definitions they change) and this file renamed to
-- baseline_NNN.sql. tests/schema/test_schema_baseline.py fails until the catalog of a schema
-- created from this file equals the catalog of one upgraded through every migration, and until
-- this file's version is the newest migration's; its message lists each catalog entry that
-- differs. Names, column order and storage settings are part of that catalog: copy definitions
-- from the migration that last changed them. docs/architecture.md ("Schema and migrations") has
-- the steps. Written for the schema awa_fast; another schema gets it rewritten as the
-- migrations are (ADR 027).
--
-- Each object's reasons are in the migration that last changed it (named in brackets).

CREATE SCHEMA IF NOT EXISTS awa_fast;

-- [001] A job's states; the bit of each in a unique_states mask (awa's positions;
-- consequence_pending is not settled yet, so it holds the key like running).
\ir objects/001_job_state.sql
-- [012] The slice of jobs_done a finished row lives in (010), inlinable (012).
\ir objects/012_done_slot.sql
-- The live jobs [001, 002]; finished rows move to jobs_done [010]. The DLQ and jobs_done copy
-- these columns by position.
\ir objects/001_jobs.sql
\ir objects/002_consequences.sql

-- [010, 014, 016] Vacuumed by the maintenance leader; autovacuum is the backstop and never cuts
-- off empty pages; fillfactor leaves room for HOT heartbeat updates.
ALTER TABLE awa_fast.jobs SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 100000,
    autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 1000000,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0,
    fillfactor = 85, vacuum_truncate = false);

-- [004] Lineage: the follow-ups a job staged.
CREATE INDEX idx_awa_fast_jobs_triggered_by ON awa_fast.jobs ((metadata ->> 'awa:triggered_by'))
    WHERE metadata ? 'awa:triggered_by';

-- [001, 002] Per-queue pause and DLQ policy.
CREATE TABLE awa_fast.queue_meta (
    queue       text PRIMARY KEY,
    paused      boolean NOT NULL DEFAULT false,
    paused_at   timestamptz,
    paused_by   text,
    dlq         boolean NOT NULL DEFAULT false
);

-- [002, 004] Dead-lettered jobs: a snapshot of the row, never claimable.
\ir objects/002_dlq.sql
CREATE INDEX idx_awa_fast_dlq_triggered_by ON awa_fast.dlq ((metadata ->> 'awa:triggered_by'))
    WHERE metadata ? 'awa:triggered_by';

-- [003] Periodic job schedules.
\ir objects/003_cron_jobs.sql

-- [005] The maintenance leader's fencing epoch (one row); the live worker processes.
\ir objects/005_leader_and_workers.sql
-- [025] Each worker's declared staleness.
ALTER TABLE awa_fast.workers ADD COLUMN min_stale_ms bigint;

-- [006] awa's CEL callback expressions, one row per job at most.
\ir objects/006_callback_expressions.sql

-- [007] Queue and job-kind descriptors (the kind table's constraints keep the queue table's
-- names, as LIKE ... INCLUDING ALL copied them).
\ir objects/007_descriptors.sql

-- [008] Durable batch operations and the job ids each froze.
\ir objects/008_batch_operations.sql

-- [010] Finished jobs: LIST partitions by done_slot, a ring of 32 one-hour slices of completed
-- rows and 32 three-hour slices of failed and cancelled rows, TRUNCATEd whole by retention.
\ir objects/010_finished_storage.sql
-- [018] Written by every completion: no vacuum cuts off their empty pages under a lock.
ALTER TABLE awa_fast.done_counts SET (vacuum_truncate = false);
ALTER TABLE awa_fast.unique_holds SET (vacuum_truncate = false);

-- [020] The kinds the leader verifies, and the completions awaiting verify_success.
\ir objects/020_verify.sql

-- [017] Coarse statistics (a target of 1) for the finished slices and unique_holds: the
-- single-job reads need them, and a small sample keeps analyze's snapshot short.
\ir objects/017_finished_statistics.sql

-- [028] The maintenance leader's lease (one row), which works through a transaction pooler.
\ir objects/028_leader_lease.sql
