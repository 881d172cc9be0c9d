"""Leader-only maintenance: promote due jobs, rescue dead or overdue attempts, prune by retention.

One leader per database: the process whose dedicated connection holds the session advisory lock
``sql.LEADER_LOCK_KEY``. If that connection dies the lock is released and another process takes
over at its next election tick.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Awaitable, Callable

import psycopg
from psycopg import errors as pg_errors

from awa_fast import sql

log = logging.getLogger("awa_fast.maintenance")


@dataclasses.dataclass
class MaintenanceConfig:
    """Intervals in milliseconds, retention in hours (awa's defaults)."""

    leader_election_interval_ms: int = 10_000
    promote_interval_ms: int = 250
    heartbeat_rescue_interval_ms: int = 30_000
    heartbeat_staleness_ms: int = 90_000
    deadline_rescue_interval_ms: int = 30_000
    callback_rescue_interval_ms: int = 30_000
    cleanup_interval_ms: int = 60_000
    completed_retention_hours: float = 24.0
    failed_retention_hours: float = 72.0
    dlq_retention_days: float = 30.0
    cleanup_batch_size: int = 1000
    promote_batch_size: int = 4096
    reconcile_interval_ms: int = 1_000
    verify_window_s: float = 3600.0


class Maintenance:
    """Runs the leader election loop and, while leader, the maintenance loops.

    ``on_rescued`` (optional) is awaited with the rescued rows after each rescue commits
    (registered Rescued specs). ``consequence_kinds()`` lists the kinds whose final-attempt
    rescue goes to ``consequence_pending`` instead of ``failed``.
    """

    def __init__(self, database_url: str, pool_getter: Callable, config: MaintenanceConfig,
                 on_rescued: Callable[[list[tuple]], Awaitable[None]] | None = None,
                 extra_tasks: list[tuple[float, Callable[[], Awaitable[Any]]]] | None = None,
                 consequence_kinds: Callable[[], list[str]] = list,
                 known_kinds: Callable[[], list[str]] = list):
        self.database_url = database_url
        self._pool_getter = pool_getter
        self.config = config
        self.on_rescued = on_rescued
        self.extra_tasks = extra_tasks or []
        self.consequence_kinds = consequence_kinds
        self.known_kinds = known_kinds
        self.is_leader = False
        self._lock_conn: psycopg.AsyncConnection | None = None
        self._loops: list[asyncio.Task] = []
        self.counts = {"promoted": 0, "rescued": 0, "pruned": 0}

    async def run(self) -> None:
        """Elect forever (cancel to stop; the lock connection is closed on the way out)."""
        interval = self.config.leader_election_interval_ms / 1000
        try:
            while True:
                try:
                    await self._elect()
                except (psycopg.Error, OSError) as exc:
                    log.warning("leader election failed: %s", exc)
                    await self._step_down()
                await asyncio.sleep(interval)
        finally:
            await self._step_down()

    async def _elect(self) -> None:
        if self.is_leader:
            await self._lock_conn.execute("SELECT 1")  # still connected means still leader
            return
        if self._lock_conn is None or self._lock_conn.closed:
            self._lock_conn = await psycopg.AsyncConnection.connect(self.database_url,
                                                                    autocommit=True)
        cur = await self._lock_conn.execute(sql.TRY_LEADER, (sql.LEADER_LOCK_KEY,))
        if (await cur.fetchone())[0]:
            self.is_leader = True
            log.info("became maintenance leader")
            c = self.config
            rescue_ms = min(c.heartbeat_rescue_interval_ms, c.deadline_rescue_interval_ms)
            self._loops = [
                asyncio.create_task(self._every(c.promote_interval_ms / 1000, self.promote)),
                asyncio.create_task(self._every(rescue_ms / 1000, self.rescue)),
                asyncio.create_task(self._every(c.cleanup_interval_ms / 1000, self.prune)),
            ] + [asyncio.create_task(self._every(s, fn)) for s, fn in self.extra_tasks]

    async def _step_down(self) -> None:
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        if self.is_leader:
            log.info("gave up maintenance leadership")
        self.is_leader = False
        if self._lock_conn is not None:
            try:
                await self._lock_conn.close()
            except Exception:  # closing a dead connection may fail; it is gone either way
                pass
            self._lock_conn = None

    async def _every(self, interval_s: float, fn: Callable[[], Awaitable[Any]]) -> None:
        while True:
            try:
                await fn()
            except (psycopg.Error, OSError) as exc:
                log.warning("maintenance task %s failed: %s", getattr(fn, "__name__", fn), exc)
            # Python 3.11's wait_for (inside the pool) can swallow a cancel that lands as a
            # connection is handed out: honour a pending cancel here so shutdown never hangs.
            if asyncio.current_task().cancelling():
                raise asyncio.CancelledError
            await asyncio.sleep(interval_s)

    async def promote(self) -> int:
        """Move due scheduled / retryable jobs to available and wake their queues."""
        pool = await self._pool_getter()
        async with pool.connection() as conn:
            try:
                cur = await conn.execute(sql.PROMOTE, (self.config.promote_batch_size,))
                queues = [r[0] for r in await cur.fetchall()]
            except pg_errors.UniqueViolation:
                queues = await self._promote_one_by_one(conn)
            for queue in set(queues):
                await conn.execute(sql.NOTIFY_QUEUE, (queue,))
        self.counts["promoted"] += len(queues)
        return len(queues)

    async def _promote_one_by_one(self, conn) -> list[str]:
        # A row moving into a state its mask holds collided with a newer duplicate: that row is
        # cancelled as a duplicate; the rest are promoted.
        cur = await conn.execute(sql.DUE_IDS, (self.config.promote_batch_size,))
        queues = []
        for (job_id,) in await cur.fetchall():
            try:
                async with conn.transaction():
                    c = await conn.execute(sql.PROMOTE_ONE, (job_id,))
                    row = await c.fetchone()
                    if row:
                        queues.append(row[0])
            except pg_errors.UniqueViolation:
                await conn.execute(sql.CANCEL_AS_DUPLICATE, (job_id,))
        return queues

    async def rescue(self) -> list[tuple]:
        """Rescue running attempts with a stale heartbeat or a passed deadline, and parked jobs
        whose callback timed out. Final attempts fail (moved to the DLQ when their queue has it)
        or, for kinds with a failure consequence, wait in ``consequence_pending`` for the
        reconciler. Returns rows ``(id, kind, new_state, rescue_reason, exhausted_reason)``."""
        params = {"stale_ms": self.config.heartbeat_staleness_ms, "limit": 500,
                  "consequence_kinds": self.consequence_kinds(), "known_kinds": self.known_kinds(),
                  "only": None}
        pool = await self._pool_getter()
        async with pool.connection() as conn:
            rows = await self._rescue_with(conn, sql.RESCUE, sql.RESCUE_CANDIDATES, params)
            rows += await self._rescue_with(conn, sql.RESCUE_CALLBACKS,
                                            sql.RESCUE_CALLBACK_CANDIDATES, params)
            for job_id, _kind, state, _why, exhausted_reason in rows:
                if state == "failed":
                    await conn.execute(sql.DEAD_LETTER, (job_id, exhausted_reason))
        if rows:
            self.counts["rescued"] += len(rows)
            log.info("rescued %d job(s)", len(rows))
            if self.on_rescued is not None:
                await self.on_rescued(rows)
        return rows

    async def _rescue_with(self, conn, query: str, candidates: str, params: dict) -> list[tuple]:
        # One statement for the whole batch; if a row's new state would take a unique key a
        # newer duplicate holds, redo it row by row and cancel that row as a duplicate.
        try:
            async with conn.transaction():
                return await (await conn.execute(query, params)).fetchall()
        except pg_errors.UniqueViolation:
            pass
        rows = []
        for (job_id,) in await (await conn.execute(candidates, params)).fetchall():
            try:
                async with conn.transaction():
                    cur = await conn.execute(query, {**params, "only": job_id})
                    rows += await cur.fetchall()
            except pg_errors.UniqueViolation:
                cur = await conn.execute(sql.CANCEL_RESCUED_DUPLICATE, {**params, "id": job_id})
                if cur.rowcount:
                    log.warning("rescued job %s cancelled as a duplicate of a newer job", job_id)
        return rows

    async def prune(self) -> int:
        """Delete terminal jobs older than their retention, and DLQ entries older than
        ``dlq_retention_days``. Returns the rows deleted (both tables)."""
        c = self.config
        pool = await self._pool_getter()
        async with pool.connection() as conn:
            cur = await conn.execute(sql.PRUNE, {
                "completed_s": c.completed_retention_hours * 3600,
                "failed_s": c.failed_retention_hours * 3600, "limit": c.cleanup_batch_size})
            pruned = cur.rowcount
            cur = await conn.execute(sql.PRUNE_DLQ, {"dlq_s": c.dlq_retention_days * 86400,
                                                     "limit": c.cleanup_batch_size})
            pruned += cur.rowcount
        self.counts["pruned"] += pruned
        return pruned
