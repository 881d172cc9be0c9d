"""What a running process says and checks: worker presence, wake-up notifications, the schema
version check at start, storage history and queue health.
"""

from awa_fast.sql.admin import UNHANDLED_AVAILABLE
from awa_fast.sql.fragments import S

NOTIFY_QUEUE = "SELECT pg_notify('awa_fast', %s)"

# Wake-ups for jobs committed without their NOTIFY (awa_fast/wake.py, migration 009, ADR 018):
# many queues in one short transaction, committed without waiting for its WAL flush, so it holds
# PostgreSQL's database-wide notify lock only for moments (a NOTIFY is not durable anyway: a
# crash also ends every LISTEN). Param: text[] of queues.
WAKE_QUEUES = """
SELECT set_config('synchronous_commit', 'off', true), pg_notify('awa_fast', q)
FROM unnest(%s::text[]) AS q"""

NOTIFY_CANCEL = "SELECT pg_notify('awa_fast_cancel', %s)"

CHANNEL_QUEUE = "awa_fast"

CHANNEL_CANCEL = "awa_fast_cancel"


HEALTH_AVAILABLE = f"""
SELECT queue, count(*) FROM {S}.jobs WHERE state = 'available' AND queue = ANY(%s)
GROUP BY queue"""

# storage_status(): when the schema was first and last migrated, and its version.
STORAGE_HISTORY = f"""
SELECT min(applied_at) AS first_at, max(applied_at) AS last_at, max(version) AS version
FROM {S}.schema_version"""

# install_queue_storage(reset=True), awa's storage reset: every job and what belongs to jobs
# (finished slices, DLQ, counters, holds, schedules, queue settings, descriptors, batch
# operations) goes; the schema, its migration history, the leader row (its epoch fences) and
# the live processes' presence and verifier registrations stay. Sequences go on (ids are not
# reused: an attempt still running elsewhere cannot finalize a new job of the same id).
# The tables to empty: every table of the schema but those, partitions left to their parent
# (run without parameters), by name within the schema.
RESET_TABLES = f"""
SELECT c.relname FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = '{S}' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND c.relname <> ALL(ARRAY['schema_version', 'leader', 'leader_lease', 'workers', 'verifier_kinds'])
ORDER BY 1"""


def reset_truncate(tables: list[str]) -> list[str]:
    """The ``TRUNCATE`` statements of ``tables`` (names within the schema, as ``RESET_TABLES``
    returns them), sequences kept: the hot table alone and last, since its truncate trigger
    (migration 010) truncates the finished storage again, which the same statement may not."""
    hot = f"{S}.jobs"
    rest = [f'{S}."{t}"' for t in tables if t != "jobs"]
    return [f"TRUNCATE {', '.join(rest)}", f"TRUNCATE {hot}"] if rest else [f"TRUNCATE {hot}"]


# Worker presence (awa_fast.workers): which queues and kinds each live process claims.
WORKER_SEEN = f"""
INSERT INTO {S}.workers (instance, queues, kinds, expires_at, min_stale_ms)
VALUES (%(instance)s, %(queues)s, %(kinds)s, now() + %(ttl_ms)s * interval '1 millisecond',
        %(min_stale_ms)s)
ON CONFLICT (instance) DO UPDATE
SET queues = EXCLUDED.queues, kinds = EXCLUDED.kinds, seen_at = now(),
    expires_at = EXCLUDED.expires_at, min_stale_ms = EXCLUDED.min_stale_ms"""

WORKER_GONE = f"DELETE FROM {S}.workers WHERE instance = %s"

# After shutdown, while def-handler threads outlive it (worker/lingering.py): the presence row
# stays, so its min_stale_ms keeps other processes from rescuing the attempts those threads
# still beat (ADR 020).
WORKER_KEEP = f"""
UPDATE {S}.workers SET seen_at = now(), expires_at = now() + %s * interval '1 millisecond'
WHERE instance = %s"""

# The kinds waiting in this process's queues that no live worker handles (logged once each).
UNHANDLED_IN_QUEUES = f"""
SELECT queue, kind, n FROM ({UNHANDLED_AVAILABLE}) x WHERE queue = ANY(%s) ORDER BY 1, 2"""

# Schema version check at start(): a worker on an unmigrated database fails fast.
SCHEMA_PRESENT = f"SELECT to_regclass('{S}.schema_version') IS NOT NULL"

# The CLI's probe before a command that needs the schema.
SCHEMA_VERSION = f"SELECT max(version) FROM {S}.schema_version"

# Every connection awa-fast writes jobs on runs its transactions at READ COMMITTED, whatever
# the database's or the role's default_transaction_isolation: the unique-key check across live
# and finished jobs looks after a lock with a snapshot taken after it, and refuses a transaction
# that reads one snapshot throughout (migration 024).
SESSION_READ_COMMITTED = "SET default_transaction_isolation TO 'read committed'"

# The pooler checks (awa_fast/pooler.py): the server's pid of this connection, and the level a
# transaction gets without a SET (through a transaction pooler it must be READ COMMITTED).
BACKEND_PID = "SELECT pg_backend_pid()"
DEFAULT_ISOLATION = "SELECT current_setting('default_transaction_isolation')"

# The runtime's LISTEN connection: new jobs per queue, and cancel requests.
LISTEN_QUEUE = f'LISTEN "{CHANNEL_QUEUE}"'
LISTEN_CANCEL = f'LISTEN "{CHANNEL_CANCEL}"'

# A server answers (awa_fast.embedded's start-up probe).
PING = "SELECT 1"
