"""Batched heartbeats for a process's in-flight attempts, with pending progress piggybacked."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable

import psycopg

from awa_fast import sql
from awa_fast.worker.context import JobContext

log = logging.getLogger("awa_fast.heartbeat")

CHUNK = 500


class Heartbeat:
    """Every ``interval_s`` seconds, one guarded statement per 500 attempts refreshes
    ``heartbeat_at`` (and writes progress that changed since the last flush)."""

    def __init__(self, pool_getter: Callable, in_flight: Callable[[], Iterable[JobContext]],
                 interval_s: float):
        self._pool_getter = pool_getter
        self._in_flight = in_flight
        self.interval_s = interval_s
        self.beats = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.beat()
            except (psycopg.Error, OSError) as exc:
                log.warning("heartbeat failed: %s", exc)

    async def beat(self) -> None:
        """Send one round of heartbeats now."""
        ctxs = sorted(self._in_flight(), key=lambda c: c.id)
        if not ctxs:
            return
        pool = await self._pool_getter()
        async with pool.connection() as conn:
            for start in range(0, len(ctxs), CHUNK):
                chunk = ctxs[start:start + CHUNK]
                snaps = [c.progress_snapshot() for c in chunk]
                await conn.execute(sql.HEARTBEAT, (
                    [c.id for c in chunk], [c.run_lease for c in chunk],
                    [None if s is None else s[1] for s in snaps]))
                for c, s in zip(chunk, snaps):
                    if s is not None:
                        c.progress_acked(s[0])
        self.beats += 1
