"""Outcomes of an attempt, every one guarded by ``(id, run_lease, state = 'running')``:
completion (batched, per job, with follow-ups), the other transitions, prompt failure,
heartbeats and progress, and the duplicate cancel of a completion that collided.
"""

from awa_fast.sql.enqueue import _follow_ups_insert
from awa_fast.sql.fragments import (
    _BY_BATCH_IDS,
    _OWES,
    ALL_COLUMNS,
    COMPLETED_ROW,
    S,
    _cancel_duplicate,
    _rescue_set,
    by_ids,
    moved_row,
)

# The compact path: one guarded statement per batch; the caller sorts ids so batches lock in order.
# The completed rows leave the hot table in the statement: deleted there, appended to jobs_done
# (whose statement trigger counts them and holds their unique keys, ADR 016).
COMPLETE_MANY = f"""
WITH b AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[]) AS b(id, lease)), d AS (
    DELETE FROM {S}.jobs j USING b
    WHERE {_BY_BATCH_IDS} AND j.id = b.id AND j.run_lease = b.lease AND j.state = 'running'
    RETURNING j.*
)
INSERT INTO {S}.jobs_done ({ALL_COLUMNS})
SELECT {moved_row("d", COMPLETED_ROW)} FROM d
RETURNING id, run_lease"""

# Every other outcome of an attempt: one guarded statement. delay is seconds (NULL keeps run_at);
# error is a one-element JSON array appended to errors (NULL appends nothing).
TRANSITION = f"""
UPDATE {S}.jobs
SET state = %(state)s::{S}.job_state,
    attempt = attempt + %(attempt_delta)s,
    run_at = CASE WHEN %(delay)s::float8 IS NULL THEN run_at
                  ELSE now() + %(delay)s::float8 * interval '1 second' END,
    finalized_at = CASE WHEN %(state)s IN ('completed', 'failed', 'cancelled') THEN now() END,
    errors = CASE WHEN %(error)s::jsonb IS NULL THEN errors ELSE errors || %(error)s::jsonb END,
    progress = CASE WHEN %(state)s = 'completed' THEN NULL
                    ELSE COALESCE(%(progress)s::jsonb, progress) END,
    heartbeat_at = NULL, deadline_at = NULL,
    callback_id = CASE WHEN %(state)s = 'waiting_external' THEN callback_id END,
    callback_timeout_at = CASE WHEN %(state)s = 'waiting_external' THEN callback_timeout_at END
WHERE id = %(id)s AND run_lease = %(lease)s AND state = 'running'
RETURNING id"""

# Rows another statement holds are skipped: they are being finalized right now. The attempts
# that were beaten come back as (id, run_lease): only their progress counts as written. An
# attempt whose row left 'running' while its handler lives on (cancelled, parked in
# wait_for_callback, failed or completed externally) keeps its "still running" mark fresh
# (heartbeat_at; see _ATTEMPT_STILL_RUNS). A running row past its deadline whose mark is
# cleared is one the worker abandoned and acknowledged (ACK_ATTEMPT_ENDED): a beat built before
# that acknowledgement and run after it must not mark it again, or rescue would keep a fresh
# mark and its retry would wait for the mark to go stale.
HEARTBEAT = f"""
WITH b AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::jsonb[]) AS b(id, lease, progress)),
l AS (
    SELECT j.id, j.state, b.progress FROM {S}.jobs j JOIN b ON j.id = b.id AND j.run_lease = b.lease
    WHERE {_BY_BATCH_IDS}
      AND (j.heartbeat_at IS NOT NULL
           OR (j.state = 'running' AND (j.deadline_at IS NULL OR j.deadline_at >= now())))
    ORDER BY j.id FOR UPDATE OF j SKIP LOCKED
)
UPDATE {S}.jobs j SET heartbeat_at = now(),
    progress = CASE WHEN l.state = 'running' THEN COALESCE(l.progress, j.progress)
                    ELSE j.progress END
FROM l WHERE {by_ids("l")} AND j.id = l.id
RETURNING j.id, j.run_lease"""

# ... and the mark of an attempt whose job was dead-lettered while its handler lives on (an
# early fail_external, a deadline rescue on the final attempt): a DLQ retry waits for it.
HEARTBEAT_DLQ_MARKS = f"""
UPDATE {S}.dlq d SET heartbeat_at = now()
FROM unnest(%s::bigint[], %s::bigint[]) AS b(id, lease)
WHERE d.id = b.id AND d.run_lease = b.lease AND d.heartbeat_at IS NOT NULL"""

