-- 009: a completion that staged follow-ups sends its wake-up NOTIFY after its commit (issue 11).
-- A transaction that NOTIFYs takes a database-wide lock from before its commit until after its
-- WAL flush, so one-job transactions whose inserts NOTIFY commit one at a time. The finalizer's
-- one-statement completion (sql.COMPLETE_WITH_FOLLOW_UPS) sets awa_fast.defer_notify = 'on'
-- for its own transaction; the insert trigger then stays silent and the finalizer notifies the
-- queues of the available follow-ups it inserted, coalesced across jobs, once they committed.
-- Every other insert notifies in its own transaction as before.
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
