-- 027: a transaction locks unique keys one by one only within its share of the shared lock
-- table.
--
-- 026 locked up to 64 keys one by one, each with its bucket in SHARE mode: up to 128 entries of
-- the shared lock table per transaction, which PostgreSQL sizes for max_locks_per_transaction
-- (64 by default) per connection. Enough concurrent transactions each inserting a few dozen
-- unique jobs filled it: "out of shared memory" (SQLSTATE 53200) for some of them, and for
-- every other statement of the server that needed a lock meanwhile. Now the one-by-one locks
-- of a transaction -- keys and their shared buckets, both counted -- stay within half of
-- max_locks_per_transaction (32 by default; the other half is left for the relations and
-- whatever else the transaction locks); a statement that would pass that takes its buckets
-- EXCLUSIVE as before, at most 256 entries, which concurrent holders of those buckets cannot
-- also hold. (Buckets held shared by an earlier statement are counted again: an over-count,
-- which only moves a statement to the bucket path sooner.)
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
