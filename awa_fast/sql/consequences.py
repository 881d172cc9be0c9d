"""Failure settlement and consequences: the settle / owe / defer transitions the reconciler
and the worker's failure path run, corrections of completed jobs and the verify pass.
"""

from awa_fast.sql.fragments import (
    CONSEQUENCE_COLUMNS,
    JOB_COLUMNS,
    S,
    _cancel_duplicate,
    ends_attempt,
    revived,
)

LOCK_RUNNING = f"""
SELECT {JOB_COLUMNS}, {CONSEQUENCE_COLUMNS} FROM {S}.jobs
WHERE id = %s AND run_lease = %s AND state = 'running' FOR UPDATE"""

# heartbeat_at: a running row gets %(mark)s (NULL from the worker, whose handler returned; the
# live attempt's heartbeat from fail_external), a row that already left 'running' keeps its
# "still running" mark; dead_letter_if_enabled carries it into the DLQ entry.
_SETTLE_MARK = "CASE WHEN state = 'running' THEN %(mark)s::timestamptz ELSE heartbeat_at END"

SETTLE_FAILED = f"""
UPDATE {S}.jobs
SET state = 'failed', finalized_at = now(), {ends_attempt(_SETTLE_MARK)},
    consequence_state = %(consequence)s, consequence_reason = %(reason)s,
    consequence_path = CASE WHEN %(consequence)s::text = 'applied' THEN %(path)s END,
    consequence_applied_at = CASE WHEN %(consequence)s::text = 'applied' THEN now() END,
    consequence_retry_at = NULL, consequence_error = NULL
WHERE id = %(id)s"""

# ... when settling as failed would make a second holder of the job's unique key (its mask
# holds 'failed' and another job holds the key): cancelled as a duplicate, as the worker's own
# failure into a held key is, with its consequence settled all the same (same params).
SETTLE_FAILED_AS_DUPLICATE = f"""{_cancel_duplicate(_SETTLE_MARK)},
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
    {ends_attempt(_SETTLE_MARK)},
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
    {ends_attempt(_SETTLE_MARK)},
    consequence_state = 'owed', consequence_reason = %(reason)s, consequence_path = %(path)s,
    consequence_error = NULL, consequence_retry_at = now()
WHERE id = %(id)s"""

MARK_CONSEQUENCE_APPLIED = f"""
UPDATE {S}.jobs
SET consequence_state = %(state)s, consequence_path = %(path)s,
    consequence_applied_at = CASE WHEN %(state)s::text = 'applied' THEN now() END,
    consequence_retry_at = NULL, consequence_error = NULL
WHERE id = %(id)s"""

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

# A corrected job owes its consequence: it moves back from jobs_done to the hot table (ADR 016).
# keep_key false: the job's mask holds 'failed' and another job holds its key, so the corrected
# job fails without holding it (its 'failed' bit leaves the mask; the error says so).
_KEYED = f"""CASE WHEN %(keep_key)s THEN {{0}}unique_states
    ELSE {{0}}unique_states & ~(1 << {S}.state_bit('failed')) END"""

_CORRECTED_ROW = {
    "state": f"'failed'::{S}.job_state",
    "unique_states": _KEYED.format("o."),
    "finalized_at": "now()",
    "errors": "o.errors || %(error)s::jsonb",
    "consequence_state": "%(cstate)s::text",
    "consequence_reason": "'corrected'",
    "consequence_path": "'reconciliation'",
    "consequence_retry_at": "now()",
    "consequence_applied_at": "NULL",
    "consequence_error": "NULL",
}

CORRECT_TO_FAILED = revived(
    "j.id = %(id)s AND j.state = 'completed'",
    _CORRECTED_ROW,
    f"""
    UPDATE {S}.jobs
    SET state = 'failed', finalized_at = now(), errors = errors || %(error)s::jsonb,
        unique_states = {_KEYED.format("")},
        consequence_state = %(cstate)s, consequence_reason = 'corrected',
        consequence_path = 'reconciliation', consequence_retry_at = now(),
        consequence_applied_at = NULL, consequence_error = NULL
    WHERE id = %(id)s AND state = 'completed'""",
    JOB_COLUMNS,
)

CONSEQUENCES_OWED = f"""
SELECT id, kind, queue, state::text AS state, consequence_reason AS reason,
       consequence_path AS path, consequence_attempts AS attempts, consequence_error AS error,
       consequence_retry_at AS retry_at,
       (consequence_attempts > 0 OR consequence_retry_at < now() - interval '60 seconds') AS overdue
FROM {S}.jobs WHERE consequence_state = 'owed' ORDER BY id LIMIT %s"""

# -- the verify pass (migration 020): completions of the verifier kinds are listed in
# verify_due by jobs_done's insert trigger; the pass reads that list, never the slices.

