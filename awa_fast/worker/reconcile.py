"""The reconciler tick (maintenance leader): ``verify_success`` and owed failure consequences."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager as AsyncContextManager
from typing import TYPE_CHECKING, Any

from awa_fast import sql
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
    ``config.verify_window_s`` seconds), correcting those it reports as not done, then retry
    every owed consequence that is due (corrections of this tick included), ``OWED_BATCH``
    at a time, oldest due first. A job whose settlement raises is backed off
    (``Settler.defer``: its next try pushed out, doubling), so jobs that fail every time
    never hold the batch.

    Every write is one transaction per job opened by ``fenced()`` (the leader's fence,
    ``Maintenance.fenced``; a plain pool transaction when ``None``). A verdict and its
    correction commit together. One job's failure is logged and never stops the others.

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
        cur = await conn.execute(sql.OWED_DUE, (OWED_BATCH,))
        ids = [r[0] for r in await cur.fetchall()]
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
    if not verifiers:
        return []
    async with pool.connection() as conn:
        cur = await conn.execute(
            sql.UNVERIFIED_COMPLETED, (list(verifiers), config.verify_window_s, VERIFY_BATCH)
        )
        rows = await cur.fetchall()
    corrected = []
    for row in rows:
        job = settler.applier.snapshot(row)
        try:
            verdict = verifiers[job.kind](job)
            if asyncio.iscoroutine(verdict):
                verdict = await verdict
        except asyncio.CancelledError:
            raise
        except BaseException:
            # unverified and is retried next tick
            log.exception("verify_success of %s job %s raised", job.kind, job.id)
            continue
        try:
            # The verdict and the correction commit together or not at all: a fault in between
            # leaves the job unverified, to be verified again next tick.
            async with fenced() as conn:
                cur = await conn.execute(sql.LOCK_UNVERIFIED, (job.id,))
                if await cur.fetchone() is None:
                    continue  # verified or changed meanwhile (another pass, an admin)
                await conn.execute(sql.MARK_VERIFIED, ([job.id],))
                if not verdict:
                    await settler.correct(conn, job.id, job.kind, job.attempt, NOT_DONE)
        except Deposed:
            raise
        except Exception:
            log.exception(
                "recording the verdict on %s job %s failed; it is verified again next tick",
                job.kind,
                job.id,
            )
            continue
        if not verdict:
            log.warning(
                "verify_success found %s job %s not done: corrected to failed", job.kind, job.id
            )
            corrected.append(job.id)
    return corrected
