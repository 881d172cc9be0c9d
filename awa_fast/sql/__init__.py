"""Named SQL statements: every query awa-fast runs lives here.

Conventions: every transition after a claim is guarded by ``id``, ``state = 'running'`` and
``run_lease``; statements that lock many rows lock them in id order or with SKIP LOCKED, and
statements that take many unique keys take them in key order, so two of them cannot deadlock
each other. Bulk statements and their row-by-row twins share one guard fragment (``ISOLATED``).
"""

S = "awa_fast"

JOB_COLUMNS = (
    "id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, "
    "deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, "
    "unique_states, callback_id, callback_timeout_at, run_lease, progress"
)
J_JOB_COLUMNS = ", ".join("j." + c.strip() for c in JOB_COLUMNS.split(","))

_INSERT_TARGET = (
    f"INSERT INTO {S}.jobs (kind, queue, args, state, priority, max_attempts, run_at, metadata, "
    "tags, unique_key, unique_states, ordering_key)"
)
# Any explicit run_at, even past, makes the job scheduled (awa-pg's rule; promotion makes it
# available when due); none makes it available now.
_INSERT_PROJECTION = f"""
SELECT v.kind, v.queue, v.args::jsonb,
       (CASE WHEN v.run_at IS NOT NULL THEN 'scheduled' ELSE 'available' END)::{S}.job_state,
       v.priority, v.max_attempts, COALESCE(v.run_at, now()), v.metadata::jsonb, v.tags,
       v.unique_key, v.unique_states, v.ordering_key"""

INSERT_ONE = f"""{_INSERT_TARGET}{_INSERT_PROJECTION}
FROM (VALUES (%s::text, %s::text, %s::text, %s::smallint, %s::smallint, %s::timestamptz, %s::text,
              %s::text[], %s::bytea, %s::smallint, %s::bytea))
     AS v(kind, queue, args, priority, max_attempts, run_at, metadata, tags, unique_key,
          unique_states, ordering_key)
RETURNING {JOB_COLUMNS}"""

# Tags travel as one JSON array per row: Postgres arrays cannot be ragged.
_INSERT_MANY_ROWS = """
FROM (SELECT {id}u.kind, u.queue, u.args, u.priority, u.max_attempts, u.run_at, u.metadata,
             CASE WHEN u.tags = '[]' THEN '{{}}'::text[]
                  ELSE ARRAY(SELECT jsonb_array_elements_text(u.tags::jsonb)) END AS tags,
             u.unique_key, u.unique_states, u.ordering_key
      FROM unnest(%s::text[], %s::text[], %s::text[], %s::smallint[], %s::smallint[],
                  %s::timestamptz[], %s::text[], %s::text[], %s::bytea[], %s::smallint[],
                  %s::bytea[]){ordinality}
           AS u(kind, queue, args, priority, max_attempts, run_at, metadata, tags, unique_key,
                unique_states, ordering_key{ord}){order}) AS v"""

INSERT_MANY = f"""{_INSERT_TARGET}{_INSERT_PROJECTION}{_INSERT_MANY_ROWS.format(id="", ordinality="", ord="", order="")}
RETURNING {JOB_COLUMNS}"""

# A batch with unique keys: ids are drawn in input order, rows are inserted in unique-key order
# (one global order of key locks, so two batches over the same keys cannot deadlock each other;
# the caller puts the returned rows back in id order).
_INSERT_TARGET_WITH_ID = _INSERT_TARGET.replace("(kind,", "(id, kind,", 1)
INSERT_MANY_KEYED = f"""{_INSERT_TARGET_WITH_ID}
SELECT v.id, {_INSERT_PROJECTION.split("SELECT ", 1)[1]}
{
    _INSERT_MANY_ROWS.format(
        id=f"nextval('{S}.jobs_id_seq') AS id, ",
        ordinality=" WITH ORDINALITY",
        ord=", ord",
        order=" ORDER BY u.ord",
    )
}
ORDER BY v.unique_key
RETURNING {JOB_COLUMNS}"""

COPY_RESERVE = f"SELECT now(), array_agg(nextval('{S}.jobs_id_seq')) FROM generate_series(1, %s)"
COPY_JOBS = (
    f"COPY {S}.jobs (id, kind, queue, args, state, priority, max_attempts, run_at, metadata, "
    "tags, unique_key, unique_states, ordering_key, created_at) FROM STDIN"
)

GET_JOB = f"SELECT {JOB_COLUMNS} FROM {S}.jobs WHERE id = %s"


# A row's unique key is held by ANOTHER row (that row's state is in that row's mask): the
# predicate of idx_awa_fast_jobs_unique, so the lookup uses that index.
def _key_held_by_other(alias: str) -> str:
    return (
        f"EXISTS (SELECT 1 FROM {S}.jobs h WHERE h.unique_key = {alias}.unique_key "
        f"AND h.id <> {alias}.id AND h.unique_key IS NOT NULL "
        f"AND (h.unique_states & (1 << {S}.state_bit(h.state))) <> 0)"
    )


# Claim guard (bulk and row by row). A row whose mask holds 'running' (bit 4) is not claimed
# while another row holds its key: it stays available until the key is free (one running
# attempt per key), so the claim never collides on idx_awa_fast_jobs_unique.
_CLAIMABLE = f"""j.state = 'available' AND j.queue = %(queue)s
      -- only kinds this process has handlers for: the rest wait for a worker that has one
      AND j.kind = ANY(%(kinds)s::text[])
      AND NOT EXISTS (SELECT 1 FROM {S}.queue_meta m WHERE m.queue = %(queue)s AND m.paused)
      AND NOT (j.unique_key IS NOT NULL AND (j.unique_states & 4) <> 0
               AND {_key_held_by_other("j")})"""

_CLAIM_SET = f"""
UPDATE {S}.jobs j
SET state = 'running', attempt = j.attempt + 1, run_lease = j.run_lease + 1,
    attempted_at = now(), heartbeat_at = now(),
    deadline_at = CASE WHEN %(deadline_ms)s > 0
                       THEN now() + %(deadline_ms)s * interval '1 millisecond' END"""

_CLAIM_RETURNING = """
RETURNING j.id, j.kind, j.queue, j.args, j.priority, j.attempt, j.max_attempts, j.run_at,
          j.deadline_at, j.created_at, j.errors::text, j.metadata::text, j.tags, j.run_lease,
          j.progress"""

