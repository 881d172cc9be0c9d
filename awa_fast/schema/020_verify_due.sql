-- 020: the completed jobs awaiting verify_success are listed, not searched for (issue 11).
--
-- The verify pass looked for completed, unverified jobs of the verifier kinds finalized within
-- the window (an hour) in awa_fast.jobs_all, every reconciler tick. No index selects them and
-- the slice key cannot prune by finalized_at, so it read every finished row of the window each
-- second (0.2-0.4 s at 1.5 M rows), holding a snapshot as long, which stops the hot table's
-- vacuum. Now a completion of a kind the maintenance leader verifies lists the job here, in
-- the statement that writes it to jobs_done; the pass reads this list and deletes what it
-- verified. A completion of any other kind pays one look at an empty or tiny table per
-- statement.

-- The kinds the maintenance leader has a verify_success hook for, kept equal to its registry
-- by the verify pass (a new leader rewrites it). A kind is 'adding' from when the leader
-- adds it (or needs a longer window, window_s) until every transaction older than the
-- addition has ended: a completion that looked at this table just before the kind was added
-- may commit later, so the window's completed jobs are listed from the slices once more then,
-- and the kind is 'active'. A dropped kind is 'dropping' until the same point, when its
-- listings are deleted again (a late completion may have listed one) and the row goes.
-- wait_xmax: pg_snapshot_xmax of a snapshot taken after the change committed; the kind
-- settles once the oldest running transaction is newer.
CREATE TABLE awa_fast.verifier_kinds (
    kind text PRIMARY KEY,
    state text NOT NULL DEFAULT 'adding' CHECK (state IN ('adding', 'active', 'dropping')),
    window_s float8 NOT NULL,
    wait_xmax xid8
);

-- tries / next_try_at: a hook that raised is tried again later, backed off, so jobs whose
-- hook keeps raising never hold the tick's batch.
CREATE TABLE awa_fast.verify_due (
    job_id bigint PRIMARY KEY,
    kind text NOT NULL,
    finalized_at timestamptz NOT NULL,
    tries integer NOT NULL DEFAULT 0,
    next_try_at timestamptz NOT NULL DEFAULT '-infinity'
);
CREATE INDEX idx_awa_fast_verify_due_finalized ON awa_fast.verify_due (finalized_at);
CREATE INDEX idx_awa_fast_verify_due_kind ON awa_fast.verify_due (kind);
-- Written by completions: no vacuum may cut its empty pages under a lock (see 016, 018).
ALTER TABLE awa_fast.verify_due SET (vacuum_truncate = false);

-- The listing runs in jobs_done's insert trigger (010's done_inserted, which already reads the
-- statement's rows): a trigger of its own cost every completing statement a second plpgsql
-- call, 15-30 us, about 5 % of a per-job completion.
CREATE OR REPLACE FUNCTION awa_fast.done_inserted() RETURNS trigger
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

    -- 020: completions of the kinds the maintenance leader verifies are listed for it.
    IF EXISTS (SELECT 1 FROM awa_fast.verifier_kinds WHERE state <> 'dropping') THEN
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

-- TRUNCATE awa_fast.jobs empties every job: their verification list too.
CREATE OR REPLACE FUNCTION awa_fast.truncate_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE awa_fast.jobs_done, awa_fast.unique_holds, awa_fast.done_counts, awa_fast.verify_due;
    RETURN NULL;
END
$$;
