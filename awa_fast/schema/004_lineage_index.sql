-- 004: find the follow-ups a job staged (dashboard lineage) without scanning finished history.
--
-- A staged follow-up carries its trigger's id in metadata "awa:triggered_by" (worker/follow_ups.py).
-- Partial expression indexes: only rows with that key have an entry, and the expression is text
-- (no cast), so a user's own non-numeric value under the key can never fail an insert.
-- The DLQ gets the same index so a dead-lettered follow-up is still found.
-- On a large existing table this build holds a write lock on the table for its duration.

CREATE INDEX idx_awa_fast_jobs_triggered_by ON awa_fast.jobs ((metadata ->> 'awa:triggered_by'))
    WHERE metadata ? 'awa:triggered_by';
CREATE INDEX idx_awa_fast_dlq_triggered_by ON awa_fast.dlq ((metadata ->> 'awa:triggered_by'))
    WHERE metadata ? 'awa:triggered_by';
