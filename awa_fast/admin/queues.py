"""Queue admin (awa-pg's names): :class:`QueueAdmin` -- counts, pause / resume, drain -- and
:class:`QueueStat` (the row type of the counts' statement, defined with it in
:mod:`awa_fast.repo.queues`)."""

from __future__ import annotations

from awa_fast.admin.area import Area
from awa_fast.repo import isolated
from awa_fast.repo.jobs import JobRepo
from awa_fast.repo.queues import QueueRepo, QueueStat
from awa_fast.requests import check_name


def _queue(queue: object) -> str:
    """``queue`` as a queue name (``requests.check_name``).

    Raises:
        ValidationError: ``field="queue"``; nothing is written.
    """
    return check_name(queue, "queue")


class QueueAdmin(Area):
    """The queue operations, exposed as ``AsyncClient``'s methods of the same names (ADR 041)."""

    async def queue_stats(self) -> list[QueueStat]:
        """Per-queue counts (see :class:`QueueStat`).

        Raises:
            DatabaseError: no connection to the database within ``ADMIN_POOL_WAIT_S`` seconds
                (3; :mod:`awa_fast.connections`), e.g. postgres is down.
        """
        async with self._db.bounded_connection() as conn:
            return await QueueRepo(conn).stats()

    async def unhandled_kinds(self) -> list[dict]:
        """Available jobs no live worker handles, per queue and kind:
        ``[{"queue", "kind", "available"}]`` (a live worker is a started runtime whose presence
        row in ``awa_fast.workers`` has not expired).
        """
        async with self._db.connection() as conn:
            rows = await QueueRepo(conn).unhandled()
        return [{"queue": r.queue, "kind": r.kind, "available": r.n} for r in rows]

    async def pause_queue(self, queue: str, paused_by: str | None = None) -> None:
        """Stop claims from ``queue`` (running jobs finish).

        Raises:
            ValidationError: ``queue`` is not a queue name (1-200 characters, no NUL).
        """
        name = _queue(queue)
        async with self._db.connection() as conn:
            await QueueRepo(conn).pause(name, paused_by)

    async def resume_queue(self, queue: str) -> None:
        """Allow claims from ``queue`` again and wake its workers.

        Raises:
            ValidationError: as :meth:`pause_queue`.
        """
        name = _queue(queue)
        async with self._db.connection() as conn:
            await QueueRepo(conn).resume(name)
            await JobRepo(conn).wake(name)

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
        params = {"queue": _queue(queue)}
        return len(await self._isolated("drain_queue", isolated.DRAIN_QUEUE, params))


__all__ = ["QueueAdmin", "QueueStat"]
