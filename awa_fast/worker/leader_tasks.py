"""The runtime's own tasks for the maintenance leader (``Maintenance``'s extra tasks, with the
reconciler, ``Runtime.reconcile``): periodic fires and the batch-operation runner, each in a
leader-fenced transaction; and the ``rescued`` follow-up specs of jobs the leader's rescue
took over."""

from __future__ import annotations

import logging
from typing import Any

from awa_fast import batch_ops, bulk, periodic
from awa_fast.repo.jobs import JobRepo
from awa_fast.repo.maintenance import Rescued
from awa_fast.worker.cancellation import raise_if_cancelling
from awa_fast.worker.finalizer import Finalizer
from awa_fast.worker.services import Services

log = logging.getLogger("awa_fast.runtime")

BATCH_RUNNER_S = 0.2  # the leader's batch-operation runner: one step (a chunk) per interval


class LeaderTasks:
    """What the runtime adds to its maintenance leader's passes.

    Args:
        services: the process's services (pool, periodic schedules, specs, settler).
        instance: this process's presence instance (the batch runner's claim on an operation).
    """

    def __init__(self, services: Services, instance: str):
        self.services = services
        self.instance = instance
        self.finalizer: Finalizer | None = None  # set when the runtime builds its parts
        # schedules the cron pass cannot evaluate or fire, warned about once (periodic.evaluate)
        self.cron_problems = bulk.Recurring()

    async def sync_periodic(self) -> None:
        """Upsert the client's registered periodic schedules into awa_fast.cron_jobs."""
        jobs = list(self.services.periodic_jobs.values())
        if jobs:
            async with (await self.services.pool()).connection() as conn:
                await periodic.sync_schedules(conn, jobs)

    async def run_batch_operations(self, fenced: Any) -> int:
        """One step of the batch-operation runner (``batch_ops.run_once``) in a leader-fenced
        transaction (``fenced``: ``Maintenance.fenced``)."""
        try:
            async with fenced() as conn:
                return await batch_ops.run_once(conn, self.instance)
        finally:
            raise_if_cancelling()

    async def evaluate_cron(self, fenced: Any = None) -> int:
        """Enqueue due periodic fires, in a leader-fenced transaction when ``fenced``
        (``Maintenance.fenced``) is given; how many were enqueued."""
        try:
            if fenced is None:
                async with (await self.services.pool()).connection() as conn:
                    return await periodic.evaluate(conn, self.cron_problems)
            async with fenced() as conn:
                return await periodic.evaluate(conn, self.cron_problems)
        finally:
            raise_if_cancelling()  # see worker/cancellation.py

    def settled_by_reconciler(self) -> list[str]:
        """Kinds whose final-attempt rescue waits in ``consequence_pending`` for the settler
        (``Settler.pending_kinds``)."""
        return self.services.settler.pending_kinds()

    async def on_rescued(self, rows: list[Rescued]) -> None:
        """Rescued specs of the jobs a rescue took: best effort, each in its own transaction
        after the rescue committed."""
        specs = self.services.specs
        wanted = [
            (row.id, row.kind, row.rescue_reason) for row in rows if specs.has(row.kind, "rescued")
        ]
        if not wanted:
            return
        finalizer = self.finalizer
        assert finalizer is not None  # set by the runtime's start()
        pool = await self.services.pool()
        for job_id, kind, reason in wanted:
            try:
                async with pool.connection() as conn:
                    job = await JobRepo(conn).get(job_id)
                if job is None:  # gone since (pruned, or moved to the DLQ)
                    log.warning(
                        "rescued follow-up spec of %s job %s: the job is gone", kind, job_id
                    )
                    continue
                requests = specs.requests(
                    kind, "rescued", job.args, job, job_id, job.metadata, reason
                )
                async with pool.connection() as conn:
                    async with conn.transaction():
                        await finalizer.insert_follow_ups(conn, kind, job_id, requests)
            except Exception:
                log.exception(
                    "rescued follow-up spec of %s job %s failed (best effort)", kind, job_id
                )
