-- Routines: finished rows move to jobs_done, are counted, and keep their fields.
--
-- A routines file (ADR 043): every function and trigger of this concern, as the current schema
-- has them, defined once and idempotently (CREATE OR REPLACE FUNCTION; DROP TRIGGER IF EXISTS,
-- then CREATE TRIGGER). awa_fast.schema.migrate() runs the routines files after the baseline of a
-- fresh install and after the newest migration of an upgrade, in the same transaction, and again
-- whenever their digest differs from the one recorded in awa_fast.schema_routines. Edit a
-- definition here, not in a migration; a migration keeps only what a routine cannot express
-- (tables, columns, indexes, data moves). The reasons of each definition are in the migrations
-- named in brackets.

-- [019] An UPDATE's finished rows move to jobs_done in one statement.
CREATE OR REPLACE FUNCTION awa_fast.move_updated_finished() RETURNS trigger
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
DROP TRIGGER IF EXISTS trg_awa_fast_jobs_finished ON awa_fast.jobs;
CREATE TRIGGER trg_awa_fast_jobs_finished
    AFTER UPDATE ON awa_fast.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.move_updated_finished();
-- [019] The row trigger's function it replaced (010-018), gone once nothing uses it.
DROP FUNCTION IF EXISTS awa_fast.move_finished();
-- [010] ... and back, a finished row made to owe its failure consequence again.
CREATE OR REPLACE FUNCTION awa_fast.move_owing() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM awa_fast.jobs_done WHERE id = NEW.id AND consequence_state = 'owed';
    IF FOUND THEN
        INSERT INTO awa_fast.jobs SELECT NEW.*;
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS trg_awa_fast_jobs_done_owing ON awa_fast.jobs_done;
CREATE TRIGGER trg_awa_fast_jobs_done_owing
    AFTER UPDATE OF consequence_state ON awa_fast.jobs_done
    FOR EACH ROW WHEN (NEW.consequence_state = 'owed')
    EXECUTE FUNCTION awa_fast.move_owing();
-- [010, 020, 029] Finished rows written: counted, listed for verification, their keys held.
CREATE OR REPLACE FUNCTION awa_fast.done_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    holder bigint;
    wanted bigint;
    taken bigint;
    verifying boolean;
