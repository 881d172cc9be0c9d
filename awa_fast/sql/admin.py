"""Job and queue admin: get / list / retry / cancel a job, queue stats, pause and resume, the
bulk admin calls on failed jobs (retry, discard) and drain_queue with their row-by-row twins.
"""

from awa_fast.sql.finished import DONE_COUNTS_BY_QUEUE
from awa_fast.sql.fragments import (
    _ATTEMPT_STILL_RUNS,
    _SETTLED_FAILED,
    _STALENESS,
    ENDED_ATTEMPT_ROW,
    FAILED_SLICES,
    J_JOB_COLUMNS,
    JOB_COLUMNS,
    JOBS_ALL,
    S,
    ends_attempt,
    revived,
)

GET_JOB = f"SELECT {JOB_COLUMNS} FROM {JOBS_ALL} WHERE id = %s"

LIST_JOBS = f"""
SELECT {JOB_COLUMNS} FROM {JOBS_ALL}
WHERE (%(state)s::text IS NULL OR state::text = %(state)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY id DESC LIMIT %(limit)s"""

# A retried job is live again: a finished one moves back from jobs_done (ADR 016), a parked or
# marked one is updated in place.
_RETRIED_ROW = {
    "state": f"'available'::{S}.job_state",
    "attempt": "0",
    "run_at": "now()",
    "finalized_at": "NULL",
    "verified_at": "NULL",  # a new completion is verified again
    **ENDED_ATTEMPT_ROW,
}
# ... and the SET of a retried job's row in the hot table.
_RETRY_SET = f"""
UPDATE {S}.jobs j
SET state = 'available', attempt = 0, run_at = now(), finalized_at = NULL, verified_at = NULL,
    {ends_attempt()}"""

RETRY_JOB = revived(
    "j.id = %(id)s AND j.state IN ('failed', 'cancelled')",
    _RETRIED_ROW,
    f"""{_RETRY_SET}
    WHERE id = %(id)s AND state IN ('failed', 'cancelled', 'waiting_external')
      AND consequence_state IS DISTINCT FROM 'owed'
      AND NOT ({_ATTEMPT_STILL_RUNS})""",
    JOB_COLUMNS,
)

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
RETURNING old.state::text AS old_state, old.run_lease AS old_run_lease, {J_JOB_COLUMNS}"""

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
), d AS ({DONE_COUNTS_BY_QUEUE}
), qd AS (
    SELECT COALESCE(q.queue, d.queue) AS queue, q.scheduled, q.available, q.retryable, q.running,
           COALESCE(q.failed, 0) + COALESCE(d.failed, 0) AS failed, q.waiting_external,
           q.consequence_pending, q.owed, q.overdue,
           COALESCE(q.completed_last_hour, 0) + COALESCE(d.completed_last_hour, 0)
               AS completed_last_hour,
           q.lag_seconds
    FROM q FULL JOIN d ON d.queue = q.queue
), u AS (
    SELECT queue, sum(n)::bigint AS unhandled FROM ({UNHANDLED_AVAILABLE}) x GROUP BY queue
)
SELECT COALESCE(q.queue, m.queue) AS queue,
       COALESCE(q.scheduled, 0) + COALESCE(q.available, 0) + COALESCE(q.retryable, 0)
           AS total_queued,
       COALESCE(q.scheduled, 0) AS scheduled,
       COALESCE(q.available, 0) AS available, COALESCE(q.retryable, 0) AS retryable,
       COALESCE(q.running, 0) AS running, COALESCE(q.failed, 0) AS failed,
       COALESCE(q.waiting_external, 0) AS waiting_external,
       COALESCE(q.consequence_pending, 0) AS consequence_pending,
       COALESCE(q.owed, 0) AS consequences_owed, COALESCE(q.overdue, 0) AS consequences_overdue,
       COALESCE(q.completed_last_hour, 0) AS completed_last_hour,
       COALESCE(q.lag_seconds, 0)::float8 AS lag_seconds,
       COALESCE(m.paused, false) AS paused, COALESCE(u.unhandled, 0) AS unhandled
FROM qd q FULL JOIN {S}.queue_meta m ON m.queue = q.queue
LEFT JOIN u ON u.queue = COALESCE(q.queue, m.queue)
ORDER BY 1"""

# Every queue name something knows of: jobs in it (live, counted finished, dead-lettered),
# its settings row, a worker process that claims from it (live or recent), a schedule or a
# descriptor naming it. The CLI's queue commands refuse any other name (a typo).
KNOWN_QUEUES = f"""
SELECT queue FROM {S}.jobs
UNION SELECT queue FROM {S}.done_counts
UNION SELECT queue FROM {S}.dlq
UNION SELECT queue FROM {S}.queue_meta
UNION SELECT unnest(queues) FROM {S}.workers
UNION SELECT queue FROM {S}.cron_jobs
UNION SELECT queue FROM {S}.queue_descriptors
ORDER BY 1"""

# Every kind something knows of, cheaply: live jobs of it, dead-lettered ones, a worker with its
# handler, a schedule, a descriptor (finished jobs: KIND_FINISHED, for one name).
KNOWN_KINDS = f"""
SELECT kind FROM {S}.jobs
UNION SELECT kind FROM {S}.dlq
UNION SELECT unnest(kinds) FROM {S}.workers
UNION SELECT kind FROM {S}.cron_jobs
UNION SELECT kind FROM {S}.job_kind_descriptors
ORDER BY 1"""

# Whether a finished job of one kind exists (no index on kind: read until the first one).
KIND_FINISHED = f"SELECT EXISTS (SELECT 1 FROM {S}.jobs_done WHERE kind = %s)"

