"""Makes attempt outcomes durable. One finalizer per process, shared by its handler tasks.

* Compact path: completions that staged nothing and have no Completed specs are buffered and
  flushed as one guarded statement per batch (sorted by id); a flush starts as soon as the
  previous one returns, so batches grow with load (group commit, no timer).
* Per-job path: every other outcome, and completions with staged follow-ups or registered specs,
  run in their own transaction: the guarded transition, then registered specs, then staged
  requests in staging order, inserted by one statement with ``ON CONFLICT`` on the dedup index
  (a held unique key is skipped, anything else rolls the completion back) -- ADR-029 / ADR-046,
  ADR 003.
* Retries (:meth:`Finalizer.finalize`; loop in ``_finalize_requests`` / ``_may_retry``): a
  deadlock re-runs the whole transaction with the same sealed follow-ups, at most 3 more times,
  a lost connection at most 6 more times; each retry waits a jittered, doubling pause, and
  after a connection error the pool's idle connections are checked first (after a server
  restart they are all dead). A commit whose acknowledgement was lost replays as stale (the
  guard no longer matches) and inserts nothing.
* Prompt failure (ADR-046's open extension, :meth:`Finalizer.fail_promptly`): an attempt whose
  finalize failed for good is failed at once, guarded by its lease, with the error -- it does
  not wait ``running`` for heartbeat rescue.

Every waiter learns ``True`` (applied) or ``False`` (stale: rescued, cancelled or superseded).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from awa_fast import bulk, enqueue, metrics, sql
from awa_fast.worker import executor as ex
from awa_fast.worker import storable
from awa_fast.worker.cancellation import raise_if_cancelling
from awa_fast.worker.context import JobContext

log = logging.getLogger("awa_fast.finalizer")

MAX_FINALIZE_RETRIES = 3  # deadlock / serialization failure (ADR-046)
MAX_CONNECTION_RETRIES = 6  # lost connection: the pauses below span a server restart
RETRY_PAUSE_S = 0.1  # first pause; doubles per retry, jittered x0.5..1.5, capped
RETRY_PAUSE_MAX_S = 2.0
BATCH_SIZE = 512
FLUSHERS = 2

# Outcome kind -> (state written, attempt delta)
_TRANSITIONS = {
    ex.COMPLETED: ("completed", 0),
    ex.RETRY: ("retryable", 0),
    ex.SNOOZE: ("scheduled", -1),
    ex.CANCEL: ("cancelled", 0),
    ex.FAIL: ("failed", 0),
    ex.WAIT: ("waiting_external", 0),
    "released": ("available", -1),
}

_RETRYABLE = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure, psycopg.OperationalError)


class Stale(Exception):
    """The guard matched no row: roll the transaction back."""


class Finalizer:
    """The per-process finalizer (see the module docstring).

    Args:
        pool_getter: ``async () -> AsyncConnectionPool``.
        batch_size: most completions in one compact statement.
    """

    def __init__(
        self,
        pool_getter: Callable[[], Awaitable[Any]],
        *,
        batch_size: int = BATCH_SIZE,
        flushers: int = FLUSHERS,
        spec_runner: Any = None,
        settler: Any = None,
    ):
        self._pool_getter = pool_getter
        self.batch_size = batch_size
        self._pending: list[tuple[int, int, asyncio.Future]] = []
        # Opt-in batched completions with follow-ups: (ctx, requests, future).
        self._staged: list[tuple[JobContext, list, asyncio.Future]] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._flushers = [
            asyncio.create_task(self._flush_loop(), name=f"awa-finalizer-{i}")
            for i in range(flushers)
        ]
        self.spec_runner = spec_runner
        self.settler = settler
        # Test hooks for fault injection: awaited with (conn, ctx) inside the per-job
        # transaction just before COMMIT, and after the COMMIT returned.
        self.before_commit: Callable[..., Awaitable[None]] | None = None
        self.after_commit: Callable[..., Awaitable[None]] | None = None
        self.stats = {
            "compact": 0,
            "per_job": 0,
            "stale": 0,
            "batches": 0,
            "retries": 0,
            "follow_ups_inserted": 0,
            "follow_ups_skipped": 0,
            "duplicates_cancelled": 0,
            "staged_batched": 0,
            "prompt_failures": 0,
        }

    # -- compact path ---------------------------------------------------------------------------

    def complete(self, job_id: int, lease: int) -> asyncio.Future:
        """Queue a plain completion; the future resolves to True (applied) or False (stale)."""
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((job_id, lease, fut))
        self._wake.set()
        return fut

    def complete_with_follow_ups(self, ctx: JobContext, requests: list) -> asyncio.Future:
        """Queue a completion with follow-ups for the opt-in batched path
        (``start(staged_completions="batched")``); resolves like :meth:`complete`."""
        fut = asyncio.get_running_loop().create_future()
        self._staged.append((ctx, requests, fut))
        self._wake.set()
        return fut

    async def _flush_loop(self) -> None:
        while True:
            if not self._pending and not self._staged:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._staged:
                staged = self._staged[: self.batch_size]
                del self._staged[: self.batch_size]
                await self._flush_staged(staged)
            if self._pending:
                batch = self._pending[: self.batch_size]
                del self._pending[: self.batch_size]
                await self._flush(batch)
            raise_if_cancelling()  # see worker/cancellation.py

    async def _flush(self, batch: list) -> None:
        batch.sort(key=lambda item: item[0])
        done = None
        attempt = 0
        while True:
            try:
                pool = await self._pool_getter()
                async with pool.connection() as conn:
                    done = await self._complete_isolated(conn, [(b[0], b[1]) for b in batch])
                break
            except _RETRYABLE as exc:
                if not await self._may_retry(attempt, exc):
                    break
                attempt += 1
                log.warning(
                    "completion batch of %d failed (%s); retry %d", len(batch), exc, attempt
                )
            except Exception as exc:  # never leave waiters hanging
                log.exception("completion batch of %d failed", len(batch))
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                return
        self.stats["batches"] += 1
        applied = None if done is None else set(done.rows)
        for job_id, lease, fut in batch:
            if fut.done():
                continue
            failed = None if done is None else done.failed.get((job_id, lease))
            if applied is None:
                fut.set_exception(psycopg.OperationalError("completion batch kept failing"))
            elif (job_id, lease) in applied:
                self.stats["compact"] += 1
                fut.set_result(True)
            elif failed is not None and not isinstance(failed, pg_errors.UniqueViolation):
                fut.set_exception(failed)  # this row alone failed to complete
            else:  # stale, or cancelled as a duplicate
                self.stats["stale"] += 1
                fut.set_result(False)

    async def _complete_isolated(self, conn, attempts: list[tuple[int, int]]) -> bulk.Isolated:
        # One guarded statement for the batch of (id, run_lease); if a row makes it fail, job by
        # job: a job whose completion would take a key a completed duplicate holds (a mask
        # holding 'completed' but not 'running') is cancelled as a duplicate, any other failing
        # row's waiter gets the error; the other jobs complete.
        async def complete(items: list[tuple[int, int]]) -> list[tuple]:
            cur = await conn.execute(
                sql.COMPLETE_MANY, ([i for i, _ in items], [lease for _, lease in items])
            )
            return [tuple(r) for r in await cur.fetchall()]

        return await bulk.run_isolated(
            conn,
            what="completion batch",
            bulk=lambda: complete(attempts),
            keys=attempts,
            one=lambda attempt: complete([attempt]),
            on_conflict=lambda attempt, _exc: self._cancel_duplicate(conn, *attempt),
        )

    async def _flush_staged(self, batch: list) -> None:
        # One guarded statement for many triggers and all their follow-ups, one commit. On a
        # deadlock or lost connection the same batch is re-run (a trigger already completed
        # replays as stale and inserts nothing); on any other error each job is redone alone.
        batch.sort(key=lambda item: item[0].id)
        ids = [ctx.id for ctx, _, _ in batch]
        leases = [ctx.run_lease for ctx, _, _ in batch]
        payload = enqueue.batch_follow_ups_json(
            [(ctx.id, ctx.run_lease, reqs) for ctx, reqs, _ in batch]
        )
        done = None
        attempt = 0
        while True:
            try:
                pool = await self._pool_getter()
                async with pool.connection() as conn:
                    cur = await conn.execute(
                        sql.COMPLETE_MANY_WITH_FOLLOW_UPS, (ids, leases, payload)
                    )
                    done_ids, done_leases, inserted = await cur.fetchone()
                    done = set(zip(done_ids, done_leases))
                break
            except _RETRYABLE as exc:
                if not await self._may_retry(attempt, exc):
                    break
                attempt += 1
                log.warning(
                    "staged completion batch of %d failed (%s); retry %d", len(batch), exc, attempt
                )
            except Exception as exc:  # one job's follow-up failed: isolate it
                log.warning(
                    "staged completion batch of %d failed (%s); completing job by job",
                    len(batch),
                    exc,
                )
                break
        if done is None:
            for ctx, reqs, fut in batch:
                try:
                    ok = await self._finalize_requests(ctx, ex.Outcome(ex.COMPLETED), reqs)
                except Exception as exc:  # never leave a waiter hanging
                    if not fut.done():
                        fut.set_exception(exc)
                    continue
                if not fut.done():
                    fut.set_result(ok)
            return
        # Applied by (job, lease): a stale attempt of a job whose newer attempt completed in the
        # same batch is stale.
        staged = sum(len(reqs) for ctx, reqs, _ in batch if (ctx.id, ctx.run_lease) in done)
        self.stats["batches"] += 1
        self.stats["follow_ups_inserted"] += inserted
        self.stats["follow_ups_skipped"] += staged - inserted
        metrics.follow_ups(inserted, staged - inserted)
        for ctx, _, fut in batch:
            ok = (ctx.id, ctx.run_lease) in done
            self.stats["staged_batched" if ok else "stale"] += 1
            if not fut.done():
                fut.set_result(ok)

    async def _cancel_duplicate(self, conn, job_id: int, lease: int) -> None:
        await conn.execute(sql.CANCEL_DUPLICATE_ATTEMPT, (job_id, lease))
        self.stats["duplicates_cancelled"] += 1
        log.warning(
            "job %s cancelled as a duplicate: its new state would take a unique key "
            "another job holds",
            job_id,
        )

    # -- per-job path ---------------------------------------------------------------------------

    async def finalize(self, ctx: JobContext, outcome: ex.Outcome) -> bool:
        """Apply ``outcome`` for ``ctx``'s attempt in its own guarded transaction, retrying a
        deadlock up to 3 times and a lost connection up to 6 times (``_may_retry``).

        Returns True if applied, False if stale.

        Raises:
            psycopg.Error: a non-retryable error, or retries exhausted; the caller then records
                a prompt failure (:meth:`fail_promptly`).
        """
        return await self._finalize_requests(ctx, outcome, self.requests_for(ctx, outcome))

    def requests_for(self, ctx: JobContext, outcome: ex.Outcome) -> list:
        """The follow-ups an outcome inserts: registered specs first, then (completed only) the
        sealed staged requests in staging order. Built once: every retry reuses them."""
        requests = [] if self.spec_runner is None else self.spec_runner.for_outcome(ctx, outcome)
        if outcome.kind == ex.COMPLETED and outcome.follow_ups:
            requests.extend(outcome.follow_ups)
        return requests

    async def _may_retry(self, attempt: int, exc: BaseException) -> bool:
        """After failed try number ``attempt`` (0-based) with the retryable ``exc``: False
        when its retries are spent, else pause (jittered, doubling) and return True. After a
        connection error the pool's idle connections are checked first: after a server restart
        they are all dead, and back-to-back retries on them fail within milliseconds."""
        limit = (
            MAX_CONNECTION_RETRIES
            if isinstance(exc, psycopg.OperationalError)
            else MAX_FINALIZE_RETRIES
        )
        if attempt >= limit:
            return False
        self.stats["retries"] += 1
        if isinstance(exc, psycopg.OperationalError):
            try:
                await (await self._pool_getter()).check()
            except Exception as err:  # the server may still be down: the pause covers it
                log.debug("pool check after a connection error failed: %s", err)
        pause = min(RETRY_PAUSE_S * 2**attempt, RETRY_PAUSE_MAX_S)
        await asyncio.sleep(pause * (0.5 + random.random()))
        return True

    async def fail_promptly(self, ctx: JobContext, cause: BaseException) -> bool:
        """ADR-046's prompt failure: ``ctx``'s finalize failed for good with ``cause``; record
        a lease-guarded failure of the attempt now, with the error, instead of leaving it
        ``running`` until heartbeat rescue. The failure is an ordinary failed attempt
        (retryable with backoff, or on the final attempt failed / settled with the kind's
        consequence and exhausted specs); if even that cannot be written, the rescue-shaped
        ``sql.FAIL_ATTEMPT`` (no inserts) records it.

        Returns True if recorded, False if stale (the attempt was rescued, cancelled or
        superseded meanwhile).

        Raises:
            psycopg.Error: nothing could be written (database unreachable); the attempt stays
                running until rescue.
        """
        text = f"finalize failed: {type(cause).__qualname__}: {storable.describe(cause)}"
        outcome = ex.failed(ctx, text, terminal=False)
        try:
            ok = await self._finalize_requests(ctx, outcome, self.requests_for(ctx, outcome))
        except Exception as exc:
            log.warning(
                "prompt failure of job %s through the failure path failed (%s); "
                "recording it without inserts",
                ctx.id,
                exc,
            )
            applier = None if self.settler is None else self.settler.applier
            pool = await self._pool_getter()
            async with pool.connection() as conn:
                cur = await conn.execute(
                    sql.FAIL_ATTEMPT,
                    {
                        "id": ctx.id,
                        "lease": ctx.run_lease,
                        "message": outcome.error["error"],
                        # settled later by the reconciler: consequence and exhausted specs
                        "consequence_kinds": []
                        if applier is None
                        else self.settler.pending_kinds(),
                        "known_kinds": [ctx.kind] if applier is None else applier.known_kinds(),
                    },
                )
                ok = await cur.fetchone() is not None
        if ok:
            self.stats["prompt_failures"] += 1
        return ok

    async def _finalize_requests(
        self, ctx: JobContext, outcome: ex.Outcome, requests: list
    ) -> bool:
        attempt = 0
        while True:
            try:
                return await self._finalize_once(ctx, outcome, requests)
            except (pg_errors.UniqueViolation, enqueue.UniqueConflict):
                # The transition itself would take a key a duplicate holds (not a follow-up:
                # those skip on conflict): cancel this attempt's job as a duplicate.
                pool = await self._pool_getter()
                async with pool.connection() as conn:
                    await self._cancel_duplicate(conn, ctx.id, ctx.run_lease)
                return False
            except _RETRYABLE as exc:
                if not await self._may_retry(attempt, exc):
                    log.error(
                        "finalize of job %s gave up after %d retries: %s", ctx.id, attempt, exc
                    )
                    raise
                attempt += 1
                log.warning("finalize of job %s failed (%s); retry %d", ctx.id, exc, attempt)

    async def _finalize_once(self, ctx: JobContext, outcome: ex.Outcome, requests: list) -> bool:
        if outcome.kind == ex.FAIL and self.settler is not None:
            return await self._fail_once(ctx, outcome, requests)
        if (
            outcome.kind == ex.COMPLETED
            and requests
            and self.before_commit is None
            and self.after_commit is None
        ):
            return await self._complete_with_follow_ups(ctx, requests)
        state, delta = _TRANSITIONS[outcome.kind]
        snap = ctx.progress_snapshot()
        params = {
            "state": state,
            "attempt_delta": delta,
            "delay": outcome.delay,
            "error": None if outcome.error is None else storable.json_text([outcome.error]),
            "progress": None if snap is None else snap[1],
            "id": ctx.id,
            "lease": ctx.run_lease,
        }

        async def body(conn) -> None:
            cur = await conn.execute(sql.TRANSITION, params)
            if cur.rowcount == 0:
                raise Stale()
            if requests:
                await self.insert_follow_ups(conn, ctx.kind, ctx.id, requests)
            if state == "available":
                await conn.execute(sql.NOTIFY_QUEUE, (ctx.queue,))

        return await self._guarded_transaction(ctx, body)

    async def _guarded_transaction(self, ctx: JobContext, body: Callable) -> bool:
        # One per-job transaction around ``body`` (which raises Stale when its guard misses),
        # with the fault-injection hooks around COMMIT.
        pool = await self._pool_getter()
        async with pool.connection() as conn:
            try:
                async with conn.transaction():
                    await body(conn)
                    if self.before_commit is not None:
                        await self.before_commit(conn, ctx)
            except Stale:
                self.stats["stale"] += 1
                return False
            if self.after_commit is not None:
                await self.after_commit(conn, ctx)
        self.stats["per_job"] += 1
        return True

    async def insert_follow_ups(
        self, conn, trigger_kind: str, trigger_id: int, requests: list
    ) -> None:
        """Insert follow-ups in the caller's transaction (see ``enqueue.insert_follow_ups``)."""
        inserted, skipped = await enqueue.insert_follow_ups(
            conn, requests, trigger_kind, trigger_id
        )
        self.stats["follow_ups_inserted"] += inserted
        self.stats["follow_ups_skipped"] += skipped
        metrics.follow_ups(inserted, skipped)

    async def _complete_with_follow_ups(self, ctx: JobContext, requests: list) -> bool:
        # One statement, one round trip, one commit (autocommit): see
        # sql.COMPLETE_WITH_FOLLOW_UPS. A lost connection is retried by finalize(); a commit
        # whose acknowledgement was lost then replays as stale and inserts nothing.
        pool = await self._pool_getter()
        async with pool.connection() as conn:
            with enqueue.mapped_errors():
                cur = await conn.execute(
                    sql.COMPLETE_WITH_FOLLOW_UPS,
                    (ctx.id, ctx.run_lease, enqueue.follow_ups_json(requests)),
                )
                applied, inserted, keys = await cur.fetchone()
        if not applied:
            self.stats["stale"] += 1
            return False
        self.stats["per_job"] += 1
        self.stats["follow_ups_inserted"] += inserted
        skipped = len(requests) - inserted
        metrics.follow_ups(inserted, skipped)
        if skipped:
            self.stats["follow_ups_skipped"] += skipped
            if log.isEnabledFor(logging.DEBUG):
                held = set(keys)
                kinds = [p.kind for p in requests if p.unique_key and p.unique_key not in held]
                log.debug(
                    "follow-ups %s of %s job %s skipped: unique key already held",
                    kinds,
                    ctx.kind,
                    ctx.id,
                )
        return True

    async def _fail_once(self, ctx: JobContext, outcome: ex.Outcome, exhausted: list) -> bool:
        # Failure path: lock the attempt under its lease, then settle (failed / DLQ + exhausted
        # specs). A kind with an effect first records the failure as owed and commits; the
        # effect then runs, and the job settles, in the next transaction (Settler.owe_or_settle,
        # Settler.apply_owed; models/settlement.pml).
        snap = ctx.progress_snapshot()
        owed = False

        async def body(conn) -> None:
            nonlocal owed
            cur = await conn.execute(sql.LOCK_RUNNING, (ctx.id, ctx.run_lease))
            row = await cur.fetchone()
            if row is None:
                raise Stale()
            owed = await self.settler.owe_or_settle(
                conn,
                row,
                reason=outcome.reason or "terminal_error",
                path="failure",
                error_entry=outcome.error,
                progress=None if snap is None else snap[1],
                exhausted=exhausted,
                owe_unknown=False,
            )  # a worker knows its kinds

        if not await self._guarded_transaction(ctx, body):
            return False
        if owed:
            try:
                pool = await self._pool_getter()
                async with pool.connection() as conn:
                    await self.settler.apply_owed(conn, ctx.id, exhausted)
            except Exception as exc:  # no connection: the debt is durable (the reconciler)
                log.warning(
                    "no connection to apply the failure consequence of job %s (%s); it "
                    "stays owed for the reconciler",
                    ctx.id,
                    exc,
                )
        return True

    async def release(self, ctx: JobContext) -> bool:
        """Give an unfinished attempt back (shutdown): available again, attempt not counted."""
        return await self.finalize(ctx, ex.Outcome("released", delay=0.0))

    # -- lifecycle ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Flush what is buffered and stop the flushers."""
        self._closing = True
        self._wake.set()
        await asyncio.gather(*self._flushers, return_exceptions=True)