# Two available rows sharing a key their mask holds in 'running': at most one (the lowest id)
# is claimed per statement; the other stays available.
CLAIM = f"""
WITH c AS (
    SELECT j.id, j.unique_key, (j.unique_key IS NOT NULL AND (j.unique_states & 4) <> 0) AS takes
    FROM {S}.jobs j
    WHERE {_CLAIMABLE}
    ORDER BY j.priority, j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), k AS (
    SELECT c.id FROM c
    WHERE NOT c.takes
       OR c.id = (SELECT min(o.id) FROM c o WHERE o.takes AND o.unique_key = c.unique_key)
){_CLAIM_SET}
FROM k WHERE j.id = k.id{_CLAIM_RETURNING}"""

# Row-by-row twin of CLAIM (same guard): its candidates, then one row each.
CLAIM_CANDIDATES = f"""
SELECT j.id FROM {S}.jobs j WHERE {_CLAIMABLE}
ORDER BY j.priority, j.run_at, j.id LIMIT %(limit)s"""

CLAIM_ONE = f"""{_CLAIM_SET}
WHERE j.id = %(id)s AND {_CLAIMABLE}{_CLAIM_RETURNING}"""

# (errors and metadata come back as text: the handler's job decodes them only when read.)

# The compact path: one guarded statement per batch; the caller sorts ids so batches lock in order.
COMPLETE_MANY = f"""
UPDATE {S}.jobs j
SET state = 'completed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
    progress = NULL, callback_id = NULL, callback_timeout_at = NULL
FROM unnest(%s::bigint[], %s::bigint[]) AS b(id, lease)
WHERE j.id = b.id AND j.run_lease = b.lease AND j.state = 'running'
RETURNING j.id, j.run_lease"""

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
# (heartbeat_at; see _ATTEMPT_STILL_RUNS).
HEARTBEAT = f"""
WITH b AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::jsonb[]) AS b(id, lease, progress)),
l AS (
    SELECT j.id, j.state, b.progress FROM {S}.jobs j JOIN b ON j.id = b.id AND j.run_lease = b.lease
    WHERE j.state = 'running' OR j.heartbeat_at IS NOT NULL
    ORDER BY j.id FOR UPDATE OF j SKIP LOCKED
)
UPDATE {S}.jobs j SET heartbeat_at = now(),
    progress = CASE WHEN l.state = 'running' THEN COALESCE(l.progress, j.progress)
                    ELSE j.progress END
FROM l WHERE j.id = l.id
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
UPDATE {S}.jobs SET heartbeat_at = NULL
WHERE id = %(id)s AND run_lease = %(lease)s AND heartbeat_at IS NOT NULL
  AND (state <> 'running' OR deadline_at < now())"""

FLUSH_PROGRESS = f"""
UPDATE {S}.jobs SET progress = %s::jsonb
WHERE id = %s AND run_lease = %s AND state = 'running'"""

# Promotion guard (bulk and row by row): due scheduled / retryable rows -- except one whose
# previous attempt still runs (a deadline rescue of a live def-handler thread keeps the
# "still running" mark, see _ATTEMPT_STILL_RUNS): it waits until the mark is cleared or stale.
_DUE = """j.state IN ('scheduled', 'retryable') AND j.run_at <= now()
      AND NOT (j.heartbeat_at IS NOT NULL
               AND j.heartbeat_at > now() - %(stale_ms)s * interval '1 millisecond')"""

PROMOTE = f"""
WITH d AS (
    SELECT j.id FROM {S}.jobs j WHERE {_DUE}
    ORDER BY j.run_at, j.id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE {S}.jobs j SET state = 'available' FROM d WHERE j.id = d.id
RETURNING j.id, j.queue"""

DUE_IDS = f"""
SELECT j.id FROM {S}.jobs j WHERE {_DUE} ORDER BY j.run_at, j.id LIMIT %(limit)s"""

PROMOTE_ONE = f"""
UPDATE {S}.jobs j SET state = 'available' WHERE j.id = %(id)s AND {_DUE}
RETURNING j.id, j.queue"""

# Rescue guards (bulk, candidates, row by row and the duplicate cancel share them): a running
# attempt whose heartbeat is stale or whose deadline passed; a parked job whose callback timed out.
_STALE = """j.state = 'running'
      AND (j.heartbeat_at < now() - %(stale_ms)s * interval '1 millisecond'
           OR (j.deadline_at IS NOT NULL AND j.deadline_at < now()))"""
_CALLBACK_EXPIRED = "j.state = 'waiting_external' AND j.callback_timeout_at < now()"

RESCUE_CANDIDATES = f"""
SELECT j.id FROM {S}.jobs j WHERE {_STALE} ORDER BY j.id LIMIT %(limit)s"""

RESCUE_CALLBACK_CANDIDATES = f"""
SELECT j.id FROM {S}.jobs j WHERE {_CALLBACK_EXPIRED} ORDER BY j.id LIMIT %(limit)s"""

# A row whose next state would take a unique key another job holds: cancelled as a duplicate.
# Each use adds its own guard, so a row that moved on meanwhile is left alone. A duplicate
# never holds the key as cancelled (the cancelled bit leaves its mask): with a mask holding
# `cancelled` the cancel itself would collide with a cancelled holder and the attempt could
# not settle at all.
# A rescued attempt whose heartbeat is still fresh (deadline passed or callback timed out while
# the worker lives: a def handler's thread cannot be stopped) keeps heartbeat_at as its "still
# running" mark: promotion and retries wait until the worker clears it or it goes stale.
_KEEP_FRESH_MARK = """CASE WHEN j.heartbeat_at > now() - %(stale_ms)s * interval '1 millisecond'
                        THEN j.heartbeat_at END"""

_CANCEL_DUPLICATE = f"""
UPDATE {S}.jobs j
SET state = 'cancelled', finalized_at = now(),
    unique_states = j.unique_states & ~(1 << {S}.state_bit('cancelled')), heartbeat_at = {{mark}},
    deadline_at = NULL,
    callback_id = NULL, callback_timeout_at = NULL,
    errors = errors || jsonb_build_array(jsonb_build_object(
        'error', 'cancelled as duplicate: another job holds its unique key',
        'attempt', attempt, 'at', now()))
"""

# ... an attempt whose completion (finalizer) collided.
CANCEL_DUPLICATE_ATTEMPT = f"""{_CANCEL_DUPLICATE.replace("{mark}", "NULL")}WHERE id = %s AND run_lease = %s AND state = 'running'"""

# ... an attempt whose inline park (wait_for_callback) collided: its handler lives on, so the row
# gets the "this attempt still runs" mark (a retry waits for it; the heartbeat keeps it fresh).
CANCEL_DUPLICATE_PARKING = f"""{_CANCEL_DUPLICATE.replace("{mark}", "now()")}WHERE id = %s AND run_lease = %s AND state = 'running'"""

