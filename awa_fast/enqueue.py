"""Execute prepared inserts on a given psycopg 3 connection (async or sync).

One round trip per call: a single row, an ``unnest`` batch, or COPY. Unique violations on
``idx_awa_fast_jobs_unique`` surface as :class:`~awa_fast.errors.UniqueConflict`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

import orjson
import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import tuple_row

from awa_fast import _native, db_errors, sql
from awa_fast.db_errors import UNIQUE_INDEX
from awa_fast.errors import UniqueConflict
from awa_fast.job import Job, JobState
from awa_fast.requests import Prepared, UniformBatch
from awa_fast.rows import one_row, one_row_sync
from awa_fast.schema_binding import DEFAULT, SchemaBinding

log = logging.getLogger("awa_fast.enqueue")


# The refusals of an insert's own rules the insert path maps where it runs (its callers inside
# awa-fast catch the typed errors); every other driver error propagates as is, for the callers
# that decide retries on it, and is mapped where the public call leaves awa-fast (db_errors).
_INSERT_REFUSALS = (pg_errors.UniqueViolation, pg_errors.CheckViolation, pg_errors.UndefinedTable)


@contextlib.contextmanager
def mapped_errors(operation: str = "insert") -> Iterator[None]:
    """Map the block's unique violations (:class:`UniqueConflict`), check violations
    (:class:`ValidationError`) and a missing table (:class:`SchemaNotMigrated`) as
    :func:`awa_fast.db_errors.translate` does, chained; other errors pass unchanged."""
    try:
        yield
    except _INSERT_REFUSALS as exc:
        raise db_errors.translate(exc, operation) from exc


async def holder_conflict(
    conn: psycopg.AsyncConnection,
    job_id: int,
    action: str,
    exc: BaseException,
    outcome: str = "nothing changed",
) -> UniqueConflict:
    """The :class:`UniqueConflict` of ``action`` on job ``job_id`` (a retry path), naming the job
    that holds its unique key. ``conn`` must be usable (outside the failed transaction)."""
    holder = None
    cur = await conn.execute(sql.UNIQUE_KEY_OF, {"id": job_id})
    key = await cur.fetchone()
    if key is not None and key[0] is not None:
        holder = await (await conn.execute(sql.UNIQUE_HOLDER, (key[0],))).fetchone()
    held = f"job {holder[0]} ({holder[1]})" if holder else "another live job"
    constraint = getattr(getattr(exc, "diag", None), "constraint_name", None) or getattr(
        exc, "constraint", None
    )
    return UniqueConflict(
        f"cannot {action} job {job_id}: its unique key is held by {held}; {outcome}",
        constraint=constraint or UNIQUE_INDEX,
        holder_id=holder[0] if holder else None,
        holder_state=holder[1] if holder else None,
    )


def maps_errors(fn):
    """Decorator: run the coroutine function ``fn`` under :func:`mapped_errors`."""

    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        with mapped_errors():
            return await fn(*args, **kwargs)

    return wrapper


def one_params(p: Prepared) -> tuple:
    return (
        p.kind,
        p.queue,
        p.args,
        p.priority,
        p.max_attempts,
        p.run_at,
        p.metadata,
        p.tags,
        p.unique_key,
        p.unique_states,
        p.ordering_key,
    )


def many_params(rows: list[Prepared]) -> tuple:
    return (
        [p.kind for p in rows],
        [p.queue for p in rows],
        [p.args for p in rows],
        [p.priority for p in rows],
        [p.max_attempts for p in rows],
        [p.run_at for p in rows],
        [p.metadata for p in rows],
        [orjson.dumps(p.tags).decode() if p.tags else "[]" for p in rows],
        [p.unique_key for p in rows],
        [p.unique_states for p in rows],
        [p.ordering_key for p in rows],
    )


async def insert_one(
    conn: psycopg.AsyncConnection,
    p: Prepared,
    *,
    defer_notify: bool = False,
    binding: SchemaBinding = DEFAULT,
) -> Job:
    """Insert one prepared job; returns the stored row. ``defer_notify``: its transaction sends
    no NOTIFY (the caller wakes the queue after the commit, ADR 018). ``binding``: the schema,
    for a caller's own connection (the bridge; awa-fast's own are bound already)."""
    with mapped_errors():
        # The caller's connection may have any row factory (bridge): read tuples.
        cur = conn.cursor(row_factory=tuple_row)
        statement = sql.INSERT_ONE_DEFERRING_NOTIFY if defer_notify else sql.INSERT_ONE
        if binding is not DEFAULT:  # (awa-fast's own connections are bound already)
            statement = binding.rewrite(statement)
        await cur.execute(statement, one_params(p))
        return Job.from_row(await one_row(cur))


def insert_one_sync(
    conn: psycopg.Connection, p: Prepared, *, binding: SchemaBinding = DEFAULT
) -> Job:
    """Blocking twin of :func:`insert_one`."""
    with mapped_errors():
        cur = conn.cursor(row_factory=tuple_row)
        statement = binding.rewrite(sql.INSERT_ONE)
        return Job.from_row(one_row_sync(cur.execute(statement, one_params(p))))


async def insert_many(conn: psycopg.AsyncConnection, rows: list[Prepared]) -> list[Job]:
    """Insert many prepared jobs in one statement (all or none); returns them in input order.

    A batch with unique keys takes them in key order (``sql.INSERT_MANY_KEYED``), so concurrent
    batches over the same keys wait for each other instead of deadlocking; ids still follow
    the input order."""
    if not rows:
        return []
    keyed = any(p.unique_key is not None for p in rows)
    with mapped_errors():
        cur = await conn.execute(
            sql.INSERT_MANY_KEYED if keyed else sql.INSERT_MANY, many_params(rows)
        )
        found = await cur.fetchall()
    if keyed:
        found.sort(key=lambda r: r[0])  # ids were drawn in input order
    return [Job.from_row(r) for r in found]


def key_order(keys: list[bytes | None]) -> list[int]:
    """Positions of ``keys`` in the one global order unique keys are taken in (bytewise, as
    PostgreSQL sorts bytea; rows without a key last)."""
    return sorted(range(len(keys)), key=lambda i: (keys[i] is None, keys[i] or b""))


def _copy_rows(rows: list[Prepared], ids: list[int], now: datetime) -> Iterable[tuple]:
    for job_id, p in zip(ids, rows):
        run_at = p.run_at or now
        state = "available" if p.run_at is None else "scheduled"  # awa: any explicit run_at
        yield (
            job_id,
            p.kind,
            p.queue,
            p.args,
            state,
            p.priority,
            p.max_attempts,
            run_at,
            p.metadata,
            p.tags,
            p.unique_key,
            p.unique_states,
            p.ordering_key,
            now,
        )


def copied_job(job_id: int, p: Prepared, now: datetime) -> Job:
    """The Job a COPY wrote, built locally (every column is known: nothing to read back)."""
    # The session's time zone, as a read-back would give it.
    run_at = p.run_at.astimezone(now.tzinfo) if p.run_at else now
    row: tuple[Any, ...] = (
        job_id,
        p.kind,
        p.queue,
        orjson.loads(p.args),
        JobState.Available if p.run_at is None else JobState.Scheduled,
        p.priority,
        0,
        p.max_attempts,
        run_at,
        None,
        None,
        None,
        None,
        now,
        [],
        orjson.loads(p.metadata),
        p.tags,
        p.unique_key,
        p.unique_states,
        None,
        None,
        0,
        None,
    )
    return Job.from_row(row)


async def copy_many(conn: psycopg.AsyncConnection, rows: list[Prepared]) -> list[Job]:
    """COPY prepared jobs (for 10k+ rows). Must run inside a transaction on ``conn``; that
    transaction commits without the insert trigger's NOTIFY (``defer_notify``): the caller wakes
    the queues after the commit.

    Ids are reserved first so the returned jobs need no read-back; ``created_at`` and the default
    ``run_at`` are the transaction's ``now()``, as a plain INSERT would write.
    """
    if not rows:
        return []
    with mapped_errors():
        cur = await conn.execute(sql.COPY_RESERVE, (len(rows),))
        now, ids = await one_row(cur)
        records = list(_copy_rows(rows, ids, now))
        async with conn.cursor().copy(sql.COPY_JOBS) as copy:
            # ids follow the input; rows go in unique-key order (see insert_many)
            for i in key_order([p.unique_key for p in rows]):
                await copy.write_row(records[i])
    return [copied_job(i, p, now) for i, p in zip(ids, rows)]


def _follow_up_record(
    p: Prepared, ord_: int, trigger: int | None, lease: int | None = None
) -> dict:
    fragment = orjson.Fragment
    return {
        "trigger": trigger,
        "lease": lease,
        "ord": ord_,
        "kind": p.kind,
        "queue": p.queue,
        "args": fragment(p.args),
        "priority": p.priority,
        "max_attempts": p.max_attempts,
        "run_at": p.run_at,
        "metadata": fragment(p.metadata),
        "tags": p.tags,
        "unique_key": None if p.unique_key is None else p.unique_key.hex(),
        "unique_states": p.unique_states,
        "ordering_key": None if p.ordering_key is None else p.ordering_key.hex(),
    }


def follow_ups_json(rows: list[Prepared], trigger: int | None = None) -> str:
    """Requests as one JSON array for ``jsonb_to_recordset`` (one parameter instead of eleven
    arrays: psycopg's array dumping dominated the per-job completion)."""
    return orjson.dumps([_follow_up_record(p, i, trigger) for i, p in enumerate(rows)]).decode()


def batch_follow_ups_json(items: list[tuple[int, int, list[Prepared]]]) -> str:
    """``(trigger_id, trigger_run_lease, requests)`` triples as one JSON array (see
    :func:`follow_ups_json`)."""
    return orjson.dumps(
        [
            _follow_up_record(p, i, trigger, lease)
            for trigger, lease, rows in items
            for i, p in enumerate(rows)
        ]
    ).decode()


def copy_escape(text: str) -> str:
    """Escape a value for PostgreSQL's COPY text format."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _array_literal(values: list[str]) -> str:
    quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return "{" + ",".join(quoted) + "}"


def _bytea_text(value: bytes | None) -> str:
    return "\\N" if value is None else "\\\\x" + value.hex()


async def copy_uniform(
    conn: psycopg.AsyncConnection, batch: UniformBatch, *, want_jobs: bool
) -> list[Job] | int:
    """COPY a :class:`UniformBatch` as one text block built in ``_ext`` (inside the caller's
    transaction, which then commits without the insert trigger's NOTIFY, as in :func:`copy_many`).
    Returns the jobs (``want_jobs``) or their count."""
    n = len(batch.jsons)
    with mapped_errors():
        cur = await conn.execute(sql.COPY_RESERVE, (n,))
        now, ids = await one_row(cur)
        run_at = batch.run_at.astimezone(now.tzinfo) if batch.run_at else now
        state = "available" if batch.run_at is None else "scheduled"  # awa: any explicit run_at
        head = f"{copy_escape(batch.kind)}\t{copy_escape(batch.queue)}".encode()
        mid = (
            f"{state}\t{batch.priority}\t{batch.max_attempts}\t{run_at.isoformat()}\t"
            f"{copy_escape(batch.metadata.decode())}\t"
            f"{copy_escape(_array_literal(batch.tags))}"
        ).encode()
        ustates = "\\N" if batch.unique_states is None else str(batch.unique_states)
        tail = f"{ustates}\t{_bytea_text(batch.ordering_key)}\t{now.isoformat()}".encode()
        if batch.keys:  # rows in unique-key order, ids in input order (see insert_many)
            order = key_order(batch.keys)
            block = _native.copy_block(
                [ids[i] for i in order],
                [batch.jsons[i] for i in order],
                [batch.keys[i] for i in order],
                head,
                mid,
                tail,
            )
        else:
            block = _native.copy_block(ids, batch.jsons, batch.keys, head, mid, tail)
        async with conn.cursor().copy(sql.COPY_JOBS) as copy:
            await copy.write(block)
    if not want_jobs:
        return n
    job_state = JobState(state)
    keys = batch.keys or [None] * n
    loads = orjson.loads
    return [
        Job.from_row(
            (
                job_id,
                batch.kind,
                batch.queue,
                args,
                job_state,
                batch.priority,
                0,
                batch.max_attempts,
                run_at,
                None,
                None,
                None,
                None,
                now,
                [],
                loads(batch.metadata),
                list(batch.tags),
                key,
                batch.unique_states,
                None,
                None,
                0,
                None,
            )
        )
        for job_id, args, key in zip(ids, batch.args, keys)
    ]


async def insert_follow_ups(
    conn: psycopg.AsyncConnection, requests: list[Prepared], trigger_kind: str, trigger_id: int
) -> tuple[int, int]:
    """Insert follow-ups inside the caller's transaction (ADR-029 / ADR-046) in ONE statement
    (``sql.INSERT_FOLLOW_UPS``): ids follow the given order, unique keys are taken in key order
    (so two transactions inserting the same keys cannot deadlock), and a request whose key is
    held is skipped (logged at debug with kinds and ids, never args). Any other error
    propagates and rolls the caller's transaction back. Returns ``(inserted, skipped)``.
    """
    if not requests:
        return 0, 0
    with mapped_errors():
        cur = await conn.execute(sql.INSERT_FOLLOW_UPS, (follow_ups_json(requests, trigger_id),))
        inserted = (await one_row(cur))[0]
    skipped = len(requests) - inserted
    if skipped:
        log.debug(
            "%d follow-up(s) of %s job %s skipped: unique key already held",
            skipped,
            trigger_kind,
            trigger_id,
        )
    return inserted, skipped
