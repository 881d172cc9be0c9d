-- 024: the cross-storage unique-key check refuses snapshot isolation; a slice's TRUNCATE waits
-- for the leader's fold of its counts.
--
-- A unique key is held by live rows (the hot table's unique index) and by finished rows
-- (unique_holds); every statement that makes a row hold a key takes the key's bucket lock, then
-- looks at the other storage (010, 011, 013). That look needs a snapshot taken after the lock:
-- READ COMMITTED gives each statement inside the trigger functions a new one. Under REPEATABLE
-- READ or SERIALIZABLE the whole transaction reads one snapshot taken before the lock, so a
-- holder that committed while it waited went unseen and the key was held twice (found by a
-- breaker helper: an enqueue in a REPEATABLE READ transaction next to a cancel; awa-fast's own
-- calls under a database whose default_transaction_isolation is repeatable read). The lock now
-- refuses such a transaction with feature_not_supported (READ UNCOMMITTED, which PostgreSQL runs
-- as READ COMMITTED, passes); awa-fast's own connections set default_transaction_isolation to
-- read committed for their session (sql.SESSION_READ_COMMITTED).
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

-- A slice's TRUNCATE trigger (023) released its slot's counters and holds:
-- * with a snapshot that, under REPEATABLE READ or SERIALIZABLE, predates a completion into the
--   slice that committed while the TRUNCATE waited for its lock, so that completion's count and
--   hold stayed behind. It now refuses such a transaction as lock_unique_keys does, except inside
--   TRUNCATE awa_fast.jobs, which empties the counters and holds in the same statement
--   (truncate_finished marks that for its own transaction);
-- * next to the leader's fold (sql.FOLD_COUNTS), which deletes a slot's old counter rows and
--   inserts their sum in one transaction, holding the slot's counts lock (1635213686, slot) from
--   before its delete: the TRUNCATE took the counters with a snapshot from before that sum
--   committed and left it. It now waits for the lock first.
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