BEGIN
    -- 029: one statement counts the rows, finds whether any kind is verified and how many rows
    -- hold their key; a statement of keyless rows of unverified kinds runs nothing else.
    WITH counted AS (
        INSERT INTO awa_fast.done_counts AS c (slot, bucket, queue, state, backend, n, newest)
        SELECT awa_fast.done_slot(n.state, n.finalized_at),
               date_trunc(CASE WHEN n.state = 'completed' THEN 'minute' ELSE 'hour' END,
                          n.finalized_at),
               n.queue, n.state, pg_backend_pid(), count(*), max(n.finalized_at)
        FROM new_rows n GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (slot, bucket, queue, state, backend)
        DO UPDATE SET n = c.n + EXCLUDED.n, newest = GREATEST(c.newest, EXCLUDED.newest)
    )
    SELECT EXISTS (SELECT 1 FROM awa_fast.verifier_kinds WHERE state <> 'dropping'),
           (SELECT count(*) FROM new_rows n WHERE n.unique_key IS NOT NULL
              AND (n.unique_states & (1 << awa_fast.state_bit(n.state))) <> 0)
    INTO verifying, wanted;

    -- 020: completions of the kinds the maintenance leader verifies are listed for it.
    IF verifying THEN
        INSERT INTO awa_fast.verify_due AS d (job_id, kind, finalized_at)
        SELECT n.id, n.kind, n.finalized_at
        FROM new_rows n JOIN awa_fast.verifier_kinds v
            ON v.kind = n.kind AND v.state <> 'dropping'
        WHERE n.state = 'completed' AND n.verified_at IS NULL
        ORDER BY n.id
        ON CONFLICT (job_id) DO UPDATE
            SET kind = EXCLUDED.kind, finalized_at = EXCLUDED.finalized_at, tries = 0,
                next_try_at = '-infinity';
    END IF;

    IF wanted = 0 THEN
        RETURN NULL;
    END IF;
    PERFORM awa_fast.lock_unique_keys(ARRAY(
        SELECT n.unique_key FROM new_rows n WHERE n.unique_key IS NOT NULL
          AND (n.unique_states & (1 << awa_fast.state_bit(n.state))) <> 0));
    SELECT j.id INTO holder
    FROM new_rows n JOIN awa_fast.jobs j ON j.unique_key = n.unique_key AND j.id <> n.id
    WHERE n.unique_key IS NOT NULL
      AND (n.unique_states & (1 << awa_fast.state_bit(n.state))) <> 0
      AND j.unique_key IS NOT NULL
      AND (j.unique_states & (1 << awa_fast.state_bit(j.state))) <> 0
    LIMIT 1;
    IF FOUND THEN
        PERFORM awa_fast.raise_key_held(holder);
    END IF;
    INSERT INTO awa_fast.unique_holds (unique_key, job_id, slot)
    SELECT n.unique_key, n.id, awa_fast.done_slot(n.state, n.finalized_at) FROM new_rows n
    WHERE n.unique_key IS NOT NULL
      AND (n.unique_states & (1 << awa_fast.state_bit(n.state))) <> 0
    ORDER BY n.unique_key
    ON CONFLICT (unique_key) DO UPDATE SET slot = EXCLUDED.slot
        WHERE unique_holds.job_id = EXCLUDED.job_id;
    GET DIAGNOSTICS taken = ROW_COUNT;
    IF taken < wanted THEN
        SELECT h.job_id INTO holder FROM new_rows n JOIN awa_fast.unique_holds h
            ON h.unique_key = n.unique_key AND h.job_id <> n.id LIMIT 1;
        PERFORM awa_fast.raise_key_held(holder);
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS trg_awa_fast_jobs_done_inserted ON awa_fast.jobs_done;
CREATE TRIGGER trg_awa_fast_jobs_done_inserted AFTER INSERT ON awa_fast.jobs_done
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.done_inserted();
-- [010] Finished rows leaving: counted down, their keys released.
CREATE OR REPLACE FUNCTION awa_fast.done_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO awa_fast.done_counts AS c (slot, bucket, queue, state, backend, n, newest)
    SELECT awa_fast.done_slot(o.state, o.finalized_at),
           date_trunc(CASE WHEN o.state = 'completed' THEN 'minute' ELSE 'hour' END,
                      o.finalized_at),
           o.queue, o.state, pg_backend_pid(), -count(*), max(o.finalized_at)
    FROM old_rows o GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
    ON CONFLICT (slot, bucket, queue, state, backend)
    DO UPDATE SET n = c.n + EXCLUDED.n, newest = GREATEST(c.newest, EXCLUDED.newest);
    DELETE FROM awa_fast.unique_holds h USING old_rows o
    WHERE h.unique_key = o.unique_key AND h.job_id = o.id;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS trg_awa_fast_jobs_done_deleted ON awa_fast.jobs_done;
CREATE TRIGGER trg_awa_fast_jobs_done_deleted AFTER DELETE ON awa_fast.jobs_done
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.done_deleted();
-- [010, 020, 024] TRUNCATE awa_fast.jobs empties every job.
CREATE OR REPLACE FUNCTION awa_fast.truncate_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('awa_fast.truncating_all', 'on', true);
    TRUNCATE awa_fast.jobs_done, awa_fast.unique_holds, awa_fast.done_counts, awa_fast.verify_due;
    PERFORM set_config('awa_fast.truncating_all', 'off', true);
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS trg_awa_fast_jobs_truncated ON awa_fast.jobs;
CREATE TRIGGER trg_awa_fast_jobs_truncated AFTER TRUNCATE ON awa_fast.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.truncate_finished();
-- [022] A finished row's counted and key fields cannot be edited in place.
CREATE OR REPLACE FUNCTION awa_fast.refuse_finished_edit() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    col text;
BEGIN
    col := CASE
        WHEN NEW.id IS DISTINCT FROM OLD.id THEN 'id'
        WHEN NEW.state IS DISTINCT FROM OLD.state THEN 'state'
        WHEN NEW.queue IS DISTINCT FROM OLD.queue THEN 'queue'
        WHEN NEW.finalized_at IS DISTINCT FROM OLD.finalized_at THEN 'finalized_at'
        WHEN NEW.unique_key IS DISTINCT FROM OLD.unique_key THEN 'unique_key'
        ELSE 'unique_states' END;
    RAISE EXCEPTION 'awa_fast.jobs_done: column % of finished job % cannot be edited in place',
            col, OLD.id
        USING ERRCODE = 'object_not_in_prerequisite_state', SCHEMA = 'awa_fast',
              TABLE = 'jobs_done', COLUMN = col,
              HINT = 'done_counts and unique_holds are kept from these fields as rows enter and '
                     'leave the finished storage: retry the job, move it to the DLQ, or delete '
                     'the row instead.';
