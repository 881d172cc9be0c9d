"""One poll for every idle queue of a process.

A dispatcher whose last claim found nothing parks here instead of running its own claim every
poll interval. Every ``poll_interval_s`` the poll asks the database, in one statement, which
parked queues now hold an available job (``sql.QUEUES_WITH_AVAILABLE``) and wakes those
dispatchers; each then runs its real claim. So an idle process costs one statement per interval
whatever its queue count (about 40 claims per interval at 40 queues before). NOTIFY wakes a
parked dispatcher as before; the poll finds what no NOTIFY announces (promotions whose NOTIFY
failed, attempts given back, an unpaused queue, a missed notification).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from awa_fast.repo.queues import QueueRepo
from awa_fast.worker.cancellation import raise_if_cancelling
from awa_fast.worker.observe import Signal

log = logging.getLogger("awa_fast.idle_poll")


class IdlePoll:
    """The shared poll of one runtime's parked dispatchers.

    Args:
        pool_getter: ``async () -> pool`` (the client's connection pool).
        interval_s: seconds between polls (the runtime's ``poll_interval_ms`` / 1000).
        kinds: the kinds this process has handlers for (a queue holding only other kinds
            stays parked).
    """

    def __init__(self, pool_getter: Callable, interval_s: float, kinds: list[str]) -> None:
        self._pool_getter = pool_getter
        self.interval_s = interval_s
        self.kinds = list(kinds)
        self._parked: dict[str, Callable[[], None]] = {}
        # fired after each poll statement that ran; the value is the queues it woke
        self.polled = Signal("idle poll")

    def park(self, queue: str, wake: Callable[[], None]) -> None:
        """``queue``'s dispatcher found nothing: poll for it, calling ``wake()`` when its queue
        holds an available job."""
        self._parked[queue] = wake

    def unpark(self, queue: str) -> None:
        """``queue``'s dispatcher woke (for any reason): stop polling for it."""
        self._parked.pop(queue, None)

    @property
    def parked(self) -> list[str]:
        """The queues polled for now."""
        return list(self._parked)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if self._parked:
                await self.poll_once()
                raise_if_cancelling()  # a cancel the pool's wait_for swallowed (cancellation.py)

    async def poll_once(self) -> list[str]:
        """Poll once for the parked queues and wake those that hold an available job; returns
        them. If the statement fails, every parked dispatcher is woken: each claims for itself,
        as without this poll, and backs off on its own errors."""
        queues = list(self._parked)
        try:
            pool = await self._pool_getter()
            async with pool.connection() as conn:
                ready = await QueueRepo(conn).with_available(queues, self.kinds)
        except Exception as exc:  # the poll must survive every error
            log.warning(
                "idle poll of %d queue(s) failed: %s: %s",
                len(queues),
                type(exc).__name__,
                exc,
                exc_info=not isinstance(exc, (psycopg.Error, OSError)),
            )
            raise_if_cancelling()
            ready = queues
        for queue in ready:
            wake = self._parked.pop(queue, None)
            if wake is not None:
                wake()
        self.polled.fire(ready)
        return ready
