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
