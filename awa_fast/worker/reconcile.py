"""The reconciler tick (maintenance leader): ``verify_success`` and owed failure consequences."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager as AsyncContextManager
from typing import TYPE_CHECKING, Any

from awa_fast.repo.consequences import ConsequenceRepo
from awa_fast.repo.verify import VerifyRepo
from awa_fast.worker.maintenance import Deposed, MaintenanceConfig
from awa_fast.worker.services import ReconcileServices

if TYPE_CHECKING:
    from awa_fast.worker.consequences import Settler

log = logging.getLogger("awa_fast.reconcile")

OWED_BATCH = 100
VERIFY_BATCH = 100
NOT_DONE = "verify_success: the job's work was found not done"


async def reconcile_tick(
    services: ReconcileServices,
    config: MaintenanceConfig,
    fenced: Callable[[], AsyncContextManager] | None = None,
) -> dict:
    """Run each kind's ``verify_success`` hook once on its recently completed jobs (within
    ``config.verify_window_s`` seconds), ``VERIFY_BATCH`` (100) a tick, lowest id first,
    correcting those it reports as not done, then retry
    every owed consequence that is due (corrections of this tick included), ``OWED_BATCH``
    at a time, oldest due first. A job whose settlement raises is backed off
    (``Settler.defer``: its next try pushed out, doubling), so jobs that fail every time
    never hold the batch.

    The jobs to verify are read from ``awa_fast.verify_due`` (migration 020), which each
    completion of a kind in ``awa_fast.verifier_kinds`` writes; the tick first makes that table
    this process's verifier kinds and, for a kind it adds, lists the window's completed jobs
    from the slices at once and again once every transaction older than the change has ended
    (ADR 019). A completed job whose handler still runs
    (its "still running" mark) is listed when the mark is cleared and it leaves the hot table.

    Every write is one transaction per job opened by ``fenced()`` (the leader's fence,
    ``Maintenance.fenced``; a plain pool transaction when ``None``), plus one that keeps the
    list (two while a kind's change settles) and one that drops listings of jobs gone from
    their slice. A verdict and its correction commit together. One job's failure is logged
    and never stops the others. Each hook call is bounded by the consequence timeout
    (``consequence_timeout_ms``); one that takes longer counts as raising (logged, its job
    backed off). A ``def`` hook runs in a thread.

    ``services``: connections, ``registry.verifiers`` and the settler
    (:class:`~awa_fast.worker.services.ReconcileServices`).

    Returns ``{"reconciled": {job_id: result}, "corrected": [job_id, ...]}``.
    """
    settler = services.settler
    pool = await services.pool()
    if fenced is None:
        fenced = _plain_transaction(pool)
    corrected = await _verify(services, pool, config, fenced)
    async with pool.connection() as conn:
        ids = await ConsequenceRepo(conn).owed_due(OWED_BATCH)
    reconciled = {}
    for job_id in ids:
        try:
            async with fenced() as conn:
                reconciled[job_id] = await settler.reconcile_on(conn, job_id)
        except Deposed:  # no longer leader: the whole tick stops
            raise
        except Exception as exc:  # one bad job must not stop the others
            log.exception("reconciling job %s failed; its next try is backed off", job_id)
            await _defer(settler, fenced, job_id, exc)
    return {"reconciled": reconciled, "corrected": corrected}


async def _defer(settler: Settler, fenced: Callable, job_id: int, exc: Exception) -> None:
    # A job that fails the same way every time would keep its place at the front of OWED_DUE
    # and, with OWED_BATCH others like it, stall the sweep: push its next try out instead.
    try:
        async with fenced() as conn:
            await settler.defer(conn, job_id, f"reconcile failed: {type(exc).__qualname__}: {exc}")
    except Deposed:
        raise
    except Exception:  # it stays due; logged, the other jobs proceed
        log.exception("backing off owed job %s failed", job_id)


async def _keep_the_due_list(fenced: Callable, kinds: list[str], window_s: float) -> None:
    """Keep ``verify_due`` listing exactly the completions of this leader's verifier ``kinds``
    within ``window_s`` (migration 020, ADR 019): make ``verifier_kinds`` those kinds, list
    the window's completed jobs of a kind it adds from the slices, forget a dropped kind's
    listings, and do both once more when every transaction older than the change has ended (a
    completion that looked at the kinds before the change may commit after it). Then drop
    listings past the window."""
    async with fenced() as conn:
        repo = VerifyRepo(conn)
        changes = await repo.sync_kinds(kinds, window_s)
        if changes.added:
            await repo.list_from_slices(changes.added, window_s)
        if changes.dropped:
            await repo.forget_kinds(changes.dropped)
        await repo.expire(window_s)
    if not (changes.added or changes.dropped or changes.unsettled):
        return  # the usual tick: nothing waits to settle
    async with fenced() as conn:  # a snapshot taken after the change above committed
        repo = VerifyRepo(conn)
        await repo.mark_changes()
        settled = await repo.settled_changes()
        adding = [s.kind for s in settled if s.state == "adding"]
        gone = [s.kind for s in settled if s.state == "dropping"]
        if adding:
            await repo.list_from_slices(adding, window_s)
            await repo.activate(adding)
        if gone:
            await repo.forget_kinds(gone)
            await repo.drop(gone)


async def _defer_due(fenced: Callable, job_id: int) -> None:
    try:
        async with fenced() as conn:
            await VerifyRepo(conn).defer(job_id)
    except Deposed:
        raise
    except Exception:  # it stays due now; logged, the other jobs proceed
        log.exception("backing off the verification of job %s failed", job_id)


async def _call_hook(hook: Callable, job: Any, timeout_s: float) -> Any:
    """``hook(job)`` bounded by ``timeout_s`` seconds (raises ``TimeoutError``): a hook that
    never returns must not freeze the leader's reconcile loop. A ``def`` hook runs in a thread
    so a blocking call (HTTP) never stalls the event loop; a thread still running at the
    timeout is left to finish on its own (it cannot be interrupted)."""
    async with asyncio.timeout(timeout_s):
        if inspect.iscoroutinefunction(hook):
            return await hook(job)
        verdict = await _in_thread(hook, job)
        if inspect.isawaitable(verdict):  # a plain callable returning a coroutine
            verdict = await verdict
        return verdict


def _in_thread(fn: Callable, arg: Any) -> asyncio.Future:
    # A daemon thread, not the default executor: a hook blocked for good must not hold the
    # process's exit (asyncio.run and interpreter exit join executor threads).
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if future.done():  # timed out meanwhile
            return
        if isinstance(exc, StopIteration):  # a future refuses it (asyncio raises TypeError)
            future.set_exception(RuntimeError(f"verify_success raised {exc!r}"))
        elif exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, exc = fn(arg), None
        except BaseException as e:  # carried to the awaiting task, as a raising async hook
            result, exc = None, e
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=run, name="awa-fast-verify", daemon=True).start()
    return future


def _plain_transaction(pool: Any) -> Callable[[], AsyncContextManager]:
    @contextlib.asynccontextmanager
    async def transaction():
        async with pool.connection() as conn:
            async with conn.transaction():
                yield conn

    return transaction


async def _verify(
    services: ReconcileServices, pool: Any, config: MaintenanceConfig, fenced: Callable
) -> list[int]:
    verifiers = services.registry.verifiers
    settler = services.settler
    kinds = sorted(verifiers)
    window_s = config.verify_window_s
    await _keep_the_due_list(fenced, kinds, window_s)
    if not kinds:
        return []
    async with pool.connection() as conn:
        repo = VerifyRepo(conn)
        due = await repo.due(kinds, window_s, VERIFY_BATCH)
        if not due:
            return []
        jobs = [settler.applier.snapshot(row) for row in await repo.jobs([d.job_id for d in due])]
    found = {job.id for job in jobs}
    gone = [d for d in due if d.job_id not in found]
    if gone:
        async with fenced() as conn:
            await VerifyRepo(conn).forget(gone)
    corrected = []
    for job in jobs:
        try:
            verdict = await _call_hook(verifiers[job.kind], job, settler.applier.config.timeout_s)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            log.error(
                "verify_success of %s job %s took over %s s (consequence_timeout_ms): "
                "counted as failed",
                job.kind,
                job.id,
                settler.applier.config.timeout_s,
            )
            await _defer_due(fenced, job.id)
            continue
        except BaseException:
            # unverified: tried again after a back-off, so it never holds the batch
            log.exception("verify_success of %s job %s raised", job.kind, job.id)
            await _defer_due(fenced, job.id)
            continue
        try:
            # The verdict and the correction commit together or not at all: a fault in between
            # leaves the job unverified, to be verified again after a back-off.
            async with fenced() as conn:
                repo = VerifyRepo(conn)
                if not await repo.lock_unverified(job.id):
                    continue  # verified or changed meanwhile (another pass, an admin)
                await repo.mark_verified(job.id)
                if not verdict:
                    await settler.correct(conn, job.id, job.kind, job.attempt, NOT_DONE)
        except Deposed:
            raise
        except Exception:
            # ... backed off like a raising hook: one that fails every time must neither run
            # the hook every tick nor hold the batch
            log.exception(
                "recording the verdict on %s job %s failed; it is verified again after a back-off",
                job.kind,
                job.id,
            )
            await _defer_due(fenced, job.id)
            continue
        if not verdict:
            log.warning(
                "verify_success found %s job %s not done: corrected to failed", job.kind, job.id
            )
            corrected.append(job.id)
    return corrected
