-- 019: a statement that finishes many rows moves them in one statement (issue 11: bulk cost).
--
-- 010's row trigger moved each finished row with its own DELETE and INSERT, and every such
-- INSERT fired jobs_done's statement trigger, which upserts the same done_counts row again in
-- the same transaction. Each upsert walks every earlier version of that row, so one UPDATE that
-- finished N rows (drain_queue of a backlog, an admin UPDATE, a batch cancel) cost more than N
-- times one row: 8,000 rows 1.2 s, 16,000 rows 3.1 s, 32,000 rows 9.2 s.
--
-- The move is now one statement trigger over the UPDATE's new rows (a transition table, which
-- PostgreSQL allows only without a column list, so it fires on every UPDATE; it returns at once
-- when none of the statement's rows is finished and movable). The moved rows reach jobs_done in
-- one INSERT: one done_counts upsert, one unique-key check, per statement.
DROP TRIGGER trg_awa_fast_jobs_finished ON awa_fast.jobs;
DROP FUNCTION awa_fast.move_finished();

CREATE FUNCTION awa_fast.move_updated_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.state IN ('completed', 'failed', 'cancelled')
                   AND n.heartbeat_at IS NULL
                   AND n.consequence_state IS DISTINCT FROM 'owed') THEN
        RETURN NULL;
    END IF;
    -- The row's state now (a later trigger may have changed it), not the transition table's.
    WITH d AS (
        DELETE FROM awa_fast.jobs j USING new_rows n
        WHERE j.id = n.id AND j.state IN ('completed', 'failed', 'cancelled')
          AND j.heartbeat_at IS NULL AND j.consequence_state IS DISTINCT FROM 'owed'
        RETURNING j.*
    )
    INSERT INTO awa_fast.jobs_done
    SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_at,
           heartbeat_at, deadline_at, attempted_at, COALESCE(finalized_at, now()),
           created_at, errors, metadata, tags, unique_key, unique_states, ordering_key,
           callback_id, callback_timeout_at, run_lease, progress, consequence_state,
           consequence_reason, consequence_path, consequence_error, consequence_attempts,
           consequence_retry_at, consequence_applied_at, verified_at
    FROM d ORDER BY d.unique_key, d.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER trg_awa_fast_jobs_finished
    AFTER UPDATE ON awa_fast.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.move_updated_finished();