# The worker is done with an attempt whose row had left 'running' (its handler returned or its
# thread finished) or that it abandoned at its deadline: clear the "still running" mark (in
# jobs, or in the DLQ entry it was carried into), so promotion or a retry may start a new
# attempt. A running row past its deadline keeps no heartbeat: deadline rescue takes it.
ACK_ATTEMPT_ENDED = f"""
WITH d AS (
    UPDATE {S}.dlq SET heartbeat_at = NULL
    WHERE id = %(id)s AND run_lease = %(lease)s AND heartbeat_at IS NOT NULL
)
UPDATE {S}.jobs SET heartbeat_at = NULL, state = state  -- a finished row then moves (ADR 016)
WHERE id = %(id)s AND run_lease = %(lease)s AND heartbeat_at IS NOT NULL
  AND (state <> 'running' OR deadline_at < now())"""

FLUSH_PROGRESS = f"""
UPDATE {S}.jobs SET progress = %s::jsonb
WHERE id = %s AND run_lease = %s AND state = 'running'"""

# ... an attempt whose completion (finalizer) collided.
CANCEL_DUPLICATE_ATTEMPT = (
    f"""{_cancel_duplicate("NULL")}WHERE id = %s AND run_lease = %s AND state = 'running'"""
)

# ... an attempt whose inline park (wait_for_callback) collided: its handler lives on, so the row
# gets the "this attempt still runs" mark (a retry waits for it; the heartbeat keeps it fresh).
CANCEL_DUPLICATE_PARKING = (
    f"""{_cancel_duplicate("now()")}WHERE id = %s AND run_lease = %s AND state = 'running'"""
)

# Prompt failure (ADR-046's open extension): an attempt whose finalize failed for good is failed
# at once, guarded by its lease, the way rescue would fail it -- retryable with backoff, or on
# the final attempt failed / consequence_pending -- but with the real error and no inserts.
FAIL_ATTEMPT = f"""
WITH r AS (
    SELECT id, 'exhausted' AS exhausted_reason, %(message)s::text AS message, {_OWES} AS owes
    FROM {S}.jobs j WHERE id = %(id)s AND run_lease = %(lease)s AND state = 'running'
    FOR UPDATE
)
UPDATE {S}.jobs j SET {_rescue_set("NULL")},
    run_at = now() + LEAST(power(2, j.attempt) * (1 + random() * 0.25), 86400) * interval '1 second'
FROM r WHERE j.id = r.id
RETURNING j.state::text"""

APPEND_ERROR = f"""
UPDATE {S}.jobs SET errors = errors || %(error)s::jsonb,
    progress = COALESCE(%(progress)s::jsonb, progress)
WHERE id = %(id)s"""


# One statement, one implicit transaction: the guarded completion, then its follow-ups (a held
# key skipped). awa_fast.defer_notify (transaction-local, set first) keeps the insert trigger from
# NOTIFYing inside this transaction (migration 009: a NOTIFY serializes commits database-wide);
# the finalizer notifies the returned queues of available follow-ups after the commit.
# Params: id, run_lease, follow-ups JSON. Returns (applied 0/1, inserted, held keys inserted,
# queues to wake).
COMPLETE_WITH_FOLLOW_UPS = f"""
WITH quiet AS (
    SELECT set_config('{S}.defer_notify', 'on', true)
), done AS (
    DELETE FROM {S}.jobs
    WHERE id = %s AND run_lease = %s AND state = 'running'
    RETURNING *
), fin AS (
    INSERT INTO {S}.jobs_done ({ALL_COLUMNS})
    SELECT {moved_row("d", COMPLETED_ROW)} FROM done d
    RETURNING unique_key, unique_states
), ins AS (
    {_follow_ups_insert("EXISTS (SELECT 1 FROM done)", completing="fin")}
    RETURNING unique_key, queue, state
)
SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM ins),
       ARRAY(SELECT unique_key FROM ins WHERE unique_key IS NOT NULL),
       ARRAY(SELECT DISTINCT queue FROM ins WHERE state = 'available')
FROM quiet"""

# Opt-in (start(staged_completions="batched")): many completions with follow-ups in ONE
# statement. Each trigger's follow-ups are inserted only if its own guarded transition matched,
# in (trigger, order) order; duplicate keys are skipped. Any other error fails the statement
# and the finalizer redoes the batch job by job (so one bad job cannot roll back the others).
COMPLETE_MANY_WITH_FOLLOW_UPS = f"""
WITH b AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[]) AS b(id, lease)), done AS (
    DELETE FROM {S}.jobs j USING b
    WHERE {_BY_BATCH_IDS} AND j.id = b.id AND j.run_lease = b.lease AND j.state = 'running'
    RETURNING j.*
), fin AS (
    INSERT INTO {S}.jobs_done ({ALL_COLUMNS})
    SELECT {moved_row("d", COMPLETED_ROW)} FROM done d
    RETURNING unique_key, unique_states
), ins AS (
    -- by (job, lease): two attempts of one job may share a batch; only the current one counts
    {_follow_ups_insert("(r.trigger, r.lease) IN (SELECT id, run_lease FROM done)", completing="fin")}
    RETURNING 1
)
SELECT ARRAY(SELECT id FROM done), ARRAY(SELECT run_lease FROM done),
       (SELECT count(*) FROM ins)"""
