"""Batch operations: awa_fast/batch_ops.py, migration 008."""

from awa_fast.sql.fragments import S

# The rows an operation may change (guard of the scan, the bulk apply and its row-by-row twin).
_BATCH_ELIGIBLE = "j.state IN ('available', 'scheduled')"

# awa's structured filter (ADR-030) over the operation-eligible rows (available, scheduled);
# every field optional, all intersected. Shared by preview and scan (one population).
_BATCH_MATCH = f"""
{_BATCH_ELIGIBLE}
AND (%(f_kind)s::text IS NULL OR j.kind = %(f_kind)s)
AND (%(f_queue)s::text IS NULL OR j.queue = %(f_queue)s)
AND (%(f_ids)s::bigint[] IS NULL OR j.id = ANY(%(f_ids)s::bigint[]))
AND (%(f_tag)s::text IS NULL OR %(f_tag)s = ANY(j.tags))
AND (%(f_state)s::text IS NULL OR j.state::text = %(f_state)s)
AND (%(f_gte)s::timestamptz IS NULL OR j.created_at >= %(f_gte)s)
AND (%(f_lt)s::timestamptz IS NULL OR j.created_at < %(f_lt)s)"""

BATCH_PREVIEW = f"""
SELECT count(*) OVER () AS total_matched, j.id, j.kind, j.queue, j.state::text, j.priority
FROM {S}.jobs j WHERE {_BATCH_MATCH} ORDER BY j.id LIMIT %(sample)s"""

BATCH_COUNT = f"SELECT count(*) FROM {S}.jobs j WHERE {_BATCH_MATCH}"

BATCH_OPERATION_COLUMNS = (
    "id::text, op_kind, filter, spec, state, submitted_by, submitted_at, started_at, "
    "finalized_at, cursor, total_matched, processed, skipped, errored, last_error, "
    "runner_instance, retention_until, updated_at"
)

BATCH_SUBMIT = f"""
INSERT INTO {S}.batch_operations (op_kind, filter, spec, submitted_by)
VALUES (%(op_kind)s, %(filter)s::jsonb, %(spec)s::jsonb, COALESCE(%(submitted_by)s, session_user))
RETURNING {BATCH_OPERATION_COLUMNS}"""

BATCH_GET = f"SELECT {BATCH_OPERATION_COLUMNS} FROM {S}.batch_operations WHERE id = %s"

BATCH_LIST = f"""
SELECT {BATCH_OPERATION_COLUMNS} FROM {S}.batch_operations
WHERE (%(state)s::text IS NULL OR state = %(state)s) ORDER BY submitted_at DESC, id LIMIT %(limit)s"""

# Cancellation is cooperative: an active operation is marked, the runner finalizes it.
BATCH_CANCEL = f"""
UPDATE {S}.batch_operations SET state = 'cancelling', updated_at = clock_timestamp()
WHERE id = %(id)s AND state IN ('pending', 'scanning', 'running')
RETURNING {BATCH_OPERATION_COLUMNS}"""

BATCH_PURGE = f"""
DELETE FROM {S}.batch_operations WHERE id IN (
    SELECT id FROM {S}.batch_operations
    WHERE finalized_at IS NOT NULL AND finalized_at < %(before)s LIMIT %(limit)s)"""

BATCH_RETENTION_PRUNE = f"""
DELETE FROM {S}.batch_operations WHERE finalized_at IS NOT NULL AND retention_until < now()"""

# The runner (leader): the oldest active operation, locked so one runner works it at a time.
BATCH_NEXT = f"""
SELECT id, op_kind, filter, spec, state FROM {S}.batch_operations
WHERE finalized_at IS NULL ORDER BY submitted_at, id LIMIT 1 FOR UPDATE SKIP LOCKED"""

BATCH_SCAN = f"""
WITH items AS (
    INSERT INTO {S}.batch_operation_items (operation_id, job_id)
    SELECT %(op)s, j.id FROM {S}.jobs j WHERE {_BATCH_MATCH}
    ON CONFLICT DO NOTHING RETURNING 1
)
UPDATE {S}.batch_operations
SET state = 'running', started_at = clock_timestamp(), total_matched = (SELECT count(*) FROM items),
    runner_instance = %(runner)s, updated_at = clock_timestamp()
WHERE id = %(op)s"""

BATCH_PENDING_ITEMS = f"""
SELECT job_id FROM {S}.batch_operation_items
WHERE operation_id = %(op)s AND state = 'pending' ORDER BY job_id LIMIT %(limit)s"""

# One guarded mutation for both kinds: still eligible rows only. set_priority keeps aging's
# base (_awa_original_priority) equal to the new priority when aging already stamped it;
# move_queue stamps _awa_original_queue once.
_BATCH_APPLY = f"""
UPDATE {S}.jobs j
SET priority = COALESCE(%(priority)s::smallint, j.priority),
    queue = COALESCE(%(queue)s::text, j.queue),
    metadata = j.metadata
        || CASE WHEN %(priority)s::smallint IS NOT NULL AND j.metadata ? '_awa_original_priority'
                THEN jsonb_build_object('_awa_original_priority', %(priority)s::smallint)
                ELSE '{{}}'::jsonb END
        || CASE WHEN %(queue)s::text IS NOT NULL AND NOT j.metadata ? '_awa_original_queue'
                THEN jsonb_build_object('_awa_original_queue', j.queue) ELSE '{{}}'::jsonb END
WHERE {_BATCH_ELIGIBLE} AND"""

BATCH_APPLY = _BATCH_APPLY + " j.id = ANY(%(ids)s::bigint[]) RETURNING j.id, j.queue, j.state::text"

BATCH_APPLY_ONE = _BATCH_APPLY + " j.id = %(id)s RETURNING j.id, j.queue, j.state::text"

BATCH_ITEMS_DONE = f"""
UPDATE {S}.batch_operation_items i
SET state = CASE WHEN i.job_id = ANY(%(done)s::bigint[]) THEN 'processed'
                 WHEN i.job_id = ANY(%(failed)s::bigint[]) THEN 'errored' ELSE 'skipped' END,
    error = (%(errors)s::jsonb) ->> i.job_id::text, processed_at = clock_timestamp()
WHERE i.operation_id = %(op)s AND i.job_id = ANY(%(ids)s::bigint[])"""

BATCH_COUNTS = f"""
UPDATE {S}.batch_operations
SET processed = processed + %(processed)s, skipped = skipped + %(skipped)s,
    errored = errored + %(errored)s, last_error = COALESCE(%(last_error)s, last_error),
    cursor = jsonb_build_object('last_job_id', %(last_id)s::bigint), updated_at = clock_timestamp()
WHERE id = %(op)s"""

BATCH_FINALIZE = f"""
UPDATE {S}.batch_operations
SET state = %(state)s, finalized_at = clock_timestamp(),
    retention_until = clock_timestamp() + %(retention_s)s * interval '1 second',
    updated_at = clock_timestamp()
WHERE id = %(op)s"""
