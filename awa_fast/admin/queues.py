"""Queue admin (awa-pg's names): :class:`QueueAdmin` -- counts, pause / resume, drain -- and
:class:`QueueStat`."""

from __future__ import annotations

import dataclasses

from awa_fast import sql
from awa_fast.connections import Connections
from awa_fast.requests import check_name


def _queue(queue: object) -> str:
    """``queue`` as a queue name (``requests.check_name``).

    Raises:
        ValidationError: ``field="queue"``; nothing is written.
    """
    return check_name(queue, "queue")


@dataclasses.dataclass(frozen=True)
class QueueStat:
    """Counts per queue (awa's fields, plus ``consequence_pending`` and the failure
    consequences still owed / overdue). ``lag_seconds`` is the age of the oldest available job,
    in seconds. ``unhandled`` counts available jobs whose kind no live worker process has a
    handler for on that queue (they wait; see ``unhandled_kinds()``)."""

    queue: str
    total_queued: int
    scheduled: int
    available: int
    retryable: int
    running: int
    failed: int
    waiting_external: int
    consequence_pending: int
    consequences_owed: int
    consequences_overdue: int
    completed_last_hour: int
    lag_seconds: float
    paused: bool
    unhandled: int = 0


class QueueAdmin:
    """The queue operations, exposed as ``AsyncClient``'s methods of the same names (ADR 041).

    Args:
        db: the connection source.
    """

    def __init__(self, db: Connections) -> None:
        self._db = db

    async def queue_stats(self) -> list[QueueStat]:
        """Per-queue counts (see :class:`QueueStat`).

        Raises:
            DatabaseError: no connection to the database within ``ADMIN_POOL_WAIT_S`` seconds
                (3; :mod:`awa_fast.connections`), e.g. postgres is down.
        """
        out = []
        for row in await self._db.fetch_bounded(sql.QUEUE_STATS):
            # QUEUE_STATS's columns are QueueStat's fields but the total (a sum) and lag's type
            queue, scheduled, available, retryable, *counts, lag, paused, unhandled = row
            total = scheduled + available + retryable
            rest = (*counts, float(lag), paused, unhandled)
            out.append(QueueStat(queue, total, scheduled, available, retryable, *rest))
        return out

    async def unhandled_kinds(self) -> list[dict]:
        """Available jobs no live worker handles, per queue and kind:
        ``[{"queue", "kind", "available"}]`` (a live worker is a started runtime whose presence
        row in ``awa_fast.workers`` has not expired).
        """
        rows = await self._db.fetch(sql.UNHANDLED_AVAILABLE_SORTED)
        return [{"queue": q, "kind": k, "available": n} for q, k, n in rows]

    async def pause_queue(self, queue: str, paused_by: str | None = None) -> None:
        """Stop claims from ``queue`` (running jobs finish).

        Raises:
            ValidationError: ``queue`` is not a queue name (1-200 characters, no NUL).
        """
        await self._db.fetch(sql.PAUSE_QUEUE, (_queue(queue), paused_by))

    async def resume_queue(self, queue: str) -> None:
        """Allow claims from ``queue`` again and wake its workers.

        Raises:
            ValidationError: as :meth:`pause_queue`.
        """
        await self._db.fetch(sql.RESUME_QUEUE, (_queue(queue),))
        await self._db.fetch(sql.NOTIFY_QUEUE, (queue,))

    async def drain_queue(self, queue: str) -> int:
        """Cancel every job of ``queue`` that is waiting (``available``, ``scheduled``,
        ``retryable``, and parked in ``waiting_external``, as awa-pg does); running attempts are
        left alone. Returns how many. A job whose
        cancel fails alone (e.g. its mask holds ``cancelled`` and another cancelled job holds
        its key) is left waiting (logged).

        Raises:
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
            ValidationError: as :meth:`pause_queue`.
        """
        rows = await self._db.run_isolated(
            "drain_queue",
            sql.DRAIN_QUEUE,
            sql.DRAINABLE_IDS,
            sql.DRAIN_ONE,
            {"queue": _queue(queue)},
        )
        return len(rows)
