"""Per-kind failure consequences (ADR-PFM-OPS-003, awa-fast's variant), declared once per kind
and applied by one applier from both settlement paths.

* Failure path (terminal error, exhaustion, staging poison, ``fail_external`` and a CEL
  ``on_fail``, rescue or callback timeout on the final attempt): the failure is first recorded
  as owed (``consequence_pending``, committed; rescue does so in its own statement), then the
  effect runs on the settling transaction's connection *before* the job settles. If it raises
  or times out, nothing settles: the job stays in the non-terminal state ``consequence_pending``
  (never handed to a handler again) and the reconciler retries the effect with backoff until
  it succeeds, then settles the job.
* Reconciliation path (``correct_to_failed`` / ``verify_success``): the job settles first
  (completed -> failed) and, in that same transaction, the consequence is recorded as *owed*;
  it is applied afterwards and the reconciler retries owed consequences until they succeed.
  This closes the seed's admitted gap (a failed effect after settlement had no retry path).

Effects must be repeat-safe: a crash after the effect but before the commit runs it again.
A successful application is recorded on the job (``consequence_state='applied'``, when, path).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, cast

import orjson
import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from awa_fast import enqueue, metrics
from awa_fast.job import Job
from awa_fast.repo.consequences import ConsequenceRepo, LockedJob, Settlement
from awa_fast.worker.registry import NO_FAILURE_CONSEQUENCE, UNDECLARED, Registry
from awa_fast.worker.sync_effect import LoopConnection

log = logging.getLogger("awa_fast.consequences")

REASONS = (
    "terminal_error",
    "exhausted",
    "rescue_exhausted",
    "deadline_exhausted",
    "callback_failed",
    "callback_timeout",
    "corrected",
)
MAX_BACKOFF_S = 600.0
# Appended to a correction's error when the corrected job cannot hold its unique key.
KEY_HELD_ELSEWHERE = "failed without its unique key: another job holds it"


@dataclasses.dataclass
class JobFailure:
    """What a failure consequence receives.

    Attributes:
        job: the job snapshot (``id, kind, queue, args`` -- typed when the kind's args type is
            registered here --, ``attempt, max_attempts, metadata, errors``).
        path: ``"failure"`` or ``"reconciliation"``.
        reason: one of ``terminal_error, exhausted, rescue_exhausted, deadline_exhausted,
            callback_failed, callback_timeout, corrected``.
        error: the failure's error text.
        conn: a psycopg ``AsyncConnection`` inside the settlement transaction: writes made on it
            commit if and only if the consequence is recorded as applied. A plain ``def``
            effect runs in a thread and gets a synchronous view of it instead
            (``sync_effect.LoopConnection``: ``execute`` / ``executemany`` returning a cursor
            with ``fetchone`` / ``fetchall``), each call run in the same transaction (ADR 031).
        idempotency_key: stable per job and failure (the same on every retry of the effect).
    """

    job: Job
    path: str
    reason: str
    error: str
    conn: psycopg.AsyncConnection | LoopConnection
    idempotency_key: str

    @property
    def id(self) -> int:
        return self.job.id

    @property
    def kind(self) -> str:
        return self.job.kind

    @property
    def args(self) -> Any:
        return self.job.args


def _is_async(fn: Any) -> bool:
    """An ``async def`` (or an object whose ``__call__`` is one): runs on the loop."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the bound __call__ itself
    )


def idempotency_key(job_id: int, run_lease: int, reason: str) -> str:
    """Stable per job and failure: the failing attempt's run lease (never reused, not even by
    admin or DLQ retries) and whether it was a failure or a correction."""
    what = "corrected" if reason == "corrected" else "failed"
    return f"awa-fast:{job_id}:lease-{run_lease}:{what}"


def backoff(attempts: int, base_s: float) -> float:
    """Seconds before the reconciler retries a failed effect (doubling, capped at 10 min)."""
    return min(base_s * 2 ** max(attempts - 1, 0), MAX_BACKOFF_S)


