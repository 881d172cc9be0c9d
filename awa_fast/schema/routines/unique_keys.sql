-- Routines: unique keys held across the hot table and the finished storage.
--
-- A routines file (ADR 043): every function and trigger of this concern, as the current schema
-- has them, defined once and idempotently (CREATE OR REPLACE FUNCTION; DROP TRIGGER IF EXISTS,
-- then CREATE TRIGGER). awa_fast.schema.migrate() runs the routines files after the baseline of a
-- fresh install and after the newest migration of an upgrade, in the same transaction, and again
-- whenever their digest differs from the one recorded in awa_fast.schema_routines. Edit a
-- definition here, not in a migration; a migration keeps only what a routine cannot express
-- (tables, columns, indexes, data moves). The reasons of each definition are in the migrations
-- named in brackets.

-- [010, 024, 026, 027] Unique keys: locked per key (within the lock table's share) or per
-- bucket; held by live rows (the hot table's unique index) or finished ones (unique_holds).
CREATE OR REPLACE FUNCTION awa_fast.lock_unique_keys(keys bytea[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    locked int := COALESCE(NULLIF(current_setting('awa_fast.key_locks', true), ''), '0')::int;
    budget int := current_setting('max_locks_per_transaction')::int / 2;
    n int;
    buckets int;
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'awa_fast: a job that holds a unique key must be inserted or finished '
                        'in a READ COMMITTED transaction, not %',
                        upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'The key is checked against finished jobs after a lock, with a snapshot '
                         'taken after it; this transaction reads one snapshot throughout. Run it '
                         'at READ COMMITTED.';
    END IF;
    SELECT count(DISTINCT key),
           count(DISTINCT CASE WHEN length(key) > 0 THEN get_byte(key, 0) ELSE 0 END)
      INTO n, buckets
      FROM unnest(keys) AS key;
    IF n = 0 THEN
        RETURN;
    END IF;
    IF locked + n + buckets <= budget THEN
        PERFORM pg_advisory_xact_lock_shared(1635213685, l.bucket)
        FROM (SELECT DISTINCT CASE WHEN length(key) > 0 THEN get_byte(key, 0) ELSE 0 END AS bucket
              FROM unnest(keys) AS key ORDER BY 1) AS l;
        PERFORM pg_advisory_xact_lock(1635213687, l.id)
        FROM (SELECT DISTINCT ('x' || rpad(encode(substr(key, 1, 4), 'hex'), 8, '0'))::bit(32)::int
                  AS id
              FROM unnest(keys) AS key ORDER BY 1) AS l;
        PERFORM set_config('awa_fast.key_locks', (locked + n + buckets)::text, true);
    ELSE
        PERFORM pg_advisory_xact_lock(1635213685, l.bucket)
        FROM (SELECT DISTINCT CASE WHEN length(key) > 0 THEN get_byte(key, 0) ELSE 0 END AS bucket
              FROM unnest(keys) AS key ORDER BY 1) AS l;
    END IF;
END
$$;
-- [010]
CREATE OR REPLACE FUNCTION awa_fast.finished_holds_key(key bytea) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM awa_fast.lock_unique_keys(ARRAY[key]);
    RETURN EXISTS (SELECT 1 FROM awa_fast.unique_holds h WHERE h.unique_key = key);
END
$$;
-- [010]
CREATE OR REPLACE FUNCTION awa_fast.raise_key_held(holder bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'duplicate key value violates unique constraint "idx_awa_fast_jobs_unique"'
        USING ERRCODE = 'unique_violation', CONSTRAINT = 'idx_awa_fast_jobs_unique',
              SCHEMA = 'awa_fast', TABLE = 'jobs',
              DETAIL = format('The key is held by job %s.', holder);
END
$$;
-- [010, 013] Inserted rows: finished ones move to jobs_done, held keys are checked.
CREATE OR REPLACE FUNCTION awa_fast.check_inserted_keys() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    holder bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows n WHERE n.state IN ('completed', 'failed', 'cancelled')
               AND n.heartbeat_at IS NULL AND n.consequence_state IS DISTINCT FROM 'owed') THEN
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
    END IF;
    IF NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.unique_key IS NOT NULL
                   AND (n.unique_states & (1 << awa_fast.state_bit(n.state))) <> 0) THEN
        RETURN NULL;
    END IF;
    PERFORM awa_fast.lock_unique_keys(ARRAY(
        SELECT n.unique_key FROM new_rows n WHERE n.unique_key IS NOT NULL
          AND (n.unique_states & (1 << awa_fast.state_bit(n.state))) <> 0));
    SELECT h.job_id INTO holder
    FROM new_rows n JOIN awa_fast.unique_holds h ON h.unique_key = n.unique_key
    WHERE n.unique_key IS NOT NULL AND h.job_id <> n.id
      AND (n.unique_states & (1 << awa_fast.state_bit(n.state))) <> 0
    LIMIT 1;
    IF FOUND THEN
        PERFORM awa_fast.raise_key_held(holder);
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS trg_awa_fast_jobs_keys_inserted ON awa_fast.jobs;
CREATE TRIGGER trg_awa_fast_jobs_keys_inserted AFTER INSERT ON awa_fast.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.check_inserted_keys();
-- [010, 011, 021] A live row that starts holding its key: by a transition, or an edit of its
-- key or mask.
CREATE OR REPLACE FUNCTION awa_fast.check_taken_key() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    holder bigint;
BEGIN
    PERFORM awa_fast.lock_unique_keys(ARRAY[NEW.unique_key]);
    SELECT h.job_id INTO holder FROM awa_fast.unique_holds h
    WHERE h.unique_key = NEW.unique_key AND h.job_id <> NEW.id;
    IF FOUND THEN
        PERFORM awa_fast.raise_key_held(holder);
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS trg_awa_fast_jobs_key_taken ON awa_fast.jobs;
CREATE TRIGGER trg_awa_fast_jobs_key_taken AFTER UPDATE OF state ON awa_fast.jobs
    FOR EACH ROW
    WHEN (NEW.unique_key IS NOT NULL
          AND (NEW.state NOT IN ('completed', 'failed', 'cancelled')
               OR NEW.heartbeat_at IS NOT NULL
               OR NEW.consequence_state IS NOT DISTINCT FROM 'owed')
          AND (NEW.unique_states & (1 << awa_fast.state_bit(NEW.state))) <> 0
          AND (OLD.unique_states & (1 << awa_fast.state_bit(OLD.state))) = 0)
    EXECUTE FUNCTION awa_fast.check_taken_key();
DROP TRIGGER IF EXISTS trg_awa_fast_jobs_key_edited ON awa_fast.jobs;
CREATE TRIGGER trg_awa_fast_jobs_key_edited AFTER UPDATE OF unique_key, unique_states
    ON awa_fast.jobs
    FOR EACH ROW
    WHEN (NEW.unique_key IS NOT NULL
          AND (NEW.state NOT IN ('completed', 'failed', 'cancelled')
               OR NEW.heartbeat_at IS NOT NULL
               OR NEW.consequence_state IS NOT DISTINCT FROM 'owed')
          AND (NEW.unique_states & (1 << awa_fast.state_bit(NEW.state))) <> 0
          AND (NEW.unique_key IS DISTINCT FROM OLD.unique_key
               OR OLD.unique_states IS NULL
               OR (OLD.unique_states & (1 << awa_fast.state_bit(OLD.state))) = 0))
    EXECUTE FUNCTION awa_fast.check_taken_key();
