-- 002: failure-consequence bookkeeping on jobs, the dead-letter queue, per-queue DLQ policy.

-- consequence_state: NULL (nothing owed), 'owed' (a failure consequence must still be applied),
-- 'applied' (applied, see consequence_applied_at / consequence_path), 'none' (declared no effect).
\ir objects/002_consequences.sql

ALTER TABLE awa_fast.queue_meta ADD COLUMN dlq boolean NOT NULL DEFAULT false;

-- Dead-lettered jobs: a snapshot of the row, never claimable.
\ir objects/002_dlq.sql
