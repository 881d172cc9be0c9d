"""Makes attempt outcomes durable. One finalizer per process, shared by its handler tasks.

One entry point, :meth:`Finalizer.submit` with a :class:`FinalizeRequest` (the attempt, its
outcome and its sealed staged follow-ups); the finalizer picks the path:

* Compact path: completions that staged nothing and whose Completed specs insert nothing are
  completed by one guarded statement per batch (``sql.COMPLETE_MANY``, sorted by id); with the
  batching finalizer a flush starts as soon as the previous one returns, so batches grow with
  load (group commit, no timer).
* Staged batch path (opt-in, ``staged_completions="batched"``, ADR 007): completions with
  follow-ups flushed as one statement per batch (``sql.COMPLETE_MANY_WITH_FOLLOW_UPS``).
* Per-job path: every other outcome, and by default every completion with staged follow-ups or
  registered specs, in its own transaction. A completion with follow-ups is one statement
  (``sql.COMPLETE_WITH_FOLLOW_UPS``: the guarded transition, then registered specs, then staged
  requests in staging order, inserted with ``ON CONFLICT`` on the dedup index -- a held unique
  key is skipped, anything else rolls the completion back; ADR-029 / ADR-046, ADR 003). Its
  insert sends no NOTIFY inside the transaction (a NOTIFY serializes commits database-wide);
  the finalizer wakes the returned queues after the commit, coalesced by its Waker (awa_fast/wake.py)
  (``_wake_queues``, ADR 015). Other outcomes run ``sql.TRANSITION`` (or the settlement of a
  failure) and their specs' inserts.
* A batched completion that fails is redone alone on the per-job path (one bad row must not
  fail the others).
* Retries (loop in ``_finalize_requests`` / ``_may_retry``), only of errors
  ``retryable.classify`` calls transient: a deadlock re-runs the whole transaction with the
  same sealed follow-ups, at most 3 more times, a lost connection (or another transient
  error) at most 6 more times; each retry waits a jittered, doubling pause, and after a connection error the
  pool's idle connections are checked first (after a server restart they are all dead). A
  commit whose acknowledgement was lost replays as stale (the guard no longer matches) and
  inserts nothing.
* Prompt failure (ADR-046's open extension, ``_fail_promptly``): an attempt whose finalize
  failed for good is failed at once, guarded by its lease, with the error -- it does not wait
  ``running`` for heartbeat rescue. A release (shutdown) is never failed: it stays for rescue.
  Neither a redo alone nor a prompt failure is tried after an error no statement can get past
  (a closed pool, a read-only database: ``Retry.CLOSED`` / ``BLOCKED``): ``submit`` raises it.

Two named constructors: :meth:`Finalizer.batching` (the runtime: background flushers) and
:meth:`Finalizer.inline` (``testing.AwaTestClient``: no background task, a batch of one is
flushed in the caller's task). Both run the same statements through the same code; only the
buffering differs. The fault-injection hooks (:meth:`Finalizer.inject_faults`) wrap the commit
point of those very statements.

Every waiter learns :class:`Finalized`: applied, stale (rescued, cancelled or superseded), or
failed promptly.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import errors as pg_errors

from awa_fast import bulk, enqueue, metrics, primary, sql
from awa_fast.pg_arrays import int8_array
from awa_fast.repo.consequences import ConsequenceRepo
from awa_fast.retryable import Retry, classify, retryable
from awa_fast.wake import Waker
from awa_fast.worker import executor as ex
from awa_fast.worker import storable
from awa_fast.worker.cancellation import raise_if_cancelling
from awa_fast.worker.context import JobContext
from awa_fast.worker.finalize_request import RELEASED, Finalized, FinalizeRequest
from awa_fast.worker.observe import Signal

if TYPE_CHECKING:
    from awa_fast.worker.consequences import Settler
    from awa_fast.worker.specs import SpecRunner

log = logging.getLogger("awa_fast.finalizer")

MAX_FINALIZE_RETRIES = 3  # deadlock / serialization failure (ADR-046)
MAX_CONNECTION_RETRIES = 6  # lost connection: the pauses below span a server restart
RETRY_PAUSE_S = 0.1  # first pause; doubles per retry, jittered x0.5..1.5, capped
RETRY_PAUSE_MAX_S = 2.0
BATCH_SIZE = 512
FLUSHERS = 2
STAGED_COMPLETIONS = ("per_job", "batched")

# Outcome kind -> (state written, attempt delta)
_TRANSITIONS = {
    ex.COMPLETED: ("completed", 0),
    ex.RETRY: ("retryable", 0),
    ex.SNOOZE: ("scheduled", -1),
    ex.CANCEL: ("cancelled", 0),
    ex.FAIL: ("failed", 0),
    ex.WAIT: ("waiting_external", 0),
    RELEASED: ("available", -1),
}

# A deadlock or serialization failure gets MAX_FINALIZE_RETRIES, any other transient error
# (``retryable.classify``) MAX_CONNECTION_RETRIES.
_CONFLICTS = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)


R = TypeVar("R")


def _hopeless(exc: BaseException) -> bool:
    """No other statement can do better (a closed pool, a read-only database -- still
    read-only after the retries, which took new connections): no job is redone alone and no
    prompt failure is tried; the attempt stays running until rescue."""
    return classify(exc) in (Retry.BLOCKED, Retry.CLOSED) or primary.read_only_error(exc)


# A fault-injection hook: ``await hook(conn, statement, requests)`` with the connection, the SQL
# constant (from ``awa_fast.sql``) whose commit it surrounds and the requests it finalizes.
FaultHook = Callable[[Any, str, Sequence["FinalizeRequest"]], Awaitable[None]]


class Stale(Exception):
    """The guard matched no row: roll the transaction back."""


class Finalizer:
    """The per-process finalizer (see the module docstring). Build it with :meth:`batching`
    or :meth:`inline`.

    ``stats`` counts, per process: ``compact``, ``per_job``, ``staged_batched`` (applied
    completions by path), ``stale``, ``batches``, ``retries``, ``follow_ups_inserted``,
    ``follow_ups_skipped``, ``duplicates_cancelled``, ``prompt_failures``.
    """

    def __init__(
        self,
        pool_getter: Callable[[], Awaitable[Any]],
        *,
        flushers: int,
        batch_size: int,
        staged_completions: str,
        specs: SpecRunner | None,
        settler: Settler | None,
    ):
        if staged_completions not in STAGED_COMPLETIONS:
            raise ValueError(f"staged_completions must be one of {STAGED_COMPLETIONS}")
        self._pool_getter = pool_getter
        self._batch_size = batch_size
        self._staged_batched = staged_completions == "batched"
        self._specs = specs
        self._settler = settler
        # Buffers of the batching finalizer: (request, future).
        self._pending: list[tuple[FinalizeRequest, asyncio.Future]] = []
        # Opt-in batched completions with follow-ups: (request, inserts, future).
        self._staged: list[tuple[FinalizeRequest, list, asyncio.Future]] = []
        self._wake = asyncio.Event()
        self._closing = False
        # the flushers have ended: nothing buffered would ever be flushed, so every request
        # takes its own transaction (a handler that outlived shutdown waited forever)
        self._closed = False
        self._flushers = [
            asyncio.create_task(self._flush_loop(), name=f"awa-finalizer-{i}")
            for i in range(flushers)
        ]
        self._inline = flushers == 0
        # Queues whose available follow-ups committed without a NOTIFY (see _wake_queues).
        self._waker = Waker(pool_getter, inline=self._inline)
        self._before_commit: FaultHook | None = None
        self._after_commit: FaultHook | None = None
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
        # fired after each batch statement's waiters are resolved (value: the batch size)
        self.flushed = Signal("finalizer flush")

    @classmethod
    def batching(
        cls,
        pool_getter: Callable[[], Awaitable[Any]],
        *,
        batch_size: int = BATCH_SIZE,
        flushers: int = FLUSHERS,
        staged_completions: str = "per_job",
        specs: SpecRunner | None = None,
        settler: Settler | None = None,
    ) -> Finalizer:
        """The runtime's finalizer: ``flushers`` background tasks flush compact completions
        (and, with ``staged_completions="batched"``, completions with follow-ups) in batches
        of at most ``batch_size``. Must be built inside a running event loop; stop it with
        :meth:`close`.

        Args:
            pool_getter: ``async () -> AsyncConnectionPool``.
            specs: the registered follow-up specs (``worker.specs.SpecRunner``) or None.
            settler: the failure settler (``worker.consequences.Settler``) or None (a failure
                is then a plain guarded transition).

        Raises:
            ValueError: ``flushers`` or ``batch_size`` below 1, or an unknown
                ``staged_completions``.
        """
        if flushers < 1 or batch_size < 1:
            raise ValueError("a batching finalizer needs flushers >= 1 and batch_size >= 1")
        return cls(
            pool_getter,
            flushers=flushers,
            batch_size=batch_size,
            staged_completions=staged_completions,
            specs=specs,
            settler=settler,
        )

    @classmethod
    def inline(
        cls,
        pool_getter: Callable[[], Awaitable[Any]],
        *,
        staged_completions: str = "per_job",
        specs: SpecRunner | None = None,
        settler: Settler | None = None,
    ) -> Finalizer:
        """A finalizer without background tasks (``testing.AwaTestClient``): each request
        runs in the caller's task, a batched path as a batch of one -- the same statements
        as :meth:`batching`. Arguments as :meth:`batching`."""
        return cls(
            pool_getter,
            flushers=0,
            batch_size=1,
            staged_completions=staged_completions,
            specs=specs,
            settler=settler,
        )

    def inject_faults(
        self, *, before_commit: FaultHook | None = None, after_commit: FaultHook | None = None
    ) -> None:
        """Tests: await ``before_commit(conn, statement, requests)`` just before the writes of
        ``statement`` commit (before COMMIT of a transaction, or before an autocommit statement
        that writes and commits at once) and ``after_commit`` once its commit returned.
        ``statement`` is the ``awa_fast.sql`` constant production runs for those requests; the
        hooks never change which statement runs. ``None`` removes a hook."""
        self._before_commit = before_commit
        self._after_commit = after_commit

    # -- the one entry point --------------------------------------------------------------------

    async def submit(self, request: FinalizeRequest) -> Finalized:
        """Make ``request``'s outcome durable on its path (module docstring), retrying a
        deadlock up to 3 times and a lost connection up to 6 times; an outcome that still
        cannot be written is recorded as a prompt failure of the attempt (not a release).

        Returns:
            :class:`Finalized`: ``APPLIED``, ``STALE`` (also a prompt failure that found the
            attempt gone), or ``PROMPT_FAILURE``.

        Raises:
            psycopg.Error: nothing could be written (database unreachable, or a release that
                failed for good); the attempt stays running until rescue.
        """
        try:
            outcome = request.outcome
            if (
                outcome.kind == ex.COMPLETED
                and not request.follow_ups
                and not self._inline
                and not self._closed
                and (self._specs is None or not self._specs.has_completed(request.attempt.kind))
            ):
                # The compact path, awaited here without the routing's coroutine layers: this
                # is every plain completion, and each layer costs its resumption per job.
                fut = asyncio.get_running_loop().create_future()
                self._pending.append((request, fut))
                self._wake.set()
                try:
                    applied = await fut
                except Exception as exc:
                    if _hopeless(exc):
                        raise
                    log.warning(
                        "batched completion of job %s failed (%s); finalizing it alone",
                        request.attempt.id,
                        exc,
                    )
                    applied = await self._finalize_requests(request, [])
            else:
                applied = await self._route(request)
        except Exception as exc:
            if request.outcome.kind == RELEASED or _hopeless(exc):
                raise  # (nothing else could be written either)
            ctx = request.attempt
            log.warning(
                "finalize of job %s (%s) failed (%s: %s); recording a prompt failure",
                ctx.id,
                ctx.kind,
                type(exc).__name__,
                exc,
            )
            if await self._fail_promptly(ctx, exc):
                return Finalized.PROMPT_FAILURE
            return Finalized.STALE
        return Finalized.APPLIED if applied else Finalized.STALE

    async def _route(self, request: FinalizeRequest) -> bool:
        ctx, outcome = request.attempt, request.outcome
        # Built once: every retry and the per-job redo reuse them.
        inserts = self._inserts_for(request)
        if (
            outcome.kind == ex.COMPLETED
            and (not inserts or self._staged_batched)
            and not self._closed
        ):
            try:
                if not inserts:
                    return await self._buffered(self._pending, self._flush, (request,))
                return await self._buffered(self._staged, self._flush_staged, (request, inserts))
            except Exception as exc:
                if _hopeless(exc):
                    raise
                log.warning(
                    "batched completion of job %s failed (%s); finalizing it alone", ctx.id, exc
                )
        return await self._finalize_requests(request, inserts)

    def _inserts_for(self, request: FinalizeRequest) -> list:
        """The follow-ups an outcome inserts: registered specs first, then (completed only)
        the sealed staged requests in staging order."""
        inserts = (
            [] if self._specs is None else self._specs.for_outcome(request.attempt, request.outcome)
        )
        inserts.extend(request.follow_ups)
        return inserts

    async def _buffered(self, buffer: list, flush: Callable, item: tuple) -> bool:
        fut = asyncio.get_running_loop().create_future()
        if not self._inline:
            buffer.append((*item, fut))
            self._wake.set()
        else:  # inline: a batch of one, now
            await flush([(*item, fut)])
        return await fut

    async def _commit_point(
        self, hook: FaultHook | None, conn: Any, statement: str, requests: Sequence
    ) -> None:
        if hook is not None:
            await hook(conn, statement, requests)

    # -- compact path ---------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            if not self._pending and not self._staged:
                if self._closing:
                    self._closed = True  # no await since the check: nothing was appended
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._staged:
                staged = self._staged[: self._batch_size]
                del self._staged[: self._batch_size]
                await self._flush_staged(staged)
            if self._pending:
                batch = self._pending[: self._batch_size]
                del self._pending[: self._batch_size]
                await self._flush(batch)
            raise_if_cancelling()  # see worker/cancellation.py

    async def _flush(self, batch: list) -> None:
        batch.sort(key=lambda item: item[0].attempt.id)
        requests = [request for request, _ in batch]
        attempts = [(r.attempt.id, r.attempt.run_lease) for r in requests]
        try:
            done = await self._batch_transaction(
                "completion batch",
                sql.COMPLETE_MANY,
                requests,
                lambda conn: self._complete_isolated(conn, attempts),
            )
        except Exception as exc:  # never leave waiters hanging
            if _hopeless(exc):  # each waiter learns it; nothing is redone
                log.warning("completion batch of %d failed: %s", len(batch), exc)
            else:
                log.exception("completion batch of %d failed", len(batch))
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        self.stats["batches"] += 1
        applied = None if done is None else set(done.rows)
        for (job_id, lease), (_, fut) in zip(attempts, batch, strict=True):
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
        self.flushed.fire(len(batch))

    async def _batch_transaction(
        self, what: str, statement: str, requests: list, run: Callable[[Any], Awaitable[R]]
    ) -> R | None:
        """``run(conn)`` on a pool connection between the commit points, re-run whole on a
        transient error (a deadlock, a lost connection) while :meth:`_may_retry` allows: its
        result, or ``None`` once the retries ran out. Any other error propagates."""
        attempt = 0
        while True:
            try:
                pool = await self._pool_getter()
                async with pool.connection() as conn:
                    await self._commit_point(self._before_commit, conn, statement, requests)
                    result = await run(conn)
                    await self._commit_point(self._after_commit, conn, statement, requests)
                return result
            except Exception as exc:
                if not retryable(exc):
                    raise
                if not await self._may_retry(attempt, exc):
                    return None
                attempt += 1
                log.warning("%s of %d failed (%s); retry %d", what, len(requests), exc, attempt)

    async def _complete_isolated(self, conn, attempts: list[tuple[int, int]]) -> bulk.Isolated:
        # One guarded statement for the batch of (id, run_lease); if a row makes it fail, job by
        # job: a job whose completion would take a key a completed duplicate holds (a mask
        # holding 'completed' but not 'running') is cancelled as a duplicate, any other failing
        # row's waiter gets the error; the other jobs complete.
        async def complete(items: list[tuple[int, int]]) -> list[tuple]:
            ids = int8_array([i for i, _ in items])
            leases = int8_array([lease for _, lease in items])
            cur = await conn.execute(sql.COMPLETE_MANY, (ids, leases))
            return [tuple(r) for r in await cur.fetchall()]

        return await bulk.run_isolated(
            conn,
            what="completion batch",
            bulk=lambda: complete(attempts),
            keys=attempts,
            one=lambda attempt: complete([attempt]),
            on_conflict=lambda attempt, _exc: self._cancel_duplicate(conn, *attempt),
        )

    # -- wake-ups after commit ------------------------------------------------------------------

    async def _wake_queues(self, queues: list[str]) -> None:
        # A per-job completion's follow-ups committed without their NOTIFY (one NOTIFY per
        # transaction would serialize those commits database-wide; migration 009): the waker
        # sends it now, coalesced with the other commits of the moment (awa_fast/wake.py).
        await self._waker.wake(queues)

    # -- staged batch path (opt-in) -------------------------------------------------------------

    async def _flush_staged(self, batch: list) -> None:
        # One guarded statement for many triggers and all their follow-ups, one commit. On a
        # deadlock or lost connection the same batch is re-run (a trigger already completed
        # replays as stale and inserts nothing); on any other error each job is redone alone.
        batch.sort(key=lambda item: item[0].attempt.id)
        requests = [request for request, _, _ in batch]
        ids = int8_array([r.attempt.id for r in requests])
        leases = int8_array([r.attempt.run_lease for r in requests])
        payload = enqueue.batch_follow_ups_json(
            [(r.attempt.id, r.attempt.run_lease, inserts) for r, inserts, _ in batch]
        )
        statement = sql.COMPLETE_MANY_WITH_FOLLOW_UPS

        async def complete(conn: Any) -> tuple[set, int]:
            cur = await conn.execute(statement, (ids, leases, payload))
            done_ids, done_leases, inserted = await cur.fetchone()
            return set(zip(done_ids, done_leases, strict=True)), inserted

        try:
            result = await self._batch_transaction(
                "staged completion batch", statement, requests, complete
            )
        except Exception as exc:  # one job's follow-up failed: isolate it
            if _hopeless(exc):  # no job alone can do better: each waiter learns it
                log.warning("staged completion batch of %d failed: %s", len(batch), exc)
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                return
            log.warning(
                "staged completion batch of %d failed (%s); completing job by job",
                len(batch),
                exc,
            )
            result = None
        if result is None:
            for request, inserts, fut in batch:
                try:
                    ok = await self._finalize_requests(request, inserts)
                except Exception as exc:  # never leave a waiter hanging
                    if not fut.done():
                        fut.set_exception(exc)
                    continue
                if not fut.done():
                    fut.set_result(ok)
            return
        done, inserted = result
        # Applied by (job, lease): a stale attempt of a job whose newer attempt completed in the
        # same batch is stale.
        staged = sum(
            len(inserts) for r, inserts, _ in batch if (r.attempt.id, r.attempt.run_lease) in done
        )
        self.stats["batches"] += 1
        self.stats["follow_ups_inserted"] += inserted
        self.stats["follow_ups_skipped"] += staged - inserted
        metrics.follow_ups(inserted, staged - inserted)
        for r, _, fut in batch:
            ok = (r.attempt.id, r.attempt.run_lease) in done
            self.stats["staged_batched" if ok else "stale"] += 1
            if not fut.done():
                fut.set_result(ok)
        self.flushed.fire(len(batch))

    async def _cancel_duplicate(self, conn, job_id: int, lease: int) -> None:
        await conn.execute(sql.CANCEL_DUPLICATE_ATTEMPT, (job_id, lease))
        self.stats["duplicates_cancelled"] += 1
        log.warning(
            "job %s cancelled as a duplicate: its new state would take a unique key "
            "another job holds",
            job_id,
        )

    # -- per-job path ---------------------------------------------------------------------------

    async def _may_retry(self, attempt: int, exc: BaseException) -> bool:
        """After failed try number ``attempt`` (0-based) with the retryable ``exc``: False
        when its retries are spent, else pause (jittered, doubling) and return True. The retry
        takes no dead connection: the pool passes those (``connections.Pool``)."""
        limit = MAX_FINALIZE_RETRIES if isinstance(exc, _CONFLICTS) else MAX_CONNECTION_RETRIES
        if attempt >= limit:
            return False
        self.stats["retries"] += 1
        pause = min(RETRY_PAUSE_S * 2**attempt, RETRY_PAUSE_MAX_S)
        await asyncio.sleep(pause * (0.5 + random.random()))
        return True

    async def _fail_promptly(self, ctx: JobContext, cause: BaseException) -> bool:
        # ADR-046's prompt failure: ``ctx``'s finalize failed for good with ``cause``; record a
        # lease-guarded failure of the attempt now, with the error, instead of leaving it
        # ``running`` until heartbeat rescue. The failure is an ordinary failed attempt
        # (retryable with backoff, or on the final attempt failed / settled with the kind's
        # consequence and exhausted specs); if even that cannot be written, the rescue-shaped
        # ``sql.FAIL_ATTEMPT`` (no inserts) records it. False if stale; raises psycopg.Error
        # when nothing could be written.
        text = f"finalize failed: {type(cause).__qualname__}: {storable.describe(cause)}"
        outcome = ex.failed(ctx, text, terminal=False)
        error = outcome.error or ex.error_entry(text, ctx.attempt)  # failed() always sets it
        request = FinalizeRequest(ctx, outcome)
        try:
            ok = await self._finalize_requests(request, self._inserts_for(request))
        except Exception as exc:
            log.warning(
                "prompt failure of job %s through the failure path failed (%s); "
                "recording it without inserts",
                ctx.id,
                exc,
            )
            settler = self._settler
            pool = await self._pool_getter()
            async with pool.connection() as conn:
                cur = await conn.execute(
                    sql.FAIL_ATTEMPT,
                    {
                        "id": ctx.id,
                        "lease": ctx.run_lease,
                        "message": error["error"],
                        # settled later by the reconciler: consequence and exhausted specs
                        "consequence_kinds": [] if settler is None else settler.pending_kinds(),
                        "known_kinds": [ctx.kind]
                        if settler is None
                        else settler.applier.known_kinds(),
                    },
                )
                ok = await cur.fetchone() is not None
        if ok:
            self.stats["prompt_failures"] += 1
        return ok

    async def _finalize_requests(self, request: FinalizeRequest, inserts: list) -> bool:
        ctx = request.attempt
        attempt = 0
        while True:
            try:
                return await self._finalize_once(request, inserts)
            except (pg_errors.UniqueViolation, enqueue.UniqueConflict):
                # The transition itself would take a key a duplicate holds (not a follow-up:
                # those skip on conflict): cancel this attempt's job as a duplicate.
                pool = await self._pool_getter()
                async with pool.connection() as conn:
                    await self._cancel_duplicate(conn, ctx.id, ctx.run_lease)
                return False
            except Exception as exc:
                if not retryable(exc):
                    raise
                if not await self._may_retry(attempt, exc):
                    log.error(
                        "finalize of job %s gave up after %d retries: %s", ctx.id, attempt, exc
                    )
                    raise
                attempt += 1
                log.warning("finalize of job %s failed (%s); retry %d", ctx.id, exc, attempt)

    async def _finalize_once(self, request: FinalizeRequest, inserts: list) -> bool:
        ctx, outcome = request.attempt, request.outcome
        if outcome.kind == ex.FAIL and self._settler is not None:
            return await self._fail_once(request, inserts, self._settler)
        if outcome.kind == ex.COMPLETED and inserts:
            return await self._complete_with_follow_ups(request, inserts)
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
            if inserts:
                await self.insert_follow_ups(conn, ctx.kind, ctx.id, inserts)

        applied = await self._guarded_transaction(request, sql.TRANSITION, body)
        if applied and state == "available":
            # After the commit, not inside it: a NOTIFY would hold PostgreSQL's notify lock
            # through this per-job commit's WAL flush (ADR 018).
            await self._waker.wake((ctx.queue,))
        return applied

    async def _guarded_transaction(
        self, request: FinalizeRequest, statement: str, body: Callable
    ) -> bool:
        # One per-job transaction around ``body`` (which raises Stale when its guard misses,
        # ``statement`` being its guarded statement), with the fault hooks around COMMIT.
        pool = await self._pool_getter()
        async with pool.connection() as conn:
            try:
                async with conn.transaction():
                    await body(conn)
                    await self._commit_point(self._before_commit, conn, statement, (request,))
            except Stale:
                self.stats["stale"] += 1
                return False
            await self._commit_point(self._after_commit, conn, statement, (request,))
        self.stats["per_job"] += 1
        return True

    async def insert_follow_ups(
        self, conn, trigger_kind: str, trigger_id: int, requests: list
    ) -> None:
        """Insert follow-ups in the caller's transaction (see ``enqueue.insert_follow_ups``),
        counted in ``stats``: the rescued specs' best-effort inserts outside an outcome."""
        inserted, skipped = await enqueue.insert_follow_ups(
            conn, requests, trigger_kind, trigger_id
        )
        self.stats["follow_ups_inserted"] += inserted
        self.stats["follow_ups_skipped"] += skipped
        metrics.follow_ups(inserted, skipped)

    async def _complete_with_follow_ups(self, request: FinalizeRequest, inserts: list) -> bool:
        # One statement, one round trip, one commit (autocommit): see
        # sql.COMPLETE_WITH_FOLLOW_UPS. A lost connection is retried by _finalize_requests; a
        # commit whose acknowledgement was lost then replays as stale and inserts nothing.
        ctx = request.attempt
        statement = sql.COMPLETE_WITH_FOLLOW_UPS
        pool = await self._pool_getter()
        async with pool.connection() as conn:
            await self._commit_point(self._before_commit, conn, statement, (request,))
            with enqueue.mapped_errors():
                cur = await conn.execute(
                    statement, (ctx.id, ctx.run_lease, enqueue.follow_ups_json(inserts))
                )
                applied, inserted, keys, queues = await cur.fetchone()
            await self._commit_point(self._after_commit, conn, statement, (request,))
        if queues:
            await self._wake_queues(queues)
        if not applied:
            self.stats["stale"] += 1
            return False
        self.stats["per_job"] += 1
        self.stats["follow_ups_inserted"] += inserted
        skipped = len(inserts) - inserted
        metrics.follow_ups(inserted, skipped)
        if skipped:
            self.stats["follow_ups_skipped"] += skipped
            if log.isEnabledFor(logging.DEBUG):
                held = set(keys)
                kinds = [p.kind for p in inserts if p.unique_key and p.unique_key not in held]
                log.debug(
                    "follow-ups %s of %s job %s skipped: unique key already held",
                    kinds,
                    ctx.kind,
                    ctx.id,
                )
        return True

    async def _fail_once(self, request: FinalizeRequest, exhausted: list, settler: Settler) -> bool:
        # Failure path: lock the attempt under its lease, then settle (failed / DLQ + exhausted
        # specs). A kind with an effect first records the failure as owed and commits; the
        # effect then runs, and the job settles, in the next transaction (Settler.owe_or_settle,
        # Settler.apply_owed; models/settlement.pml).
        ctx, outcome = request.attempt, request.outcome
        snap = ctx.progress_snapshot()
        owed = False

        async def body(conn) -> None:
            nonlocal owed
            row = await ConsequenceRepo(conn).lock_running(ctx.id, ctx.run_lease)
            if row is None:
                raise Stale()
            owed = await settler.owe_or_settle(
                conn,
                row,
                reason=outcome.reason or "terminal_error",
                path="failure",
                error_entry=outcome.error,
                progress=None if snap is None else snap[1],
                exhausted=exhausted,
                owe_unknown=False,
            )  # a worker knows its kinds

        if not await self._guarded_transaction(request, sql.LOCK_RUNNING, body):
            return False
        if owed:
            try:
                pool = await self._pool_getter()
                async with pool.connection() as conn:
                    await settler.apply_owed(conn, ctx.id, exhausted)
            except Exception as exc:  # no connection: the debt is durable (the reconciler)
                log.warning(
                    "no connection to apply the failure consequence of job %s (%s); it "
                    "stays owed for the reconciler",
                    ctx.id,
                    exc,
                )
        return True

    # -- lifecycle ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Flush what is buffered (completions, then pending wake-ups) and stop the
        background tasks (nothing to do for an inline finalizer)."""
        self._closing = True
        self._wake.set()
        try:
            await asyncio.gather(*self._flushers, return_exceptions=True)
        finally:
            # Also when close() was cancelled (shutdown's bound): what is still buffered is
            # handed back to its submitters, which finalize it alone or leave it to rescue.
            self._closed = True
            for buffer in (self._pending, self._staged):
                for *_, fut in buffer:
                    if not fut.done():
                        fut.set_exception(RuntimeError("the finalizer closed before this batch"))
                buffer.clear()
        await self._waker.flush()  # after the flushers: their redo may still wake queues