# Rescue's per-row fallback: only a row that is still the stale attempt being rescued (a live
# attempt's fresh mark is kept, as rescue keeps it).
CANCEL_RESCUED_DUPLICATE = f"""{_CANCEL_DUPLICATE.replace("{mark}", _KEEP_FRESH_MARK)}WHERE j.id = %(id)s
  AND (({_STALE}) OR ({_CALLBACK_EXPIRED}))"""

# ... a due scheduled/retryable row whose promotion collided.
CANCEL_AS_DUPLICATE = (
    f"""{_CANCEL_DUPLICATE.replace("{mark}", "NULL")}WHERE j.id = %(id)s AND {_DUE}"""
)

# Rescue of attempts whose worker is presumed dead or whose deadline passed. attempt is kept: the
# next claim counts a new attempt. On the final attempt the job fails -- or, for kinds with a
# failure consequence, waits in consequence_pending for the reconciler to apply it and settle.
# A kind owes a consequence when this process knows it has one -- or does not know the kind at
# all (its declaration lives elsewhere): then it waits, owed and visible, for a reconciler that does.
_OWES = "(j.kind = ANY(%(consequence_kinds)s) OR NOT j.kind = ANY(%(known_kinds)s))"

_RESCUE_SET = f"""
    state = (CASE WHEN j.attempt < j.max_attempts THEN 'retryable'
                  WHEN {_OWES} THEN 'consequence_pending'
                  ELSE 'failed' END)::{S}.job_state,
    finalized_at = CASE WHEN j.attempt >= j.max_attempts AND NOT {_OWES} THEN now() END,
    heartbeat_at = {{mark}}, deadline_at = NULL, callback_id = NULL, callback_timeout_at = NULL,
    consequence_state = CASE WHEN j.attempt >= j.max_attempts AND {_OWES} THEN 'owed' END,
    consequence_reason = CASE WHEN j.attempt >= j.max_attempts THEN r.exhausted_reason END,
    consequence_path = CASE WHEN j.attempt >= j.max_attempts AND {_OWES} THEN 'failure' END,
    consequence_retry_at = CASE WHEN j.attempt >= j.max_attempts AND {_OWES} THEN now() END,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'error', r.message, 'attempt', j.attempt, 'at', now()) ||
        CASE WHEN j.attempt >= j.max_attempts THEN '{{"terminal": true}}'::jsonb
             ELSE '{{}}'::jsonb END)"""

RESCUE = f"""
WITH r AS (
    SELECT id,
           CASE WHEN deadline_at IS NOT NULL AND deadline_at < now() THEN 'deadline_exceeded'
                ELSE 'stale_heartbeat' END AS rescue_reason,
           CASE WHEN deadline_at IS NOT NULL AND deadline_at < now() THEN 'deadline_exhausted'
                ELSE 'rescue_exhausted' END AS exhausted_reason,
           CASE WHEN deadline_at IS NOT NULL AND deadline_at < now() THEN 'hard deadline exceeded'
                ELSE 'heartbeat stale: worker presumed dead' END AS message
    FROM {S}.jobs j
    WHERE {_STALE}
      AND (%(only)s::bigint IS NULL OR id = %(only)s)
    ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE {S}.jobs j SET {_RESCUE_SET.replace("{mark}", _KEEP_FRESH_MARK)}, run_at = now()
FROM r WHERE j.id = r.id
RETURNING j.id, j.kind, j.state::text, r.rescue_reason, r.exhausted_reason"""

# Prompt failure (ADR-046's open extension): an attempt whose finalize failed for good is failed
# at once, guarded by its lease, the way rescue would fail it -- retryable with backoff, or on
# the final attempt failed / consequence_pending -- but with the real error and no inserts.
FAIL_ATTEMPT = f"""
WITH r AS (
    SELECT id, 'exhausted' AS exhausted_reason, %(message)s::text AS message
    FROM {S}.jobs WHERE id = %(id)s AND run_lease = %(lease)s AND state = 'running'
    FOR UPDATE
)
UPDATE {S}.jobs j SET {_RESCUE_SET.replace("{mark}", "NULL")},
    run_at = now() + LEAST(power(2, j.attempt) * (1 + random() * 0.25), 86400) * interval '1 second'
FROM r WHERE j.id = r.id
RETURNING j.state::text"""

# Parked jobs whose callback timed out: retried with backoff, or failed on the final attempt.
RESCUE_CALLBACKS = f"""
WITH r AS (
    SELECT id, 'expired_callback' AS rescue_reason, 'callback_timeout' AS exhausted_reason,
           'callback timed out' AS message
    FROM {S}.jobs j
    WHERE {_CALLBACK_EXPIRED}
      AND (%(only)s::bigint IS NULL OR id = %(only)s)
    ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE {S}.jobs j SET {_RESCUE_SET.replace("{mark}", _KEEP_FRESH_MARK)},
    run_at = now() + LEAST(power(2, j.attempt) * (1 + random() * 0.25), 86400) * interval '1 second'
FROM r WHERE j.id = r.id
RETURNING j.id, j.kind, j.state::text, r.rescue_reason, r.exhausted_reason"""

# Prune guard (bulk and row by row): terminal rows past their retention.
# A row whose failure consequence is still owed is kept past retention: deleting it would drop
# the debt (models/settlement.pml, nothing_owed_is_lost).
_PRUNABLE = """((j.state = 'completed'
        AND j.finalized_at < now() - %(completed_s)s * interval '1 second')
       OR (j.state IN ('failed', 'cancelled')
           AND j.finalized_at < now() - %(failed_s)s * interval '1 second'))
      AND j.consequence_state IS DISTINCT FROM 'owed'"""

PRUNE = f"""
DELETE FROM {S}.jobs WHERE id IN (
    SELECT j.id FROM {S}.jobs j WHERE {_PRUNABLE} LIMIT %(limit)s)
RETURNING id"""

PRUNE_IDS = f"SELECT j.id FROM {S}.jobs j WHERE {_PRUNABLE} LIMIT %(limit)s"

PRUNE_ONE = f"DELETE FROM {S}.jobs j WHERE j.id = %(id)s AND {_PRUNABLE} RETURNING id"

NOTIFY_QUEUE = "SELECT pg_notify('awa_fast', %s)"
NOTIFY_CANCEL = "SELECT pg_notify('awa_fast_cancel', %s)"
CHANNEL_QUEUE = "awa_fast"
CHANNEL_CANCEL = "awa_fast_cancel"

# Admin ------------------------------------------------------------------------------------------

LIST_JOBS = f"""
SELECT {JOB_COLUMNS} FROM {S}.jobs
WHERE (%(state)s::text IS NULL OR state::text = %(state)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY id DESC LIMIT %(limit)s"""

