"""The maintenance leader's election and fencing statements (``sql.leader``): the advisory
lock, the displacement of a frozen holder, the lease and the epoch, the fence every leader
write runs under, and the session limits of a pass."""

from __future__ import annotations

from typing import Any

from awa_fast import sql
from awa_fast.repo import Repo
from awa_fast.rows import one_row


class LeaderRepo(Repo):
    """Leader statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction, or the election's own autocommit connection). ``stale_ms``: the heartbeat
    staleness (ms) after which a holder counts as frozen."""

    __slots__ = ()

    async def _scalar(self, statement: str, params: Any = None) -> Any:
        # the one column of a statement that always returns one row
        (value,) = await one_row(await self.conn.execute(statement, params))
        return value

    async def try_lock(self, key: int) -> bool:
        """Take the session advisory lock ``key`` if free."""
        return bool(await self._scalar(sql.TRY_LEADER, (key,)))

    async def displace_frozen_leader(self, key: int, stale_ms: int) -> bool:
        """End the backend of a lock holder idle for more than ``stale_ms`` (and its open
        passes); whether one was ended."""
        params = {"key": key, "stale_ms": stale_ms}
        return bool(await self._scalar(sql.DISPLACE_FROZEN_LEADER, params))

    async def displace_frozen_passes(self, stale_ms: int) -> bool:
        """End a previous leader's passes idle in transaction past ``stale_ms``."""
        return bool(await self._scalar(sql.DISPLACE_FROZEN_PASSES, {"stale_ms": stale_ms}))

    async def limit_waits(self, lock_wait_ms: int) -> None:
        """This transaction waits at most ``lock_wait_ms`` ms for a lock and is ended by the
        server if it sits idle (``sql.PASS_IDLE_TIMEOUT``)."""
        await self.conn.execute(sql.LOCK_TIMEOUT_LOCAL.format(ms=int(lock_wait_ms)))
        await self.conn.execute(sql.PASS_IDLE_TIMEOUT)

    async def bound_pass(self) -> None:
        """A pass's limits: ``sql.PASS_LOCK_TIMEOUT`` and ``sql.PASS_IDLE_TIMEOUT``."""
        await self.conn.execute(sql.PASS_LOCK_TIMEOUT)
        await self.conn.execute(sql.PASS_IDLE_TIMEOUT)

    async def take_lease(self, holder: str, via_lock: bool, stale_ms: int) -> int | None:
        """Take the lease (created if missing) and bump the leader row's epoch, fencing off the
        previous leader; the new epoch, or ``None`` when another process holds the lease."""
        await self.conn.execute(sql.LEASE_ENSURE)
        params = {"holder": holder, "via_lock": via_lock, "stale_ms": stale_ms}
        cur = await self.conn.execute(sql.LEASE_TAKE, params)
        if await cur.fetchone() is None:
            return None
        epoch = int(await self._scalar(sql.LEADER_BUMP, (holder,)))
        await self.conn.execute(sql.LEASE_EPOCH, (epoch,))
        return epoch

    async def renew(self, epoch: int | None, stale_ms: int) -> bool:
        """Renew the lease at ``epoch``; False when the epoch moved on."""
        cur = await self.conn.execute(sql.LEASE_RENEW, {"epoch": epoch, "stale_ms": stale_ms})
        return await cur.fetchone() is not None

    async def release(self, epoch: int | None) -> None:
        """Free the lease held at ``epoch``."""
        await self.conn.execute(sql.LEASE_RELEASE, (epoch,))

    async def fence(self, epoch: int) -> bool:
        """Hold the leader row ``FOR SHARE`` at ``epoch``; False when the epoch is over."""
        cur = await self.conn.execute(sql.LEADER_FENCE, (epoch,))
        return await cur.fetchone() is not None
