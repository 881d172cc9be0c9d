"""The promote pass: due scheduled and retryable jobs become available, their queues woken."""

from __future__ import annotations

import logging

import psycopg

from awa_fast import bulk, sql
from awa_fast.repo.jobs import JobRepo
from awa_fast.worker.maintenance.passes import PassContext, cancel_duplicate, fetch, fetch_ids

log = logging.getLogger("awa_fast.maintenance")


async def promote(ctx: PassContext) -> int:
    """Move due scheduled / retryable jobs to available and wake their queues. A row whose
    key another job holds is cancelled as a duplicate; any other row that fails alone is
    left due (logged); the rest are promoted (``bulk.run_isolated``). A row whose previous
    attempt still runs (a fresh "still running" mark) waits until it ends. Due twins that
    share a unique key (``sql.PROMOTE``): the first is promoted, the others are cancelled as
    duplicates in the same statement (logged at INFO). Returns the rows promoted.

    Raises:
        Deposed: another process took leadership.
        psycopg.Error: the pass's transaction failed (the loop retries).
    """
    limit = {
        "limit": ctx.config.promote_batch_size,
        "stale_ms": ctx.config.heartbeat_staleness_ms,
    }
    async with ctx.fenced(bounded=True) as conn:
        done = await bulk.run_isolated(
            conn,
            what="promote",
            bulk=lambda: fetch(conn, sql.PROMOTE, limit),
            keys=lambda skip: fetch_ids(conn, sql.DUE_IDS, {**limit, "skip": skip}),
            one=lambda job_id: fetch(conn, sql.PROMOTE_ONE, {**limit, "id": job_id}),
            on_conflict=lambda job_id, _exc: cancel_duplicate(
                conn, sql.CANCEL_AS_DUPLICATE, {**limit, "id": job_id}
            ),
            recurring=ctx.recurring["promote"],
            batch=ctx.config.promote_batch_size,
        )
    twins = [job_id for job_id, _queue, cancelled in done.rows if cancelled]
    if twins:
        log.info(
            "%d due job(s) cancelled as duplicates of a due twin with their unique key: %s",
            len(twins),
            twins[:20],
        )
    promoted = [(job_id, queue) for job_id, queue, cancelled in done.rows if not cancelled]
    queues = sorted({queue for _id, queue in promoted})
    if queues:  # after the commit: a NOTIFY inside would hold the notify lock (ADR 018)
        try:
            pool = await ctx.pool_getter()
            async with pool.connection() as conn:
                await JobRepo(conn).wake_all(queues)
        except psycopg.Error as exc:  # the promotion committed; dispatchers poll
            log.warning("wake-up NOTIFY for promoted queues %s failed: %s", queues, exc)
    ctx.counts["promoted"] += len(promoted)
    return len(promoted)
