"""Dead-letter queue admin (ADR-020, awa-pg's names): :class:`DlqAdmin` and :class:`DlqEntry`.

A failed job of a queue with DLQ enabled (``{"name": "q", "max_workers": 4, "dlq": True}`` in
``start()``, or ``start(dlq_enabled_by_default=True)``) is moved from ``awa_fast.jobs`` to
``awa_fast.dlq`` with a reason and its last run lease; DLQ rows are never claimed. They come back
with :meth:`DlqAdmin.retry_from_dlq` (same id, attempt 0) or go away with
:meth:`DlqAdmin.purge_dlq` / the maintenance retention (``dlq_retention_days``, default 30). Bulk
operations without a filter need ``allow_all=True``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from awa_fast import _native, enqueue
from awa_fast.admin import paging
from awa_fast.admin.area import Area
from awa_fast.connections import Connections
from awa_fast.errors import AttemptStillRunning, UniqueConflict
from awa_fast.job import Job
from awa_fast.repo import isolated
from awa_fast.repo.dlq import DeadLettered, DlqRepo
from awa_fast.repo.jobs import JobRepo
from awa_fast.requests import optional_name


@dataclasses.dataclass(frozen=True)
class DlqEntry:
    """A dead-lettered job: its snapshot (``job.state`` is ``failed``), why and when it was
    dead-lettered, and the run lease of its last attempt."""

    job: Job
    reason: str
    dlq_at: datetime
    original_run_lease: int

    @classmethod
    def from_row(cls, row: DeadLettered) -> DlqEntry:
        return cls(row.job, row.reason, row.dlq_at, row.original_run_lease)

    def to_dict(self) -> dict:
        """JSON-compatible: the job's fields plus ``dlq_reason``, ``dlq_at``,
        ``original_run_lease``."""
        out = self.job.to_dict()
        out.update(
            dlq_reason=self.reason,
            dlq_at=self.dlq_at.isoformat(),
            original_run_lease=self.original_run_lease,
        )
        return out


def when(value: Any, name: str) -> datetime | None:
    """A datetime or ISO 8601 string (naive = UTC) as an aware datetime; ``None`` stays ``None``.

    Raises:
        ValueError: a string that is not ISO 8601. TypeError: neither a datetime nor a string.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{name}: not an ISO 8601 timestamp: {value!r}") from None
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime or ISO 8601 string, got {type(value).__name__}")
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def names_only(filters: dict) -> None:
    """Check the ``kind`` / ``queue`` filters among ``filters`` (``None`` = no filter) with the
    one name rule: a name no job can have is a mistake, not an empty match.

    Raises:
        ValidationError: naming the filter.
    """
    for field in ("kind", "queue"):
        optional_name(filters.get(field), field)


def require_filter(op: str, allow_all: bool, **filters: Any) -> None:
    """Refuse a bulk operation over every row unless ``allow_all``.

    Raises:
        ValidationError (a ValueError): a ``kind`` or ``queue`` filter breaks the name rule
            (``requests.check_name``).
        ValueError: every filter is ``None`` and ``allow_all`` is false.
    """
    names_only(filters)
    if not allow_all and all(v is None for v in filters.values()):
        names = ", ".join(filters)
        raise ValueError(f"{op} without a filter ({names}) affects every row: pass allow_all=True")


def _match(
    kind: str | None,
    queue: str | None,
    tag: str | None,
    before_id: int | None,
    before_dlq_at: datetime | str | None,
) -> dict[str, Any]:
    """The DLQ entries filter's parameters (``before_dlq_at`` as :func:`when` reads it)."""
    at = when(before_dlq_at, "before_dlq_at")
    return {"kind": kind, "queue": queue, "tag": tag, "before_id": before_id, "before_dlq_at": at}


