-- 022: a finished row's counted and key fields cannot be edited in place.
--
-- done_counts (010) counts jobs_done by (slot, minute or hour of finalized_at, queue, state),
-- and unique_holds (010, 011) holds a finished row's key by (unique_key, job_id, slot); both are
-- written when a row enters jobs_done and when it leaves. An UPDATE of jobs_done fires neither
-- trigger (a row it moves to another slice is deleted and inserted without the statement
-- triggers either), so an admin edit of state, queue, finalized_at, id, unique_key or
-- unique_states left the counts queue_stats reads, or the holds that keep a duplicate out,
-- wrong for good. No statement of awa-fast's own edits those fields; its updates of finished
-- rows set verified_at, errors or consequence_state. Such an edit is refused with
-- object_not_in_prerequisite_state naming the column; a finished job changes through the
-- operations that move it (retry, DLQ, cancel of a live job) or by deleting its row.
CREATE FUNCTION awa_fast.refuse_finished_edit() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    col text;
BEGIN
    col := CASE
        WHEN NEW.id IS DISTINCT FROM OLD.id THEN 'id'
        WHEN NEW.state IS DISTINCT FROM OLD.state THEN 'state'
        WHEN NEW.queue IS DISTINCT FROM OLD.queue THEN 'queue'
        WHEN NEW.finalized_at IS DISTINCT FROM OLD.finalized_at THEN 'finalized_at'
        WHEN NEW.unique_key IS DISTINCT FROM OLD.unique_key THEN 'unique_key'
        ELSE 'unique_states' END;
    RAISE EXCEPTION 'awa_fast.jobs_done: column % of finished job % cannot be edited in place',
            col, OLD.id
        USING ERRCODE = 'object_not_in_prerequisite_state', SCHEMA = 'awa_fast',
              TABLE = 'jobs_done', COLUMN = col,
              HINT = 'done_counts and unique_holds are kept from these fields as rows enter and '
                     'leave the finished storage: retry the job, move it to the DLQ, or delete '
                     'the row instead.';
END
$$;

CREATE TRIGGER trg_awa_fast_jobs_done_edited
    BEFORE UPDATE OF id, state, queue, finalized_at, unique_key, unique_states
    ON awa_fast.jobs_done
    FOR EACH ROW
    WHEN (NEW.id IS DISTINCT FROM OLD.id OR NEW.state IS DISTINCT FROM OLD.state
          OR NEW.queue IS DISTINCT FROM OLD.queue
          OR NEW.finalized_at IS DISTINCT FROM OLD.finalized_at
          OR NEW.unique_key IS DISTINCT FROM OLD.unique_key
          OR NEW.unique_states IS DISTINCT FROM OLD.unique_states)
    EXECUTE FUNCTION awa_fast.refuse_finished_edit();