PAUSE_QUEUE = f"""
INSERT INTO {S}.queue_meta (queue, paused, paused_at, paused_by) VALUES (%s, true, now(), %s)
ON CONFLICT (queue) DO UPDATE SET paused = true, paused_at = now(), paused_by = EXCLUDED.paused_by"""

# A queue never paused has no row to clear (an insert would list it in queue_stats).
RESUME_QUEUE = f"""
UPDATE {S}.queue_meta SET paused = false, paused_at = NULL, paused_by = NULL WHERE queue = %s"""

CLEAN = (
    f"TRUNCATE {S}.jobs, {S}.queue_meta, {S}.dlq, {S}.cron_jobs, {S}.callback_expressions, "
    f"{S}.queue_descriptors, {S}.job_kind_descriptors, {S}.batch_operations CASCADE"
)


SET_QUEUE_DLQ = f"""
INSERT INTO {S}.queue_meta (queue, dlq) VALUES (%s, %s)
ON CONFLICT (queue) DO UPDATE SET dlq = EXCLUDED.dlq"""


# The unique key of a job, live or dead-lettered (to find who holds it after a conflict).
UNIQUE_KEY_OF = f"""
SELECT unique_key FROM {JOBS_ALL} WHERE id = %(id)s
UNION ALL SELECT unique_key FROM {S}.dlq WHERE id = %(id)s LIMIT 1"""

# The job holding a unique key, live or finished (to name it in a UniqueConflict message).
UNIQUE_HOLDER = f"""
WITH k AS (SELECT %s::bytea AS key)
(SELECT j.id, j.state::text FROM {S}.jobs j, k
 WHERE j.unique_key = k.key AND j.unique_key IS NOT NULL
   AND (j.unique_states & (1 << {S}.state_bit(j.state))) <> 0
 ORDER BY j.id LIMIT 1)
UNION ALL
(SELECT j.id, j.state::text FROM k JOIN {S}.unique_holds u ON u.unique_key = k.key
 JOIN {S}.jobs_done j ON j.id = u.job_id AND {S}.done_slot(j.state, j.finalized_at) = u.slot)
LIMIT 1"""

# retry_failed: failed -> available, attempt 0 (as RETRY_JOB), by kind or queue: the settled
# failed jobs, except a failed row whose handler still runs (an early fail_external; see
# _ATTEMPT_STILL_RUNS), which waits.
_RETRYABLE_FAILED = (
    _SETTLED_FAILED
    + f"""
      AND NOT (j.heartbeat_at IS NOT NULL
               AND j.heartbeat_at > now() - {_STALENESS})"""
)


# Failed jobs live in both storages (a marked or owed one stays in the hot table, ADR 016): each
# statement reads both, jobs_done through its failed slices only.
def _retry_failed(where: str) -> str:
    return revived(
        f"{where}{_RETRYABLE_FAILED} AND {FAILED_SLICES}",
        _RETRIED_ROW,
        f"""{_RETRY_SET}
    WHERE j.id IN (SELECT j.id FROM {S}.jobs j WHERE {where}{_RETRYABLE_FAILED}
                   ORDER BY j.id FOR UPDATE SKIP LOCKED)""",
        J_JOB_COLUMNS,
    )


RETRY_FAILED = _retry_failed("")

FAILED_IDS = f"""
SELECT j.id FROM {S}.jobs j WHERE {_RETRYABLE_FAILED}
UNION ALL
SELECT j.id FROM {S}.jobs_done j WHERE {_RETRYABLE_FAILED} AND {FAILED_SLICES}
ORDER BY 1"""

# Candidates of the move-to-DLQ and discard fallbacks.
SETTLED_FAILED_IDS = f"""
SELECT j.id FROM {S}.jobs j WHERE {_SETTLED_FAILED}
UNION ALL
SELECT j.id FROM {S}.jobs_done j WHERE {_SETTLED_FAILED} AND {FAILED_SLICES}
ORDER BY 1"""

# awa's RetryFailedResult.matched: failed jobs the filter finds (owed ones included).
_FAILED_MATCH = """j.state = 'failed'
  AND (%(kind)s::text IS NULL OR j.kind = %(kind)s)
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)"""
FAILED_MATCHING = f"""
SELECT (SELECT count(*) FROM {S}.jobs j WHERE {_FAILED_MATCH})
     + (SELECT count(*) FROM {S}.jobs_done j WHERE {_FAILED_MATCH} AND {FAILED_SLICES})"""

RETRY_FAILED_ONE = _retry_failed("j.id = %(id)s AND ")


# Jobs whose failure consequence is still owed are kept (deleting them would lose it).
def _discard_failed(where: str) -> str:
    return f"""
WITH h AS (DELETE FROM {S}.jobs j WHERE {where}{_SETTLED_FAILED} RETURNING j.id),
f AS (DELETE FROM {S}.jobs_done j WHERE {where}{_SETTLED_FAILED} AND {FAILED_SLICES}
      RETURNING j.id)
SELECT id FROM h UNION ALL SELECT id FROM f"""


DISCARD_FAILED = _discard_failed("")

DISCARD_FAILED_ONE = _discard_failed("j.id = %(id)s AND ")

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
DUMP_JOB = f"SELECT to_jsonb(j) FROM {JOBS_ALL} j WHERE id = %s"

# awa_fast.testing.work_one: the job after its outcome, as awa's testing.JobRow.
TESTING_JOB_ROW = f"""
SELECT id, kind, queue, args, attempt, max_attempts, priority, tags, state::text AS state
FROM {JOBS_ALL} WHERE id = %s"""
