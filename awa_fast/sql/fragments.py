"""Fragments several statement modules share: the schema name, column lists, predicates that
more than one concern tests, and the SET items that end an attempt (``ends_attempt``).
"""

S = "awa_fast"

# How long a heartbeat, "still running" mark or leader's lock connection stays fresh: the
# caller's heartbeat_staleness_ms (%(stale_ms)s), or longer if a live worker process declared
# that its heartbeats may be further apart (min_stale_ms, migration 025).
_STALENESS = f"""GREATEST(%(stale_ms)s::bigint, (SELECT max(w.min_stale_ms) FROM {S}.workers w
                                       WHERE w.expires_at > now())) * interval '1 millisecond'"""

JOB_COLUMNS = (
    "id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, "
    "deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, "
    "unique_states, callback_id, callback_timeout_at, run_lease, progress"
)

J_JOB_COLUMNS = ", ".join("j." + c.strip() for c in JOB_COLUMNS.split(","))

# Every column of awa_fast.jobs, in table order: awa_fast.jobs_done has the same ones (migration
# 010), so a row moves between the two by position.
ALL_COLUMNS = (
    JOB_COLUMNS.replace("unique_states,", "unique_states, ordering_key,")
    + ", consequence_state, consequence_reason, consequence_path, consequence_error, "
    "consequence_attempts, consequence_retry_at, consequence_applied_at, verified_at"
)

# Live jobs and finished jobs together (migration 010): reads that may meet a finished job.
JOBS_ALL = f"{S}.jobs_all"

# The failed / cancelled slices of jobs_done (partition pruning on its key expression).
FAILED_SLICES = f"{S}.done_slot(j.state, j.finalized_at) >= 32"


def by_ids(cte: str) -> str:
    """The hot table's rows (alias ``j``) whose ids the CTE ``cte`` (column ``id``) lists, as an
    index condition: a probe per listed id, whatever the statistics say. A join alone let the
    planner scan the hot table once per listed row when a vacuum or analyze of the small,
    fast-changing table made it look nearly empty: measured in the soak, 50-500 ms per claim or
    completion (and a growing backlog) instead of about 1 ms (ADR 017)."""
    return f"j.id = ANY(ARRAY(SELECT {cte}.id FROM {cte}))"


def skipping(alias: str) -> str:
    """Rows of ``alias`` whose id is not in ``%(skip)s`` (bigint[]): the candidates of a
    row-by-row redo leave out the rows earlier passes left unchanged (``bulk.run_isolated``
    with ``batch``). A hashed subplan: one probe per row, whatever the array's length."""
    return f"{alias}.id NOT IN (SELECT unnest(%(skip)s::bigint[]))"


_BY_BATCH_IDS = by_ids("b")


def moved_row(source: str, overrides: dict[str, str]) -> str:
    """The select list of a row of ``source`` (an alias with every jobs column) written to the
    other storage, every column in table order, ``overrides`` (column -> SQL expression)
    replacing some."""
    return ", ".join(
        overrides.get(c.strip(), f"{source}.{c.strip()}") for c in ALL_COLUMNS.split(",")
    )


def moved_back(done_where: str, overrides: dict[str, str], returning: str) -> str:
    """CTEs ``back`` (rows of jobs_done matching ``done_where``, over alias j, deleted and
    re-inserted into the hot table with ``overrides``, in unique-key order) returning
    ``returning``: how an admin call brings a finished job back to life."""
    return f"""back_out AS (
    DELETE FROM {S}.jobs_done WHERE id IN (
        SELECT j.id FROM {S}.jobs_done j WHERE {done_where} ORDER BY j.id FOR UPDATE SKIP LOCKED)
    RETURNING *
), back AS (
    INSERT INTO {S}.jobs AS j ({ALL_COLUMNS})
    SELECT {moved_row("o", overrides)} FROM back_out o ORDER BY o.unique_key, o.id
    RETURNING {returning}
)"""


def revived(done_where: str, overrides: dict[str, str], live_update: str, returning: str) -> str:
    """A statement bringing jobs back to life wherever they are stored: the finished rows of
    jobs_done matching ``done_where`` through :func:`moved_back` (``overrides``), the hot
    table's through ``live_update`` (an ``UPDATE ... WHERE ...`` without RETURNING); both
    return ``returning``."""
    return f"""
WITH {moved_back(done_where, overrides, returning)},
live AS ({live_update}
    RETURNING {returning}
)
SELECT * FROM back UNION ALL SELECT * FROM live"""


def ends_attempt(heartbeat_at: str | None = "NULL") -> str:
    """The SET items that end an attempt: no deadline, no callback wait. ``heartbeat_at``: the
    SQL expression the column gets, or None to keep it (a live handler's "still running" mark,
    see _ATTEMPT_STILL_RUNS)."""
    cleared = "deadline_at = NULL, callback_id = NULL, callback_timeout_at = NULL"
    return cleared if heartbeat_at is None else f"heartbeat_at = {heartbeat_at}, {cleared}"


# ends_attempt() as the columns of a row moved between the tables (moved_row overrides).
ENDED_ATTEMPT_ROW = dict.fromkeys(
    ("heartbeat_at", "deadline_at", "callback_id", "callback_timeout_at"), "NULL"
)

