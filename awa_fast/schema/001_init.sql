-- 001: the job table, queue metadata, unique-key index and wakeup notifications.

-- (migrate() also creates the schema first; here so that migrations() SQL run by hand works.)
CREATE SCHEMA IF NOT EXISTS awa_fast;

\ir objects/001_job_state.sql

\ir objects/001_jobs.sql

CREATE TABLE awa_fast.queue_meta (
    queue       text PRIMARY KEY,
    paused      boolean NOT NULL DEFAULT false,
    paused_at   timestamptz,
    paused_by   text
);
