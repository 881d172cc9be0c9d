"""External waits (callbacks): registering a callback, parking, and the external completion,
retry, resume and heartbeat of a waiting job.
"""

from awa_fast.sql.fragments import (
    _ATTEMPT_STILL_RUNS,
    COMPLETED,
    CONSEQUENCE_COLUMNS,
    JOB_COLUMNS,
    S,
    _cancel_duplicate,
    ends_attempt,
)

ATTEMPT_STILL_RUNS_BY_CALLBACK = f"""
SELECT id, heartbeat_at FROM {S}.jobs WHERE callback_id = %(cid)s AND {_ATTEMPT_STILL_RUNS}"""

# The callback's CEL expressions (006) go in with it; a registration without any leaves an
# older row unread (its callback_id no longer matches).
REGISTER_CALLBACK = f"""
WITH r AS (
    UPDATE {S}.jobs
    SET callback_id = gen_random_uuid(), callback_timeout_at = now() + %(timeout)s * interval '1 second'
    WHERE id = %(id)s AND run_lease = %(lease)s AND state = 'running'
    RETURNING id, callback_id, callback_timeout_at
), e AS (
    INSERT INTO {S}.callback_expressions (job_id, callback_id, expressions)
    SELECT r.id, r.callback_id, %(exprs)s::jsonb FROM r WHERE %(exprs)s::jsonb IS NOT NULL
    ON CONFLICT (job_id) DO UPDATE
    SET callback_id = excluded.callback_id, expressions = excluded.expressions
)
SELECT callback_id, callback_timeout_at FROM r"""

# The parked handler lives on in wait_for_callback: heartbeat_at stays as its mark.
PARK_FOR_CALLBACK = f"""
UPDATE {S}.jobs SET state = 'waiting_external', heartbeat_at = now(), deadline_at = NULL
WHERE id = %s AND run_lease = %s AND state = 'running' AND callback_id = %s"""

POLL_CALLBACK_WAIT = f"""
SELECT state::text, run_lease, callback_id, metadata -> '_awa_callback_result' AS payload
FROM {S}.jobs_all WHERE id = %s"""

# The callback's CEL expressions (006), read under LOCK_BY_CALLBACK's row lock.
CALLBACK_EXPRESSIONS = f"""
SELECT expressions FROM {S}.callback_expressions WHERE job_id = %s AND callback_id = %s"""

LOCK_BY_CALLBACK = f"""
SELECT {JOB_COLUMNS}, {CONSEQUENCE_COLUMNS} FROM {S}.jobs
WHERE callback_id = %s AND state IN ('waiting_external', 'running') FOR UPDATE"""

COMPLETE_EXTERNAL = f"""
UPDATE {S}.jobs
SET {COMPLETED}
WHERE id = %s RETURNING {JOB_COLUMNS}"""

# ... when completing would make a second holder of the job's unique key (its mask holds
# 'completed', another job holds the key): cancelled as a duplicate, as a worker's completion
# into a held key is. A handler still alive (an early callback, wait_for_callback) keeps its
# "still running" mark: a retry of the cancelled job must wait for it.
COMPLETE_EXTERNAL_AS_DUPLICATE = f"""{_cancel_duplicate("heartbeat_at")}WHERE id = %s
RETURNING {JOB_COLUMNS}"""

RETRY_EXTERNAL = f"""
UPDATE {S}.jobs
SET state = 'available', attempt = 0, run_at = now(), {ends_attempt()}
WHERE callback_id = %(cid)s AND state = 'waiting_external' AND NOT ({_ATTEMPT_STILL_RUNS})
RETURNING {JOB_COLUMNS}"""

JOB_BY_CALLBACK = f"SELECT id FROM {S}.jobs WHERE callback_id = %s"

RESUME_EXTERNAL = f"""
UPDATE {S}.jobs
SET state = 'running', heartbeat_at = now(), callback_id = NULL, callback_timeout_at = NULL,
    metadata = metadata || %s::jsonb
WHERE callback_id = %s AND state = 'waiting_external'
RETURNING {JOB_COLUMNS}"""

HEARTBEAT_CALLBACK = f"""
UPDATE {S}.jobs SET callback_timeout_at = now() + %s * interval '1 second'
WHERE callback_id = %s AND state IN ('waiting_external', 'running')
RETURNING {JOB_COLUMNS}"""