# "The attempt still runs": a row that is not 'running' but whose heartbeat_at is set and fresh.
# Only a live handler keeps it so (the worker's heartbeat refreshes it, ACK_ATTEMPT_ENDED
# clears it, a dead worker's mark goes stale); every other transition out of 'running' clears
# heartbeat_at. Admin paths that would start a new attempt refuse such a row: the new attempt
# would overlap the old one.
_ATTEMPT_STILL_RUNS = """state <> 'running' AND heartbeat_at IS NOT NULL
      AND heartbeat_at > now() - %(stale_ms)s * interval '1 millisecond'"""

RETRY_JOB = f"""
UPDATE {S}.jobs
SET state = 'available', attempt = 0, run_at = now(), finalized_at = NULL,
    heartbeat_at = NULL, deadline_at = NULL, callback_id = NULL, callback_timeout_at = NULL
WHERE id = %(id)s AND state IN ('failed', 'cancelled', 'waiting_external')
  AND consequence_state IS DISTINCT FROM 'owed'
  AND NOT ({_ATTEMPT_STILL_RUNS})
RETURNING {JOB_COLUMNS}"""

ATTEMPT_STILL_RUNS = f"""
SELECT heartbeat_at FROM {S}.jobs WHERE id = %(id)s AND {_ATTEMPT_STILL_RUNS}"""

ATTEMPT_STILL_RUNS_BY_CALLBACK = f"""
SELECT id, heartbeat_at FROM {S}.jobs WHERE callback_id = %(cid)s AND {_ATTEMPT_STILL_RUNS}"""

# heartbeat_at is kept: a running (or waiting) attempt's handler lives on until it notices.
# consequence_pending is left alone: its failure is decided and the reconciler settles it (a
# cancelled row is never reconciled: models/settlement.pml, nothing_owed_is_lost).
CANCEL_JOB = f"""
WITH old AS (SELECT id, state, run_lease FROM {S}.jobs WHERE id = %s FOR UPDATE)
UPDATE {S}.jobs j
SET state = 'cancelled', finalized_at = now(), deadline_at = NULL,
    callback_id = NULL, callback_timeout_at = NULL,
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

# Arbitrary constant: the advisory-lock key of the maintenance leader.
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
      AND a.state_change < now() - %(stale_ms)s * interval '1 millisecond'"""

DISPLACE_FROZEN_LEADER = f"""
WITH holder AS (
    SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.database = (
              SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = (%(key)s::bigint >> 32)::oid
      AND l.objid = (%(key)s::bigint & 4294967295)::oid
      AND l.objsubid = 1 AND a.state = 'idle'
      AND a.state_change < now() - %(stale_ms)s * interval '1 millisecond'),
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

# The test harness's claim: one available job of a kind and queue.
CLAIM_ONE_OF_KIND = f"""
WITH c AS (
    SELECT id FROM {S}.jobs
    WHERE state = 'available' AND queue = %(queue)s AND kind = %(kind)s
    ORDER BY priority, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED
)
UPDATE {S}.jobs j
SET state = 'running', attempt = j.attempt + 1, run_lease = j.run_lease + 1,
    attempted_at = now(), heartbeat_at = now(), deadline_at = now() + interval '5 minutes'
FROM c WHERE j.id = c.id
RETURNING j.id, j.kind, j.queue, j.args, j.priority, j.attempt, j.max_attempts, j.run_at,
          j.deadline_at, j.created_at, j.errors::text, j.metadata::text, j.tags, j.run_lease,
          j.progress"""

CLEAN = (
    f"TRUNCATE {S}.jobs, {S}.queue_meta, {S}.dlq, {S}.cron_jobs, {S}.callback_expressions, "
    f"{S}.queue_descriptors, {S}.job_kind_descriptors, {S}.batch_operations CASCADE"
)


# -- periodic (cron) jobs: awa_fast/periodic.py, migration 003 -----------------------------------

CRON_COLUMNS = (
    "name, cron_expr, timezone, kind, queue, args, priority, max_attempts, tags, metadata, "
    "missed_fire_policy, last_fire_at, created_at, updated_at"
)

# Register a schedule. A new row starts never fired (last_fire_at NULL, created_at now: awa's
# first-registration rule in periodic.due_fires). An unchanged cron_expr + timezone keeps its
# last_fire_at (so fires missed while no leader ran are still seen); a changed one restarts from
# max(old, %(initial)s), the latest fire time <= now; a never-fired row stays never fired. An
# identical definition is not rewritten at all.
CRON_UPSERT = f"""
INSERT INTO {S}.cron_jobs AS c (name, cron_expr, timezone, kind, queue, args, priority,
                                max_attempts, tags, metadata, missed_fire_policy, last_fire_at)
VALUES (%(name)s, %(cron_expr)s, %(timezone)s, %(kind)s, %(queue)s, %(args)s::jsonb,
        %(priority)s, %(max_attempts)s, %(tags)s::text[], %(metadata)s::jsonb,
        %(missed_fire_policy)s, NULL)
ON CONFLICT (name) DO UPDATE SET
    cron_expr = EXCLUDED.cron_expr, timezone = EXCLUDED.timezone, kind = EXCLUDED.kind,
    queue = EXCLUDED.queue, args = EXCLUDED.args, priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts, tags = EXCLUDED.tags, metadata = EXCLUDED.metadata,
    missed_fire_policy = EXCLUDED.missed_fire_policy,
    last_fire_at = CASE
        WHEN c.last_fire_at IS NULL
             OR (c.cron_expr = EXCLUDED.cron_expr AND c.timezone = EXCLUDED.timezone)
        THEN c.last_fire_at
        ELSE GREATEST(c.last_fire_at, %(initial)s::timestamptz) END,
    updated_at = now()
