-- 021: a live row given a unique key (or a mask) by an UPDATE is checked against finished
-- holders too.
--
-- trg_awa_fast_jobs_key_taken (010, 011) fires on UPDATE OF state: a row whose state starts
-- holding its key. An admin UPDATE of unique_key or unique_states on a live row made it hold a
-- key without that check, so a finished job's hold in unique_holds and the live row held the
-- same key (the hot table's unique index sees live holders only). The same check now runs when
-- the key or the mask changes and the row holds the key in its state afterwards, where it did
-- not hold that key before. No statement of awa-fast's own sets unique_key; the duplicate
-- cancel narrows the mask of a row that no longer holds its key, which this does not check.
CREATE TRIGGER trg_awa_fast_jobs_key_edited AFTER UPDATE OF unique_key, unique_states
    ON awa_fast.jobs
    FOR EACH ROW
    WHEN (NEW.unique_key IS NOT NULL
          AND (NEW.state NOT IN ('completed', 'failed', 'cancelled')
               OR NEW.heartbeat_at IS NOT NULL
               OR NEW.consequence_state IS NOT DISTINCT FROM 'owed')
          AND (NEW.unique_states & (1 << awa_fast.state_bit(NEW.state))) <> 0
          AND (NEW.unique_key IS DISTINCT FROM OLD.unique_key
               OR OLD.unique_states IS NULL
               OR (OLD.unique_states & (1 << awa_fast.state_bit(OLD.state))) = 0))
    EXECUTE FUNCTION awa_fast.check_taken_key();
