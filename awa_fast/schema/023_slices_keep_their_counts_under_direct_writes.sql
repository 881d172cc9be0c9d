-- 023: a statement that writes one slice directly keeps done_counts and unique_holds right.
--
-- done_inserted and done_deleted (010, 020) are statement triggers of jobs_done, and a
-- statement trigger of a partitioned table fires only for statements naming that table: an
-- INSERT, COPY, DELETE or TRUNCATE naming a slice (awa_fast.jobs_done_c07, say) left the
-- counts queue_stats reads, the holds that keep a duplicate out and the verify list as they
-- were. Each slice now has the same triggers, which fire only for statements naming that
-- slice, so nothing is counted twice. An UPDATE of a slice is refused where it would matter by
-- 022's row trigger, which partitions inherit. DETACH PARTITION stays outside (DDL).
CREATE FUNCTION awa_fast.slice_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- TG_ARGV[0]: the slice's slot (awa_fast.done_slot); the retention prune does the same
    -- after its own TRUNCATE (sql.RELEASE_SLICE), so a second release finds nothing.
    DELETE FROM awa_fast.unique_holds WHERE slot = TG_ARGV[0]::smallint;
    DELETE FROM awa_fast.done_counts WHERE slot = TG_ARGV[0]::smallint;
    RETURN NULL;
END
$$;

DO $$
DECLARE
    slice text;
BEGIN
    FOR i IN 0..63 LOOP
        slice := CASE WHEN i < 32 THEN format('jobs_done_c%s', lpad(i::text, 2, '0'))
                      ELSE format('jobs_done_f%s', lpad((i - 32)::text, 2, '0')) END;
        EXECUTE format(
            'CREATE TRIGGER trg_awa_fast_slice_inserted AFTER INSERT ON awa_fast.%I '
            'REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT '
            'EXECUTE FUNCTION awa_fast.done_inserted()', slice);
        EXECUTE format(
            'CREATE TRIGGER trg_awa_fast_slice_deleted AFTER DELETE ON awa_fast.%I '
            'REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT '
            'EXECUTE FUNCTION awa_fast.done_deleted()', slice);
        EXECUTE format(
            'CREATE TRIGGER trg_awa_fast_slice_truncated AFTER TRUNCATE ON awa_fast.%I '
            'FOR EACH STATEMENT EXECUTE FUNCTION awa_fast.slice_truncated(%s)', slice, i);
    END LOOP;
END
$$;
