-- 017: autovacuum analyzes the finished slices and unique_holds again, from 300 rows (issue 11).
--
-- 015 stopped autovacuum from analyzing them: the analyze of the growing current slice held a
-- snapshot for seconds every naptime, which stopped the hot table's vacuum. But without
-- statistics the planner guesses 0.5 % of a slice for `id = $1`, and the single-job admin
-- statements (retry, dead-letter move of one failed job) and a dashboard query read every
-- slice sequentially: 300 ms at 1.5 million finished rows, growing with the history. The
-- statistics these reads need are coarse (ids are distinct), so every column, and the slices'
-- expression index, gets a statistics target of 1: an analyze samples 300 rows from 300 pages
-- instead of 30,000 (3-5 ms instead of 143 ms on a 1.5 million row slice), and its snapshot is
-- held that long.
DO $$
DECLARE
    rel regclass;
BEGIN
    FOR rel IN
        SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'awa_fast.jobs_done'::regclass
        UNION ALL SELECT 'awa_fast.unique_holds'::regclass
    LOOP
        EXECUTE format('ALTER TABLE %s RESET (autovacuum_analyze_threshold)', rel);
    END LOOP;
END
$$;
\ir objects/017_finished_statistics.sql
