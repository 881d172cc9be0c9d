-- 003: periodic (cron) job schedules.
--
-- One row per schedule name. Processes that register a schedule with client.periodic(...) upsert
-- it on start(); the maintenance leader evaluates every row about once a second. last_fire_at is
-- the scheduled fire time most recently enqueued (not the wall-clock time of the enqueue). The
-- evaluator locks the row (SELECT ... FOR UPDATE), inserts the due job(s) and advances
-- last_fire_at in one transaction, so each fire time is enqueued exactly once.

\ir objects/003_cron_jobs.sql
