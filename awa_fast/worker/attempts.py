"""The attempts this process runs, each in a task of its own keyed by attempt (job id,
run_lease): spawned from a dispatcher's claim, supervised (deadline, lease, cancel flag,
shutdown) until the task ends, finalized or given back. The runtime wires it
(``worker/runtime.py``); the heartbeat, the liveness thread and maintenance read it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
from datetime import UTC, datetime
from typing import Any

from awa_fast import metrics
from awa_fast.repo.attempts import AttemptRepo
from awa_fast.retryable import Retry, classify
from awa_fast.worker import executor as ex
from awa_fast.worker.context import JobContext
from awa_fast.worker.dispatcher import Dispatcher
from awa_fast.worker.executor import execute as run_handler  # (not a statement)
from awa_fast.worker.finalizer import Finalized, Finalizer, FinalizeRequest
from awa_fast.worker.lingering import Lingering
from awa_fast.worker.liveness import LEASE_MARGIN
from awa_fast.worker.observe import Signal
from awa_fast.worker.services import AttemptRuntime, Services
from awa_fast.worker.shutdown import first, wait_bounded

log = logging.getLogger("awa_fast.runtime")

DEADLINE_SWEEP_S = 0.5


def _free_slot_when_done(thread: concurrent.futures.Future, dispatcher: Dispatcher) -> None:
    """Give ``dispatcher`` its slot back when the handler ``thread`` ends (from that thread,
    through the dispatcher's loop; nothing if the loop is closed by then)."""
    loop = asyncio.get_running_loop()

    def done(_: concurrent.futures.Future) -> None:
        try:
            loop.call_soon_threadsafe(dispatcher.slot_freed)
        except RuntimeError:  # the loop is closed: the process is ending
            pass

    thread.add_done_callback(done)


def _thread_runs(ctx: JobContext) -> bool:
    """True when ``ctx``'s ``def`` handler thread has started and not finished (a thread that
    had not started is cancelled here and never will)."""
    thread = ctx.thread
    return thread is not None and not thread.cancel() and not thread.done()


def _log_failed_attempt(ctx: JobContext, outcome: ex.Outcome) -> None:
    """One line per failed or retried attempt: kind, id, attempt, the error's type and message
    (its first line; never the job's args), and what happens next ("retry in N s", or "not
    retried (reason)": the settlement then fails, dead-letters or owes the attempt)."""
    error = (outcome.error or {}).get("error") or "the handler asked for it (no error)"
    head, _, _ = error.partition("\n")
    head = head[:500]
    if outcome.kind == ex.RETRY:
        then = f"retry in {outcome.delay or 0:.1f} s"
    else:  # failed, dead-lettered or owing its kind's consequence: the settlement decides
        then = f"not retried ({outcome.reason})"
    log.warning(
        "job %s (%s) attempt %d/%d failed: %s; %s",
        ctx.id,
        ctx.kind,
        ctx.attempt,
        ctx.max_attempts,
        head,
        then,
        extra={"kind": ctx.kind, "job_id": ctx.id, "attempt": ctx.attempt, "outcome": outcome.kind},
    )


def _left_after_shutdown(ctx: JobContext) -> None:
    # Shutdown has returned (its bound passed): nothing of this runtime touches the database
    # any more (the client may have closed its pool; a late statement would open a new one).
    # The attempt stays running; heartbeat rescue takes it.
    log.error(
        "job %s (%s) ended after shutdown had returned: its attempt stays running until "
        "heartbeat rescue",
        ctx.id,
        ctx.kind,
    )


def _own(make: Any) -> Any:
    """A field each instance makes for itself, not a constructor argument."""
    return dataclasses.field(default_factory=make, init=False)


@dataclasses.dataclass(slots=True)
class _Ending:
    """How an attempt's run ended, for its clean-up: ``released`` (its slot is freed),
    ``abandoned`` (at its deadline, to rescue), ``applied`` (its outcome's write: None when
    none was made, False when stale)."""

    released: bool = False
    abandoned: bool = False
    applied: bool | None = None


@dataclasses.dataclass(eq=False, repr=False)
class Attempts:
    """The attempts of one runtime.

    Args:
        runtime: what each attempt's ``JobContext`` uses of its runtime.
        services: the process's services (handlers, pool).
        lease_s: the heartbeat staleness (seconds): an attempt unbeaten for nearly that long
            may be rescued, so it is cancelled and given back (``LEASE_MARGIN``).
        thread_pool: where ``def`` handlers run.
        progress: the runtime's progress signal, fired when an attempt ends.
        dispatchers: queue -> dispatcher (the runtime's, filled when it starts).

    ``finalizer`` and ``lingering`` are set when the runtime builds its parts (before any
    claim); ``stopped`` once its shutdown returned (attempts ending later are left to rescue).
    """

    runtime: AttemptRuntime
    services: Services
    lease_s: float
    thread_pool: concurrent.futures.ThreadPoolExecutor
    progress: Signal
    dispatchers: dict[str, Dispatcher]
    finalizer: Finalizer | None = None
    lingering: Lingering | None = None  # def-handler threads outliving their task
    stopped: bool = False
    # Every structure is keyed by attempt (job id, run_lease).
    in_flight: dict[tuple[int, int], JobContext] = _own(dict)
    tasks: dict[tuple[int, int], asyncio.Task] = _own(dict)
    outcomes: dict[str, int] = _own(dict)
    ended: int = 0  # attempts whose task ended (finalized, released, abandoned)
    _ended: asyncio.Event = _own(asyncio.Event)
    _giving_back: set[asyncio.Future] = _own(set)  # see _never_started

    # -- what the liveness thread, the heartbeat and maintenance read ---------------------------

    def targets(self) -> list[JobContext]:
        return list(self.in_flight.values())  # one C-level copy: safe from the liveness thread

    def live(self) -> int:
        return sum(1 for c in list(self.in_flight.values()) if not c.returned and not c.lease_lost)

    def oldest_lease(self) -> float | None:
        live = [
            max(c.claimed_mono, c.beaten_mono)
            for c in list(self.in_flight.values())
            if not c.returned and not c.waiting and not c.lease_lost
        ]
        return min(live) if live else None

    def own(self) -> list[str]:
        # 'id:run_lease' of every attempt this process still runs (sql.RESCUE's %(own)s)
        return [f"{job_id}:{lease}" for job_id, lease in list(self.in_flight)]

    def handler_on_stack(self, frame: Any) -> tuple[str, int] | None:
        # Called from the liveness thread during a stall: is ``frame`` an attempt's task frame?
        for key, task in list(self.tasks.items()):
            if getattr(task.get_coro(), "cr_frame", None) is frame:
                ctx = self.in_flight.get(key)
                return None if ctx is None else (ctx.kind, ctx.id)
        return None

    async def wait_ended(self, n: int) -> None:
        """Wait until ``n`` attempts have ended: finalized (or their prompt failure recorded),
        released, or abandoned."""
        while self.ended < n:
            self._ended.clear()
            await self._ended.wait()

    def cancel_flagged(self, job_id: Any, run_lease: Any) -> bool:
        """Flag the attempt (job_id, run_lease) cancelled (a cancel NOTIFY); False if it does
        not run here."""
        ctx = self.in_flight.get((job_id, run_lease))
        if ctx is None:
            return False
        ctx.cancel_flag()
        return True

    # -- spawning and ending --------------------------------------------------------------------

    def spawn(self, row: tuple, claim_sent: float) -> None:
        """Start the attempt of a claimed ``row`` (a dispatcher's ``spawn``)."""
        ctx = JobContext(row, self.runtime)
        # Keyed by attempt: a superseded attempt of a re-claimed job stays supervised (deadline,
        # shutdown cancel flag, cancel NOTIFY, heartbeat) until its own task ends.
        key = (ctx.id, ctx.run_lease)
        # The lease runs from the claim's send, not from now: its rows may have waited on a
        # blocked loop, unbeaten, while a rescuer's clock ran from the claim's commit.
        ctx.claimed_mono = claim_sent
        self.in_flight[key] = ctx
        task = asyncio.get_running_loop().create_task(self._run(ctx))
        self.tasks[key] = task
        task.add_done_callback(lambda _t: self._never_started(ctx))

    def _never_started(self, ctx: JobContext) -> None:
        # A task cancelled before its first step (a lease expiry, a deadline sweep or a
        # shutdown in the loop iteration that spawned it) never runs _run's ``finally``: its
        # attempt would stay in flight (and this process's own, never rescued by it) forever.
        key = (ctx.id, ctx.run_lease)
        if self.in_flight.get(key) is not ctx:
            return  # _run ran and cleaned up
        self.in_flight.pop(key, None)
        self.tasks.pop(key, None)
        self.dispatchers[ctx.queue].slot_freed()
        log.warning(
            "job %s (%s) was cancelled before its handler started; its attempt is given back",
            ctx.id,
            ctx.kind,
        )
        if not self.stopped and self.finalizer is not None:
            giving = asyncio.ensure_future(self._give_back(ctx))
            self._giving_back.add(giving)  # held until done (the loop keeps weak references)
            giving.add_done_callback(self._giving_back.discard)
        else:
            self._done()

    async def _give_back(self, ctx: JobContext) -> None:
        try:
            assert self.finalizer is not None
            await self.finalizer.submit(FinalizeRequest.release(ctx))
        except Exception as exc:  # it stays running until rescue
            log.warning("giving back job %s's attempt failed: %s", ctx.id, exc)
        finally:
            self._done()

    def _done(self) -> None:
        self.ended += 1
        self._ended.set()
        self.progress.fire("attempt ended")

    def _lease_ran_out(self, ctx: JobContext) -> bool:
        """No beat has beaten ``ctx`` (nor its claim been sent) for nearly the lease: a rescuer
        may take it any moment."""
        since = max(ctx.claimed_mono, ctx.beaten_mono)
        return time.monotonic() - since >= self.lease_s * (1 - LEASE_MARGIN)

    def lease_expired(self) -> None:
        """Attempts that no beat has beaten (nor their claim started) for nearly this process's
        ``heartbeat_staleness_ms`` -- the database did not answer, or the row is no longer
        theirs -- may soon be taken by a rescuer. Their handlers are cancelled and the attempts
        given back (guarded by their lease), so no execution of theirs overlaps the rescued
        one's (docs/architecture.md, "Which executions can overlap")."""
        now = time.monotonic()
        cutoff = now - self.lease_s * (1 - LEASE_MARGIN)
        lost = []
        oldest = now
        for key, ctx in list(self.in_flight.items()):
            since = max(ctx.claimed_mono, ctx.beaten_mono)
            if ctx.returned or ctx.waiting or ctx.lease_lost or since > cutoff:
                continue
            oldest = min(oldest, since)
            ctx.lease_lost = True
            task = self.tasks.get(key)
            if task is not None:
                task.cancel()
                lost.append(ctx)
        if lost:
            metrics.leases_expired(len(lost))
            log.warning(
                "no heartbeat committed for %.1f s (the database did not answer, or this "
                "process was stopped and the job rescued): %d attempt(s) cancelled and given "
                "back before a rescuer runs them again: %s",
                now - oldest,
                len(lost),
                ", ".join(f"job {c.id} ({c.kind})" for c in lost[:10]),
                extra={"lease_lost_job_ids": [c.id for c in lost]},
            )

    async def _run(self, ctx: JobContext) -> None:
        dispatcher = self.dispatchers[ctx.queue]
        end = _Ending()
        try:
            await self._execute(ctx, dispatcher, end)
        except Exception as exc:
            if classify(exc) is Retry.CLOSED:  # (the pool closed under it: one line per job)
                log.warning(
                    "finalizing job %s (%s) failed: %s; it stays running until rescue",
                    ctx.id,
                    ctx.kind,
                    exc,
                )
            else:
                log.exception(
                    "finalizing job %s (%s) failed; it stays running until rescue",
                    ctx.id,
                    ctx.kind,
                )
        finally:
            if not end.released:
                dispatcher.slot_freed()
            self.in_flight.pop((ctx.id, ctx.run_lease), None)
            self.tasks.pop((ctx.id, ctx.run_lease), None)
            try:
                if (end.applied is False or end.abandoned) and not self.stopped:
                    # Stale (maybe cancelled or failed externally while it ran) or abandoned
                    # at its deadline: its handler is done now, so clear the "still running"
                    # mark.
                    await self._ack_ended(ctx)
            finally:
                self._done()

    async def _execute(self, ctx: JobContext, dispatcher: Dispatcher, end: _Ending) -> None:
        """Run the handler and finalize its outcome (or give the attempt back unrun)."""
        finalizer = self.finalizer
        assert finalizer is not None  # set by the runtime's start()
        handler = self.services.registry.get(ctx.kind)
        lease_out = self._lease_ran_out(ctx)
        if lease_out or handler is None:
            await self._give_back_unrun(ctx, not lease_out, dispatcher, end)
            return
        try:
            outcome = await run_handler(handler, ctx, self.thread_pool)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                await self._handler_cancelled(ctx, dispatcher, end)
                return
            # Raised by the handler's own code (an inner task was cancelled): an ordinary
            # failure of this attempt, not ours to release.
            outcome = ex.handler_error(ctx, exc)
        ctx.returned = True
        dispatcher.slot_freed()
        end.released = True
        self.outcomes[outcome.kind] = self.outcomes.get(outcome.kind, 0) + 1
        if outcome.kind in (ex.FAIL, ex.RETRY):
            _log_failed_attempt(ctx, outcome)
        if self.stopped:
            _left_after_shutdown(ctx)
            return
        returned_at = time.perf_counter()
        result = await finalizer.submit(FinalizeRequest.of(ctx, outcome))
        end.applied = result is not Finalized.STALE
        if result is Finalized.APPLIED:
            metrics.finalized(ctx.queue, ctx.kind, outcome.kind, time.perf_counter() - returned_at)
        elif result is Finalized.PROMPT_FAILURE:
            metrics.finalized(ctx.queue, ctx.kind, "prompt_failure")

    async def _give_back_unrun(
        self, ctx: JobContext, no_handler: bool, dispatcher: Dispatcher, end: _Ending
    ) -> None:
        """Hand an attempt back, uncounted, without starting its handler."""
        if no_handler:
            # The claim takes only kinds with a handler here; a job claimed anyway (its
            # handler dropped after start) is never failed for it: hand it back uncounted.
            log.error(
                "job %s of kind %r was claimed but this process has no handler for "
                "it; released for a worker that has one",
                ctx.id,
                ctx.kind,
            )
        else:
            # Claimed while the loop was blocked (or by a claim that took nearly the
            # staleness): a rescuer may already run it again, so its handler never starts.
            ctx.lease_lost = True
            metrics.leases_expired(1)
            log.warning(
                "job %s (%s) waited %.1f s after its claim was sent, nearly the heartbeat "
                "staleness: given back without running its handler (it may be rescued "
                "already)",
                ctx.id,
                ctx.kind,
                time.monotonic() - ctx.claimed_mono,
                extra={"lease_lost_job_ids": [ctx.id]},
            )
        dispatcher.slot_freed()
        end.released = True
        assert self.finalizer is not None
        await self.finalizer.submit(FinalizeRequest.release(ctx))

    async def _handler_cancelled(
        self, ctx: JobContext, dispatcher: Dispatcher, end: _Ending
    ) -> None:
        """The runtime cancelled the handler (its deadline, shutdown, a lease that ran out):
        the attempt is abandoned to rescue, kept until its thread ends, or given back."""
        assert self.finalizer is not None and self.lingering is not None
        if ctx.staged_follow_ups is not None:
            ctx.staged_follow_ups.discard("abandoned", ctx.kind)
        end.released = True
        if ctx.deadline_expired:
            # Abandoned at its deadline: rescue takes it over. A thread cannot be stopped: its
            # mark stays fresh until it ends, so the rescued job is not run again meanwhile;
            # otherwise the mark is cleared.
            self.outcomes[ex.ABANDON] = self.outcomes.get(ex.ABANDON, 0) + 1
            if _thread_runs(ctx):
                # ... and it keeps its handler thread, so it keeps its slot: a job claimed
                # into the slot would wait for a thread while its own deadline ran.
                assert ctx.thread is not None
                _free_slot_when_done(ctx.thread, dispatcher)
                self.lingering.watch(ctx, release=False)
            else:
                dispatcher.slot_freed()
                end.abandoned = True
            return
        dispatcher.slot_freed()
        if _thread_runs(ctx):
            # A thread cannot be stopped: releasing now would let another worker run the job
            # while this thread still does.
            log.warning(
                "job %s (%s): its handler thread is still running; the attempt is given back "
                "when the thread finishes",
                ctx.id,
                ctx.kind,
            )
            self.lingering.watch(ctx, release=True)
            return
        # Shutdown gave up waiting: hand the attempt back, uncounted.
        if self.stopped:
            _left_after_shutdown(ctx)
            return
        result = await self.finalizer.submit(FinalizeRequest.release(ctx))
        end.applied = result is Finalized.APPLIED

    async def _ack_ended(self, ctx: JobContext) -> None:
        try:
            async with (await self.services.pool()).connection() as conn:
                await AttemptRepo(conn).ack_ended(ctx.id, ctx.run_lease)
        except Exception as exc:  # the mark goes stale on its own
            log.warning("could not acknowledge the end of job %s's attempt: %s", ctx.id, exc)

    # -- deadlines and shutdown -----------------------------------------------------------------

    async def sweep_deadlines(self) -> None:
        """Cancel handlers whose attempt deadline passed (checked every half second)."""
        while True:
            await asyncio.sleep(DEADLINE_SWEEP_S)
            try:
                self._abandon_overdue(datetime.now(UTC))
            except Exception:  # the sweep must survive every error
                log.exception("deadline sweep failed")

    def _abandon_overdue(self, now: datetime) -> None:
        for key, ctx in list(self.in_flight.items()):
            deadline = ctx.deadline_at
            if (
                deadline is not None
                and deadline <= now
                and not ctx.returned
                and not ctx.waiting
                and not ctx.deadline_expired
            ):
                ctx.deadline_expired = True
                task = self.tasks.get(key)
                if task is not None:
                    log.warning(
                        "job %s (%s) passed its deadline: abandoning the attempt", ctx.id, ctx.kind
                    )
                    task.cancel()

    async def drain(self, timeout_s: float) -> None:
        """Shutdown's handler phase: tell every attempt it is cancelled, wait up to
        ``timeout_s`` seconds for the handlers, cancel the ones still running (their attempts
        given back; a ``def`` handler's only once its thread has finished), then wait, bounded
        (``shutdown.wait_bounded``), for the attempts still ending."""
        for ctx in self.in_flight.values():
            ctx.cancel_flag()
        pending = dict(self.tasks)
        if not pending:
            return
        _, still = await asyncio.wait(pending.values(), timeout=timeout_s)
        given_back = []
        for key, task in pending.items():
            job_id, _ = key
            attempt = self.in_flight.get(key)
            # A handler that returned is finalizing: let it finish, never cancel it.
            if task in still and (attempt is None or not attempt.returned):
                task.cancel()
                thread = attempt.thread if attempt is not None else None
                if thread is None or not thread.running():
                    # (a running def thread's attempt is logged apart: kept, not given back)
                    given_back.append(job_id)
        if given_back:
            log.warning(
                "drain timeout (%g s) passed: %d handler(s) still running were "
                "cancelled and their attempts given back to available: job ids %s",
                timeout_s,
                len(given_back),
                first(sorted(given_back)),
                extra={"released": len(given_back), "released_job_ids": sorted(given_back)},
            )
        if still:
            await wait_bounded(still, pending)
