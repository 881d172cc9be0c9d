"""This process's presence row (``awa_fast.workers``): the queues and kinds it claims and its
``min_stale_ms`` (ADR 020), refreshed with every round of heartbeats and by its own loop, and
the check for waiting kinds no live worker handles."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import socket
import uuid
from typing import Any

from awa_fast import descriptors
from awa_fast.repo.workers import Unhandled, WorkerRepo
from awa_fast.worker.config import HEARTBEAT_SAFETY
from awa_fast.worker.maintenance import MaintenanceConfig
from awa_fast.worker.services import Services

log = logging.getLogger("awa_fast.runtime")

UNHANDLED_CHECK_S = 30.0  # how often a process looks for waiting kinds no live worker handles
PRESENCE_GONE_S = 2.0  # removing the presence row at shutdown (it expires on its own)


def _instance() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclasses.dataclass(eq=False)
class Presence:
    """The presence row of one runtime (``instance``: its key, host:pid:random).

    Args:
        services: the process's services (pool, descriptors).
        queues: names of the queues this process claims from.
        kinds: the kinds it has handlers for (sorted).
        heartbeat_interval_s: seconds between heartbeats (and presence refreshes).
        maintenance: the maintenance configuration (staleness, leader check), and whether
            this process takes part in the leader election (``run_maintenance``).
    """

    services: Services
    queues: list[str]
    kinds: list[str]
    heartbeat_interval_s: float
    maintenance: MaintenanceConfig
    run_maintenance: bool
    instance: str = dataclasses.field(default_factory=_instance, init=False)
    unhandled_warned: set[tuple[str, str]] = dataclasses.field(default_factory=set, init=False)

    @property
    def min_stale_ms(self) -> int:
        """The shortest heartbeat staleness (ms) under which this process's live attempts, their
        "still running" marks and, while it leads, its lock connection never look stale: two
        heartbeat intervals (``HEARTBEAT_SAFETY``) and, if it runs maintenance, two leader
        checks. Written with its presence row; every process's rescue and leader displacement
        wait at least the longest such value of a live process (migration 025), so one started
        with a short ``heartbeat_staleness_ms`` never rescues another's live attempt."""
        beats = HEARTBEAT_SAFETY * self.heartbeat_interval_s * 1000
        checks = 2 * self.maintenance.leader_check_ms if self.run_maintenance else 0
        return math.ceil(max(beats, checks))

    @property
    def ttl_ms(self) -> float:
        """How long the presence row outlives its last refresh (ms)."""
        return max(self.maintenance.heartbeat_staleness_ms, 3 * self.heartbeat_interval_s * 1000)

    async def beat(self, conn: Any) -> None:
        """Refresh the row on ``conn``. With every round of heartbeats (the liveness thread):
        the row, and with it ``min_stale_ms`` (ADR 020), lives as long as the beats do."""
        await WorkerRepo(conn).seen(
            self.instance, self.queues, self.kinds, self.ttl_ms, self.min_stale_ms
        )

    async def seen(self, conn: Any) -> None:
        """Refresh the row and the descriptors this process declares (stored at start)."""
        await self.beat(conn)
        await descriptors.sync(
            conn,
            self.services.queue_descriptors,
            self.services.kind_descriptors,
        )

    async def check_unhandled(self) -> list[Unhandled]:
        """Refresh the row, then look in this process's queues for available jobs no live
        worker has a handler for; log each ``(queue, kind)`` once (an error: they wait until a
        worker with a handler starts). Returns them (``(queue, kind, n)`` rows)."""
        async with (await self.services.pool()).connection() as conn:
            await self.seen(conn)
            rows = await WorkerRepo(conn).unhandled(self.queues)
        for row in rows:
            if (row.queue, row.kind) not in self.unhandled_warned:
                self.unhandled_warned.add((row.queue, row.kind))
                log.error(
                    "queue %r holds %d available job(s) of kind %r, which no live worker "
                    "has a handler for (this process handles: %s); they wait for a worker "
                    "that has one",
                    row.queue,
                    row.n,
                    row.kind,
                    ", ".join(self.kinds),
                )
        return rows

    async def run(self) -> None:
        """Keep the row fresh (every heartbeat interval) and check for unhandled kinds (every
        ``UNHANDLED_CHECK_S`` s); survives every error."""
        next_check = 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                if loop.time() >= next_check:
                    await self.check_unhandled()
                    next_check = loop.time() + UNHANDLED_CHECK_S
                else:
                    async with (await self.services.pool()).connection() as conn:
                        await self.seen(conn)
            except Exception as exc:  # presence is advisory; never let the loop end
                log.warning("worker presence update failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(min(self.heartbeat_interval_s, UNHANDLED_CHECK_S))

    async def gone(self) -> None:
        """Remove the row at shutdown, within ``PRESENCE_GONE_S``; a failure is logged (the
        row expires on its own)."""
        try:
            async with asyncio.timeout(PRESENCE_GONE_S):
                async with (await self.services.pool()).connection() as conn:
                    await WorkerRepo(conn).gone(self.instance)
        except (Exception, TimeoutError) as exc:
            log.warning("could not remove this worker's presence row: %r", exc)
