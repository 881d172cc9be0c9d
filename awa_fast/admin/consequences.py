"""Failure-consequence admin: :class:`ConsequenceAdmin` -- correct an apparent success to a
failure, list the consequences owed. The settling rules are in
:mod:`awa_fast.worker.consequences`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from awa_fast.admin.area import Area
from awa_fast.connections import Connections
from awa_fast.errors import AwaError
from awa_fast.job import Job
from awa_fast.repo.consequences import ConsequenceRepo
from awa_fast.worker.consequences import Settler


class ConsequenceAdmin(Area):
    """``correct_to_failed`` and ``consequences_owed``, exposed as ``AsyncClient``'s methods
    of the same names (ADR 041).

    Args:
        db: the connection source.
        settler: returns the settler (records the correction, and applies its effect when
            this process knows it: ``Settler.correct_to_failed``).
        get_job: reads a job by id (raises ``JobNotFound``).
    """

    def __init__(
        self,
        db: Connections,
        settler: Callable[[], Settler],
        get_job: Callable[[int], Awaitable[Job]],
    ) -> None:
        super().__init__(db)
        self._settler = settler
        self._get_job = get_job

    async def correct_to_failed(self, job_id: int, *, error: str) -> Job:
        """Correct an apparent success: a ``completed`` job becomes ``failed`` (``error``
        appended) and, in the same transaction, its failure consequence is recorded as owed;
        it is applied right after (when this process knows the kind's consequence) and
        retried by the reconciler until it succeeds.

        Raises:
            JobNotFound: no job with that id.
            AwaError: the job is not ``completed``.
        """
        job = await self._get_job(job_id)
        settler = self._settler()
        pool = await self._db.pool()
        if not await settler.correct_to_failed(pool, job_id, job.kind, job.attempt, error):
            raise AwaError(f"job {job_id} is {job.state}, not completed: nothing to correct")
        return await self._get_job(job_id)

    async def consequences_owed(self, limit: int = 100) -> list[dict]:
        """Jobs whose failure consequence is owed (pending failures and corrections), with
        ``overdue`` true once an application failed or it waited over 60 s.
        """
        async with self._db.connection() as conn:
            rows = await ConsequenceRepo(conn).owed(limit)
        return [r._asdict() for r in rows]
