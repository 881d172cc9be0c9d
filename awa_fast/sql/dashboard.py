"""Read statements of the web dashboard (``awa_fast.web``).

Every statement is bounded so a page stays fast with millions of finished jobs
(docs/adr/008-dashboard-bounded-queries.md): it reads through a partial index whose size is the *active* set (available, scheduled,
retryable, running, waiting, owed), through the primary key within a window of ids, or one row by
id. None counts or sorts the whole job table; lists page by keyset (``id < before``), never OFFSET.
The DLQ, kept small by its retention, is paged by keyset without a window.
``tests/web/test_dashboard_plans.py`` runs EXPLAIN on each against 200k finished rows.

Parameters are named (``%(name)s``); the web layer runs these on connections without server-side
prepared statements, so each is planned with its actual values.
"""

from awa_fast.sql.fragments import S

# Bounds (ids, rows) shared with the web layer, which shows them on the pages.
SCAN_WINDOW_IDS = 50_000  # a job list page examines at most this many ids
SAMPLE_IDS = 20_000  # "recent" figures come from the newest this many job ids
PAGE_ROWS = 50
OWED_ROWS = 200
RUNNING_ROWS = 100
CHILD_ROWS = 100

# follow_ups.PROVENANCE_KEY, spelled out so the planner can match the partial lineage index
# (migration 004); a test checks the two agree.
PROVENANCE_KEY = "awa:triggered_by"

# The live states whose depth per queue QUEUE_DEPTH reports (its partial indexes), in the order
# the dashboard and the metrics' gauges list them.
LIVE_STATES = (
    "available",
    "scheduled",
    "retryable",
    "running",
    "waiting_external",
    "consequence_pending",
)

# Newest and oldest job id: two backward/forward primary-key probes.
ID_BOUNDS = f"SELECT min(id), max(id) FROM {S}.jobs_all"

# -- queues ------------------------------------------------------------------------------------

# Depth of the active states per queue, each through its own partial index (never the finished
# rows); `oldest` is the oldest run_at of the available rows (the lag a worker would see).
QUEUE_DEPTH = f"""
SELECT queue, 'available' AS state, count(*) AS n, min(run_at) AS oldest
FROM {S}.jobs WHERE state = 'available' GROUP BY queue
UNION ALL
SELECT queue, state::text, count(*), NULL FROM {S}.jobs
WHERE state IN ('scheduled', 'retryable') GROUP BY queue, state
UNION ALL
SELECT queue, 'running', count(*), NULL FROM {S}.jobs WHERE state = 'running' GROUP BY queue
UNION ALL
SELECT queue, 'waiting_external', count(*), NULL FROM {S}.jobs
WHERE state = 'waiting_external' GROUP BY queue
UNION ALL
SELECT queue, 'consequence_pending', count(*), NULL FROM {S}.jobs
WHERE consequence_state = 'owed' AND state = 'consequence_pending' GROUP BY queue"""

# Outcomes among the newest SAMPLE_IDS job ids (a primary-key range): the completion rate.
QUEUE_RECENT = f"""
SELECT queue,
       count(*) FILTER (WHERE state = 'completed') AS completed,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE state = 'completed'
                        AND finalized_at > now() - interval '5 minutes') AS completed_5m
FROM {S}.jobs_all WHERE id >= %(floor)s GROUP BY queue"""

QUEUE_META = f"SELECT queue, paused, paused_at, paused_by, dlq FROM {S}.queue_meta ORDER BY queue"

# -- jobs --------------------------------------------------------------------------------------

_LIST_COLUMNS = (
    "id, kind, queue, state::text AS state, priority, attempt, max_attempts, run_at, "
    "created_at, finalized_at, progress"
)

# One page of jobs, newest first, inside the id window [floor, before): a filter that matches
# few rows costs at most the window, and the page says which ids it examined.
JOB_PAGE = f"""
SELECT {_LIST_COLUMNS} FROM {S}.jobs_all
WHERE id < %(before)s AND id >= %(floor)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(state)s::text IS NULL OR state = %(state)s::{S}.job_state)
ORDER BY id DESC LIMIT %(limit)s"""

JOB_DETAIL = f"SELECT *, state::text AS state, false AS in_dlq FROM {S}.jobs_all WHERE id = %(id)s"

DLQ_DETAIL = f"SELECT *, state::text AS state, true AS in_dlq FROM {S}.dlq WHERE id = %(id)s"

# A job's summary wherever it lives (the job table or the DLQ), for lineage links.
JOB_SUMMARY = f"""
SELECT id, kind, queue, state::text AS state, false AS in_dlq FROM {S}.jobs_all WHERE id = %(id)s
UNION ALL
SELECT id, kind, queue, state::text, true FROM {S}.dlq WHERE id = %(id)s"""

