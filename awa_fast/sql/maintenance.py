"""The maintenance passes: promotion of due jobs, rescue of stale / past-deadline attempts and
expired callback waits, retention (jobs and DLQ), priority aging, pruning of worker presence
and of unread callback expressions. Each bulk pass has a row-by-row twin with the same guard
(``ISOLATED``).
"""

from awa_fast.sql.fragments import (
    _OWES,
    _STALENESS,
    S,
    _cancel_duplicate,
    _rescue_set,
    by_ids,
    skipping,
)

# The row-by-row redo's candidate statements (DUE_IDS, RESCUE_CANDIDATES, ...) leave out the
# ids in %(skip)s (bigint[]): the rows earlier passes left unchanged, retried apart
# (bulk.run_isolated with batch), so a batch of refused rows at the head cannot hide the rest.

# Promotion guard (bulk and row by row): due scheduled / retryable rows -- except one whose
# previous attempt still runs (a deadline rescue of a live def-handler thread keeps the
# "still running" mark, see _ATTEMPT_STILL_RUNS): it waits until the mark is cleared or stale.
_DUE = f"""j.state IN ('scheduled', 'retryable') AND j.run_at <= now()
      AND NOT (j.heartbeat_at IS NOT NULL
               AND j.heartbeat_at > now() - {_STALENESS})"""

# Due twins (rows locked here that share a unique key their masks hold in 'available'): the
# first by (run_at, id) is promoted, the others would collide with it, an expected case and
# not a reason to redo the pass row by row -- they are cancelled as duplicates in the same
# statement, as the row-by-row redo would. Rows: (id, queue, cancelled).
_HOLDS_AVAILABLE = f"(%s.unique_states & (1 << {S}.state_bit('available'))) <> 0"

PROMOTE = f"""
WITH d AS (
    SELECT j.id, j.run_at, j.unique_key, j.unique_states FROM {S}.jobs j WHERE {_DUE}
    ORDER BY j.run_at, j.id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), twin AS (
    SELECT d.id FROM d
    WHERE d.unique_key IS NOT NULL AND {_HOLDS_AVAILABLE % "d"}
      AND EXISTS (SELECT 1 FROM d e
                  WHERE e.unique_key = d.unique_key AND {_HOLDS_AVAILABLE % "e"}
                    AND (e.run_at, e.id) < (d.run_at, d.id))
), due AS (
    SELECT d.id FROM d WHERE d.id NOT IN (SELECT twin.id FROM twin)
), promoted AS (
    UPDATE {S}.jobs j SET state = 'available' WHERE {by_ids("due")}
    RETURNING j.id, j.queue
), cancelled AS (
    {_cancel_duplicate("NULL").strip()}
    WHERE {by_ids("twin")}
    RETURNING j.id, j.queue
)
SELECT id, queue, false FROM promoted
UNION ALL SELECT id, queue, true FROM cancelled"""

DUE_IDS = f"""
SELECT j.id FROM {S}.jobs j WHERE {_DUE} AND {skipping("j")}
ORDER BY j.run_at, j.id LIMIT %(limit)s"""

PROMOTE_ONE = f"""
UPDATE {S}.jobs j SET state = 'available' WHERE j.id = %(id)s AND {_DUE}
RETURNING j.id, j.queue, false"""

# Rescue guards (bulk, candidates, row by row and the duplicate cancel share them): a running
# attempt whose heartbeat is stale or whose deadline passed; a parked job whose callback timed out.
# A stale heartbeat never rescues an attempt the rescuing process itself still runs
# (%(own)s: its live attempts' job ids): its beats only stalled (issue 28, docs/architecture.md
# "Which executions can overlap").
_STALE = f"""j.state = 'running'
      AND ((j.heartbeat_at < now() - {_STALENESS} AND j.id <> ALL(%(own)s::bigint[]))
           OR (j.deadline_at IS NOT NULL AND j.deadline_at < now()))"""

_CALLBACK_EXPIRED = "j.state = 'waiting_external' AND j.callback_timeout_at < now()"

RESCUE_CANDIDATES = f"""
SELECT j.id FROM {S}.jobs j WHERE {_STALE} AND {skipping("j")} ORDER BY j.id LIMIT %(limit)s"""

RESCUE_CALLBACK_CANDIDATES = f"""
SELECT j.id FROM {S}.jobs j WHERE {_CALLBACK_EXPIRED} AND {skipping("j")}
ORDER BY j.id LIMIT %(limit)s"""

# A rescued attempt whose heartbeat is still fresh (deadline passed or callback timed out while
# the worker lives: a def handler's thread cannot be stopped) keeps heartbeat_at as its "still
# running" mark: promotion and retries wait until the worker clears it or it goes stale.
_KEEP_FRESH_MARK = f"""CASE WHEN j.heartbeat_at > now() - {_STALENESS}
                        THEN j.heartbeat_at END"""

# Rescue's per-row fallback: only a row that is still the stale attempt being rescued (a live
# attempt's fresh mark is kept, as rescue keeps it).
CANCEL_RESCUED_DUPLICATE = f"""{_cancel_duplicate(_KEEP_FRESH_MARK)}WHERE j.id = %(id)s
  AND (({_STALE}) OR ({_CALLBACK_EXPIRED}))"""

