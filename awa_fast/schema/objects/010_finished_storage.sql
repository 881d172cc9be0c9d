-- Included by migration 010 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
-- Same columns, same order as jobs (a DLQ move copies rows by position).
CREATE TABLE awa_fast.jobs_done (
    LIKE awa_fast.jobs INCLUDING DEFAULTS,
    CONSTRAINT jobs_done_finished CHECK (
        state IN ('completed', 'failed', 'cancelled') AND finalized_at IS NOT NULL)
) PARTITION BY LIST (awa_fast.done_slot(state, finalized_at));

-- Append-only slices: nothing to vacuum but what a rare admin update leaves; insert-driven
-- autovacuum would only re-read them.
DO $$
BEGIN
    FOR i IN 0..63 LOOP
        EXECUTE format(
            'CREATE TABLE awa_fast.%I PARTITION OF awa_fast.jobs_done FOR VALUES IN (%s) '
            'WITH (autovacuum_vacuum_insert_threshold = -1)',
            CASE WHEN i < 32 THEN format('jobs_done_c%s', lpad(i::text, 2, '0'))
                 ELSE format('jobs_done_f%s', lpad((i - 32)::text, 2, '0')) END,
            i);
    END LOOP;
END
$$;

-- By id (get_job, admin moves, id windows of the dashboard), by finalized_at (the verify pass),
-- and the lineage key as on jobs and dlq (migration 004).
CREATE INDEX idx_awa_fast_jobs_done_id ON awa_fast.jobs_done (id);
CREATE INDEX idx_awa_fast_jobs_done_finalized ON awa_fast.jobs_done USING brin (finalized_at);
CREATE INDEX idx_awa_fast_jobs_done_triggered_by
    ON awa_fast.jobs_done ((metadata ->> 'awa:triggered_by'))
    WHERE metadata ? 'awa:triggered_by';

-- A finished job's unique key, while its final state is in its mask (until its slice is
-- pruned, or it leaves jobs_done: retried, dead-lettered, discarded).
CREATE TABLE awa_fast.unique_holds (
    unique_key  bytea PRIMARY KEY,
    job_id      bigint NOT NULL,
    slot        smallint NOT NULL
);
CREATE INDEX idx_awa_fast_unique_holds_slot ON awa_fast.unique_holds (slot);

-- Finished rows per slice, minute (completed) or hour (failed, cancelled), queue, final state
-- and writing backend (one row per backend: concurrent writers never wait on one another).
-- newest: the latest finalized_at written to the slice (its expiry). Deletes from jobs_done add
-- negative counts.
CREATE TABLE awa_fast.done_counts (
    slot     smallint NOT NULL,
    bucket   timestamptz NOT NULL,
    queue    text NOT NULL,
    state    awa_fast.job_state NOT NULL,
    backend  integer NOT NULL,
    n        bigint NOT NULL,
    newest   timestamptz NOT NULL,
    PRIMARY KEY (slot, bucket, queue, state, backend)
);

CREATE VIEW awa_fast.jobs_all AS
    SELECT * FROM awa_fast.jobs
    UNION ALL
    SELECT * FROM awa_fast.jobs_done;