# The follow-ups a job staged: rows whose provenance names it (partial indexes of migration 004).
_CHILD_MATCH = (
    f"metadata ? '{PROVENANCE_KEY}' AND metadata->>'{PROVENANCE_KEY}' = %(id)s::bigint::text"
)
JOB_CHILDREN = f"""
SELECT * FROM (
    SELECT id, kind, queue, state::text AS state, false AS in_dlq FROM {S}.jobs_all
    WHERE {_CHILD_MATCH}
    UNION ALL
    SELECT id, kind, queue, state::text, true FROM {S}.dlq WHERE {_CHILD_MATCH}
) c ORDER BY id LIMIT %(limit)s"""

# -- dead-letter queue -------------------------------------------------------------------------

# The DLQ is kept small by retention (dlq_retention_days) and its ids are sparse job ids, so its
# pages are plain keyset pages over its primary key, without an id window.
DLQ_PAGE = f"""
SELECT id, kind, queue, attempt, max_attempts, dlq_reason, dlq_at, created_at,
       errors -> -1 ->> 'error' AS last_error
FROM {S}.dlq
WHERE id < %(before)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
ORDER BY id DESC LIMIT %(limit)s"""

# -- failure consequences ----------------------------------------------------------------------

# Same rule as sql.CONSEQUENCES_OWED: retried at least once, or due for over a minute.
_OVERDUE = "(consequence_attempts > 0 OR consequence_retry_at < now() - interval '60 seconds')"

CONSEQUENCE_COUNTS = f"""
SELECT count(*) AS owed, count(*) FILTER (WHERE {_OVERDUE}) AS overdue
FROM {S}.jobs WHERE consequence_state = 'owed'"""

CONSEQUENCES_OWED = f"""
SELECT id, kind, queue, state::text AS state, consequence_reason, consequence_path,
       consequence_attempts, consequence_error, consequence_retry_at, {_OVERDUE} AS overdue
FROM {S}.jobs WHERE consequence_state = 'owed'
ORDER BY consequence_retry_at, id LIMIT %(limit)s"""

# Applied consequences among the newest SAMPLE_IDS job ids (no index on applied rows: they are
# finished history).
CONSEQUENCES_APPLIED = f"""
SELECT id, kind, queue, state::text AS state, consequence_reason, consequence_path,
       consequence_attempts, consequence_applied_at
FROM {S}.jobs_all WHERE id >= %(floor)s AND consequence_state = 'applied'
ORDER BY id DESC LIMIT %(limit)s"""

# -- workers and the maintenance leader --------------------------------------------------------

# The backend holding the leader's session advisory lock (sql.LEADER_LOCK_KEY); a bigint key
# shows in pg_locks as classid = high 32 bits, objid = low 32 bits, objsubid = 1.
LEADER = """
SELECT l.pid, a.application_name, host(a.client_addr) AS client_addr, a.backend_start,
       a.state_change
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = (%(key)s::bigint >> 32)::oid
  AND l.objid = (%(key)s::bigint & 4294967295)::oid"""

# The leader's lease (migration 028, ADR 028): the only trace of a leader behind a transaction
# pooler (no advisory lock); live while expires_at is ahead.
LEADER_LEASE = f"""
SELECT holder, epoch, via_lock, expires_at > now() AS live FROM {S}.leader_lease"""

# The live processes' presence rows (one per process; migration 005), newest first.
PRESENCE_ROWS = 200
PRESENCE = f"""
SELECT instance, queues, kinds, started_at, seen_at, expires_at
FROM {S}.workers WHERE expires_at > now() ORDER BY started_at DESC, instance LIMIT %(limit)s"""

# Connections to this database by client.
CONNECTIONS = """
SELECT application_name, host(client_addr) AS client_addr, count(*) AS connections,
       count(*) FILTER (WHERE state = 'active') AS active, min(backend_start) AS oldest
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2"""

RUNNING_COUNT = f"SELECT count(*) FROM {S}.jobs WHERE state = 'running'"

RUNNING = f"""
SELECT id, kind, queue, attempt, max_attempts, attempted_at, heartbeat_at, deadline_at, progress,
       EXTRACT(EPOCH FROM now() - heartbeat_at)::float8 AS heartbeat_age
FROM {S}.jobs WHERE state = 'running' ORDER BY id LIMIT %(limit)s"""

# Every dashboard read, in its own transaction: a statement that runs longer fails
# (milliseconds). SET LOCAL: safe through a transaction pooler.
STATEMENT_TIMEOUT_MS = 5000
SET_STATEMENT_TIMEOUT = f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}"
