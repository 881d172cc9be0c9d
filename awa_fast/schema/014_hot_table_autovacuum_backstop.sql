-- 014: autovacuum is the hot table's backstop, no longer a second vacuum (issue 11).
--
-- The maintenance leader vacuums the hot table whenever a few thousand dead rows piled up
-- (Maintenance.vacuum_hot). 010 also let autovacuum start at 5,000 dead rows, so once a naptime
-- it did, and while it ran (seconds, with its analyze) the leader's VACUUM (SKIP_LOCKED) was
-- skipped: in the 10-minute soak at 8,000 jobs/s every autovacuum visit doubled the dead rows
-- (35,000 against about 16,000 between the leader's passes) and grew the table a step. Now
-- autovacuum steps in only when no leader vacuums (no worker runs maintenance): far above
-- what the leader lets pile up.
ALTER TABLE awa_fast.jobs SET (
    autovacuum_vacuum_threshold = 100000, autovacuum_vacuum_insert_threshold = 1000000);
