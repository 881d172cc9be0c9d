-- 005: the maintenance leader's fencing epoch, and the live workers' handled kinds.

-- One row. A process that takes the leader advisory lock bumps epoch; every write transaction
-- of a leader pass first locks this row FOR SHARE at its own epoch (docs/architecture.md,
-- "the leader's fencing rule"), so a deposed leader's passes find no row and write nothing.
\ir objects/005_leader_and_workers.sql