WHERE (c.cron_expr, c.timezone, c.kind, c.queue, c.args, c.priority, c.max_attempts, c.tags,
       c.metadata, c.missed_fire_policy)
      IS DISTINCT FROM
      (EXCLUDED.cron_expr, EXCLUDED.timezone, EXCLUDED.kind, EXCLUDED.queue, EXCLUDED.args,
       EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.tags, EXCLUDED.metadata,
       EXCLUDED.missed_fire_policy)"""

CRON_NOW = "SELECT statement_timestamp()"

# Unlocked scan: which schedules may be due (the locked re-check decides).
CRON_SCAN = f"""
SELECT name, cron_expr, timezone, last_fire_at, created_at, statement_timestamp()
FROM {S}.cron_jobs ORDER BY name"""

# Inside the firing transaction: lock one schedule and read it again.
CRON_LOCK = f"""
SELECT {CRON_COLUMNS}, statement_timestamp()
FROM {S}.cron_jobs WHERE name = %s FOR UPDATE"""

CRON_ADVANCE = f"UPDATE {S}.cron_jobs SET last_fire_at = %s WHERE name = %s"

CRON_LIST = f"SELECT {CRON_COLUMNS} FROM {S}.cron_jobs ORDER BY name"

CRON_DELETE = f"DELETE FROM {S}.cron_jobs WHERE name = %s"

# Failure settlement and consequences -------------------------------------------------------------

# Rows of these two carry the consequence columns after JOB_COLUMNS.
CONSEQUENCE_COLUMNS = "consequence_reason, consequence_path, consequence_attempts"

LOCK_RUNNING = f"""
SELECT {JOB_COLUMNS}, {CONSEQUENCE_COLUMNS} FROM {S}.jobs
WHERE id = %s AND run_lease = %s AND state = 'running' FOR UPDATE"""

# heartbeat_at: a running row gets %(mark)s (NULL from the worker, whose handler returned; the
# live attempt's heartbeat from fail_external), a row that already left 'running' keeps its
# "still running" mark; dead_letter_if_enabled carries it into the DLQ entry.
_SETTLE_MARK = (
    "heartbeat_at = CASE WHEN state = 'running' THEN %(mark)s::timestamptz ELSE heartbeat_at END"
)

SETTLE_FAILED = f"""
UPDATE {S}.jobs
SET state = 'failed', finalized_at = now(), {_SETTLE_MARK}, deadline_at = NULL,
    callback_id = NULL, callback_timeout_at = NULL,
    consequence_state = %(consequence)s, consequence_reason = %(reason)s,
    consequence_path = CASE WHEN %(consequence)s::text = 'applied' THEN %(path)s END,
    consequence_applied_at = CASE WHEN %(consequence)s::text = 'applied' THEN now() END,
    consequence_retry_at = NULL, consequence_error = NULL
WHERE id = %(id)s"""

# A failing job whose consequence did not apply stays consequence_pending (a corrected job stays
# failed); either way the consequence is owed and retried after retry_in seconds.
MARK_CONSEQUENCE_PENDING = f"""
UPDATE {S}.jobs
SET state = CASE WHEN state = 'failed' THEN state ELSE 'consequence_pending' END,
    {_SETTLE_MARK}, deadline_at = NULL, callback_id = NULL, callback_timeout_at = NULL,
    consequence_state = 'owed', consequence_reason = %(reason)s, consequence_path = %(path)s,
    consequence_error = %(error)s, consequence_attempts = consequence_attempts + 1,
    consequence_retry_at = now() + %(retry_in)s * interval '1 second'
WHERE id = %(id)s"""

# The worker's failure path, first transaction: the failure is recorded (consequence_pending,
# owed, due now) before the effect runs, so a crash after the effect's outside part leaves a
# debt the reconciler repeats under the same idempotency key (models/settlement.pml).
OWE_FAILURE = f"""
UPDATE {S}.jobs
SET state = 'consequence_pending',
    {_SETTLE_MARK}, deadline_at = NULL, callback_id = NULL, callback_timeout_at = NULL,
    consequence_state = 'owed', consequence_reason = %(reason)s, consequence_path = %(path)s,
    consequence_error = NULL, consequence_retry_at = now()
WHERE id = %(id)s"""

MARK_CONSEQUENCE_APPLIED = f"""
UPDATE {S}.jobs
SET consequence_state = %(state)s, consequence_path = %(path)s,
    consequence_applied_at = CASE WHEN %(state)s::text = 'applied' THEN now() END,
    consequence_retry_at = NULL, consequence_error = NULL
WHERE id = %(id)s"""

DEAD_LETTER = f"SELECT {S}.dead_letter_if_enabled(%s, %s)"

# Rescue's dead-letter moves: the bulk form of DEAD_LETTER (same function, so the same guard).
DEAD_LETTER_MANY = f"""
SELECT m.id FROM unnest(%s::bigint[], %s::text[]) AS m(id, reason)
WHERE {S}.dead_letter_if_enabled(m.id, m.reason)"""

# A failed row whose dead-letter move failed stays failed in jobs: say so in its errors.
NOTE_DEAD_LETTER_FAILED = f"""
UPDATE {S}.jobs SET errors = errors || jsonb_build_array(jsonb_build_object(
    'error', 'dead-letter move failed: ' || %(error)s, 'at', now()))
WHERE id = %(id)s AND state = 'failed'"""

OWED_DUE = f"""
SELECT id FROM {S}.jobs
WHERE consequence_state = 'owed' AND consequence_retry_at <= now()
ORDER BY consequence_retry_at LIMIT %s"""

# A due owed job the reconciler could not settle (its settlement raised, or this process does
# not know its kind): pushed out by a doubling backoff, so it leaves the front of OWED_DUE and
# the other owed jobs proceed. Params: id, error, base_s, cap_s.
DEFER_OWED = f"""
UPDATE {S}.jobs
SET consequence_attempts = consequence_attempts + 1, consequence_error = %(error)s,
    consequence_retry_at = now() + LEAST(%(base_s)s * power(2, consequence_attempts),
                                         %(cap_s)s) * interval '1 second'
WHERE id = %(id)s AND consequence_state = 'owed'
RETURNING consequence_retry_at"""

LOCK_OWED = f"""
SELECT {JOB_COLUMNS}, {CONSEQUENCE_COLUMNS} FROM {S}.jobs
WHERE id = %s AND consequence_state = 'owed' AND consequence_retry_at <= now()
  AND state IN ('consequence_pending', 'failed')
FOR UPDATE SKIP LOCKED"""

CORRECT_TO_FAILED = f"""
UPDATE {S}.jobs
SET state = 'failed', finalized_at = now(), errors = errors || %(error)s::jsonb,
    consequence_state = %(cstate)s, consequence_reason = 'corrected',
    consequence_path = 'reconciliation', consequence_retry_at = now(),
    consequence_applied_at = NULL, consequence_error = NULL
WHERE id = %(id)s AND state = 'completed'
RETURNING {JOB_COLUMNS}"""

CONSEQUENCES_OWED = f"""
SELECT id, kind, queue, state::text, consequence_reason, consequence_path, consequence_attempts,
       consequence_error, consequence_retry_at,
       (consequence_attempts > 0 OR consequence_retry_at < now() - interval '60 seconds') AS overdue
