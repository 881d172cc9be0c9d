-- Included by migration 008 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
CREATE TABLE awa_fast.batch_operations (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    op_kind         text NOT NULL CHECK (op_kind IN ('set_priority', 'move_queue')),
    filter          jsonb NOT NULL,
    spec            jsonb NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN (
                        'pending', 'scanning', 'running', 'cancelling', 'completed',
                        'cancelled', 'failed')),
    submitted_by    text,
    submitted_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at      timestamptz,
    finalized_at    timestamptz,
    cursor          jsonb,
    total_matched   bigint,
    processed       bigint NOT NULL DEFAULT 0,
    skipped         bigint NOT NULL DEFAULT 0,
    errored         bigint NOT NULL DEFAULT 0,
    last_error      text,
    runner_instance text,
    retention_until timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX idx_awa_fast_batch_operations_active ON awa_fast.batch_operations (submitted_at)
    WHERE finalized_at IS NULL;

CREATE TABLE awa_fast.batch_operation_items (
    operation_id uuid NOT NULL REFERENCES awa_fast.batch_operations (id) ON DELETE CASCADE,
    job_id       bigint NOT NULL,
    state        text NOT NULL DEFAULT 'pending',
    error        text,
    processed_at timestamptz,
    PRIMARY KEY (operation_id, job_id)
);