END
$$;
DROP TRIGGER IF EXISTS trg_awa_fast_jobs_done_edited ON awa_fast.jobs_done;
CREATE TRIGGER trg_awa_fast_jobs_done_edited
    BEFORE UPDATE OF id, state, queue, finalized_at, unique_key, unique_states
    ON awa_fast.jobs_done
    FOR EACH ROW
    WHEN (NEW.id IS DISTINCT FROM OLD.id OR NEW.state IS DISTINCT FROM OLD.state
          OR NEW.queue IS DISTINCT FROM OLD.queue
          OR NEW.finalized_at IS DISTINCT FROM OLD.finalized_at
          OR NEW.unique_key IS DISTINCT FROM OLD.unique_key
          OR NEW.unique_states IS DISTINCT FROM OLD.unique_states)
    EXECUTE FUNCTION awa_fast.refuse_finished_edit();
-- [023, 024] Statements naming one slice keep done_counts and unique_holds right.
CREATE OR REPLACE FUNCTION awa_fast.slice_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('awa_fast.truncating_all', true) = 'on' THEN
        RETURN NULL;  -- TRUNCATE awa_fast.jobs: the counters and holds are emptied with it
    END IF;
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'awa_fast: a slice of jobs_done must be truncated in a READ COMMITTED '
                        'transaction, not %', upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Its counters and unique keys are released with a snapshot taken after '
                         'the TRUNCATE''s lock; this transaction reads one snapshot throughout.';
    END IF;
    -- TG_ARGV[0]: the slice's slot (awa_fast.done_slot); the retention prune does the same
    -- after its own TRUNCATE (sql.RELEASE_SLICE), so a second release finds nothing.
    PERFORM pg_advisory_xact_lock(1635213686, TG_ARGV[0]::int);
    DELETE FROM awa_fast.unique_holds WHERE slot = TG_ARGV[0]::smallint;
    DELETE FROM awa_fast.done_counts WHERE slot = TG_ARGV[0]::smallint;
    RETURN NULL;
END
$$;
DO $$
DECLARE
    slice text;
BEGIN
    FOR i IN 0..63 LOOP
        slice := CASE WHEN i < 32 THEN format('jobs_done_c%s', lpad(i::text, 2, '0'))
                      ELSE format('jobs_done_f%s', lpad((i - 32)::text, 2, '0')) END;
        EXECUTE format('DROP TRIGGER IF EXISTS trg_awa_fast_slice_inserted ON awa_fast.%I', slice);
        EXECUTE format('DROP TRIGGER IF EXISTS trg_awa_fast_slice_deleted ON awa_fast.%I', slice);
        EXECUTE format('DROP TRIGGER IF EXISTS trg_awa_fast_slice_truncated ON awa_fast.%I', slice);
        EXECUTE format(
            'CREATE TRIGGER trg_awa_fast_slice_inserted AFTER INSERT ON awa_fast.%I '
            'REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT '
            'EXECUTE FUNCTION awa_fast.done_inserted()', slice);
        EXECUTE format(
            'CREATE TRIGGER trg_awa_fast_slice_deleted AFTER DELETE ON awa_fast.%I '
            'REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT '
            'EXECUTE FUNCTION awa_fast.done_deleted()', slice);
        EXECUTE format(
            'CREATE TRIGGER trg_awa_fast_slice_truncated AFTER TRUNCATE ON awa_fast.%I '
            'FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.slice_truncated(%s)', slice, i);
    END LOOP;
END
$$;
