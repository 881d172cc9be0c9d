"""Claiming available jobs: the bulk claim, its row-by-row twin (same ``_CLAIMABLE`` guard) and
the test harness's claim of one job.
"""

from awa_fast.sql.fragments import S, _key_held_by_other, by_ids, skipping

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
WHERE {by_ids("k")}{_CLAIM_RETURNING}"""

# Row-by-row twin of CLAIM (same guard): its candidates, then one row each.
# ... its row-by-row redo's candidates, without the rows earlier claims left available
# (%(skip)s, bulk.run_isolated with batch): a batch of refused rows at the head of the queue
# cannot hide the rows behind them.
CLAIM_CANDIDATES = f"""
SELECT j.id FROM {S}.jobs j WHERE {_CLAIMABLE} AND {skipping("j")}
ORDER BY j.priority, j.run_at, j.id LIMIT %(limit)s"""

CLAIM_ONE = f"""{_CLAIM_SET}
WHERE j.id = %(id)s AND {_CLAIMABLE}{_CLAIM_RETURNING}"""

# (errors and metadata come back as text: the handler's job decodes them only when read.)

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

# The idle poll (worker/idle_poll.py): which of the given queues hold an available job of one
# of the process's kinds and are not paused. One statement for every idle queue of a process,
# each probe one descent of idx_awa_fast_jobs_claim; a queue it names gets a real CLAIM.
QUEUES_WITH_AVAILABLE = f"""
SELECT q.queue FROM unnest(%(queues)s::text[]) AS q(queue)
WHERE EXISTS (SELECT 1 FROM {S}.jobs j
              WHERE j.state = 'available' AND j.queue = q.queue
                AND j.kind = ANY(%(kinds)s::text[]))
  AND NOT EXISTS (SELECT 1 FROM {S}.queue_meta m WHERE m.queue = q.queue AND m.paused)"""
