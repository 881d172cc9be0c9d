-- 025: the snapshot checks of 024, refined (a second breaker helper's findings).
--
-- READ UNCOMMITTED runs as READ COMMITTED in PostgreSQL, so lock_unique_keys accepts it too.
-- A slice's TRUNCATE trigger (023, 024) releases its slot's counters and holds with a DELETE
-- whose snapshot, under REPEATABLE READ or SERIALIZABLE, predates a completion into the slice
-- that committed while the TRUNCATE waited for its lock: that completion's count and hold
-- stayed behind. It now refuses such a transaction as lock_unique_keys does, except inside
-- TRUNCATE awa_fast.jobs, which empties the counters and holds in the same statement
-- (truncate_finished marks that for its own transaction).
CREATE OR REPLACE FUNCTION awa_fast.lock_unique_keys(keys bytea[]) RETURNS void
LANGUAGE plpgsql AS $$
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
    PERFORM pg_advisory_xact_lock(1635213685, l.bucket)
    FROM (SELECT DISTINCT CASE WHEN length(key) > 0 THEN get_byte(key, 0) ELSE 0 END AS bucket
          FROM unnest(keys) AS key ORDER BY 1) AS l;
END
$$;

CREATE OR REPLACE FUNCTION awa_fast.truncate_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('awa_fast.truncating_all', 'on', true);
    TRUNCATE awa_fast.jobs_done, awa_fast.unique_holds, awa_fast.done_counts, awa_fast.verify_due;
    PERFORM set_config('awa_fast.truncating_all', 'off', true);
    RETURN NULL;
END
$$;

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
