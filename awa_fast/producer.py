"""Producers: :class:`Producer` prepares and inserts jobs (one row, one statement for many,
COPY) on the client's pool, and begins transactions; :data:`DEFAULT_QUEUE` tells an insert
without ``queue=`` apart. ``AsyncClient`` exposes its methods as its own (ADR 041); the
statements are in :mod:`awa_fast.enqueue`."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from awa_fast import bulk, enqueue, primary, sql, storage_options
from awa_fast.connections import Connections
from awa_fast.errors import QueueMismatchWarning, ValidationError
from awa_fast.job import Job, JobState
from awa_fast.requests import check_statement_size, prepare, prepare_uniform
from awa_fast.transaction import Transaction
from awa_fast.wake import Waker


class _ImplicitQueue(str):
    """``insert``'s default queue: ``"default"``, told apart (by identity) from an explicit
    ``queue="default"``, so that only an insert without ``queue=`` can warn."""

    __slots__ = ()


DEFAULT_QUEUE = _ImplicitQueue("default")


class OffQueueWarner:
    """Warns (:class:`QueueMismatchWarning`) once per kind and client when jobs given no queue
    land in ``default`` although this client registered their kind's handler for another queue
    (no worker may run there): inserts and staged follow-ups share it.

    Args:
        off_default: returns ``{kind: queue}`` for the kinds this client registered for a queue
            other than ``default`` (``Registry.off_default``), read at each call.
    """

    def __init__(self, off_default: Callable[[], dict[str, str]]) -> None:
        self._off_default = off_default
        self._warned: set[str] = set()  # kinds warned about

    def warn(self, rows: Any, *, stacklevel: int, how: str = "inserted") -> None:
        """``rows``: prepared jobs (``.kind``, ``.queue``) given no ``queue=``; ``how`` says
        what happened to them (``"inserted"``, ``"staged"``); ``stacklevel`` as
        ``warnings.warn``'s, counted from the caller."""
        off_default = self._off_default()
        if not off_default:
            return
        for row in rows:
            queue = off_default.get(row.kind)
            if queue is None or row.queue != "default" or row.kind in self._warned:
                continue
            self._warned.add(row.kind)
            warnings.warn(
                QueueMismatchWarning(
                    f"job kind {row.kind!r} is registered for queue {queue!r} on this client but "
                    f"was {how} without queue=, so it went to 'default' (awa-pg semantics); "
                    f"pass queue={queue!r} or work 'default' too"
                ),
                stacklevel=stacklevel + 1,
            )


