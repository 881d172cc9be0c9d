"""Job and queue admin: get / list / retry / cancel a job, queue stats, pause and resume, the
bulk admin calls on failed jobs (retry, discard) and drain_queue with their row-by-row twins.
"""

from awa_fast.sql.fragments import (
    _ATTEMPT_STILL_RUNS,
    _SETTLED_FAILED,
    J_JOB_COLUMNS,
    JOB_COLUMNS,
    S,
    ends_attempt,
)

GET_JOB = f"SELECT {JOB_COLUMNS} FROM {S}.jobs WHERE id = %s"

LIST_JOBS = f"""
SELECT {JOB_COLUMNS} FROM {S}.jobs
WHERE (%(state)s::text IS NULL OR state::text = %(state)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY id DESC LIMIT %(limit)s"""

RETRY_JOB = f"""
UPDATE {S}.jobs
SET state = 'available', attempt = 0, run_at = now(), finalized_at = NULL,
    {ends_attempt()}
WHERE id = %(id)s AND state IN ('failed', 'cancelled', 'waiting_external')
  AND consequence_state IS DISTINCT FROM 'owed'
  AND NOT ({_ATTEMPT_STILL_RUNS})
RETURNING {JOB_COLUMNS}"""

ATTEMPT_STILL_RUNS = f"""
SELECT heartbeat_at FROM {S}.jobs WHERE id = %(id)s AND {_ATTEMPT_STILL_RUNS}"""

# heartbeat_at is kept: a running (or waiting) attempt's handler lives on until it notices.
# consequence_pending is left alone: its failure is decided and the reconciler settles it (a
# cancelled row is never reconciled: models/settlement.pml, nothing_owed_is_lost).
CANCEL_JOB = f"""
WITH old AS (SELECT id, state, run_lease FROM {S}.jobs WHERE id = %s FOR UPDATE)
UPDATE {S}.jobs j
SET state = 'cancelled', finalized_at = now(), {ends_attempt(None)},
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'error', 'cancelled: cancelled by admin', 'attempt', j.attempt, 'at', now()))
FROM old
WHERE j.id = old.id
  AND old.state NOT IN ('completed', 'failed', 'cancelled', 'consequence_pending')
RETURNING old.state::text, old.run_lease, {J_JOB_COLUMNS}"""

CANCEL_BY_UNIQUE_KEY = f"""
SELECT id FROM {S}.jobs
WHERE unique_key = %s AND state NOT IN ('completed', 'failed', 'cancelled')
ORDER BY id LIMIT 1"""

# Available jobs per (queue, kind) that no live worker (awa_fast.workers, not expired) claims:
# no live process has a handler for the kind on that queue.
UNHANDLED_AVAILABLE = f"""
SELECT j.queue, j.kind, count(*) AS n FROM {S}.jobs j
WHERE j.state = 'available'
  AND NOT EXISTS (SELECT 1 FROM {S}.workers w WHERE w.expires_at > now()
                  AND j.queue = ANY(w.queues) AND j.kind = ANY(w.kinds))
GROUP BY j.queue, j.kind"""

UNHANDLED_AVAILABLE_SORTED = f"{UNHANDLED_AVAILABLE} ORDER BY 1, 2"

QUEUE_STATS = f"""
WITH q AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE state = 'available') AS available,
           count(*) FILTER (WHERE state = 'retryable') AS retryable,
           count(*) FILTER (WHERE state = 'running') AS running,
           count(*) FILTER (WHERE state = 'failed') AS failed,
           count(*) FILTER (WHERE state = 'waiting_external') AS waiting_external,
           count(*) FILTER (WHERE state = 'consequence_pending') AS consequence_pending,
           count(*) FILTER (WHERE consequence_state = 'owed') AS owed,
           count(*) FILTER (WHERE consequence_state = 'owed' AND (consequence_attempts > 0
                            OR consequence_retry_at < now() - interval '60 seconds')) AS overdue,
           count(*) FILTER (WHERE state = 'completed' AND finalized_at > now() - interval '1 hour')
               AS completed_last_hour,
           COALESCE(EXTRACT(EPOCH FROM now() - min(run_at) FILTER (WHERE state = 'available')), 0)
               AS lag_seconds
    FROM {S}.jobs GROUP BY queue
), u AS (
    SELECT queue, sum(n)::bigint AS unhandled FROM ({UNHANDLED_AVAILABLE}) x GROUP BY queue
)
SELECT COALESCE(q.queue, m.queue), COALESCE(q.scheduled, 0), COALESCE(q.available, 0),
       COALESCE(q.retryable, 0), COALESCE(q.running, 0), COALESCE(q.failed, 0),
       COALESCE(q.waiting_external, 0), COALESCE(q.consequence_pending, 0),
       COALESCE(q.owed, 0), COALESCE(q.overdue, 0),
       COALESCE(q.completed_last_hour, 0), COALESCE(q.lag_seconds, 0)::float8,
       COALESCE(m.paused, false), COALESCE(u.unhandled, 0)
FROM q FULL JOIN {S}.queue_meta m ON m.queue = q.queue
LEFT JOIN u ON u.queue = COALESCE(q.queue, m.queue)
ORDER BY 1"""

PAUSE_QUEUE = f"""
INSERT INTO {S}.queue_meta (queue, paused, paused_at, paused_by) VALUES (%s, true, now(), %s)
ON CONFLICT (queue) DO UPDATE SET paused = true, paused_at = now(), paused_by = EXCLUDED.paused_by"""

