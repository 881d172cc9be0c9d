-- Included by migration 006 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
CREATE TABLE awa_fast.callback_expressions (
    job_id      bigint PRIMARY KEY,
    callback_id uuid NOT NULL,
    expressions jsonb NOT NULL
);