# ... a due scheduled/retryable row whose promotion collided.
CANCEL_AS_DUPLICATE = f"""{_cancel_duplicate("NULL")}WHERE j.id = %(id)s AND {_DUE}"""

RESCUE = f"""
WITH r AS (
    SELECT id,
           CASE WHEN deadline_at IS NOT NULL AND deadline_at < now() THEN 'deadline_exceeded'
                ELSE 'stale_heartbeat' END AS rescue_reason,
           CASE WHEN deadline_at IS NOT NULL AND deadline_at < now() THEN 'deadline_exhausted'
                ELSE 'rescue_exhausted' END AS exhausted_reason,
           CASE WHEN deadline_at IS NOT NULL AND deadline_at < now() THEN 'hard deadline exceeded'
                ELSE 'heartbeat stale: worker presumed dead' END AS message,
           {_OWES} AS owes
    FROM {S}.jobs j
    WHERE {_STALE}
      AND (%(only)s::bigint IS NULL OR id = %(only)s)
    ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE {S}.jobs j SET {_rescue_set(_KEEP_FRESH_MARK)}, run_at = now()
FROM r WHERE {by_ids("r")} AND j.id = r.id
RETURNING j.id, j.kind, j.state::text, r.rescue_reason, r.exhausted_reason"""

# Parked jobs whose callback timed out: retried with backoff, or failed on the final attempt.
RESCUE_CALLBACKS = f"""
WITH r AS (
    SELECT id, 'expired_callback' AS rescue_reason, 'callback_timeout' AS exhausted_reason,
           'callback timed out' AS message, {_OWES} AS owes
    FROM {S}.jobs j
    WHERE {_CALLBACK_EXPIRED}
      AND (%(only)s::bigint IS NULL OR id = %(only)s)
    ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE {S}.jobs j SET {_rescue_set(_KEEP_FRESH_MARK)},
    run_at = now() + LEAST(power(2, j.attempt) * (1 + random() * 0.25), 86400) * interval '1 second'
FROM r WHERE {by_ids("r")} AND j.id = r.id
RETURNING j.id, j.kind, j.state::text, r.rescue_reason, r.exhausted_reason"""

# Finished jobs are pruned by truncating whole slices of jobs_done (sql/finished.py, ADR 016),
# row by row only past a queue's shorter retention or the ring's span (ADR 029). A row whose failure consequence is still owed stays in the hot
# table, so no slice ever holds a debt (models/settlement.pml, nothing_owed_is_lost).

# Maintenance: DLQ retention (independent of the jobs' retention).
_DLQ_PRUNABLE = "d.dlq_at < now() - %(dlq_s)s * interval '1 second'"

PRUNE_DLQ = f"""
DELETE FROM {S}.dlq WHERE id IN (
    SELECT d.id FROM {S}.dlq d WHERE {_DLQ_PRUNABLE} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING id"""

PRUNE_DLQ_IDS = f"""
SELECT d.id FROM {S}.dlq d WHERE {_DLQ_PRUNABLE} AND {skipping("d")} LIMIT %(limit)s"""

# (row by row after the bulk statement failed: a row another session holds is skipped too)
PRUNE_DLQ_ONE = f"""
DELETE FROM {S}.dlq WHERE id = (
    SELECT d.id FROM {S}.dlq d WHERE d.id = %(id)s AND {_DLQ_PRUNABLE} FOR UPDATE SKIP LOCKED)
RETURNING id"""

# Priority aging (awa's ADR-005 rule): an available job waiting k whole intervals has priority
# max(1, original - k); the original is kept in metadata._awa_original_priority. Computed from
# run_at, so repeated or concurrent passes agree (no leader needed). Params: queue, interval_ms,
# limit. Returns the aged ids.
AGE_PRIORITIES = f"""
WITH c AS (
    SELECT id, COALESCE((metadata->>'_awa_original_priority')::int, priority) AS orig,
           GREATEST(1, COALESCE((metadata->>'_awa_original_priority')::int, priority)
               - floor(extract(epoch FROM now() - run_at) * 1000 / %(interval_ms)s))::smallint AS p
    FROM {S}.jobs
    WHERE state = 'available' AND queue = %(queue)s AND priority > 1
      AND run_at <= now() - %(interval_ms)s * interval '1 millisecond'
      AND GREATEST(1, COALESCE((metadata->>'_awa_original_priority')::int, priority)
               - floor(extract(epoch FROM now() - run_at) * 1000 / %(interval_ms)s)) < priority
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {S}.jobs j
SET priority = c.p,
    metadata = j.metadata || jsonb_build_object('_awa_original_priority', c.orig)
FROM c WHERE {by_ids("c")} AND j.id = c.id AND j.state = 'available'
RETURNING j.id"""

WORKERS_PRUNE = f"DELETE FROM {S}.workers WHERE expires_at < now() - interval '1 hour'"

# Expressions of callbacks no job waits on any more (resolved, completed, timed out, pruned).
CALLBACK_EXPRESSIONS_PRUNE = f"""
DELETE FROM {S}.callback_expressions e
WHERE NOT EXISTS (SELECT 1 FROM {S}.jobs j WHERE j.id = e.job_id AND j.callback_id = e.callback_id)"""