FROM {S}.jobs WHERE consequence_state = 'owed' ORDER BY id LIMIT %s"""

UNVERIFIED_COMPLETED = f"""
SELECT {JOB_COLUMNS} FROM {S}.jobs
WHERE kind = ANY(%s) AND state = 'completed' AND verified_at IS NULL
  AND finalized_at > now() - %s * interval '1 second'
ORDER BY id LIMIT %s"""

MARK_VERIFIED = f"UPDATE {S}.jobs SET verified_at = now() WHERE id = ANY(%s)"

# The verify pass re-checks, under the row lock, that the job is still unverified and completed.
LOCK_UNVERIFIED = f"""
SELECT id FROM {S}.jobs WHERE id = %s AND state = 'completed' AND verified_at IS NULL
FOR UPDATE SKIP LOCKED"""

APPEND_ERROR = f"""
UPDATE {S}.jobs SET errors = errors || %(error)s::jsonb,
    progress = COALESCE(%(progress)s::jsonb, progress)
WHERE id = %(id)s"""

# External waits (callbacks) ----------------------------------------------------------------------

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
SELECT state::text, run_lease, callback_id, metadata -> '_awa_callback_result'
FROM {S}.jobs WHERE id = %s"""

# The callback's CEL expressions (006), read under LOCK_BY_CALLBACK's row lock.
CALLBACK_EXPRESSIONS = f"""
SELECT expressions FROM {S}.callback_expressions WHERE job_id = %s AND callback_id = %s"""

LOCK_BY_CALLBACK = f"""
SELECT {JOB_COLUMNS}, {CONSEQUENCE_COLUMNS} FROM {S}.jobs
WHERE callback_id = %s AND state IN ('waiting_external', 'running') FOR UPDATE"""

COMPLETE_EXTERNAL = f"""
UPDATE {S}.jobs
SET state = 'completed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
    progress = NULL, callback_id = NULL, callback_timeout_at = NULL
WHERE id = %s RETURNING {JOB_COLUMNS}"""

RETRY_EXTERNAL = f"""
UPDATE {S}.jobs
SET state = 'available', attempt = 0, run_at = now(), callback_id = NULL,
    callback_timeout_at = NULL, heartbeat_at = NULL, deadline_at = NULL
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

SET_QUEUE_DLQ = f"""
INSERT INTO {S}.queue_meta (queue, dlq) VALUES (%s, %s)
ON CONFLICT (queue) DO UPDATE SET dlq = EXCLUDED.dlq"""


# -- dead-letter queue and admin operations: awa_fast/admin.py -------------------------------------

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

# Failed jobs an admin bulk call may act on (retry_failed, move to the DLQ, discard), by kind
# and/or queue (NULL = any). A job whose failure consequence is still owed is never touched:
# retrying, moving or deleting it would lose the consequence (the reconciler sees only jobs).
_SETTLED_FAILED = """j.state = 'failed' AND j.consequence_state IS DISTINCT FROM 'owed'
      AND (%(kind)s::text IS NULL OR j.kind = %(kind)s)
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)"""

# Admin move of failed jobs to the DLQ (whatever the queue's policy).
_MOVE_TO_DLQ = f"""
WITH d AS (
    DELETE FROM {S}.jobs WHERE id IN (
        SELECT j.id FROM {S}.jobs j WHERE {_SETTLED_FAILED} AND {{where}}
        ORDER BY j.id FOR UPDATE SKIP LOCKED)
    RETURNING *)
INSERT INTO {S}.dlq SELECT d.*, %(reason)s, now(), d.run_lease FROM d
RETURNING id"""

DLQ_MOVE_ONE = _MOVE_TO_DLQ.format(where="j.id = %(id)s")
DLQ_MOVE_BULK = _MOVE_TO_DLQ.format(where="true")
# (its candidates are SETTLED_FAILED_IDS; its row-by-row twin is DLQ_MOVE_ONE)

DLQ_PURGE_ONE = f"DELETE FROM {S}.dlq WHERE id = %s"
DLQ_PURGE = f"DELETE FROM {S}.dlq WHERE {_DLQ_FILTER} RETURNING id"
DLQ_PURGE_MATCHING_ONE = f"DELETE FROM {S}.dlq WHERE id = %(id)s AND {_DLQ_FILTER} RETURNING id"

# Maintenance: DLQ retention (independent of the jobs' retention).
_DLQ_PRUNABLE = "d.dlq_at < now() - %(dlq_s)s * interval '1 second'"

PRUNE_DLQ = f"""
DELETE FROM {S}.dlq WHERE id IN (
    SELECT d.id FROM {S}.dlq d WHERE {_DLQ_PRUNABLE} LIMIT %(limit)s)
RETURNING id"""

PRUNE_DLQ_IDS = f"SELECT d.id FROM {S}.dlq d WHERE {_DLQ_PRUNABLE} LIMIT %(limit)s"

PRUNE_DLQ_ONE = f"DELETE FROM {S}.dlq d WHERE d.id = %(id)s AND {_DLQ_PRUNABLE} RETURNING id"

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
    heartbeat_at = NULL, deadline_at = NULL, callback_id = NULL, callback_timeout_at = NULL"""

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
SET state = 'cancelled', finalized_at = now(), deadline_at = NULL,
    callback_id = NULL, callback_timeout_at = NULL,
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
DUMP_DLQ_JOB = f"SELECT to_jsonb(d) FROM {S}.dlq d WHERE id = %s"

HEALTH_AVAILABLE = f"""
SELECT queue, count(*) FROM {S}.jobs WHERE state = 'available' AND queue = ANY(%s)
GROUP BY queue"""

# The per-job completion of a job with follow-ups (registered specs first, then staged requests,
# in order), as ONE statement: the guarded transition, then the inserts only if it matched.
# A follow-up whose unique key is held is skipped (ON CONFLICT on the dedup index, which also
# sees the trigger's own just-completed row); any other error fails the whole statement.
UNIQUE_CONFLICT_TARGET = (
    "(unique_key) WHERE unique_key IS NOT NULL "
    f"AND (unique_states & (1 << {S}.state_bit(state))) <> 0"
)


