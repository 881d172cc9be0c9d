"""Decides when and how many jobs to claim for one queue; never runs handlers.

It claims when it has free slots and either was woken (a NOTIFY for its queue, a freed slot
after a full claim, the idle poll) or its poll interval passed. After a claim that found
nothing it parks on the runtime's idle poll (``worker/idle_poll.py``), which checks every idle
queue of the process in one statement per interval, instead of claiming on its own. One statement claims up to the free slot count
(at most ``claim_batch_size``) with ``FOR UPDATE SKIP LOCKED``, bumping ``run_lease``. It claims
only the kinds this process has handlers for: a job of another kind is never taken (and so never
failed) here; it waits for a worker that has its handler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg

from awa_fast import bulk, metrics, sql
from awa_fast.worker.cancellation import raise_if_cancelling
from awa_fast.worker.idle_poll import IdlePoll
from awa_fast.worker.observe import Signal
from awa_fast.worker.rate_limit import TokenBucket
from awa_fast.worker.weighted import OverflowPool

if TYPE_CHECKING:
    from awa_fast.worker.config import QueueConfig

log = logging.getLogger("awa_fast.dispatcher")


class Dispatcher:
    """Claims for one queue and hands each claimed row to ``spawn(row, sent)``, ``sent`` the
    ``time.monotonic()`` at which its claim statement was sent (the attempt's lease runs from
    there: the rows may wait on a blocked event loop after their claim committed).

    Args:
        queue: the queue name.
        max_workers: concurrent attempts of this queue in this process.
        deadline_ms: per-attempt deadline in milliseconds (0 disables).
        claim_batch_size: most rows one claim takes.
        poll_interval_s: seconds between claims when nothing wakes the dispatcher.
        rate_limit: optional ``(max_rate, burst)``: a token bucket bounding claimed jobs per
            second (``worker/rate_limit.py``).
        kinds: the kinds this process has handlers for (the only ones claimed).
        overflow: weighted mode (``worker/weighted.py``): the pool shared with the other
            queues; ``max_workers`` is then the queue's guaranteed ``min_workers``.
        cap: weighted mode: most attempts of this queue at once (its ``max_workers``), or None.
        idle_poll: the runtime's shared poll to park on after a claim that found nothing, or
            None to claim every ``poll_interval_s`` while idle.
        claimers: claim loops of this queue in this process (awa's ``QueueConfig.claimers``,
            >= 1): up to that many claim statements in flight at once, each taking slots,
            overflow permits and rate-limit tokens from the shared ones before it runs.
    """

    def __init__(
        self,
        queue: str,
        *,
        pool_getter: Callable,
        spawn: Callable[[tuple, float], None],
        max_workers: int,
        deadline_ms: int,
        claim_batch_size: int,
        poll_interval_s: float,
        kinds: list[str],
        rate_limit: tuple[float, int] | None = None,
        overflow: OverflowPool | None = None,
        cap: int | None = None,
        idle_poll: IdlePoll | None = None,
        claimers: int = 1,
    ):
        self.queue = queue
        self.claimers = claimers
        self.max_workers = max_workers
        self.free = max_workers
        self.deadline_ms = deadline_ms
        self.claim_batch_size = claim_batch_size
        self.poll_interval_s = poll_interval_s
        self.kinds = list(kinds)
        self._pool_getter = pool_getter
        self._spawn = spawn
        # a row a trigger refuses stays available and meets every claim: warned about once
        self._recurring = bulk.Recurring()
        self.bucket = TokenBucket(*rate_limit) if rate_limit else None
        self._wake = asyncio.Event()
        self._wake.set()
        self._more = True  # the last claim was full: more rows are probably waiting
        self._stopping = False
        self.claimed = 0
        self.claims = 0  # claim statements run
        # fired after each claim statement that returned, once its rows are spawned; the value
        # is the number of rows claimed
        self.claim_ran = Signal("claim")
        self.overflow, self.cap = overflow, cap
        self.overflow_held = 0  # running attempts on overflow permits
        self.idle_poll = idle_poll
        self._parked = False  # parked on idle_poll: no timed claim until woken
        if overflow is not None:
            overflow.register(queue, self._wake.set)

    @classmethod
    def for_queue(
        cls,
        q: QueueConfig,
        pool_getter: Callable,
        spawn: Callable[[tuple, float], None],
        poll_interval_s: float,
        kinds: list[str],
        overflow: OverflowPool | None,
        idle_poll: IdlePoll | None,
    ) -> Dispatcher:
        """The dispatcher of queue ``q`` (its slots, deadline, claim batch, rate limit, cap and
        claimers); in weighted mode (``overflow``) its own slots are ``q.min_workers``, the rest
        borrowed from the overflow pool."""
        return cls(
            q.name,
            pool_getter=pool_getter,
            spawn=spawn,
            max_workers=q.min_workers if overflow is not None else q.max_workers,
            deadline_ms=q.deadline_duration_ms,
            claim_batch_size=q.claim_batch_size,
            poll_interval_s=poll_interval_s,
            rate_limit=q.rate_limit,
            kinds=kinds,
            overflow=overflow,
            cap=q.cap,
            idle_poll=idle_poll,
            claimers=q.claimers,
        )

    def notify(self) -> None:
        """A job became available in this queue."""
        self._more = True
        self._wake.set()

    def slot_freed(self) -> None:
        """A handler of this queue returned."""
        # shared capacity goes back first: other queues may wait
        if self.overflow is not None and self.overflow_held > 0:
            self.overflow_held -= 1
            self.overflow.release(self.queue, 1)
        else:
            self.free += 1
        if self._more:
            self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        """Claim until :meth:`stop`: ``claimers`` claim loops (awa's ``QueueConfig.claimers``)
        sharing this queue's slots, its overflow permits and its rate limit."""
        if self.claimers == 1:
            await self._claim_loop()
            return
        loops = [
            asyncio.create_task(self._claim_loop(), name=f"awa-claimer-{self.queue}-{i}")
            for i in range(self.claimers)
        ]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def _claim_loop(self) -> None:
        while not self._stopping:
            try:
                await asyncio.wait_for(
                    self._wake.wait(), None if self._parked else self.poll_interval_s
                )
            except TimeoutError:
                pass
            if self._parked and self.idle_poll is not None:
                self._parked = False
                self.idle_poll.unpark(self.queue)
            raise_if_cancelling()
            if self._stopping:
                return
            # Let handlers finishing in this loop iteration free their slots first, so one
            # claim takes them all.
            await asyncio.sleep(0)
            self._wake.clear()
            local = min(self.free, self.claim_batch_size)
            granted = self._acquire_overflow(local)
            limit = local + granted
            if limit <= 0:
                continue
            if self.bucket is not None:
                tokens = self.bucket.available()
                if tokens <= 0:  # rate limited: claim again when a token is due
                    self._give_back(granted)
                    self._more = True
                    await asyncio.sleep(min(self.bucket.wait_s(), self.poll_interval_s))
                    self._wake.set()
                    continue
                if limit > tokens:  # overflow permits go back first
                    trim = limit - tokens
                    back = min(granted, trim)
                    self._give_back(back)
                    granted -= back
                    local -= trim - back
                    limit = tokens
                self.bucket.take(limit)  # spent before the claim: other claimers see it
            # The slots of this claim are reserved before it runs: another claim loop of the
            # queue (claimers > 1) claims only what is left.
            self.free -= local
            try:
                started = time.perf_counter()
                sent = time.monotonic()  # the claimed attempts' leases run from here
                rows = await self._claim(limit)
                metrics.claimed(self.queue, time.perf_counter() - started)
            except Exception as exc:  # the claim loop must survive every error
                await self._claim_failed(exc, local, granted, limit)
                continue
            self.claims += 1
            self._more = len(rows) == limit
            if self._more:
                self._wake.set()
            on_local = min(len(rows), local)
            self.free += local - on_local
            if self.overflow is not None:
                self.overflow_held += len(rows) - on_local
                self._give_back(granted - (len(rows) - on_local))
                if not rows:
                    self.overflow.try_acquire(self.queue, 0)  # nothing waiting: no demand
            if not rows and self.idle_poll is not None:
                self._parked = True
                self.idle_poll.park(self.queue, self.notify)
            if self.bucket is not None:
                self.bucket.refund(limit - len(rows))
            self.claimed += len(rows)
            for row in rows:
                self._spawn(row, sent)
            self.claim_ran.fire(len(rows))
            raise_if_cancelling()  # after spawning: claimed rows always get their handler

    async def _claim_failed(self, exc: Exception, local: int, granted: int, limit: int) -> None:
        """Give back what a failed claim reserved (slots, overflow permits, rate tokens), log
        it, and wait a little before the next try."""
        self.free += local
        self._give_back(granted)
        if self.bucket is not None:
            self.bucket.refund(limit)
        log.warning(
            "claim from queue %r failed: %s: %s",
            self.queue,
            type(exc).__name__,
            exc,
            exc_info=not isinstance(exc, (psycopg.Error, OSError)),
        )
        raise_if_cancelling()
        await asyncio.sleep(min(self.poll_interval_s, 1.0))

    def _acquire_overflow(self, local: int) -> int:
        """Weighted mode: overflow permits for this claim beyond the ``local`` guaranteed slots
        (asking for the rest of a claim batch, as awa, within ``cap``)."""
        if self.overflow is None:
            return 0
        wanted = self.claim_batch_size - local
        if self.cap is not None:
            running = self.max_workers - self.free + self.overflow_held
            wanted = min(wanted, self.cap - running - local)
        return self.overflow.try_acquire(self.queue, max(wanted, 0))

    def _give_back(self, n: int) -> None:
        if self.overflow is not None and n > 0:
            self.overflow.release(self.queue, n)

    async def _claim(self, limit: int) -> list[tuple]:
        # One statement; if a row makes it fail (a trigger, or a unique collision with a
        # concurrent claim of a duplicate), the candidates are claimed one by one and that row
        # stays available (logged), so it cannot wedge the queue.
        params = {
            "queue": self.queue,
            "limit": limit,
            "deadline_ms": self.deadline_ms,
            "kinds": self.kinds,
        }
        pool = await self._pool_getter()
        async with pool.connection() as conn:

            async def fetch(query: str, extra: dict | None = None) -> list[tuple]:
                cur = await conn.execute(query, {**params, **(extra or {})})
                return await cur.fetchall()

            async def candidates(skip: list[int]) -> list[int]:
                return [r[0] for r in await fetch(sql.CLAIM_CANDIDATES, {"skip": skip})]

            done = await bulk.run_isolated(
                conn,
                what=f"claim from queue {self.queue!r}",
                bulk=lambda: fetch(sql.CLAIM),
                keys=candidates,
                one=lambda job_id: fetch(sql.CLAIM_ONE, {"id": job_id}),
                recurring=self._recurring,
                batch=limit,
                most=limit,
            )
            return done.rows