RESUME_QUEUE = f"""
INSERT INTO {S}.queue_meta (queue, paused) VALUES (%s, false)
ON CONFLICT (queue) DO UPDATE SET paused = false, paused_at = NULL, paused_by = NULL"""

CLEAN = (
    f"TRUNCATE {S}.jobs, {S}.queue_meta, {S}.dlq, {S}.cron_jobs, {S}.callback_expressions, "
    f"{S}.queue_descriptors, {S}.job_kind_descriptors, {S}.batch_operations CASCADE"
)


SET_QUEUE_DLQ = f"""
INSERT INTO {S}.queue_meta (queue, dlq) VALUES (%s, %s)
ON CONFLICT (queue) DO UPDATE SET dlq = EXCLUDED.dlq"""


# The unique key of a job, live or dead-lettered (to find who holds it after a conflict).
UNIQUE_KEY_OF = f"""
SELECT unique_key FROM {S}.jobs WHERE id = %(id)s
UNION ALL SELECT unique_key FROM {S}.dlq WHERE id = %(id)s LIMIT 1"""

# The live job holding a unique key (to name it in a UniqueConflict message).
UNIQUE_HOLDER = f"""
SELECT id, state::text FROM {S}.jobs
WHERE unique_key = %s AND unique_key IS NOT NULL
  AND (unique_states & (1 << {S}.state_bit(state))) <> 0
ORDER BY id LIMIT 1"""

# retry_failed: failed -> available, attempt 0 (as RETRY_JOB), by kind or queue: the settled
# failed jobs, except a failed row whose handler still runs (an early fail_external; see
# _ATTEMPT_STILL_RUNS), which waits.
_RETRYABLE_FAILED = (
    _SETTLED_FAILED
    + """
      AND NOT (j.heartbeat_at IS NOT NULL
               AND j.heartbeat_at > now() - %(stale_ms)s * interval '1 millisecond')"""
)

_RETRY_FAILED_SET = f"""
UPDATE {S}.jobs j
SET state = 'available', attempt = 0, run_at = now(), finalized_at = NULL,
    {ends_attempt()}"""

RETRY_FAILED = f"""{_RETRY_FAILED_SET}
WHERE j.id IN (SELECT j.id FROM {S}.jobs j WHERE {_RETRYABLE_FAILED}
               ORDER BY j.id FOR UPDATE SKIP LOCKED)
RETURNING {J_JOB_COLUMNS}"""

FAILED_IDS = f"""
SELECT j.id FROM {S}.jobs j WHERE {_RETRYABLE_FAILED} ORDER BY j.id"""

# Candidates of the move-to-DLQ and discard fallbacks.
SETTLED_FAILED_IDS = f"SELECT j.id FROM {S}.jobs j WHERE {_SETTLED_FAILED} ORDER BY j.id"

# awa's RetryFailedResult.matched: failed jobs the filter finds (owed ones included).
FAILED_MATCHING = f"""
SELECT count(*) FROM {S}.jobs j WHERE j.state = 'failed'
  AND (%(kind)s::text IS NULL OR j.kind = %(kind)s)
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)"""

RETRY_FAILED_ONE = f"""{_RETRY_FAILED_SET}
WHERE j.id = %(id)s AND {_RETRYABLE_FAILED}
RETURNING {J_JOB_COLUMNS}"""

# Jobs whose failure consequence is still owed are kept (deleting them would lose it).
DISCARD_FAILED = f"DELETE FROM {S}.jobs j WHERE {_SETTLED_FAILED} RETURNING j.id"

DISCARD_FAILED_ONE = f"""
DELETE FROM {S}.jobs j WHERE j.id = %(id)s AND {_SETTLED_FAILED} RETURNING j.id"""

# drain_queue guard: waiting rows of one queue, parked (waiting_external) ones included as in
# awa-pg; running attempts are left alone.
_DRAINABLE = (
    "j.queue = %(queue)s AND j.state IN ('available', 'scheduled', 'retryable', 'waiting_external')"
)

# heartbeat_at is kept: a parked handler still in wait_for_callback keeps its mark.
_DRAIN_SET = f"""
UPDATE {S}.jobs j
SET state = 'cancelled', finalized_at = now(), {ends_attempt(None)},
    errors = errors || jsonb_build_array(jsonb_build_object(
        'error', 'cancelled: queue drained by admin', 'attempt', attempt, 'at', now()))"""

DRAIN_QUEUE = f"""{_DRAIN_SET}
WHERE j.id IN (SELECT j.id FROM {S}.jobs j WHERE {_DRAINABLE}
               ORDER BY j.id FOR UPDATE SKIP LOCKED)
RETURNING j.id"""

DRAINABLE_IDS = f"SELECT j.id FROM {S}.jobs j WHERE {_DRAINABLE} ORDER BY j.id"

DRAIN_ONE = f"""{_DRAIN_SET}
WHERE j.id = %(id)s AND {_DRAINABLE}
RETURNING j.id"""

# Whole rows as JSON (every column, consequence bookkeeping included).
DUMP_JOB = f"SELECT to_jsonb(j) FROM {S}.jobs j WHERE id = %s"

# awa_fast.testing.work_one: the job after its outcome, as awa's testing.JobRow.
TESTING_JOB_ROW = f"""
SELECT id, kind, queue, args, attempt, max_attempts, priority, tags, state::text AS state
FROM {S}.jobs WHERE id = %s"""
