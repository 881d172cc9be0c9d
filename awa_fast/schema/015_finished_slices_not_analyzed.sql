-- 015: autovacuum no longer analyzes the finished slices or unique_holds (issue 11).
--
-- An ANALYZE holds a snapshot while it samples, and that snapshot holds back the oldest xmin
-- every VACUUM and every page prune in the database must respect. The current completed slice
-- grows by the whole job rate (480,000 rows a minute at 8,000 jobs/s), so autovacuum analyzed it
-- once a naptime, each time longer (0.6 s, then 2.8 s ten minutes later): meanwhile the hot
-- table's vacuum removed nothing, its dead rows rose to 43,000, its heap grew from 1.8 to 9 MB
-- and pickup p99 reached 123 ms, every minute of the 8,000 jobs/s soak. Autovacuum may still
-- vacuum them (rare admin updates and deletes) but never analyzes them. A manual ANALYZE still
-- works. Superseded by 017: with no statistics at all, single-job admin reads scanned every slice.
DO $$
DECLARE
    rel regclass;
BEGIN
    FOR rel IN
        SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'awa_fast.jobs_done'::regclass
        UNION ALL SELECT 'awa_fast.unique_holds'::regclass
    LOOP
        EXECUTE format('ALTER TABLE %s SET (autovacuum_analyze_threshold = 2147483647)', rel);
    END LOOP;
END
$$;
