-- 003: periodic (cron) job schedules.
--
-- One row per schedule name. Processes that register a schedule with client.periodic(...) upsert
-- it on start(); the maintenance leader evaluates every row about once a second. last_fire_at is
-- the scheduled fire time most recently enqueued (not the wall-clock time of the enqueue). The
-- evaluator locks the row (SELECT ... FOR UPDATE), inserts the due job(s) and advances
-- last_fire_at in one transaction, so each fire time is enqueued exactly once.

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
