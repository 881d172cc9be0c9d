"""The maintenance leader: its lease and advisory lock, the epoch fencing (docs/architecture.md, "the
leader's fencing rule") and the displacement of a frozen leader and its frozen passes.
"""

from awa_fast.sql.fragments import _STALENESS, S

# Arbitrary constant: the advisory-lock key of the default schema's maintenance leader (another
# schema's: schema_binding.SchemaBinding.leader_lock_key, which callers pass).
LEADER_LOCK_KEY = 0x6177615F6C6561  # "awa_lea"

TRY_LEADER = "SELECT pg_try_advisory_lock(%s)"

# A frozen leader (SIGSTOPped, its loop blocked) keeps its lock connection open, so the lock
# never frees. A live leader runs LEADER_EPOCH on that connection at least every
# staleness / 3 (Maintenance.run), so a holder idle longer than %(stale_ms)s is frozen: its lock
# connection is terminated, and with it every transaction it left open on the leader row (a
# pass frozen mid-way, idle in transaction as long), which the epoch bump would wait for. The
# epoch fencing keeps whatever it does when continued from writing anything.
_FROZEN_PASSES = f"""
    SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.relation = '{S}.leader'::regclass
      AND a.pid <> pg_backend_pid() AND a.state = 'idle in transaction'
      AND a.state_change < now() - {_STALENESS}"""

DISPLACE_FROZEN_LEADER = f"""
WITH holder AS (
    SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.database = (
              SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = (%(key)s::bigint >> 32)::oid
      AND l.objid = (%(key)s::bigint & 4294967295)::oid
      AND l.objsubid = 1 AND a.state = 'idle'
      AND a.state_change < now() - {_STALENESS}),
open_passes AS ({_FROZEN_PASSES}
      AND EXISTS (SELECT FROM holder))
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
FROM (SELECT pid FROM holder UNION SELECT pid FROM open_passes) frozen"""

# Run by a process that holds the advisory lock but whose epoch bump timed out: a pass of the
# displaced leader that froze a moment after its lock connection (so was not yet stale when the
# holder was terminated) still holds the leader row; once idle in transaction longer than
# %(stale_ms)s it is frozen too and is terminated, so the bump can go through.
DISPLACE_FROZEN_PASSES = f"""
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM ({_FROZEN_PASSES}) frozen"""

# Taking leadership: bump the epoch. The UPDATE waits for every transaction still holding the
# old epoch FOR SHARE (an old leader's pass in flight); afterwards any such pass finds no row.
LEADER_BUMP = f"""
UPDATE {S}.leader SET epoch = epoch + 1, holder = %s, since = now() RETURNING epoch"""

# The lease (migration 028, ADR 028): claimed in the transaction that bumps the epoch, when it
# has expired or (via_lock) its holder took it with the advisory lock this process now holds.
# SKIP LOCKED: a row another process is claiming or renewing right now is not takeable.
# The lease row, put back if something emptied the table (a reset before it kept the row):
# without it no process could ever lead.
LEASE_ENSURE = f"INSERT INTO {S}.leader_lease DEFAULT VALUES ON CONFLICT DO NOTHING"

LEASE_TAKE = f"""
UPDATE {S}.leader_lease l SET holder = %(holder)s, via_lock = %(via_lock)s,
    expires_at = now() + {_STALENESS}
WHERE l.singleton IN (SELECT singleton FROM {S}.leader_lease
                      WHERE expires_at < now() OR (via_lock AND %(via_lock)s)
                      FOR UPDATE SKIP LOCKED)
RETURNING l.singleton"""

LEASE_EPOCH = f"UPDATE {S}.leader_lease SET epoch = %s"

# The leader's hold, at each election tick (at most staleness / 3 apart): the lease is renewed
# only while it and the leader row are still at this process's epoch. No row: deposed.
LEASE_RENEW = f"""
UPDATE {S}.leader_lease l SET expires_at = now() + {_STALENESS}
WHERE l.epoch = %(epoch)s AND (SELECT epoch FROM {S}.leader) = %(epoch)s
RETURNING l.epoch"""

# A leader stepping down frees the lease at once (the next process takes it at its next tick).
LEASE_RELEASE = f"UPDATE {S}.leader_lease SET expires_at = '-infinity' WHERE epoch = %s"

# First statement of every leader write transaction.
LEADER_FENCE = f"SELECT epoch FROM {S}.leader WHERE epoch = %s FOR SHARE"

LEADER_EPOCH = f"SELECT epoch FROM {S}.leader"

# The epoch bump's wait for the previous leader's passes, in milliseconds (SET LOCAL: this
# transaction only).
LOCK_TIMEOUT_LOCAL = "SET LOCAL lock_timeout = {ms:d}"

# Every fenced leader pass: a row or table lock held by another session fails the statement
# after 2 s (logged; the pass's other steps go on) instead of stalling the maintenance loop.
PASS_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '2s'"

# ... and a pass whose process stops between two of its statements (SIGSTOP, a hung host) is
# ended by the server after 5 s idle in its transaction, releasing its locks: a finished slice's
# ACCESS EXCLUSIVE lock blocked every read of finished jobs, in every process, until another
# process displaced the frozen leader (heartbeat_staleness_ms), or for good without one.
# The election's own transactions (the lease renewal, the take and bump) set it too: a leader
# whose host was cut off between the renewal's statements left its lock connection idle in a
# transaction holding the lease row, which no displacement matched (it looks for an idle
# holder) and the lease take skipped (SKIP LOCKED), so no process led again for as long as the
# dead TCP connection stayed open (tests/deploy/test_hosts.py; ADR 039).
PASS_IDLE_TIMEOUT_S = 5
PASS_IDLE_TIMEOUT = f"SET LOCAL idle_in_transaction_session_timeout = '{PASS_IDLE_TIMEOUT_S}s'"
