-- 026: a statement that makes a few keys held locks each key alone; only a bulk one locks
-- whole buckets.
--
-- 010 locked one of 256 buckets (the key's first byte) per key, held to commit: two different
-- keys sharing a first byte waited for each other's transaction, and two transactions that each
-- inserted two unique jobs could deadlock over four distinct keys (found by a breaker helper;
-- awa-pg's unique index never makes distinct keys wait). Now, while a transaction has locked at
-- most 64 keys this way, each key is locked alone (class 1635213687, its first four bytes), under
-- its bucket's lock in SHARE mode; a statement that would pass 64 (a bulk insert, a large
-- completion batch) locks its buckets EXCLUSIVE as before, which waits for the shared holders
-- of those buckets and they for it. Same key: the key lock, or shared against exclusive bucket,
-- serializes them as before. Buckets are taken in order before any key, so one statement's
-- locks never cycle with another's; a transaction's key locks stay bounded by 64 plus what its
-- last statement added. (Keys are BLAKE3 hashes: four bytes tell them apart but for 1 in 2^32.)
CREATE OR REPLACE FUNCTION awa_fast.lock_unique_keys(keys bytea[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    locked int := COALESCE(NULLIF(current_setting('awa_fast.key_locks', true), ''), '0')::int;
    n int;
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
    SELECT count(DISTINCT key) INTO n FROM unnest(keys) AS key;
    IF n = 0 THEN
        RETURN;
    END IF;
    IF locked + n <= 64 THEN
        PERFORM pg_advisory_xact_lock_shared(1635213685, l.bucket)
        FROM (SELECT DISTINCT CASE WHEN length(key) > 0 THEN get_byte(key, 0) ELSE 0 END AS bucket
              FROM unnest(keys) AS key ORDER BY 1) AS l;
        PERFORM pg_advisory_xact_lock(1635213687, l.id)
        FROM (SELECT DISTINCT ('x' || rpad(encode(substr(key, 1, 4), 'hex'), 8, '0'))::bit(32)::int
                  AS id
              FROM unnest(keys) AS key ORDER BY 1) AS l;
        PERFORM set_config('awa_fast.key_locks', (locked + n)::text, true);
    ELSE
        PERFORM pg_advisory_xact_lock(1635213685, l.bucket)
        FROM (SELECT DISTINCT CASE WHEN length(key) > 0 THEN get_byte(key, 0) ELSE 0 END AS bucket
              FROM unnest(keys) AS key ORDER BY 1) AS l;
    END IF;
END
$$;
