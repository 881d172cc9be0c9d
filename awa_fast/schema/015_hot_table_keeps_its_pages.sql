-- 015: vacuuming the hot table never tries to truncate it (issue 11).
--
-- A VACUUM that finds empty pages at the end of a table waits to take it ACCESS EXCLUSIVE and
-- cut them off: it retries a conditional lock every 50 ms for up to 5 s, and the hot table is
-- never without a writer. Sampled in an 8,000 jobs/s soak, the leader's vacuum spent about 80%
-- of its time in that wait (wait event VacuumTruncate): each pass took 0.1-0.7 s instead of a
-- few ms, dead rows piled up behind it, and when it did get the lock every claim and completion
-- queued behind it. Without truncation the table keeps its largest size and reuses its free
-- pages; after a burst an operator may return the space with VACUUM (TRUNCATE) awa_fast.jobs.
ALTER TABLE awa_fast.jobs SET (vacuum_truncate = false);
