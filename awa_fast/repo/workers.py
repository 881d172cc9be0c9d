"""Worker presence (``awa_fast.workers``, ``sql.runtime``): the row each live process keeps
with the queues and kinds it claims, the kinds waiting that no live worker handles, and the
LISTEN of the runtime's notification connection."""

from __future__ import annotations

from typing import NamedTuple

from awa_fast import sql
from awa_fast.repo import Repo, named


class Unhandled(NamedTuple):
    """Available jobs of a kind in a queue that no live worker has a handler for."""

    queue: str
    kind: str
    n: int


_UNHANDLED = named(Unhandled)


class WorkerRepo(Repo):
    """Presence statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction)."""

    __slots__ = ()

    async def seen(
        self, instance: str, queues: list[str], kinds: list[str], ttl_ms: float, min_stale_ms: int
    ) -> None:
        """Insert or refresh ``instance``'s row: it expires ``ttl_ms`` ms from now and holds the
        shortest staleness ``min_stale_ms`` (ms) under which its attempts never look stale."""
        params = {
            "instance": instance,
            "queues": queues,
            "kinds": kinds,
            "ttl_ms": ttl_ms,
            "min_stale_ms": min_stale_ms,
        }
        await self.conn.execute(sql.WORKER_SEEN, params)

    async def gone(self, instance: str) -> None:
        """Remove ``instance``'s row (it would expire on its own)."""
        await self.conn.execute(sql.WORKER_GONE, (instance,))

    async def unhandled(self, queues: list[str]) -> list[Unhandled]:
        """The kinds with available jobs in ``queues`` that no live worker handles."""
        return await self._all(_UNHANDLED, sql.UNHANDLED_IN_QUEUES, (queues,))

    async def listen(self) -> None:
        """LISTEN on the queue wake-up and the cancel channels (an autocommit connection)."""
        await self.conn.execute(sql.LISTEN_QUEUE)
        await self.conn.execute(sql.LISTEN_CANCEL)
