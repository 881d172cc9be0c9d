"""The dead-letter queue: moving failed jobs in (``dead_letter_if_enabled`` and the admin move),
listing, retrying (re-inserting under the same id) and purging entries.
"""

from awa_fast.sql.fragments import (
    _ATTEMPT_STILL_RUNS,
    _SETTLED_FAILED,
    FAILED_SLICES,
    JOB_COLUMNS,
    S,
)

DEAD_LETTER = f"SELECT {S}.dead_letter_if_enabled(%s, %s)"

# Rescue's dead-letter moves: the bulk form of DEAD_LETTER (same function, so the same guard).
DEAD_LETTER_MANY = f"""
SELECT m.id FROM unnest(%s::bigint[], %s::text[]) AS m(id, reason)
WHERE {S}.dead_letter_if_enabled(m.id, m.reason)"""

# A failed row whose dead-letter move failed stays failed (in either storage): say so in its
# errors.
_NOTE_DLQ_FAILED = """SET errors = errors || jsonb_build_array(jsonb_build_object(
    'error', 'dead-letter move failed: ' || %(error)s, 'at', now()))
WHERE id = %(id)s AND state = 'failed'"""
NOTE_DEAD_LETTER_FAILED = f"""
WITH h AS (UPDATE {S}.jobs {_NOTE_DLQ_FAILED})
UPDATE {S}.jobs_done {_NOTE_DLQ_FAILED}"""

# DLQ rows carry the job columns (JOB_COLUMNS order) followed by these three.
DLQ_COLUMNS = f"{JOB_COLUMNS}, dlq_reason, dlq_at, original_run_lease"

# Shared filter of the DLQ list / bulk statements (every parameter NULL = no filter).
_DLQ_FILTER = """
    (%(kind)s::text IS NULL OR kind = %(kind)s)
    AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    AND (%(tag)s::text IS NULL OR %(tag)s = ANY(tags))
    AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
    AND (%(before_dlq_at)s::timestamptz IS NULL OR dlq_at < %(before_dlq_at)s)"""

DLQ_LIST = f"""
SELECT {DLQ_COLUMNS} FROM {S}.dlq
WHERE {_DLQ_FILTER}
ORDER BY dlq_at DESC, id DESC LIMIT %(limit)s"""

DLQ_GET = f"SELECT {DLQ_COLUMNS} FROM {S}.dlq WHERE id = %s"

DLQ_DEPTH = f"SELECT count(*) FROM {S}.dlq WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)"

DLQ_DEPTH_BY_QUEUE = f"SELECT queue, count(*) FROM {S}.dlq GROUP BY queue ORDER BY queue"

# Re-enqueue dead-lettered rows under their own ids: attempt 0, run_lease 0, errors kept,
# available (scheduled for a future run_at), optional priority / queue overrides. A unique-key
# collision with a live job raises unique_violation and rolls the whole statement back.
_DLQ_REINSERT = f"""
INSERT INTO {S}.jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at,
                      created_at, errors, metadata, tags, unique_key, unique_states,
                      ordering_key, run_lease)
SELECT d.id, d.kind, COALESCE(%(to_queue)s::text, d.queue), d.args,
       (CASE WHEN %(run_at)s::timestamptz > now() THEN 'scheduled'
             ELSE 'available' END)::{S}.job_state,
       COALESCE(%(priority)s::smallint, d.priority), 0, d.max_attempts,
       GREATEST(COALESCE(%(run_at)s::timestamptz, now()), now()), d.created_at, d.errors,
       d.metadata, d.tags, d.unique_key, d.unique_states, d.ordering_key,
       d.run_lease  -- kept: a lease value is never reused, so a zombie attempt stays stale
FROM d ORDER BY d.unique_key, d.id  -- keys in the one global order (ids are kept)
RETURNING {JOB_COLUMNS}"""

# An entry whose attempt's handler still runs (its mark came along: an early fail_external, a
# deadline rescue of a live thread) stays in the DLQ until the worker clears it or it is stale.
_DLQ_NOT_LIVE = f"NOT ({_ATTEMPT_STILL_RUNS})"

DLQ_RETRY = f"""
WITH d AS (DELETE FROM {S}.dlq WHERE id = %(id)s AND {_DLQ_NOT_LIVE} RETURNING *)
{_DLQ_REINSERT}"""

DLQ_ATTEMPT_STILL_RUNS = f"""
SELECT heartbeat_at FROM {S}.dlq WHERE id = %(id)s AND {_ATTEMPT_STILL_RUNS}"""

# Bulk retry and its row-by-row twin share the filter.
DLQ_RETRY_BULK = f"""
WITH d AS (
    DELETE FROM {S}.dlq WHERE id IN (
        SELECT id FROM {S}.dlq WHERE {_DLQ_FILTER} AND {_DLQ_NOT_LIVE}
        ORDER BY id FOR UPDATE SKIP LOCKED)
    RETURNING *)
{_DLQ_REINSERT}"""

DLQ_MATCHING_IDS = f"SELECT id FROM {S}.dlq WHERE {_DLQ_FILTER} ORDER BY id"

DLQ_RETRY_ONE = f"""
WITH d AS (DELETE FROM {S}.dlq WHERE id = %(id)s AND {_DLQ_FILTER} AND {_DLQ_NOT_LIVE}
           RETURNING *)
{_DLQ_REINSERT}"""

# Admin move of failed jobs to the DLQ (whatever the queue's policy).
_MOVE_TO_DLQ = f"""
WITH h AS (
    DELETE FROM {S}.jobs WHERE id IN (
        SELECT j.id FROM {S}.jobs j WHERE {_SETTLED_FAILED} AND {{where}}
        ORDER BY j.id FOR UPDATE SKIP LOCKED)
    RETURNING *
), f AS (
    DELETE FROM {S}.jobs_done WHERE id IN (
        SELECT j.id FROM {S}.jobs_done j WHERE {_SETTLED_FAILED} AND {FAILED_SLICES}
          AND {{where}}
        ORDER BY j.id FOR UPDATE SKIP LOCKED)
    RETURNING *
)
INSERT INTO {S}.dlq
SELECT d.*, %(reason)s, now(), d.run_lease FROM (SELECT * FROM h UNION ALL SELECT * FROM f) d
RETURNING id"""

DLQ_MOVE_ONE = _MOVE_TO_DLQ.format(where="j.id = %(id)s")

DLQ_MOVE_BULK = _MOVE_TO_DLQ.format(where="true")
# (its candidates are SETTLED_FAILED_IDS; its row-by-row twin is DLQ_MOVE_ONE)

DLQ_PURGE_ONE = f"DELETE FROM {S}.dlq WHERE id = %s"

DLQ_PURGE = f"DELETE FROM {S}.dlq WHERE {_DLQ_FILTER} RETURNING id"

DLQ_PURGE_MATCHING_ONE = f"DELETE FROM {S}.dlq WHERE id = %(id)s AND {_DLQ_FILTER} RETURNING id"

DUMP_DLQ_JOB = f"SELECT to_jsonb(d) FROM {S}.dlq d WHERE id = %s"