class DlqAdmin(Area):
    """The dead-letter queue's operations (ADR-020), exposed as ``AsyncClient``'s methods of
    the same names (ADR 041). Arguments as :class:`~awa_fast.admin.jobs.JobAdmin`'s."""

    def __init__(self, db: Connections, staleness_ms: Callable[[], int]) -> None:
        super().__init__(db)
        self._staleness_ms = staleness_ms

    async def list_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        before_id: int | None = None,
        before_dlq_at: datetime | str | None = None,
        limit: int = 100,
    ) -> list[DlqEntry]:
        """Dead-lettered jobs, newest first (``dlq_at``, then id). ``before_id`` /
        ``before_dlq_at`` page backwards (strictly older).

        Raises:
            ValidationError: ``limit`` or ``before_id`` is not in 1..2**63-1.
        """
        limit = paging.positive(limit, "limit")
        before_id = paging.positive_or_none(before_id, "before_id")
        names_only({"kind": kind, "queue": queue})
        match = _match(kind, queue, tag, before_id, before_dlq_at)
        async with self._db.connection() as conn:
            rows = await DlqRepo(conn).newest(match, limit)
        return [DlqEntry.from_row(r) for r in rows]

    async def get_dlq_job(self, job_id: int) -> DlqEntry | None:
        """The DLQ entry of job ``job_id``, or ``None``."""
        async with self._db.connection() as conn:
            row = await DlqRepo(conn).get(job_id)
        return None if row is None else DlqEntry.from_row(row)

    async def dlq_depth(self, *, queue: str | None = None) -> int:
        """Number of dead-lettered jobs (of ``queue``, or in all).

        Raises:
            ValidationError: ``queue`` breaks the name rule (``requests.check_name``).
        """
        optional_name(queue, "queue")
        async with self._db.connection() as conn:
            return await DlqRepo(conn).depth(queue)

    async def dlq_depth_by_queue(self) -> dict[str, int]:
        """``{queue: dead-lettered jobs}`` for every queue with at least one."""
        async with self._db.connection() as conn:
            return await DlqRepo(conn).depth_by_queue()

    async def retry_from_dlq(
        self,
        job_id: int,
        *,
        run_at: datetime | str | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> Job | None:
        """Move a dead-lettered job back to ``awa_fast.jobs`` under the same id: attempt 0,
        run lease kept (never reused, so a zombie attempt stays stale), errors kept,
        ``available`` (``scheduled`` for a future ``run_at``), with optional ``priority`` /
        ``queue`` overrides. Returns the job, or ``None`` if job ``job_id`` is not in the DLQ.

        Raises:
            UniqueConflict: a live job holds its unique key; nothing changes (the DLQ row stays).
            ValidationError: an override breaks a rule (e.g. priority outside 1..4).
            AttemptStillRunning: the handler of the job's last attempt is still running (an
                early ``fail_external`` dead-lettered it; docs/architecture.md, "No two
                executions of one job overlap"); nothing changes, retry once it has ended.
        """
        # Overrides obey the insert rules (validated in _ext, with placeholders for the rest).
        optional_name(queue, "queue")
        _native.validate_insert("kind", "default", 2 if priority is None else priority, 1, None)
        stale_ms = self._staleness_ms()
        params = {
            "id": job_id,
            "run_at": when(run_at, "run_at"),
            "priority": priority,
            "to_queue": queue,
            "stale_ms": stale_ms,
        }
        async with self._db.connection() as conn:
            dlq = DlqRepo(conn)
            try:
                with enqueue.mapped_errors():
                    async with conn.transaction():
                        job = await dlq.retry(params)
                        if job is not None and job.state == "available":
                            await JobRepo(conn).wake(job.queue)
            except UniqueConflict as exc:
                raise await enqueue.holder_conflict(
                    conn, job_id, "retry DLQ", exc, "the job stays in the DLQ (nothing changed)"
                ) from exc
            if job is None:
                running = await dlq.attempt_still_runs(job_id, stale_ms)
                if running is not None:
                    raise AttemptStillRunning(
                        f"job {job_id} is in the DLQ but its last attempt's handler is still "
                        f"running (last heartbeat {running.isoformat()}); retry once it has "
                        "ended",
                        job_id=job_id,
                    )
        return job

    async def bulk_retry_from_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        allow_all: bool = False,
    ) -> int:
        """Retry every matching DLQ entry (as :meth:`retry_from_dlq`); returns how many.
        Entries whose unique key is held by a live job are skipped and stay in the DLQ (logged
        with the holder); so does an entry whose re-insert fails for another reason, and one
        whose last attempt's handler is still running (retry it once it has ended).

        Raises:
            ValueError: no filter and not ``allow_all``.
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        require_filter("bulk_retry_from_dlq", allow_all, kind=kind, queue=queue, tag=tag)
        params = {
            **_match(kind, queue, tag, None, None),
            "run_at": None,
            "priority": None,
            "to_queue": None,
            "stale_ms": self._staleness_ms(),
        }
        rows = await self._isolated(
            "DLQ bulk retry",
            isolated.DLQ_RETRY,
            params,
            wakes=lambda job: job.state == "available",
        )
        return len(rows)

    async def move_failed_to_dlq(self, job_id: int, reason: str = "manual") -> bool:
        """Move a ``failed`` job to the DLQ (whatever its queue's DLQ setting). ``False`` if
        the job is not failed (or its failure consequence is still owed).
        """
        async with self._db.connection() as conn:
            return await DlqRepo(conn).move(job_id, reason)

    async def bulk_move_failed_to_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        reason: str = "manual",
        allow_all: bool = False,
    ) -> int:
        """Move every matching ``failed`` job to the DLQ; returns how many.

        A job whose move fails alone (say a trigger refuses it) stays failed (logged).

        Raises:
            ValueError: no filter and not ``allow_all``.
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        require_filter("bulk_move_failed_to_dlq", allow_all, kind=kind, queue=queue)
        params = {"kind": kind, "queue": queue, "reason": reason}
        return len(await self._isolated("move to the DLQ", isolated.DLQ_MOVE, params))

    async def purge_dlq_job(self, job_id: int) -> bool:
        """Delete one DLQ entry; ``True`` if it existed."""
        async with self._db.connection() as conn:
            return await DlqRepo(conn).purge(job_id)

    async def purge_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        before_id: int | None = None,
        before_dlq_at: datetime | str | None = None,
        allow_all: bool = False,
    ) -> int:
        """Delete matching DLQ entries; returns how many. An entry whose delete fails alone is
        kept (logged).

        Raises:
            ValueError: no filter and not ``allow_all``.
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
            ValidationError: ``before_id`` is not in 1..2**63-1 (nothing is deleted).
        """
        before_id = paging.positive_or_none(before_id, "before_id")
        require_filter(
            "purge_dlq",
            allow_all,
            kind=kind,
            queue=queue,
            tag=tag,
            before_id=before_id,
            before_dlq_at=before_dlq_at,
        )
        match = _match(kind, queue, tag, before_id, before_dlq_at)
        return len(await self._isolated("DLQ purge", isolated.DLQ_PURGE, match))
