-- 028: the maintenance leader's lease, which works through a transaction pooler (ADR 028).
--
-- A session advisory lock is session state: through PgBouncer in transaction mode it is taken
-- on whichever server connection ran the statement and stays there, held for whoever gets that
-- connection next. Leadership is now this row: the process that claims it when it has expired
-- (the server's clock) bumps awa_fast.leader.epoch in the same transaction and keeps renewing
-- it while it leads; every leader pass is still fenced by the epoch (docs/architecture.md,
-- "the leader's fencing rule"). A process connected directly still takes the advisory lock
-- first (via_lock): holding it proves the previous lock-holding leader gone, so it may take
-- over such a lease before it expires (a killed leader is replaced at the next election tick,
-- not after the staleness). Apart from awa_fast.leader: every pass locks that row FOR SHARE,
-- which a renewal there would wait for.
CREATE TABLE awa_fast.leader_lease (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch bigint NOT NULL DEFAULT 0,
    holder text,
    via_lock boolean NOT NULL DEFAULT false,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO awa_fast.leader_lease DEFAULT VALUES;
