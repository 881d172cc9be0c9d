-- 012: the slice function is inlined again (issue 11: burst completion cost).
--
-- 010's done_slot read extract(epoch FROM timestamptz), which PostgreSQL marks STABLE (other
-- fields of a timestamptz depend on TimeZone). An IMMUTABLE SQL function whose body is not
-- immutable is never inlined, so the partition routing of every finished row and the counting
-- trigger called it as a function: about 2 us per call, a third of a batched completion's
-- server time. The epoch of the difference from the epoch is the same number (an interval's
-- epoch is immutable), so every row keeps its slice; only the cost changes. The test
-- test_finished_storage::test_done_slot_is_inlined_and_unchanged checks both.
\ir objects/012_done_slot.sql
