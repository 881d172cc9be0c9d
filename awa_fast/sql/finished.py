"""Statements of the finished-job storage (migration 010, ADR 016): the slices of
``awa_fast.jobs_done`` that retention truncates whole, their counters, and the hot table's
vacuum.

A slice is the partition of one final-state class (completed: slots ``0 .. RING_SLOTS - 1``,
failed and cancelled: ``RING_SLOTS .. 2 * RING_SLOTS - 1``) and one period of ``finalized_at``
(``awa_fast.done_slot``). It expires when the newest row written to it is older than its class's
retention; a retention longer than the ring keeps is deleted row by row (ADR 029).
"""

from awa_fast.sql.fragments import _STALENESS, S, skipping

RING_SLOTS = 32  # slices per class (awa_fast.done_slot)
COUNTS_LOCK_CLASS = 1635213686  # advisory lock (class, slot) of a slot's counters (migration 024)
COMPLETED_SLICE_S = 3600  # period of a completed slice
FAILED_SLICE_S = 3 * 3600  # period of a failed / cancelled slice


def slice_table(slot: int) -> str:
    """The partition of ``awa_fast.jobs_done`` that holds slice ``slot`` (0 .. 63).

    Raises:
        ValueError: ``slot`` is not a slice of the ring.
    """
    if not 0 <= slot < 2 * RING_SLOTS:
        raise ValueError(f"no finished slice {slot}")
    if slot < RING_SLOTS:
        return f"{S}.jobs_done_c{slot:02d}"
    return f"{S}.jobs_done_f{slot - RING_SLOTS:02d}"


# A slice's class retention in seconds (params completed_s, failed_s).
_RETENTION = (
    f"CASE WHEN slot < {RING_SLOTS} THEN %(completed_s)s::float8 ELSE %(failed_s)s::float8 END"
    " * interval '1 second'"
)

# Slices whose newest row is past its retention (from the counters: no scan of the slices).
EXPIRED_SLICES = f"""
SELECT slot FROM {S}.done_counts GROUP BY slot
HAVING max(newest) < now() - {_RETENTION}
ORDER BY slot"""

# Under the slice's ACCESS EXCLUSIVE lock (no writer in flight), the same test again: its rows
# if still expired, no row otherwise (a late writer put a young row in it).
EXPIRED_SLICE = f"""
SELECT COALESCE(sum(n), 0)::bigint FROM {S}.done_counts WHERE slot = %(slot)s
HAVING max(newest) < now() - CASE WHEN %(slot)s < {RING_SLOTS} THEN %(completed_s)s::float8
                                  ELSE %(failed_s)s::float8 END * interval '1 second'"""

# A reader or writer queued behind the prune's lock waits at most this long; the prune gives
# up and tries the slice again next pass. Short: while it waits (say behind a pg_dump), every
# new read of jobs_all queues behind it (a breaker helper measured 1.7 s stalls at 2 s).
SLICE_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '200ms'"


def lock_slice(slot: int) -> str:
    """``LOCK TABLE`` of slice ``slot``'s partition, ACCESS EXCLUSIVE."""
    return f"LOCK TABLE {slice_table(slot)} IN ACCESS EXCLUSIVE MODE"


def truncate_slice(slot: int) -> str:
    """``TRUNCATE`` of slice ``slot``'s partition."""
    return f"TRUNCATE {slice_table(slot)}"


# With the slice: the unique keys its jobs held and its counters (per-row deletes, unique jobs
# and counter rows only).
RELEASE_SLICE = f"""
WITH h AS (DELETE FROM {S}.unique_holds WHERE slot = %(slot)s)
DELETE FROM {S}.done_counts WHERE slot = %(slot)s"""