# Follow-up requests passed as one JSON array (enqueue.follow_ups_json), read back as rows and
# inserted with ON CONFLICT DO NOTHING. Ids are drawn in (trigger, order) order among the rows
# that pass ``where``; rows are inserted in unique-key order, so two completions whose
# follow-ups share keys wait for each other instead of deadlocking (ADR-046's deadlock-free
# multi-insert completion).
def _follow_ups_insert(where: str) -> str:
    return f"""{_INSERT_TARGET_WITH_ID}
    SELECT v.id, v.kind, v.queue, v.args,
           (CASE WHEN v.run_at IS NOT NULL THEN 'scheduled' ELSE 'available' END)::{S}.job_state,
           v.priority, v.max_attempts, COALESCE(v.run_at, now()), v.metadata, v.tags,
           v.unique_key, v.unique_states, v.ordering_key
    FROM (SELECT nextval('{S}.jobs_id_seq') AS id, r.kind, r.queue, r.args, r.priority,
                 r.max_attempts, r.run_at, r.metadata, r.tags,
                 decode(r.unique_key, 'hex') AS unique_key, r.unique_states,
                 decode(r.ordering_key, 'hex') AS ordering_key
          FROM jsonb_to_recordset(%s::jsonb)
               AS r(trigger bigint, lease bigint, ord int, kind text, queue text, args jsonb,
                    priority smallint, max_attempts smallint, run_at timestamptz, metadata jsonb,
                    tags text[], unique_key text, unique_states smallint, ordering_key text)
          WHERE {where}
          ORDER BY r.trigger, r.ord) AS v
    ORDER BY v.unique_key, v.id
    ON CONFLICT {UNIQUE_CONFLICT_TARGET} DO NOTHING"""


# Follow-ups inserted inside a caller's transaction (failure settlement, external completion,
# other outcomes): one statement, keys in key order, held keys skipped. Returns the count.
INSERT_FOLLOW_UPS = f"""
WITH ins AS (
    {_follow_ups_insert("true")}
    RETURNING 1
)
SELECT count(*) FROM ins"""

COMPLETE_WITH_FOLLOW_UPS = f"""
WITH done AS (
    UPDATE {S}.jobs
    SET state = 'completed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
        progress = NULL, callback_id = NULL, callback_timeout_at = NULL
    WHERE id = %s AND run_lease = %s AND state = 'running'
    RETURNING id
), ins AS (
    {_follow_ups_insert("EXISTS (SELECT 1 FROM done)")}
    RETURNING unique_key
)
SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM ins),
       ARRAY(SELECT unique_key FROM ins WHERE unique_key IS NOT NULL)"""

# Opt-in (start(staged_completions="batched")): many completions with follow-ups in ONE
# statement. Each trigger's follow-ups are inserted only if its own guarded transition matched,
# in (trigger, order) order; duplicate keys are skipped. Any other error fails the statement
# and the finalizer redoes the batch job by job (so one bad job cannot roll back the others).
COMPLETE_MANY_WITH_FOLLOW_UPS = f"""
WITH done AS (
    UPDATE {S}.jobs j
    SET state = 'completed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
        progress = NULL, callback_id = NULL, callback_timeout_at = NULL
    FROM unnest(%s::bigint[], %s::bigint[]) AS b(id, lease)
    WHERE j.id = b.id AND j.run_lease = b.lease AND j.state = 'running'
    RETURNING j.id, j.run_lease
), ins AS (
    -- by (job, lease): two attempts of one job may share a batch; only the current one counts
    {_follow_ups_insert("(r.trigger, r.lease) IN (SELECT id, run_lease FROM done)")}
    RETURNING 1
)
SELECT ARRAY(SELECT id FROM done), ARRAY(SELECT run_lease FROM done),
       (SELECT count(*) FROM ins)"""

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
FROM c WHERE j.id = c.id AND j.state = 'available'
RETURNING j.id"""

# storage_status(): when the schema was first and last migrated, and its version.
STORAGE_HISTORY = f"""
SELECT min(applied_at), max(applied_at), max(version) FROM {S}.schema_version"""

# awa_fast.testing.work_one: the job after its outcome, as awa's testing.JobRow.
TESTING_JOB_ROW = f"""
SELECT id, kind, queue, args, attempt, max_attempts, priority, tags, state::text AS state
FROM {S}.jobs WHERE id = %s"""

# Every bulk statement run through bulk.run_isolated, with the statements of its row-by-row
# fallback (candidates, one row, duplicate cancel): each carries the family's one guard
# fragment (checked by tests/test_hardening_wedge.py). Complete, heartbeat, rescue and the
# dead-letter move redo rows with the bulk statement itself (one-element arrays / %(only)s).
ISOLATED = {
    "claim": (_CLAIMABLE, (CLAIM, CLAIM_CANDIDATES, CLAIM_ONE)),
    "promote": (_DUE, (PROMOTE, DUE_IDS, PROMOTE_ONE, CANCEL_AS_DUPLICATE)),
    "rescue": (_STALE, (RESCUE, RESCUE_CANDIDATES, CANCEL_RESCUED_DUPLICATE)),
    "rescue_callbacks": (
        _CALLBACK_EXPIRED,
        (RESCUE_CALLBACKS, RESCUE_CALLBACK_CANDIDATES, CANCEL_RESCUED_DUPLICATE),
    ),
    "retry_failed": (_RETRYABLE_FAILED, (RETRY_FAILED, FAILED_IDS, RETRY_FAILED_ONE)),
    "drain_queue": (_DRAINABLE, (DRAIN_QUEUE, DRAINABLE_IDS, DRAIN_ONE)),
    "dlq_retry": (_DLQ_FILTER, (DLQ_RETRY_BULK, DLQ_MATCHING_IDS, DLQ_RETRY_ONE)),
    "dlq_purge": (_DLQ_FILTER, (DLQ_PURGE, DLQ_MATCHING_IDS, DLQ_PURGE_MATCHING_ONE)),
    "dlq_move": (_SETTLED_FAILED, (DLQ_MOVE_BULK, SETTLED_FAILED_IDS, DLQ_MOVE_ONE)),
    "discard_failed": (_SETTLED_FAILED, (DISCARD_FAILED, SETTLED_FAILED_IDS, DISCARD_FAILED_ONE)),
    "complete": ("j.run_lease = b.lease AND j.state = 'running'", (COMPLETE_MANY,)),
    "heartbeat": ("j.run_lease = b.lease", (HEARTBEAT,)),
    "dead_letter": (f"{S}.dead_letter_if_enabled(", (DEAD_LETTER_MANY, DEAD_LETTER)),
    "prune": (_PRUNABLE, (PRUNE, PRUNE_IDS, PRUNE_ONE)),
    "prune_dlq": (_DLQ_PRUNABLE, (PRUNE_DLQ, PRUNE_DLQ_IDS, PRUNE_DLQ_ONE)),
}

# awa_fast.bridge for drivers other than psycopg 3 (asyncpg, SQLAlchemy, Django): the same
# insert returning the row as one JSON text value, so every driver reads it the same way.
BRIDGE_INSERT = f"WITH j AS ({INSERT_ONE}) SELECT row_to_json(j)::text FROM j"
# ... with $1..$n placeholders (asyncpg, SQLAlchemy's numeric_dollar paramstyle).
BRIDGE_INSERT_DOLLAR = BRIDGE_INSERT
for _n in range(1, BRIDGE_INSERT.count("%s") + 1):
    BRIDGE_INSERT_DOLLAR = BRIDGE_INSERT_DOLLAR.replace("%s", f"${_n}", 1)
del _n

# The maintenance leader's fencing (docs/architecture.md, "the leader's fencing rule") ---------

# Taking leadership: bump the epoch. The UPDATE waits for every transaction still holding the
# old epoch FOR SHARE (an old leader's pass in flight); afterwards any such pass finds no row.
LEADER_BUMP = f"""
UPDATE {S}.leader SET epoch = epoch + 1, holder = %s, since = now() RETURNING epoch"""

# First statement of every leader write transaction.
LEADER_FENCE = f"SELECT epoch FROM {S}.leader WHERE epoch = %s FOR SHARE"

LEADER_EPOCH = f"SELECT epoch FROM {S}.leader"

# Worker presence (awa_fast.workers): which queues and kinds each live process claims.
WORKER_SEEN = f"""
INSERT INTO {S}.workers (instance, queues, kinds, expires_at)
VALUES (%(instance)s, %(queues)s, %(kinds)s, now() + %(ttl_ms)s * interval '1 millisecond')
ON CONFLICT (instance) DO UPDATE
SET queues = EXCLUDED.queues, kinds = EXCLUDED.kinds, seen_at = now(),
    expires_at = EXCLUDED.expires_at"""

WORKER_GONE = f"DELETE FROM {S}.workers WHERE instance = %s"

WORKERS_PRUNE = f"DELETE FROM {S}.workers WHERE expires_at < now() - interval '1 hour'"

# Expressions of callbacks no job waits on any more (resolved, completed, timed out, pruned).
CALLBACK_EXPRESSIONS_PRUNE = f"""
DELETE FROM {S}.callback_expressions e
WHERE NOT EXISTS (SELECT 1 FROM {S}.jobs j WHERE j.id = e.job_id AND j.callback_id = e.callback_id)"""

# The kinds waiting in this process's queues that no live worker handles (logged once each).
UNHANDLED_IN_QUEUES = f"""
SELECT queue, kind, n FROM ({UNHANDLED_AVAILABLE}) x WHERE queue = ANY(%s) ORDER BY 1, 2"""

# Schema version check at start(): a worker on an unmigrated database fails fast.
SCHEMA_PRESENT = f"SELECT to_regclass('{S}.schema_version') IS NOT NULL"
SCHEMA_VERSION = f"SELECT max(version) FROM {S}.schema_version"


# -- queue and job-kind descriptors: awa_fast/descriptors.py, migration 007 ---------------------


def _descriptor_upsert(table: str, key: str) -> str:
    return f"""
