-- 011: a finished row the hot table keeps takes its key under the key's lock (ADR 016).
--
-- A finished row stays in awa_fast.jobs while its handler still runs (heartbeat_at, e.g. an
-- admin cancel of a running job) or its failure consequence is owed. In a state of its mask it
-- holds its key through the hot table's unique index, which cannot see unique_holds: 010's
-- check on a transition skipped final states, so such a row could hold a key a finished job
-- already held (two holders), and moving it later failed every time (the stale-mark settle of
-- every prune pass with it). Now the transition checks unique_holds as for live states; a row
-- that moves at once is checked when it is written to jobs_done (awa_fast.done_inserted).
DROP TRIGGER trg_awa_fast_jobs_key_taken ON awa_fast.jobs;

CREATE TRIGGER trg_awa_fast_jobs_key_taken AFTER UPDATE OF state ON awa_fast.jobs
    FOR EACH ROW
    WHEN (NEW.unique_key IS NOT NULL
          AND (NEW.state NOT IN ('completed', 'failed', 'cancelled')
               OR NEW.heartbeat_at IS NOT NULL
               OR NEW.consequence_state IS NOT DISTINCT FROM 'owed')
          AND (NEW.unique_states & (1 << awa_fast.state_bit(NEW.state))) <> 0
          AND (OLD.unique_states & (1 << awa_fast.state_bit(OLD.state))) = 0)
    EXECUTE FUNCTION awa_fast.check_taken_key();