class Producer:
    """Inserts jobs for one client.

    Args:
        db: the connection source.
        off_queue: warns about inserts without ``queue=`` of kinds registered off ``default``.
    """

    def __init__(self, db: Connections, off_queue: OffQueueWarner) -> None:
        self._db = db
        self._off_queue = off_queue
        self._stripes_logged = False  # enqueue_many_copy's stripe count logged (once)
        # The inserts below commit without a NOTIFY and wake their queues after the commit:
        # concurrent notifying commits would take PostgreSQL's notify lock one at a time, each
        # through its own WAL flush (ADR 018). A transaction() the caller ends notifies inside.
        self.waker = Waker(db.pool)

    async def insert(
        self,
        args: Any,
        *,
        kind: str | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 2,
        max_attempts: int = 25,
        tags: list[str] | None = None,
        metadata: dict | None = None,
        run_at: Any = None,
        unique_opts: dict | None = None,
        ordering_key: bytes | str | None = None,
    ) -> Job:
        """Insert one job and return it.

        ``args`` is a dict (then ``kind`` is required), a dataclass, a ``msgspec.Struct`` or a
        pydantic model. A future ``run_at`` (datetime, naive = UTC, or ISO 8601 str) makes the job
        ``scheduled``. ``unique_opts`` is ``{by_queue, by_args, by_period, states}``
        ({} = defaults). Without ``queue=`` the job goes to ``"default"``, as in awa-pg, even
        for a kind registered here with ``task(..., queue=X)``; that case warns once per kind
        (:class:`QueueMismatchWarning`). The job is committed when this returns; the NOTIFY
        that wakes its queue's dispatchers follows from a background task (ADR 018, as for
        every insert method here; ``close()`` waits for it).

        Raises:
            ValidationError: a field breaks an insert rule (nothing is written).
            UniqueConflict: another job holds the same unique key.
        """
        implicit = queue is DEFAULT_QUEUE
        p = prepare(
            args,
            kind=kind,
            queue="default" if implicit else queue,
            priority=priority,
            max_attempts=max_attempts,
            tags=tags,
            metadata=metadata,
            run_at=run_at,
            unique_opts=unique_opts,
            ordering_key=ordering_key,
        )
        if implicit:
            self._warn_off_queue((p,), stacklevel=5)  # + the client's db_errors wrapper

        async def once() -> Job:
            async with (await self._db.pool()).connection() as conn:
                return await enqueue.insert_one(conn, p, defer_notify=True)  # autocommit

        job = await primary.retry_read_only(once, what="insert")
        if job.state is JobState.Available:
            await self.waker.wake((job.queue,))
        return job

    async def insert_many(self, jobs: list, **opts: Any) -> list[Job]:
        """Insert many jobs in one statement with shared keyword options (all or none).

        Each element of ``jobs`` is args (as for :meth:`insert`) or an ``EnqueueRequest``.

        Raises:
            ValidationError: any element breaks a rule (no row of the batch is written).
            UniqueConflict: any element's unique key is held (no row is written).
            DeadlockError: kept deadlocking with concurrent writers after bounded retries
                (unique keys are taken in one global order, so only writers outside
                awa-fast's order can cause one; no row is written).
        """
        rows = _prepare_all(jobs, opts)
        check_statement_size(
            rows, "insert them with insert_many_copy (COPY streams them) or in smaller batches"
        )
        if "queue" not in opts:
            self._warn_off_queue(rows, stacklevel=5)

        async def once() -> list[Job]:
            async with (await self._db.pool()).connection() as conn:
                async with conn.transaction():
                    await conn.execute(sql.DEFER_NOTIFY)
                    return await enqueue.insert_many(conn, rows)

        jobs = await primary.retry_read_only(
            lambda: bulk.retry_deadlocks(once, what="insert_many"), what="insert_many"
        )
        await self.waker.wake(j.queue for j in jobs if j.state is JobState.Available)
        return jobs

    async def insert_many_copy(self, jobs: list, **opts: Any) -> list[Job]:
        """Bulk insert with COPY (for 10k+ rows); same arguments and errors as :meth:`insert_many`,
        plus awa's ``opts``: a list (one entry per job, ``None`` or a dict with ``queue`` and/or
        ``ordering_key``; an explicit ``ordering_key: None`` clears the batch's key) overriding
        those two options per job.

        Raises:
            ValidationError: also for an ``opts`` list of the wrong length, a non-dict entry or
                another key (awa's messages).
        """
        return await self._copy(jobs, opts, want_jobs=True)

    async def enqueue_many_copy(self, jobs: list, **opts: Any) -> int:
        """Like :meth:`insert_many_copy` but returns only the number of jobs written (awa-pg's
        ``enqueue_many_copy``): no Job objects are built.

        awa's ``queue_storage_queue_stripe_count`` (an int > 0) is accepted and has no effect:
        awa-fast has no stripes (logged at INFO, once per client, when not awa's default 1;
        storage_options.py).

        Raises:
            ValidationError, UniqueConflict, DeadlockError: as :meth:`insert_many_copy`.
            ConfigError: ``queue_storage_queue_stripe_count`` not an int > 0.
        """
        stripes = opts.pop("queue_storage_queue_stripe_count", 1)
        storage_options.check_value("queue_storage_queue_stripe_count", stripes)
        if stripes != 1 and not self._stripes_logged:
            self._stripes_logged = True
            storage_options.accept(
                {"queue_storage_queue_stripe_count": stripes}, where="enqueue_many_copy()"
            )
        return await self._copy(jobs, opts, want_jobs=False)

    async def _copy(self, jobs: list, opts: dict, *, want_jobs: bool) -> Any:
        per_job = opts.pop("opts", None)
        rows: list | None
        if per_job is not None:
            rows, batch = _prepare_with_overrides(jobs, opts, per_job), None
        else:
            # Args of one type with shared options take the compiled path (one COPY block).
            batch = prepare_uniform(jobs, **opts)
            rows = None if batch is not None else _prepare_all(jobs, opts)
            if "queue" not in opts:
                self._warn_off_queue((batch,) if batch is not None else rows, stacklevel=6)

        async def once() -> Any:
            async with (await self._db.pool()).connection() as conn:
                async with conn.transaction():  # COPY_RESERVE defers the NOTIFY
                    if batch is not None:
                        return await enqueue.copy_uniform(conn, batch, want_jobs=want_jobs)
                    assert rows is not None  # prepared when there is no uniform batch
                    return await enqueue.copy_many(conn, rows)

        copied = await primary.retry_read_only(
            lambda: bulk.retry_deadlocks(once, what="COPY insert"), what="COPY insert"
        )
        if batch is not None:  # one queue; available unless it has a run_at (awa's rule)
            if batch.run_at is None and batch.jsons:
                await self.waker.wake((batch.queue,))
            return copied
        await self.waker.wake(j.queue for j in copied if j.state is JobState.Available)
        return copied if want_jobs else len(copied)

    def _warn_off_queue(self, rows: Any, stacklevel: int) -> None:
        self._off_queue.warn(rows, stacklevel=stacklevel)

    async def transaction(self) -> Transaction:
        """Begin a transaction: ``async with await client.transaction() as tx``."""
        pool = await self._db.pool()
        conn = await pool.getconn()
        try:
            await conn.execute(sql.TX_BEGIN)
        except BaseException:
            await pool.putconn(conn)
            raise
        return Transaction(pool, conn, self._off_queue)