INSERT INTO {S}.{table} AS d ({key}, display_name, description, owner, docs_url, tags, extra,
                               descriptor_hash)
VALUES (%(name)s, %(display_name)s, %(description)s, %(owner)s, %(docs_url)s, %(tags)s::text[],
        %(extra)s::jsonb, %(hash)s)
ON CONFLICT ({key}) DO UPDATE SET
    display_name = EXCLUDED.display_name, description = EXCLUDED.description,
    owner = EXCLUDED.owner, docs_url = EXCLUDED.docs_url, tags = EXCLUDED.tags,
    extra = EXCLUDED.extra, descriptor_hash = EXCLUDED.descriptor_hash,
    updated_at = CASE WHEN d.descriptor_hash = EXCLUDED.descriptor_hash THEN d.updated_at
                      ELSE now() END,
    last_seen_at = now()"""


QUEUE_DESCRIPTOR_UPSERT = _descriptor_upsert("queue_descriptors", "queue")
KIND_DESCRIPTOR_UPSERT = _descriptor_upsert("job_kind_descriptors", "kind")

# Rows no runtime has refreshed for %(retention_s)s seconds (descriptor_retention_days).
DESCRIPTORS_PRUNE = f"""
WITH q AS (DELETE FROM {S}.queue_descriptors
           WHERE last_seen_at < now() - %(retention_s)s * interval '1 second' RETURNING 1),
     k AS (DELETE FROM {S}.job_kind_descriptors
           WHERE last_seen_at < now() - %(retention_s)s * interval '1 second' RETURNING 1)
SELECT (SELECT count(*) FROM q) + (SELECT count(*) FROM k)"""

DESCRIPTOR_COLUMNS = (
    "display_name, description, owner, docs_url, tags, extra, descriptor_hash, "
    "created_at, updated_at, last_seen_at"
)
LIST_QUEUE_DESCRIPTORS = (
    f"SELECT queue AS name, {DESCRIPTOR_COLUMNS} FROM {S}.queue_descriptors ORDER BY queue"
)
LIST_KIND_DESCRIPTORS = (
    f"SELECT kind AS name, {DESCRIPTOR_COLUMNS} FROM {S}.job_kind_descriptors ORDER BY kind"
)

# -- batch operations: awa_fast/batch_ops.py, migration 008 -------------------------------------

# awa's structured filter (ADR-030) over the operation-eligible rows (available, scheduled);
# every field optional, all intersected. Shared by preview and scan (one population).
_BATCH_MATCH = """
j.state IN ('available', 'scheduled')
AND (%(f_kind)s::text IS NULL OR j.kind = %(f_kind)s)
AND (%(f_queue)s::text IS NULL OR j.queue = %(f_queue)s)
AND (%(f_ids)s::bigint[] IS NULL OR j.id = ANY(%(f_ids)s::bigint[]))
AND (%(f_tag)s::text IS NULL OR %(f_tag)s = ANY(j.tags))
AND (%(f_state)s::text IS NULL OR j.state::text = %(f_state)s)
AND (%(f_gte)s::timestamptz IS NULL OR j.created_at >= %(f_gte)s)
AND (%(f_lt)s::timestamptz IS NULL OR j.created_at < %(f_lt)s)"""

BATCH_PREVIEW = f"""
SELECT count(*) OVER (), j.id, j.kind, j.queue, j.state::text, j.priority
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
UPDATE {S}.batch_operations
SET state = CASE WHEN state = 'pending' THEN 'cancelled' ELSE 'cancelling' END,
    finalized_at = CASE WHEN state = 'pending' THEN clock_timestamp() END,
    retention_until = CASE WHEN state = 'pending'
                      THEN clock_timestamp() + %(retention_s)s * interval '1 second' END,
    updated_at = clock_timestamp()
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
WHERE j.state IN ('available', 'scheduled') AND"""
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