@dataclasses.dataclass(frozen=True)
class ConsequenceConfig:
    """How effects run: ``timeout_s`` seconds an effect may take before it counts as failed,
    ``backoff_base_s`` the first reconciler retry delay (seconds; doubles per failure, at most
    ``MAX_BACKOFF_S``). ``start(consequence_timeout_ms=, consequence_backoff_ms=)`` sets them."""

    timeout_s: float = 30.0
    backoff_base_s: float = 1.0


class ConsequenceApplier:
    """Runs declared consequences for one client's registry.

    Args:
        registry: the client's handler registry (declarations live on its handlers and in
            ``declarations`` for kinds handled elsewhere).
        config: effect timeout and retry backoff (:class:`ConsequenceConfig`).
    """

    def __init__(self, registry: Registry, config: ConsequenceConfig | None = None):
        self.registry = registry
        self.config = ConsequenceConfig() if config is None else config

    def declaration(self, kind: str) -> Any:
        """The declared consequence of ``kind``: a callable, ``NO_FAILURE_CONSEQUENCE``, or
        ``UNDECLARED``."""
        handler = self.registry.get(kind)
        if handler is not None and handler.failure_consequence is not UNDECLARED:
            return handler.failure_consequence
        return self.registry.consequences.get(kind, UNDECLARED)

    def effect_of(self, kind: str) -> Callable | None:
        decl = self.declaration(kind)
        return decl if callable(decl) else None

    def kinds_with_effects(self) -> list[str]:
        kinds = {k for k in self.registry.consequences if callable(self.registry.consequences[k])}
        kinds.update(
            h.kind for h in self.registry.handlers.values() if callable(h.failure_consequence)
        )
        return sorted(kinds)

    def known_kinds(self) -> list[str]:
        """Kinds whose consequence this process knows (:meth:`knows`), sorted."""
        return sorted(set(self.registry.handlers) | set(self.registry.consequences))

    def knows(self, kind: str) -> bool:
        """Whether this process knows ``kind``'s consequence -- the one rule every settlement
        path asks: it registers the kind's handler (a handler without a declaration has no
        effect) or declares its consequence. A process that does not know it never settles the
        kind's failure: the consequence stays owed for a process that does."""
        return kind in self.registry.handlers or kind in self.registry.consequences

    def snapshot(self, row: tuple) -> Job:
        """A Job from a ``JOB_COLUMNS`` row (a :class:`LockedJob` too), with typed args when
        the kind is registered."""
        job = Job.from_row(row)
        decode = self.registry.decoder(job.kind)
        if decode is not None:
            try:
                job.args = decode(job.args)
            except Exception:  # the effect still gets the raw dict
                pass
        return job

    async def run_effect(
        self,
        conn,
        fn: Callable[[JobFailure], Awaitable[Any]],
        job: Job,
        path: str,
        reason: str,
        error: str,
    ) -> str | None:
        """Run ``fn`` under a savepoint on ``conn``; returns ``None`` on success or the error
        text (the savepoint is rolled back: the effect's writes are undone)."""
        key = idempotency_key(job.id, job.run_lease, reason)
        in_thread = not _is_async(fn)
        # A plain def runs in a thread with a synchronous view of ``conn`` (sync_effect.py):
        # it cannot block the loop, and its writes stay in the settlement (ADR 031).
        view = LoopConnection(conn, asyncio.get_running_loop()) if in_thread else None
        failure = JobFailure(job, path, reason, error, view or conn, key)
        repo = ConsequenceRepo(conn)
        await repo.effect_savepoint()
        try:
            async with asyncio.timeout(self.config.timeout_s):
                if view is not None:
                    try:
                        result = await asyncio.to_thread(fn, failure)
                    finally:
                        view.close()  # a thread past its timeout can send nothing more
                else:
                    result = fn(failure)
                if asyncio.iscoroutine(result):
                    await result
            if conn.info.transaction_status == TransactionStatus.INERROR:
                raise RuntimeError(
                    "the effect left the transaction aborted (it caught a database error)"
                )
        except asyncio.CancelledError:
            raise  # the runtime's own cancellation (asyncio.timeout turns its own into TimeoutError)
        except BaseException as exc:
            # KeyboardInterrupt raised inside it included, keeps the job owed (as for handlers)
            log.warning("failure consequence of %s job %s failed: %s", job.kind, job.id, exc)
            await repo.effect_failed()
            return f"{type(exc).__qualname__}: {exc}"
        await repo.effect_done()
        return None


