-- Included by migration 002 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
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
