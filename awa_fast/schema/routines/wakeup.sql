-- Routines: the wake-up notification of available jobs.
--
-- A routines file (ADR 043): every function and trigger of this concern, as the current schema
-- has them, defined once and idempotently (CREATE OR REPLACE FUNCTION; DROP TRIGGER IF EXISTS,
-- then CREATE TRIGGER). awa_fast.schema.migrate() runs the routines files after the baseline of a
-- fresh install and after the newest migration of an upgrade, in the same transaction, and again
-- whenever their digest differs from the one recorded in awa_fast.schema_routines. Edit a
-- definition here, not in a migration; a migration keeps only what a routine cannot express
-- (tables, columns, indexes, data moves). The reasons of each definition are in the migrations
-- named in brackets.

-- [001, 009] One wake-up per statement and queue, deferred by the finalizer's completion.
CREATE OR REPLACE FUNCTION awa_fast.notify_available() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('awa_fast.defer_notify', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('awa_fast', q.queue)
    FROM (SELECT DISTINCT queue FROM new_rows WHERE state = 'available') AS q;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS trg_awa_fast_notify ON awa_fast.jobs;
CREATE TRIGGER trg_awa_fast_notify AFTER INSERT ON awa_fast.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.notify_available();
