-- Routines: a failed job to the dead-letter queue.
--
-- A routines file (ADR 043): every function and trigger of this concern, as the current schema
-- has them, defined once and idempotently (CREATE OR REPLACE FUNCTION; DROP TRIGGER IF EXISTS,
-- then CREATE TRIGGER). awa_fast.schema.migrate() runs the routines files after the baseline of a
-- fresh install and after the newest migration of an upgrade, in the same transaction, and again
-- whenever their digest differs from the one recorded in awa_fast.schema_routines. Edit a
-- definition here, not in a migration; a migration keeps only what a routine cannot express
-- (tables, columns, indexes, data moves). The reasons of each definition are in the migrations
-- named in brackets.

-- [002, 010] A failed job, in either storage, to the DLQ when its queue has DLQ enabled.
CREATE OR REPLACE FUNCTION awa_fast.dead_letter_if_enabled(job_id bigint, reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE moved integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM awa_fast.jobs_all j JOIN awa_fast.queue_meta m
                   ON m.queue = j.queue AND m.dlq WHERE j.id = job_id AND j.state = 'failed') THEN
        RETURN false;
    END IF;
    WITH h AS (
        DELETE FROM awa_fast.jobs j WHERE j.id = job_id AND j.state = 'failed' RETURNING j.*
    ), f AS (
        DELETE FROM awa_fast.jobs_done j WHERE j.id = job_id AND j.state = 'failed' RETURNING j.*
    )
    INSERT INTO awa_fast.dlq
    SELECT d.*, reason, now(), d.run_lease
    FROM (SELECT * FROM h UNION ALL SELECT * FROM f) AS d;
    GET DIAGNOSTICS moved = ROW_COUNT;
    RETURN moved > 0;
END
$$;
