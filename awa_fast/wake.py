"""Wake-ups sent after a commit: :class:`Waker` gathers the queues whose available jobs committed
without a NOTIFY and sends them in one short transaction of its own (ADR 015, ADR 018).

A transaction that NOTIFYs holds a database-wide lock from just before its commit until its
commit record is flushed, so concurrent notifying transactions commit one at a time, each
waiting for its own WAL flush. The client's own inserts and the per-job completions with
follow-ups therefore commit silently (``awa_fast.defer_notify``, migration 009) and wake their
queues here once they committed; the wake-up transaction commits without waiting for its flush,
so it holds that lock only for moments. A wake-up that is lost (crash, no connection) delays the
pickup to the dispatchers' next poll; no job is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from psycopg_pool import AsyncConnectionPool

from awa_fast.repo.jobs import JobRepo

log = logging.getLogger("awa_fast.wake")


class Waker:
    """Sends ``NOTIFY awa_fast, <queue>`` for queues whose jobs committed silently.

    Args:
        pool: an async callable returning the open pool the wake-ups run on.
        inline: ``True`` sends each wake-up before :meth:`wake` returns (deterministic, for the
            inline finalizer of ``AwaTestClient``); ``False`` (default) returns at once and one
            background task sends everything gathered while its previous NOTIFY ran, so a burst of
            commits costs one wake-up transaction.
    """

    def __init__(
        self, pool: Callable[[], Awaitable[AsyncConnectionPool]], *, inline: bool = False
    ) -> None:
        self._pool = pool
        self._inline = inline
        self._queues: set[str] = set()
        self._sender: asyncio.Task | None = None
        self.sent = 0  # wake-up transactions sent (one per coalesced burst)

    async def wake(self, queues: Iterable[str]) -> None:
        """Wake the dispatchers of ``queues`` (names; duplicates and an empty iterable are fine).
        Never raises for a failed NOTIFY: it is logged, and the dispatchers' poll finds the jobs."""
        self._queues.update(queues)
        if not self._queues:
            return
        if self._inline:
            await self._send()
        elif not self._sending():
            self._sender = asyncio.get_running_loop().create_task(
                self._drain(), name="awa-fast-wake"
            )

    async def flush(self) -> None:
        """Return once every wake-up asked for so far was sent (or failed and was logged)."""
        while self._sending():
            assert self._sender is not None
            await asyncio.gather(self._sender, return_exceptions=True)
        if self._queues:
            await self._send()

    def _sending(self) -> bool:
        # A sender left pending on another (closed) event loop never finishes: start afresh.
        sender = self._sender
        return (
            sender is not None
            and not sender.done()
            and sender.get_loop() is asyncio.get_running_loop()
        )

    async def _drain(self) -> None:
        while self._queues:
            await self._send()

    async def _send(self) -> None:
        queues = sorted(self._queues)
        self._queues.clear()
        try:
            pool = await self._pool()
            async with pool.connection() as conn:
                await JobRepo(conn).wake_all(queues)
            self.sent += 1
        except Exception as exc:
            log.warning(
                "wake-up NOTIFY for queues %s failed (%s); their dispatchers poll", queues, exc
            )
