"""Per-queue statements: the worker's own loops (which parked queues hold a claimable job,
``sql.QUEUES_WITH_AVAILABLE``, the idle poll; priority aging, ``sql.AGE_PRIORITIES``; the DLQ
policy a process sets at start, ``sql.SET_QUEUE_DLQ``) and the admin's (counts per queue,
pause / resume, jobs no live worker handles)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from awa_fast import sql
from awa_fast.repo import Repo, named, shaped


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


class Unhandled(NamedTuple):
    """``n`` available jobs of ``kind`` on ``queue`` that no live worker claims."""

    queue: str
    kind: str
    n: int


_STAT = shaped(
    tuple(f.name for f in dataclasses.fields(QueueStat)), lambda v: QueueStat(*v), "QueueStat"
)
_UNHANDLED = named(Unhandled)


class QueueRepo(Repo):
    """Queue statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction)."""

    async def with_available(self, queues: list[str], kinds: list[str]) -> list[str]:
        """Those of ``queues`` (not paused) holding an available job of one of ``kinds``."""
        params = {"queues": queues, "kinds": kinds}
        cur = await self.conn.execute(sql.QUEUES_WITH_AVAILABLE, params)
        return [queue for (queue,) in await cur.fetchall()]

    async def age_priorities(self, queue: str, interval_ms: int, limit: int) -> int:
        """Raise the priority of up to ``limit`` of ``queue``'s jobs waiting longer than
        ``interval_ms`` per step; how many were raised."""
        params = {"queue": queue, "interval_ms": interval_ms, "limit": limit}
        cur = await self.conn.execute(sql.AGE_PRIORITIES, params)
        return len(await cur.fetchall())

    async def set_dlq(self, queue: str, enabled: bool) -> None:
        """Store whether ``queue``'s jobs that fail for good go to the DLQ."""
        await self.conn.execute(sql.SET_QUEUE_DLQ, (queue, enabled))

    async def stats(self) -> list[QueueStat]:
        """Every queue's counts, by name (a queue with jobs, finished ones or a settings row)."""
        return await self._all(_STAT, sql.QUEUE_STATS)

    async def available(self, queues: list[str]) -> dict[str, int]:
        """``{queue: available jobs}`` for those of ``queues`` with any."""
        cur = await self.conn.execute(sql.HEALTH_AVAILABLE, (queues,))
        return {queue: n for queue, n in await cur.fetchall()}

    async def unhandled(self) -> list[Unhandled]:
        """Available jobs no live worker handles, per queue and kind, by queue then kind."""
        return await self._all(_UNHANDLED, sql.UNHANDLED_AVAILABLE_SORTED)

    async def pause(self, queue: str, paused_by: str | None) -> None:
        """Mark ``queue`` paused (by ``paused_by``): claims skip it."""
        await self.conn.execute(sql.PAUSE_QUEUE, (queue, paused_by))

    async def resume(self, queue: str) -> None:
        """Clear ``queue``'s pause (a queue never paused keeps no settings row)."""
        await self.conn.execute(sql.RESUME_QUEUE, (queue,))