# (Buckets: a minute of completed rows, an hour of failed and cancelled ones, done_inserted.)
# Counter rows are folded in two steps, each bounded by the ring, not by the writers: a
# bucket that ended five minutes ago keeps one row per (slot, bucket, queue, state) instead of
# one per writing backend (backend 0: every connection, and a new one after each reconnect,
# had added its own rows for two hours), and rows older than two hours become one per (slot,
# queue, state) (bucket 'epoch'). Writers stamp the bucket of their own finalized_at, so they
# are done with one by then; a transaction older than that adds a row the next pass folds.
# The slots to fold are locked first (their counts lock, in slot order) and only those are
# folded: a slice's TRUNCATE waits on that lock before it releases the slot's counters
# (migration 024), so it sees the folded sum. Returns the folded slots.
_FOLDABLE = """(backend <> 0 AND bucket < now() - CASE WHEN state = 'completed'
    THEN interval '6 minutes' ELSE interval '65 minutes' END
  OR bucket < now() - interval '2 hours' AND bucket <> 'epoch')"""
LOCK_FOLDABLE_SLOTS = f"""
SELECT COALESCE(array_agg(s.slot ORDER BY s.slot), '{{}}')
FROM (SELECT DISTINCT slot FROM {S}.done_counts WHERE {_FOLDABLE} ORDER BY slot) AS s
CROSS JOIN LATERAL (SELECT pg_advisory_xact_lock({COUNTS_LOCK_CLASS}, s.slot)) AS l"""

# No row is both deleted and upserted: a backend-0 row is deleted only past two hours, when
# its sum goes to the 'epoch' row, which is never deleted here. A row a writer holds (a
# transaction that finishes jobs under an old now()) is skipped, folded by a later pass: the
# fold never waits on a writer, so it can neither stall the prune pass nor deadlock with one
# (only the leader writes backend-0 rows).
FOLD_COUNTS = f"""
WITH old AS (
    DELETE FROM {S}.done_counts d
    USING (SELECT ctid FROM {S}.done_counts
           WHERE {_FOLDABLE} AND slot = ANY(%(slots)s::smallint[])
           FOR UPDATE SKIP LOCKED) AS free
    WHERE d.ctid = free.ctid
    RETURNING d.slot, d.bucket, d.queue, d.state, d.n, d.newest
)
INSERT INTO {S}.done_counts AS c (slot, bucket, queue, state, backend, n, newest)
SELECT slot, CASE WHEN bucket < now() - interval '2 hours' THEN 'epoch' ELSE bucket END AS b,
       queue, state, 0, sum(n), max(newest)
FROM old GROUP BY slot, b, queue, state ORDER BY slot, b, queue, state
ON CONFLICT (slot, bucket, queue, state, backend)
DO UPDATE SET n = c.n + EXCLUDED.n, newest = GREATEST(c.newest, EXCLUDED.newest)"""

# Finished rows kept in the hot table by their "still running" mark once the mark went stale
# (the worker died without clearing it): the mark is cleared, so they move to jobs_done
# (state = state fires the move trigger). Through bulk.run_isolated: a row whose move fails (a
# trigger, a key another job holds) is kept and logged, the others move, the pass goes on.
_STALE_MARK = f"""s.state IN ('completed', 'failed', 'cancelled') AND s.heartbeat_at IS NOT NULL
  AND s.heartbeat_at < now() - {_STALENESS}"""

SETTLE_STALE_MARKS = f"""
UPDATE {S}.jobs SET heartbeat_at = NULL, state = state
WHERE id IN (SELECT s.id FROM {S}.jobs s WHERE {_STALE_MARK} ORDER BY s.id LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED)
RETURNING id"""

STALE_MARK_IDS = f"""
SELECT s.id FROM {S}.jobs s WHERE {_STALE_MARK} AND {skipping("s")} ORDER BY s.id LIMIT %(limit)s"""

SETTLE_STALE_MARK_ONE = f"""
UPDATE {S}.jobs SET heartbeat_at = NULL, state = state
WHERE id = (SELECT s.id FROM {S}.jobs s WHERE s.id = %(id)s AND {_STALE_MARK}
            FOR UPDATE SKIP LOCKED)
RETURNING id"""

# The hot table's dead rows (the statistics the backends flushed, about once a second), its
# heap size in bytes as its last vacuum left it (pg_class: no lock taken), and whether the
# statistics have seen it vacuumed: crash recovery (or pg_stat_reset) zeroes them, dead-row
# count included, while the dead rows stay in the heap.
HOT_DEAD_ROWS = f"""
SELECT COALESCE(s.n_dead_tup, 0) AS dead_rows,
       c.relpages::bigint * current_setting('block_size')::bigint AS heap_bytes,
       COALESCE(s.vacuum_count + s.autovacuum_count, 0) > 0 AS vacuumed
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = '{S}.jobs'::regclass"""

