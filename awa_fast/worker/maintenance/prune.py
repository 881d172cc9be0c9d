"""The prune pass (retention): worker presence, callback expressions, batch operations, stale
"still running" marks, the finished-row counters, descriptors, the DLQ, and the finished rows,
per-queue retention row by row and whole slices by TRUNCATE (ADR 029). Also the counter fold,
run by the prune pass or as a loop of its own (``terminal_count_rollup_interval_ms``)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

import psycopg

from awa_fast import bulk, sql
from awa_fast.repo.maintenance import PassRepo
from awa_fast.worker.maintenance.config import retention_s
from awa_fast.worker.maintenance.passes import PassContext, fetch, fetch_id, fetch_ids
from awa_fast.worker.maintenance.scheduler import PassIncomplete

log = logging.getLogger("awa_fast.maintenance")

# A prune pass deletes expired DLQ rows in batches of cleanup_batch_size, each its own
# transaction, until none is left or this many batches ran (100,000 rows by default): one
# batch a pass could not keep up with a DLQ filling faster than 1000 rows a minute.
DLQ_PRUNE_BATCHES = 100

# One step of a prune pass: its statements on a fenced connection; returns the rows removed.
Step = Callable[[psycopg.AsyncConnection], Awaitable[int]]


class Prune:
    """The prune pass and the counter fold of one process's maintenance.

    Attributes:
        refused_slices: rows of the finished slices whose TRUNCATE the last expiry pass saw
            refused (a trigger), by slot: kept past retention, reported as the prune loop's
            ``stuck_rows``.
    """

    def __init__(self, ctx: PassContext):
        self.ctx = ctx
        self.refused_slices: dict[int, int] = {}

    async def prune(self) -> int:
        """Expire finished jobs and DLQ entries past their retention. Returns the rows removed.

        Finished jobs go a whole slice at a time (:meth:`expire_slices`: one TRUNCATE, no
        per-row delete); DLQ entries older than ``dlq_retention_days`` in batches of
        ``cleanup_batch_size`` rows until a batch comes up short (none left) or
        ``DLQ_PRUNE_BATCHES`` (100) batches ran (a row whose delete fails alone, say a trigger
        refuses it, is kept and logged). A finished row the hot table kept for a stale "still
        running" mark moves to the finished storage. The finished rows of a queue whose
        retention is shorter than its class's horizon (the longest of any queue, which the
        slices keep: ``queue_retention``), and every finished row past its retention in a class
        whose horizon is longer than the ring keeps (``RING_KEEPS_HOURS``, ADR 029), are
        deleted row by row first, in batches as the DLQ's (``sql.PRUNE_QUEUE_RETENTION``): at
        most ``DLQ_PRUNE_BATCHES * cleanup_batch_size`` rows per class a pass.

        Each step (presence, callback expressions, batch operations, stale marks, the counter
        fold, descriptors, each DLQ batch, the slices) runs in its own transaction; a step
        that fails is logged and the others run.

        Raises:
            PassIncomplete: after every step ran, when some failed (named in the message).
            Deposed: another process took leadership.
        """
        c = self.ctx.config
        failed: list[str] = []
        step = functools.partial(self._step, failed)
        await step("worker presence", _execute(sql.WORKERS_PRUNE))
        await step("callback expressions", _execute(sql.CALLBACK_EXPRESSIONS_PRUNE))
        await step("batch operations", _execute(sql.BATCH_RETENTION_PRUNE))
        stale_marks = self._isolated(
            "stale mark settle",
            sql.SETTLE_STALE_MARKS,
            sql.STALE_MARK_IDS,
            sql.SETTLE_STALE_MARK_ONE,
        )
        await step("stale mark settle", stale_marks)
        if c.terminal_count_rollup_interval_ms is None:  # else its own loop (fold_counts)
            await step("counter fold", fold)
        if c.descriptor_retention_days > 0:
            descriptors_s = retention_s(c.descriptor_retention_days * 24)
            await step(
                "descriptors", _execute(sql.DESCRIPTORS_PRUNE, {"retention_s": descriptors_s})
            )
        dlq = self._isolated("DLQ prune", sql.PRUNE_DLQ, sql.PRUNE_DLQ_IDS, sql.PRUNE_DLQ_ONE)
        pruned = await self._batches(step, "DLQ", dlq)
        for class_params in c.queue_retention_params():
            by_queue = self._isolated(
                "queue retention",
                sql.PRUNE_QUEUE_RETENTION,
                sql.PRUNE_QUEUE_RETENTION_IDS,
                sql.PRUNE_QUEUE_RETENTION_ONE,
                class_params,
            )
            pruned += await self._batches(step, "queue retention", by_queue)
        pruned += await self.expire_slices()
        self.ctx.counts["pruned"] += pruned
        if failed:
            raise PassIncomplete(f"prune steps failed: {', '.join(failed)}; the others ran")
        return pruned

    async def _step(self, failed: list[str], what: str, run: Step) -> int:
        # Each step is its own fenced transaction: one that fails (a trigger, a lock wait
        # past PASS_LOCK_TIMEOUT) is logged and the others go on, slice expiry included.
        try:
            async with self.ctx.fenced(bounded=True) as conn:
                return await run(conn)
        except psycopg.Error as exc:
            log.warning("prune step %s failed this pass: %s: %s", what, type(exc).__name__, exc)
            failed.append(f"{what} ({type(exc).__name__})")
            return 0

    async def _batches(self, step: Callable[[str, Step], Awaitable[int]], what: str, run: Step):
        """Run ``run`` batch after batch (at most ``DLQ_PRUNE_BATCHES``); the rows removed."""
        pruned = 0
        for _ in range(DLQ_PRUNE_BATCHES):
            removed = await step(what, run)
            pruned += removed
            # A short batch: none left, the step failed, or refused rows (kept, retried apart
            # by the next batch's redo; one that still fills a batch goes on: ADR 009).
            if removed < self.ctx.config.cleanup_batch_size:
                break
        return pruned

    def _isolated(
        self, what: str, bulk_q: str, ids_q: str, one_q: str, extra: dict | None = None
    ) -> Step:
        """A step running ``bulk_q`` on a batch, a failing row alone (``bulk.run_isolated``)."""
        c = self.ctx.config
        p = {
            "dlq_s": c.dlq_retention_days * 86400,
            "limit": c.cleanup_batch_size,
            "stale_ms": c.heartbeat_staleness_ms,
            **(extra or {}),
        }

        async def run(conn: psycopg.AsyncConnection) -> int:
            done = await bulk.run_isolated(
                conn,
                what=what,
                bulk=functools.partial(fetch, conn, bulk_q, p),
                keys=lambda skip: fetch_ids(conn, ids_q, {**p, "skip": skip}),
                one=functools.partial(fetch_id, conn, one_q, p),
                recurring=self.ctx.recurring[what],
                batch=c.cleanup_batch_size,
            )
            return len(done.rows)

        return run

    async def fold_counts(self) -> int:
        """Fold the finished-job counters (``sql.FOLD_COUNTS``) in one fenced transaction: awa's
        terminal-count rollup. Run by the prune pass, or as the ``counter_fold`` loop every
        ``terminal_count_rollup_interval_ms`` when that is set. Returns 0 (rows are folded,
        not removed).

        Raises:
            Deposed: another process took leadership.
            psycopg.Error: the fold failed (the loop retries).
        """
        async with self.ctx.fenced(bounded=True) as conn:
            return await fold(conn)

    async def expire_slices(self) -> int:
        """TRUNCATE every finished slice whose newest row is past its class's horizon
        (``completed_retention_hours``; ``failed_retention_hours`` for failed and cancelled; a
        longer per-queue retention raises it: ``MaintenanceConfig.retention_horizons``; one of
        ``KEEP_FOREVER_S`` or more expires none), releasing the unique keys its jobs held.
        Returns the rows removed.

        Each slice is its own fenced transaction: its partition is locked ACCESS EXCLUSIVE
        (waiting at most 200 ms: readers and writers queue behind it), its expiry checked
        again under the lock, then truncated. A slice that cannot be locked or truncated is
        kept (logged) and tried next pass; the others are pruned. A slice whose truncate is refused pass after pass (a
        trigger) is warned about once (:class:`bulk.Recurring`), and its rows count in the
        prune loop's ``stuck_rows`` until a pass truncates it; a lock wait is logged each time.

        Raises:
            Deposed: another process took leadership.
        """
        # the longest retention of any queue: a queue's shorter one is pruned row by row
        completed_h, failed_h = self.ctx.config.retention_horizons()
        # None (kept forever) expires no slice
        ages = {"completed_s": retention_s(completed_h), "failed_s": retention_s(failed_h)}
        pool = await self.ctx.pool_getter()
        async with pool.connection() as conn:
            expired = await PassRepo(conn).expired_slices(ages)
        pruned = 0
        kept = self.ctx.recurring["finished slice"]
        refused: dict[int, int] = {}
        for slot in expired:
            rows = None
            try:
                async with self.ctx.fenced(bounded=True) as conn:
                    repo = PassRepo(conn)
                    await repo.lock_slice(slot)
                    rows = await repo.expired_slice(ages, slot)
                    if rows is not None:
                        await repo.truncate_slice(slot)
                        pruned += rows
            except psycopg.Error as exc:
                args = ("finished slice %s kept this pass: %s: %s", slot, type(exc).__name__, exc)
                if bulk.is_row_error(exc):  # refused by what it holds (a trigger): every pass
                    kept.warn(log, slot, bulk.error_signature(exc), *args)
                    refused[slot] = rows or 1  # a slice whose count was not read: at least 1
                else:  # a lock wait, a lost connection: as it happens
                    log.warning(*args)
        kept.pass_done()
        self.refused_slices = refused
        return pruned


def _execute(query: str, params: dict | None = None) -> Step:
    """A step running one statement (it reports no rows removed)."""

    async def run(conn: psycopg.AsyncConnection) -> int:
        await PassRepo(conn).run(query, params)
        return 0

    return run


async def fold(conn: psycopg.AsyncConnection) -> int:
    """Fold the counters of every foldable slot (``sql.FOLD_COUNTS``) on ``conn``, in its
    transaction. Returns 0 (rows are folded, not removed)."""
    await PassRepo(conn).fold_counts()
    return 0
