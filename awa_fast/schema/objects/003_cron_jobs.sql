-- Included by migration 003 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
CREATE TABLE awa_fast.cron_jobs (
    name                text PRIMARY KEY,
    cron_expr           text NOT NULL,
    timezone            text NOT NULL DEFAULT 'UTC',
    kind                text NOT NULL,
    queue               text NOT NULL DEFAULT 'default',
    args                jsonb NOT NULL DEFAULT '{}',
    priority            smallint NOT NULL DEFAULT 2,
    max_attempts        smallint NOT NULL DEFAULT 25,
    tags                text[] NOT NULL DEFAULT '{}',
    metadata            jsonb NOT NULL DEFAULT '{}',
    missed_fire_policy  text NOT NULL DEFAULT 'coalesce'
        CONSTRAINT cron_jobs_missed_fire_policy_check
        CHECK (missed_fire_policy IN ('coalesce', 'catch_up')),
    last_fire_at        timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);
