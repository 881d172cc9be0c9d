-- 029: finished rows are counted with one statement per insert (issue 32: work per job).
--
-- done_inserted (010, 020) ran three statements for every statement that wrote finished rows,
-- before any key was checked: the done_counts upsert, a look at verifier_kinds and a count of
-- the rows holding a key. Each is a plpgsql statement of its own (planning cache lookup,
-- executor start, a snapshot), paid per completion batch and, on the per-job paths, per job.
-- The upsert is now a data-modifying WITH of the statement that reads the other two, so a batch
-- of keyless rows of unverified kinds (the common completion) runs one statement in the
-- trigger. What is counted, listed and checked, and in which order, is unchanged.
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
