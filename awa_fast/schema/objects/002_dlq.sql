-- Included by migration 002 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
CREATE TABLE awa_fast.dlq (
    LIKE awa_fast.jobs INCLUDING DEFAULTS,
    dlq_reason text NOT NULL,
    dlq_at timestamptz NOT NULL DEFAULT now(),
    original_run_lease bigint NOT NULL,
    PRIMARY KEY (id)
);
CREATE INDEX idx_awa_fast_dlq_at ON awa_fast.dlq (dlq_at);