# The leader's verifier kinds made equal to its registry: a kind it lacks, had dropped, or now
# needs a longer window for is (re)added; a kind it no longer has is dropping. Returns both,
# and whether a change from an earlier tick is still to settle (read before this statement's).
SYNC_VERIFIER_KINDS = f"""
WITH added AS (
    INSERT INTO {S}.verifier_kinds AS v (kind, window_s)
    SELECT unnest(%(kinds)s::text[]), %(window_s)s
    ON CONFLICT (kind) DO UPDATE
        SET state = CASE WHEN v.state = 'dropping' OR v.window_s < EXCLUDED.window_s
                         THEN 'adding' ELSE v.state END,
            wait_xmax = CASE WHEN v.state = 'dropping' OR v.window_s < EXCLUDED.window_s
                             THEN NULL ELSE v.wait_xmax END,
            window_s = EXCLUDED.window_s
        WHERE v.state = 'dropping' OR v.window_s <> EXCLUDED.window_s
    RETURNING v.kind, v.state
), dropped AS (
    UPDATE {S}.verifier_kinds SET state = 'dropping', wait_xmax = NULL
    WHERE state <> 'dropping' AND kind <> ALL(%(kinds)s::text[])
    RETURNING kind
)
SELECT ARRAY(SELECT kind FROM added WHERE state = 'adding' ORDER BY kind) AS added,
       ARRAY(SELECT kind FROM dropped ORDER BY kind) AS dropped,
       EXISTS (SELECT 1 FROM {S}.verifier_kinds WHERE state <> 'active') AS unsettled"""

FORGET_DUE_OF_KINDS = f"DELETE FROM {S}.verify_due WHERE kind = ANY(%(kinds)s::text[])"

# In a transaction after the change committed: the point every older transaction must pass.
MARK_KIND_CHANGES = f"""
UPDATE {S}.verifier_kinds SET wait_xmax = pg_snapshot_xmax(pg_current_snapshot())
WHERE state <> 'active' AND wait_xmax IS NULL"""

# Kinds whose change every transaction older than it has now left behind.
SETTLED_KIND_CHANGES = f"""
SELECT kind, state FROM {S}.verifier_kinds
WHERE state <> 'active' AND wait_xmax <= pg_snapshot_xmin(pg_current_snapshot())
ORDER BY kind FOR UPDATE"""

ACTIVATE_KINDS = f"""
UPDATE {S}.verifier_kinds SET state = 'active', wait_xmax = NULL
WHERE kind = ANY(%(kinds)s::text[]) AND state = 'adding'"""

DROP_KINDS = f"""
DELETE FROM {S}.verifier_kinds WHERE kind = ANY(%(kinds)s::text[]) AND state = 'dropping'"""

LIST_DUE_FROM_SLICES = f"""
INSERT INTO {S}.verify_due (job_id, kind, finalized_at)
SELECT j.id, j.kind, j.finalized_at FROM {S}.jobs_done j
WHERE j.kind = ANY(%(kinds)s::text[]) AND j.state = 'completed' AND j.verified_at IS NULL
  AND j.finalized_at > now() - %(window_s)s * interval '1 second'
ORDER BY j.id
ON CONFLICT (job_id) DO NOTHING"""

EXPIRE_DUE = f"""
DELETE FROM {S}.verify_due WHERE finalized_at <= now() - %(window_s)s * interval '1 second'"""

# Lowest id first, skipping jobs whose hook raised until their next try.
VERIFY_DUE = f"""
SELECT job_id, finalized_at FROM {S}.verify_due
WHERE kind = ANY(%(kinds)s::text[]) AND finalized_at > now() - %(window_s)s * interval '1 second'
  AND next_try_at <= now()
ORDER BY job_id LIMIT %(limit)s"""

# By id in every slice (an index probe each): an admin edit of finalized_at may have moved a
# listed row to another slice.
DUE_JOBS = f"""
SELECT {JOB_COLUMNS} FROM {S}.jobs_done
WHERE id = ANY(%(ids)s) AND state = 'completed' AND verified_at IS NULL
ORDER BY id"""

# Listed jobs no longer completed and unverified in a slice (retried, dead-lettered, pruned,
# verified or corrected elsewhere). The finalized_at match keeps a listing a later completion
# of the same job renewed.
FORGET_DUE = f"""
DELETE FROM {S}.verify_due d USING unnest(%(ids)s::bigint[], %(finalized)s::timestamptz[])
    AS g(job_id, finalized_at)
WHERE d.job_id = g.job_id AND d.finalized_at = g.finalized_at"""

# A hook that raised: its job is tried again after 1, 2, 4 ... 60 s.
DEFER_DUE = f"""
UPDATE {S}.verify_due
SET tries = tries + 1, next_try_at = now() + least(power(2, tries), 60) * interval '1 second'
WHERE job_id = %(id)s"""

MARK_VERIFIED = f"""
WITH i AS (SELECT unnest(%s::bigint[]) AS id),
h AS (UPDATE {S}.jobs j SET verified_at = now() FROM i WHERE j.id = i.id),
d AS (DELETE FROM {S}.verify_due d USING i WHERE d.job_id = i.id)
UPDATE {S}.jobs_done j SET verified_at = now() FROM i WHERE j.id = i.id"""

# The verify pass re-checks, under the row lock, that the job is still unverified and completed.
LOCK_UNVERIFIED = f"""
WITH i AS (SELECT %s::bigint AS id),
h AS (SELECT j.id FROM {S}.jobs j, i WHERE j.id = i.id AND j.state = 'completed'
      AND j.verified_at IS NULL FOR UPDATE OF j SKIP LOCKED),
f AS (SELECT j.id FROM {S}.jobs_done j, i WHERE j.id = i.id AND j.state = 'completed'
      AND j.verified_at IS NULL FOR UPDATE OF j SKIP LOCKED)
SELECT id FROM h UNION ALL SELECT id FROM f"""

# A failure consequence's effect runs under its own savepoint: undone alone when it fails.
EFFECT_SAVEPOINT = "SAVEPOINT awa_fast_effect"
EFFECT_ROLLBACK = "ROLLBACK TO SAVEPOINT awa_fast_effect"
EFFECT_RELEASE = "RELEASE SAVEPOINT awa_fast_effect"
