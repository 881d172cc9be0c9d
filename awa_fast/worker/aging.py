"""Priority aging per queue (``priority_aging_interval_ms``, awa's ADR-005 rule).

An ``available`` job that has waited ``k`` whole intervals since its ``run_at`` is claimed as
priority ``max(1, original - k)``; the original priority is kept in
``metadata["_awa_original_priority"]``. The claim order stays ``priority, run_at, id`` on the
claim index. Every process that configures aging for a queue runs the pass for it; the new
priority is a function of ``run_at`` alone, so passes repeated or run concurrently agree.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from awa_fast.repo.queues import QueueRepo
from awa_fast.worker.cancellation import raise_if_cancelling

log = logging.getLogger("awa_fast.aging")

AGE_BATCH = 1000  # rows per pass and queue (awa ages up to 1000 per pass)


async def age_once(pool, queue: str, interval_ms: int, limit: int = AGE_BATCH) -> int:
    """One aging pass over ``queue``; returns the number of jobs whose priority was raised."""
    async with pool.connection() as conn:
        return await QueueRepo(conn).age_priorities(queue, interval_ms, limit)


async def run_aging(pool_getter: Callable, queue: str, interval_ms: int) -> None:
    """Age ``queue`` forever, a pass every half interval (at most every 5 s). Cancel to stop."""
    period_s = min(interval_ms / 2000, 5.0)
    while True:
        try:
            await age_once(await pool_getter(), queue, interval_ms)
        except Exception as exc:  # the aging loop must survive every error
            log.warning(
                "priority aging of queue %r failed: %s: %s",
                queue,
                type(exc).__name__,
                exc,
                exc_info=not isinstance(exc, (psycopg.Error, OSError)),
            )
        raise_if_cancelling()  # see worker/cancellation.py
        await asyncio.sleep(period_s)
