-- 016: no vacuum cuts off the hot table's empty pages unless asked to (issue 11, ADR 016).
--
-- Cutting off a table's empty tail takes an ACCESS EXCLUSIVE lock: every claim, insert,
-- heartbeat and completion waits for it, and at a steady rate the table grows back the same
-- pages within a second, each new page extended under the relation extension lock. In the
-- 8,000 jobs/s soak the leader's vacuum cut the 1.5 MB heap to 0.1 MB and the producer's inserts
-- stalled up to 81 ms behind it; between such cuts the vacuum spent most of its time retrying
-- the lock (VacuumTruncate). The leader's vacuum asks for truncation only when the heap is large
-- (Maintenance.vacuum_hot, after a backlog drained); autovacuum, the backstop, never truncates.
ALTER TABLE awa_fast.jobs SET (vacuum_truncate = false);