class Settler:
    """Settles failing jobs the same way from every path: the ordinary failure path (worker
    outcome, ``fail_external``), rescue on the final attempt, and the reconciler.

    Args:
        applier: the consequence applier (declarations + effect runner).
        specs: the client's :class:`~awa_fast.worker.specs.SpecRunner` (exhausted specs).
    """

    def __init__(self, applier: ConsequenceApplier, specs: Any):
        self.applier = applier
        self.specs = specs
        self.stats = {"applied": 0, "pending": 0, "dead_lettered": 0}

    def pending_kinds(self) -> list[str]:
        """Kinds whose final failure recorded outside a settling transaction (rescue, the
        prompt-failure fallback) waits in ``consequence_pending`` for the reconciler to settle
        it here: those with a failure consequence and those with exhausted specs (which fire
        however the job is exhausted)."""
        return sorted(set(self.applier.kinds_with_effects()) | set(self.specs.kinds("exhausted")))

    def _consequence_value(self, kind: str) -> str | None:
        return "none" if self.applier.declaration(kind) is NO_FAILURE_CONSEQUENCE else None

    async def owe_or_settle(
        self,
        conn,
        row: LockedJob,
        *,
        reason: str,
        path: str,
        error_entry: dict | None,
        progress: str | None = None,
        exhausted: list | None = None,
        owe_unknown: bool = True,
        mark: datetime | None = None,
    ) -> bool:
        """The failure path's first transaction (the worker's ``Finalizer._fail_once``,
        ``fail_external`` and ``resolve_callback``'s on_fail), with the job's row locked
        (``ConsequenceRepo.lock_running`` or the like); ``error_entry`` is appended first.

        A kind with an effect only records the failure as ``consequence_pending`` with its
        consequence owed and due now, without running the effect, and this returns True: the
        caller commits, then calls :meth:`apply_owed`. So a crash after the effect's outside
        part ran leaves a debt repeated under the same idempotency key, never a row a rescue or
        callback timeout retries (models/settlement.pml, ``NEG_EFFECT_FIRST``).

        Other kinds settle here and this returns False: failed or dead-lettered (with the
        exhausted specs' follow-ups), or left ``consequence_pending`` when -- with
        ``owe_unknown`` -- this process does not know the kind (the reconciler settles it).

        ``mark`` is the "still running" mark a ``running`` row keeps (its handler lives on:
        ``fail_external`` of a running attempt), carried into the DLQ entry if it moves there;
        a row that already left ``running`` keeps its own (also through the owed settlement).
        """
        repo = ConsequenceRepo(conn)
        await repo.append_error(row.id, error_entry, progress)
        if self.applier.effect_of(row.kind) is not None:
            await repo.owe_failure(row.id, reason, path, mark)
            self.stats["pending"] += 1
            return True
        if owe_unknown and not self.applier.knows(row.kind):
            # This process cannot know the kind's consequence (declared elsewhere): leave it
            # owed and visible for a reconciler that does, instead of settling without it.
            await repo.mark_pending(
                row.id,
                reason=reason,
                path=path,
                error="consequence not declared in the settling process",
                mark=mark,
                retry_in_s=0,
            )
            self.stats["pending"] += 1
            return False
        error = "" if error_entry is None else error_entry.get("error", "")
        await self._apply_and_settle(conn, row, reason, path, error, exhausted, mark)
        return False

    async def apply_owed(self, conn, job_id: int, exhausted: list | None = None) -> str | None:
        """The failure path's second transaction, after :meth:`owe_or_settle` returned True and
        its transaction committed: apply the owed effect and settle (:meth:`reconcile_on`).
        Never raises for the effect or the settlement: the debt is durable, so on any error
        it stays owed for the reconciler (logged). Returns what :meth:`reconcile_on` returns,
        or ``None`` on such an error."""
        try:
            return await self.reconcile_on(conn, job_id, exhausted)
        except Exception as exc:
            log.warning(
                "applying the failure consequence of job %s failed (%s); it stays "
                "owed for the reconciler",
                job_id,
                exc,
            )
            return None

    async def _run_or_defer(
        self,
        repo: ConsequenceRepo,
        fn: Callable,
        row: LockedJob,
        path: str,
        reason: str,
        error: str,
        mark: datetime | None,
    ) -> bool:
        """Run effect ``fn`` for the locked ``row``; if it fails, leave the job owed (retried
        after the backoff) and return False."""
        failed = await self.applier.run_effect(
            repo.conn, fn, self.applier.snapshot(row), path, reason, error
        )
        if failed is None:
            self.stats["applied"] += 1
            metrics.CONSEQUENCES_APPLIED.labels(row.kind).inc()
            return True
        await repo.mark_pending(
            row.id,
            reason=reason,
            path=path,
            error=failed,
            mark=mark,
            retry_in_s=backoff(row.consequence_attempts + 1, self.applier.config.backoff_base_s),
        )
        return False

    async def _apply_and_settle(
        self,
        conn,
        row: LockedJob,
        reason: str,
        path: str,
        error: str,
        exhausted: list | None,
        mark: datetime | None = None,
    ) -> str:
        job_id, kind = row.id, row.kind
        repo = ConsequenceRepo(conn)
        fn = self.applier.effect_of(kind)
        consequence = self._consequence_value(kind)
        if fn is not None:
            if not await self._run_or_defer(repo, fn, row, path, reason, error, mark):
                self.stats["pending"] += 1
                return "consequence_pending"
            consequence = "applied"
        settle = Settlement(consequence, reason, path, mark)
        if not await repo.settle_failed(job_id, settle):
            # Another job holds the key this failure would hold: settled once, as a duplicate,
            # instead of rolling back and running the effect again on every reconciler tick.
            await repo.settle_failed_as_duplicate(job_id, settle)
            log.info("failed job %s cancelled as a duplicate: another job holds its key", job_id)
            return "cancelled"
        if exhausted is None:
            job = Job.from_row(row)
            exhausted = self.specs.requests(
                kind, "exhausted", job.args, job, job_id, job.metadata, error, job.attempt
            )
        if exhausted:
            await enqueue.insert_follow_ups(conn, exhausted, kind, job_id)
        if await repo.dead_letter(job_id, reason):
            self.stats["dead_lettered"] += 1
            return "dead_lettered"
        return "failed"

    async def defer(self, conn, job_id: int, error: str) -> None:
        """Push the next reconciler try of owed job ``job_id`` out by the doubling backoff
        (``backoff_base_s`` * 2^attempts, at most ``MAX_BACKOFF_S``), recording ``error``."""
        await ConsequenceRepo(conn).defer_owed(
            job_id, error, self.applier.config.backoff_base_s, MAX_BACKOFF_S
        )

    def correction_state(self, kind: str) -> str | None:
        """What a correction of ``kind`` owes: ``"owed"``, ``"none"`` (declared no effect) or
        ``None`` (registered here without a declaration: nothing to owe)."""
        decl = self.applier.declaration(kind)
        if decl is NO_FAILURE_CONSEQUENCE:
            return "none"
        if decl is UNDECLARED and self.applier.knows(kind):
            return None
        return "owed"

    async def correct(self, conn, job_id: int, kind: str, attempt: int, error: str) -> bool:
        """Inside the caller's transaction: a ``completed`` job becomes ``failed`` with
        ``error`` appended and its consequence owed (``correction_state``). Returns False (and
        writes nothing) when the job is no longer ``completed``."""
        entry = {
            "error": str(error),
            "attempt": attempt,
            "corrected": True,
            "at": datetime.now(UTC).isoformat(),
        }
        repo = ConsequenceRepo(conn)
        owes = self.correction_state(kind)
        done = await repo.correct_to_failed(job_id, owes=owes, entry=entry, keep_key=True)
        if done == "key_held":
            # Failed, its mask holds 'failed', and another job holds the key: the correction
            # (and the consequence it owes) stands; the job fails without holding the key.
            keyless = {**entry, "error": f"{entry['error']}; {KEY_HELD_ELSEWHERE}"}
            done = await repo.correct_to_failed(job_id, owes=owes, entry=keyless, keep_key=False)
        return done == "corrected"

    async def correct_to_failed(
        self, pool: AsyncConnectionPool, job_id: int, kind: str, attempt: int, error: str
    ) -> bool:
        """``correct_to_failed`` (admin): :meth:`correct` in a transaction of its own on a
        connection of ``pool``; when this process knows the kind's effect, it is applied right
        after (:meth:`reconcile_one`; a failure leaves it owed for the reconciler). Returns
        False (nothing written) when the job is no longer ``completed``."""
        async with pool.connection() as conn:
            async with conn.transaction():
                if not await self.correct(conn, job_id, kind, attempt, error):
                    return False
        if self.applier.effect_of(kind) is not None:  # owed, and its effect is known here
            await self.reconcile_one(pool, job_id)
        return True

    async def reconcile_one(self, pool: AsyncConnectionPool, job_id: int) -> str | None:
        """Retry the owed consequence of one job on a connection of ``pool`` (see
        :meth:`reconcile_on`)."""
        async with pool.connection() as conn:
            return await self.reconcile_on(conn, job_id)

    async def reconcile_on(self, conn, job_id: int, exhausted: list | None = None) -> str | None:
        """Retry the owed consequence of one job (reconciler), in a transaction (a savepoint
        when ``conn`` is already in one). Returns the new settlement, ``"owed"`` if the effect
        failed again, or ``None`` when the job was not due/lockable or its kind's consequence
        is unknown in this process (left owed and visible)."""
        async with conn.transaction():
            repo = ConsequenceRepo(conn)
            row = await repo.lock_owed(job_id)
            if row is None:
                return None
            kind, state = row.kind, row.state
            if not self.applier.knows(kind):
                log.warning(
                    "consequence of %s job %s is owed but %s is not declared in "
                    "this process; leaving it owed",
                    kind,
                    job_id,
                    kind,
                )
                # ... backed off, so owed jobs of unknown kinds never fill the sweep's batch
                await self.defer(
                    conn, job_id, f"consequence of {kind!r} not declared in the reconciling process"
                )
                return None
            # a NULL reason passes through as stored
            reason = cast(str, row.consequence_reason)
            path = row.consequence_path or "failure"
            error = error_text(row.errors)
            if state == "consequence_pending":
                return await self._apply_and_settle(conn, row, reason, path, error, exhausted)
            # A corrected (already settled) job: apply, then record it applied.
            fn = self.applier.effect_of(kind)
            if fn is not None and not await self._run_or_defer(
                repo, fn, row, path, reason, error, None
            ):
                return "owed"
            state = "applied" if fn is not None else "none"
            await repo.mark_applied(job_id, path, state)
            return state


def error_text(errors: list) -> str:
    if not errors:
        return ""
    last = errors[-1]
    return last.get("error", "") if isinstance(last, dict) else orjson.dumps(last).decode()