# Run on an autocommit connection; skipped when autovacuum holds the table. The hot table's
# empty tail is cut off only when it is large (migration 016: truncation takes an ACCESS
# EXCLUSIVE lock that stops every claim, insert and completion, and the table grows back at once).
VACUUM_HOT = f"VACUUM (SKIP_LOCKED, TRUNCATE false) {S}.jobs"
VACUUM_HOT_TRUNCATING = f"VACUUM (SKIP_LOCKED, TRUNCATE true) {S}.jobs"

# Finished jobs per queue from the counters: failed / cancelled held now, completed in the last
# hour (minute buckets; rows of the hour's first, partial minute are left out).
DONE_COUNTS_BY_QUEUE = f"""
SELECT queue,
       COALESCE(sum(n) FILTER (WHERE state = 'failed'), 0)::bigint AS failed,
       COALESCE(sum(n) FILTER (WHERE state = 'cancelled'), 0)::bigint AS cancelled,
       COALESCE(sum(n) FILTER (WHERE state = 'completed'
                               AND bucket >= now() - interval '1 hour'), 0)::bigint
           AS completed_last_hour
FROM {S}.done_counts GROUP BY queue"""

# Row-by-row retention: finished rows of a queue whose retention is shorter than its class's
# horizon (the longest retention any queue of the class has: what the slices keep,
# EXPIRED_SLICES; per-queue retention is start()'s queue dict "retention", awa's
# queue_retention), and every row of a class whose horizon is longer than the ring keeps (ADR
# 029: 30 h completed, 90 h failed and cancelled; a slice is written again before its rows
# expire), are deleted row by row, in batches; a slice still goes whole once its newest row is
# past the horizon. Params: states (the class's final states), queues / ages (the queues with a
# retention of their own and its seconds, NULL where it is left to the slices or kept
# forever), default_s (every other queue's, NULL likewise), min_s (the shortest of them: lets
# the BRIN index on finalized_at skip young ranges), limit. The delete fires done_deleted
# (counters, unique holds; migration 010).
_PAST_QUEUE_RETENTION = (
    "j.state = ANY(%(states)s::awa_fast.job_state[])"
    " AND j.finalized_at < now() - %(min_s)s::float8 * interval '1 second'"
    " AND j.finalized_at < now() - CASE WHEN array_position(%(queues)s::text[], j.queue) IS NULL"
    " THEN %(default_s)s::float8"
    " ELSE (%(ages)s::float8[])[array_position(%(queues)s::text[], j.queue)] END"
    " * interval '1 second'"
)
# The class's slices (first_slot .. last_slot: partition pruning on jobs_done's key
# expression), on both sides of the delete: without it each batch scanned every slice to join
# its 1,000 ids (352 ms a batch at 300,000 finished rows against 27 ms).
_CLASS_SLICES = f"{S}.done_slot(j.state, j.finalized_at) BETWEEN %(first_slot)s AND %(last_slot)s"

PRUNE_QUEUE_RETENTION = f"""
WITH t AS (SELECT j.id FROM {S}.jobs_done j WHERE {_CLASS_SLICES} AND {_PAST_QUEUE_RETENTION}
           LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
DELETE FROM {S}.jobs_done j WHERE {_CLASS_SLICES} AND j.id = ANY(ARRAY(SELECT t.id FROM t))
RETURNING j.id"""

PRUNE_QUEUE_RETENTION_IDS = f"""
SELECT j.id FROM {S}.jobs_done j
WHERE {_CLASS_SLICES} AND {_PAST_QUEUE_RETENTION} AND {skipping("j")}
LIMIT %(limit)s"""

PRUNE_QUEUE_RETENTION_ONE = f"""
DELETE FROM {S}.jobs_done j WHERE {_CLASS_SLICES} AND j.id = (
    SELECT j.id FROM {S}.jobs_done j
    WHERE j.id = %(id)s AND {_CLASS_SLICES} AND {_PAST_QUEUE_RETENTION}
    FOR UPDATE SKIP LOCKED)
RETURNING j.id"""
