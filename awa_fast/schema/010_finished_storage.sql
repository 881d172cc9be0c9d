-- 010: finished jobs leave the hot table (ADR 016).
--
-- awa_fast.jobs keeps the live jobs only (scheduled, available, running, retryable,
-- waiting_external, consequence_pending, and a finished row whose handler still runs or whose
-- failure consequence is still owed). A finished row moves, in the transaction that finishes
-- it, to awa_fast.jobs_done: LIST partitions by a time slice of finalized_at (a ring of slices
-- per final-state class), which retention TRUNCATEs whole. A unique key that a finished job
-- holds in its mask's final state is kept in awa_fast.unique_holds; per-slice counters in
-- awa_fast.done_counts, written once per statement, answer "how many" without a scan.
-- Reads that may meet finished jobs go through the view awa_fast.jobs_all.
--
-- On a large existing table this migration moves every finished row in one transaction;
-- run VACUUM awa_fast.jobs afterwards to reclaim their space at once.

-- The slice of a finished row: completed rows in 32 one-hour slices, failed and cancelled rows
-- in 32 three-hour slices (slices 32..63). A slice is reused 32 periods later; retention
-- TRUNCATEs it before that unless the retention is longer than the ring (then rows are kept
-- longer, never shorter). IMMUTABLE for the partition key: the ring never changes without a
-- migration that repartitions.
CREATE FUNCTION awa_fast.done_slot(s awa_fast.job_state, at timestamptz) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (CASE WHEN s = 'completed'
                 THEN mod(mod(floor(extract(epoch FROM at) / 3600)::bigint, 32) + 32, 32)
                 ELSE 32 + mod(mod(floor(extract(epoch FROM at) / 10800)::bigint, 32) + 32, 32)
            END)::smallint
$$;

\ir objects/010_finished_storage.sql

-- The hot table stays small, so vacuum it whenever a few thousand dead rows piled up, without
-- throttling (the leader also vacuums it between autovacuum rounds: maintenance.vacuum_hot).
-- fillfactor leaves room on each page for heartbeat updates to stay HOT.
ALTER TABLE awa_fast.jobs SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0,
    fillfactor = 85);

-- Move the finished rows of an existing database, counting them and holding their keys as
-- jobs_done's insert trigger does for later writes (ADR 043: that trigger is a routine, applied
-- after the newest migration, so this statement does its work itself). One statement: one
-- counter row per slice, minute or hour, queue and state. The single-table unique index these
-- rows come from let no two rows hold one key, so no hold can conflict.
WITH d AS (
    DELETE FROM awa_fast.jobs
    WHERE state IN ('completed', 'failed', 'cancelled') AND heartbeat_at IS NULL
      AND consequence_state IS DISTINCT FROM 'owed'
    RETURNING *
), moved AS (
    INSERT INTO awa_fast.jobs_done
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at,
           deadline_at, attempted_at, COALESCE(finalized_at, now()), created_at, errors,
           metadata, tags, unique_key, unique_states, ordering_key, callback_id,
           callback_timeout_at, run_lease, progress, consequence_state, consequence_reason,
           consequence_path, consequence_error, consequence_attempts, consequence_retry_at,
           consequence_applied_at, verified_at
    FROM d
    RETURNING id, queue, state, finalized_at, unique_key, unique_states
), held AS (
    INSERT INTO awa_fast.unique_holds (unique_key, job_id, slot)
    SELECT m.unique_key, m.id, awa_fast.done_slot(m.state, m.finalized_at) FROM moved m
    WHERE m.unique_key IS NOT NULL
      AND (m.unique_states & (1 << awa_fast.state_bit(m.state))) <> 0
)
INSERT INTO awa_fast.done_counts (slot, bucket, queue, state, backend, n, newest)
SELECT awa_fast.done_slot(m.state, m.finalized_at),
       date_trunc(CASE WHEN m.state = 'completed' THEN 'minute' ELSE 'hour' END, m.finalized_at),
       m.queue, m.state, pg_backend_pid(), count(*), max(m.finalized_at)
FROM moved m GROUP BY 1, 2, 3, 4;
