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

-- Per unique key, one transaction at a time decides whether a live job or a finished job holds
-- it: the hot table's unique index cannot see unique_holds. The lock is one of 256 buckets (the
-- key's first byte: keys are BLAKE3 hashes), so a bulk insert of any size takes at most 256
-- locks; locks are taken in bucket order and held to commit, and the check after them runs in
-- a new statement, so it sees what the previous holder committed.
CREATE FUNCTION awa_fast.lock_unique_keys(keys bytea[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1635213685, l.bucket)
    FROM (SELECT DISTINCT CASE WHEN length(key) > 0 THEN get_byte(key, 0) ELSE 0 END AS bucket
          FROM unnest(keys) AS key ORDER BY 1) AS l;
END
$$;

-- Does a finished job hold this key? Locks the key first, then looks in a new statement: a
-- completion of its holder in flight has committed (or rolled back) by then. Used by follow-up
-- inserts, which skip a held key instead of failing (ON CONFLICT cannot see unique_holds).
CREATE FUNCTION awa_fast.finished_holds_key(key bytea) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM awa_fast.lock_unique_keys(ARRAY[key]);
    RETURN EXISTS (SELECT 1 FROM awa_fast.unique_holds h WHERE h.unique_key = key);
END
$$;

-- A finished job's row leaves jobs in the statement's transaction (unless its handler still
-- runs, heartbeat_at set, or its failure consequence is still owed).
CREATE FUNCTION awa_fast.move_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM awa_fast.jobs
    WHERE id = NEW.id AND state IN ('completed', 'failed', 'cancelled')
      AND heartbeat_at IS NULL AND consequence_state IS DISTINCT FROM 'owed';
    IF FOUND THEN
        NEW.finalized_at := COALESCE(NEW.finalized_at, now());
        INSERT INTO awa_fast.jobs_done SELECT NEW.*;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER trg_awa_fast_jobs_finished
    AFTER INSERT OR UPDATE OF state, consequence_state ON awa_fast.jobs
    FOR EACH ROW
    WHEN (NEW.state IN ('completed', 'failed', 'cancelled') AND NEW.heartbeat_at IS NULL
          AND NEW.consequence_state IS DISTINCT FROM 'owed')
    EXECUTE FUNCTION awa_fast.move_finished();

-- ... and back: a finished row that is made to owe its failure consequence again (an admin
-- statement, a correction) returns to jobs, so no slice ever holds a debt.
CREATE FUNCTION awa_fast.move_owing() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM awa_fast.jobs_done WHERE id = NEW.id AND consequence_state = 'owed';
    IF FOUND THEN
        INSERT INTO awa_fast.jobs SELECT NEW.*;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER trg_awa_fast_jobs_done_owing
    AFTER UPDATE OF consequence_state ON awa_fast.jobs_done
    FOR EACH ROW WHEN (NEW.consequence_state = 'owed')
    EXECUTE FUNCTION awa_fast.move_owing();

-- The error a held key raises, as the hot table's unique index would.
CREATE FUNCTION awa_fast.raise_key_held(holder bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'duplicate key value violates unique constraint "idx_awa_fast_jobs_unique"'
        USING ERRCODE = 'unique_violation', CONSTRAINT = 'idx_awa_fast_jobs_unique',
              SCHEMA = 'awa_fast', TABLE = 'jobs',
              DETAIL = format('The key is held by job %s.', holder);
END
$$;

-- Live rows inserted holding their key: no finished job may hold it.
CREATE FUNCTION awa_fast.check_inserted_keys() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    holder bigint;
BEGIN
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

CREATE TRIGGER trg_awa_fast_jobs_keys_inserted AFTER INSERT ON awa_fast.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.check_inserted_keys();

-- A live row whose transition makes it hold its key (its old state was not in its mask).
CREATE FUNCTION awa_fast.check_taken_key() RETURNS trigger
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

CREATE TRIGGER trg_awa_fast_jobs_key_taken AFTER UPDATE OF state ON awa_fast.jobs
    FOR EACH ROW
    WHEN (NEW.unique_key IS NOT NULL
          AND NEW.state NOT IN ('completed', 'failed', 'cancelled')
          AND (NEW.unique_states & (1 << awa_fast.state_bit(NEW.state))) <> 0
          AND (OLD.unique_states & (1 << awa_fast.state_bit(OLD.state))) = 0)
    EXECUTE FUNCTION awa_fast.check_taken_key();

-- Finished rows written: counted once per statement; a final state in the row's mask holds the
-- key in unique_holds, unless a live job (or another finished one) holds it -- then the
-- statement fails with unique_violation, as the single-table unique index made it fail.
CREATE FUNCTION awa_fast.done_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    holder bigint;
    wanted bigint;
    taken bigint;
BEGIN
    INSERT INTO awa_fast.done_counts AS c (slot, bucket, queue, state, backend, n, newest)
    SELECT awa_fast.done_slot(n.state, n.finalized_at),
           date_trunc(CASE WHEN n.state = 'completed' THEN 'minute' ELSE 'hour' END,
                      n.finalized_at),
           n.queue, n.state, pg_backend_pid(), count(*), max(n.finalized_at)
    FROM new_rows n GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
    ON CONFLICT (slot, bucket, queue, state, backend)
    DO UPDATE SET n = c.n + EXCLUDED.n, newest = GREATEST(c.newest, EXCLUDED.newest);

    SELECT count(*) INTO wanted FROM new_rows n WHERE n.unique_key IS NOT NULL
      AND (n.unique_states & (1 << awa_fast.state_bit(n.state))) <> 0;
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

CREATE TRIGGER trg_awa_fast_jobs_done_inserted AFTER INSERT ON awa_fast.jobs_done
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.done_inserted();

-- Finished rows leaving jobs_done (retried, dead-lettered, discarded): counted down, their
-- keys released.
CREATE FUNCTION awa_fast.done_deleted() RETURNS trigger
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

CREATE TRIGGER trg_awa_fast_jobs_done_deleted AFTER DELETE ON awa_fast.jobs_done
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.done_deleted();

-- TRUNCATE awa_fast.jobs still empties every job (tests, resets).
CREATE FUNCTION awa_fast.truncate_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE awa_fast.jobs_done, awa_fast.unique_holds, awa_fast.done_counts;
    RETURN NULL;
END
$$;

CREATE TRIGGER trg_awa_fast_jobs_truncated AFTER TRUNCATE ON awa_fast.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.truncate_finished();

-- A failed job, in either storage, to the DLQ when its queue has DLQ enabled.
CREATE OR REPLACE FUNCTION awa_fast.dead_letter_if_enabled(job_id bigint, reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE moved integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM awa_fast.jobs_all j JOIN awa_fast.queue_meta m
                   ON m.queue = j.queue AND m.dlq WHERE j.id = job_id AND j.state = 'failed') THEN
        RETURN false;
    END IF;
    WITH h AS (
        DELETE FROM awa_fast.jobs j WHERE j.id = job_id AND j.state = 'failed' RETURNING j.*
    ), f AS (
        DELETE FROM awa_fast.jobs_done j WHERE j.id = job_id AND j.state = 'failed' RETURNING j.*
    )
    INSERT INTO awa_fast.dlq
    SELECT d.*, reason, now(), d.run_lease
    FROM (SELECT * FROM h UNION ALL SELECT * FROM f) AS d;
    GET DIAGNOSTICS moved = ROW_COUNT;
    RETURN moved > 0;
END
$$;

-- The hot table stays small, so vacuum it whenever a few thousand dead rows piled up, without
-- throttling (the leader also vacuums it between autovacuum rounds: maintenance.vacuum_hot).
-- fillfactor leaves room on each page for heartbeat updates to stay HOT.
ALTER TABLE awa_fast.jobs SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0,
    fillfactor = 85);

-- Move the finished rows of an existing database (the triggers above count them and hold
-- their keys).
WITH d AS (
    DELETE FROM awa_fast.jobs
    WHERE state IN ('completed', 'failed', 'cancelled') AND heartbeat_at IS NULL
      AND consequence_state IS DISTINCT FROM 'owed'
    RETURNING *
)
INSERT INTO awa_fast.jobs_done
SELECT id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at,
       deadline_at, attempted_at, COALESCE(finalized_at, now()), created_at, errors, metadata,
       tags, unique_key, unique_states, ordering_key, callback_id, callback_timeout_at,
       run_lease, progress, consequence_state, consequence_reason, consequence_path,
       consequence_error, consequence_attempts, consequence_retry_at, consequence_applied_at,
       verified_at
FROM d;
