"""Per-queue statements of the worker's own loops: which parked queues hold a claimable job
(``sql.QUEUES_WITH_AVAILABLE``, the idle poll), priority aging (``sql.AGE_PRIORITIES``) and
the DLQ policy a process sets at start (``sql.SET_QUEUE_DLQ``)."""

from __future__ import annotations

from typing import Any

from awa_fast import sql


class QueueRepo:
    """Queue statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction)."""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

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
