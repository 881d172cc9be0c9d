-- 002: failure-consequence bookkeeping on jobs, the dead-letter queue, per-queue DLQ policy.

-- consequence_state: NULL (nothing owed), 'owed' (a failure consequence must still be applied),
-- 'applied' (applied, see consequence_applied_at / consequence_path), 'none' (declared no effect).
ALTER TABLE awa_fast.jobs
    ADD COLUMN consequence_state text,
    ADD COLUMN consequence_reason text,
    ADD COLUMN consequence_path text,
    ADD COLUMN consequence_error text,
    ADD COLUMN consequence_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN consequence_retry_at timestamptz,
    ADD COLUMN consequence_applied_at timestamptz,
    ADD COLUMN verified_at timestamptz,
    ADD CONSTRAINT jobs_consequence_state CHECK (
        consequence_state IS NULL OR consequence_state IN ('owed', 'applied', 'none'));

-- The reconciler's work list: pending failures and owed corrections.
CREATE INDEX idx_awa_fast_jobs_owed ON awa_fast.jobs (consequence_retry_at)
    WHERE consequence_state = 'owed';

ALTER TABLE awa_fast.queue_meta ADD COLUMN dlq boolean NOT NULL DEFAULT false;

-- Dead-lettered jobs: a snapshot of the row, never claimable.
CREATE TABLE awa_fast.dlq (
    LIKE awa_fast.jobs INCLUDING DEFAULTS,
    dlq_reason text NOT NULL,
    dlq_at timestamptz NOT NULL DEFAULT now(),
    original_run_lease bigint NOT NULL,
    PRIMARY KEY (id)
);
CREATE INDEX idx_awa_fast_dlq_at ON awa_fast.dlq (dlq_at);
