-- 005: the maintenance leader's fencing epoch, and the live workers' handled kinds.

-- One row. A process that takes the leader advisory lock bumps epoch; every write transaction
-- of a leader pass first locks this row FOR SHARE at its own epoch (docs/architecture.md,
-- "the leader's fencing rule"), so a deposed leader's passes find no row and write nothing.
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
