-- Included by migration 017 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
DO $$
DECLARE
    rel regclass;
    col name;
BEGIN
    FOR rel IN SELECT 'awa_fast.jobs_done'::regclass UNION ALL SELECT 'awa_fast.unique_holds'::regclass
    LOOP
        FOR col IN
            SELECT attname FROM pg_attribute WHERE attrelid = rel AND attnum > 0 AND NOT attisdropped
        LOOP
            EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET STATISTICS 1', rel, col);
        END LOOP;
    END LOOP;
    -- An expression index has its own target, and the sample is as large as the largest.
    FOR rel IN
        SELECT indexrelid::regclass FROM pg_index
        WHERE indexprs IS NOT NULL AND indrelid IN (
            SELECT inhrelid FROM pg_inherits WHERE inhparent = 'awa_fast.jobs_done'::regclass)
    LOOP
        EXECUTE format('ALTER INDEX %s ALTER COLUMN 1 SET STATISTICS 1', rel);
    END LOOP;
END
$$;
