-- Included by migration 005 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
CREATE TABLE awa_fast.leader (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch bigint NOT NULL DEFAULT 0,
    holder text,
    since timestamptz
);
INSERT INTO awa_fast.leader (epoch) VALUES (0);

-- One row per running worker process: the queues it claims from and the kinds it has handlers
-- for, refreshed every heartbeat interval; a row past expires_at is a dead process (pruned by the
-- leader after an hour). `queue stats` counts available jobs no live worker handles.
CREATE TABLE awa_fast.workers (
    instance text PRIMARY KEY,
    queues text[] NOT NULL,
    kinds text[] NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