def _prepare_all(jobs: list, opts: dict) -> list:
    from awa_fast.requests import EnqueueRequest

    out = []
    for i, item in enumerate(jobs):
        try:
            if isinstance(item, EnqueueRequest):
                out.append(prepare(item.args, **{**opts, **item.options}))
            else:
                out.append(prepare(item, **opts))
        except ValidationError as exc:
            _name_the_row(exc, i)
            raise
    return out


def _name_the_row(exc: ValidationError, i: int) -> None:
    """A path inside one job's args (``args.when``) as the path in the list (``args[3].when``);
    the bare field ``args`` (its type, its size) stays, as the uniform path reports it."""
    field = exc.field or ""
    if field.startswith(("args.", "args[", "args ")):
        row = f"args[{i}]{field[4:]}"
        exc.field = row
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (exc.args[0].replace(field, row, 1), *exc.args[1:])


_PER_JOB_KEYS = ("queue", "ordering_key")


def _prepare_with_overrides(jobs: list, opts: dict, per_job: Any) -> list:
    """awa's per-job COPY ``opts``: each entry overrides ``queue`` / ``ordering_key``."""
    if not isinstance(per_job, (list, tuple)) or len(per_job) != len(jobs):
        got = len(per_job) if isinstance(per_job, (list, tuple)) else type(per_job).__name__
        raise ValidationError(
            f"opts length must match jobs length (got {got}, expected {len(jobs)})", field="opts"
        )
    merged = []
    for i, entry in enumerate(per_job):
        if entry is None:
            entry = {}
        if not isinstance(entry, dict):
            raise ValidationError("each opts entry must be a dict or None", field=f"opts[{i}]")
        for key in entry:
            if key not in _PER_JOB_KEYS:
                raise ValidationError(
                    f"unsupported opts key '{key}'; expected 'queue' or 'ordering_key'",
                    field=f"opts[{i}]",
                )
        if entry.get("queue", "") is None:
            entry = {k: v for k, v in entry.items() if k != "queue"}
        merged.append({**opts, **entry})
    return [_prepare_all([job], o)[0] for job, o in zip(jobs, merged)]
