-- Included by migration 020 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
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