# The SET items of every completion (the worker's, batched or not, and an external one).
COMPLETED = f"state = 'completed', finalized_at = now(), progress = NULL, {ends_attempt()}"

# ... as the columns of the row a worker's completion writes to jobs_done (moved_row).
COMPLETED_ROW = {
    "state": f"'completed'::{S}.job_state",
    "finalized_at": "now()",
    "progress": "NULL",
    **ENDED_ATTEMPT_ROW,
}


# A row's unique key is held by ANOTHER row (that row's state is in that row's mask): the
# predicate of idx_awa_fast_jobs_unique, so the lookup uses that index.
# A finished job holds it if it is in unique_holds (migration 010).
def _key_held_by_other(alias: str) -> str:
    return (
        f"(EXISTS (SELECT 1 FROM {S}.jobs h WHERE h.unique_key = {alias}.unique_key "
        f"AND h.id <> {alias}.id AND h.unique_key IS NOT NULL "
        f"AND (h.unique_states & (1 << {S}.state_bit(h.state))) <> 0) "
        f"OR EXISTS (SELECT 1 FROM {S}.unique_holds u WHERE u.unique_key = {alias}.unique_key "
        f"AND u.job_id <> {alias}.id))"
    )


# A row whose next state would take a unique key another job holds: cancelled as a duplicate.
# Each use adds its own guard, so a row that moved on meanwhile is left alone. A duplicate
# never holds the key as cancelled (the cancelled bit leaves its mask): with a mask holding
# `cancelled` the cancel itself would collide with a cancelled holder and the attempt could
# not settle at all. ``mark``: the SQL expression heartbeat_at gets.
def _cancel_duplicate(mark: str) -> str:
    return f"""
UPDATE {S}.jobs j
SET state = 'cancelled', finalized_at = now(),
    unique_states = j.unique_states & ~(1 << {S}.state_bit('cancelled')),
    {ends_attempt(mark)},
    errors = errors || jsonb_build_array(jsonb_build_object(
        'error', 'cancelled as duplicate: another job holds its unique key',
        'attempt', attempt, 'at', now()))
"""


# Rescue of attempts whose worker is presumed dead or whose deadline passed. attempt is kept: the
# next claim counts a new attempt. On the final attempt the job fails -- or, for kinds with a
# failure consequence, waits in consequence_pending for the reconciler to apply it and settle.
# A kind owes a consequence when this process knows it has one -- or does not know the kind at
# all (its declaration lives elsewhere): then it waits, owed and visible, for a reconciler that does.
_OWES = "(j.kind = ANY(%(consequence_kinds)s) OR NOT j.kind = ANY(%(known_kinds)s))"


# The SET list of rescue and prompt failure, over `r` (its CTE of locked rows: `owes` is _OWES
# of the row, evaluated once there; `exhausted_reason`, `message`). ``mark``: the SQL expression
# heartbeat_at gets.
def _rescue_set(mark: str) -> str:
    return f"""
    state = (CASE WHEN j.attempt < j.max_attempts THEN 'retryable'
                  WHEN r.owes THEN 'consequence_pending'
                  ELSE 'failed' END)::{S}.job_state,
    finalized_at = CASE WHEN j.attempt >= j.max_attempts AND NOT r.owes THEN now() END,
    {ends_attempt(mark)},
    consequence_state = CASE WHEN j.attempt >= j.max_attempts AND r.owes THEN 'owed' END,
    consequence_reason = CASE WHEN j.attempt >= j.max_attempts THEN r.exhausted_reason END,
    consequence_path = CASE WHEN j.attempt >= j.max_attempts AND r.owes THEN 'failure' END,
    consequence_retry_at = CASE WHEN j.attempt >= j.max_attempts AND r.owes THEN now() END,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'error', r.message, 'attempt', j.attempt, 'at', now()) ||
        CASE WHEN j.attempt >= j.max_attempts THEN '{{"terminal": true}}'::jsonb
             ELSE '{{}}'::jsonb END)"""


# "The attempt still runs": a row that is not 'running' but whose heartbeat_at is set and fresh.
# Only a live handler keeps it so (the worker's heartbeat refreshes it, ACK_ATTEMPT_ENDED
# clears it, a dead worker's mark goes stale); every other transition out of 'running' clears
# heartbeat_at. Admin paths that would start a new attempt refuse such a row: the new attempt
# would overlap the old one.
_ATTEMPT_STILL_RUNS = f"""state <> 'running' AND heartbeat_at IS NOT NULL
      AND heartbeat_at > now() - {_STALENESS}"""

# Rows of these two carry the consequence columns after JOB_COLUMNS.
CONSEQUENCE_COLUMNS = "consequence_reason, consequence_path, consequence_attempts"

# Failed jobs an admin bulk call may act on (retry_failed, move to the DLQ, discard), by kind
# and/or queue (NULL = any). A job whose failure consequence is still owed is never touched:
# retrying, moving or deleting it would lose the consequence (the reconciler sees only jobs).
_SETTLED_FAILED = """j.state = 'failed' AND j.consequence_state IS DISTINCT FROM 'owed'
      AND (%(kind)s::text IS NULL OR j.kind = %(kind)s)
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)"""
