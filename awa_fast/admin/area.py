"""What every admin area has: :class:`Area`, its connection source and the row-isolated bulk
change (``bulk.run_isolated`` over an ``IsolatedRepo`` operation) several areas run."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from awa_fast import bulk, enqueue
from awa_fast.connections import Connections
from awa_fast.job import Job
from awa_fast.repo.isolated import IsolatedRepo, Operation
from awa_fast.repo.jobs import JobRepo

log = logging.getLogger("awa_fast.admin")


class Area:
    """An admin area over ``db``, the connection source (the client's pool, opened on first
    use); an area runs its statements through the repositories of :mod:`awa_fast.repo` on a
    connection of it, and never holds the client.

    Args:
        db: the connection source.
    """

    def __init__(self, db: Connections) -> None:
        self._db = db

    async def _isolated(
        self,
        what: str,
        operation: Operation,
        params: dict[str, Any],
        wakes: Callable[[Job], bool] | None = None,
    ) -> list[Any]:
        """One transaction: ``operation``'s bulk statement, or -- where a row fails it -- its
        one-row statement for each candidate (:func:`awa_fast.bulk.run_isolated`); a row that
        fails alone is left unchanged and logged (``what`` names the operation; a unique
        collision names the holder). With ``wakes`` (an operation returning jobs), the queues
        of the jobs it accepts are woken. Returns the rows changed.

        Raises:
            DeadlockError: kept deadlocking with concurrent writers after bounded retries of
                the whole transaction (nothing changed).
        """

        async def once() -> list[Any]:
            async with self._db.connection() as conn:
                repo = IsolatedRepo(conn, operation, params)

                async def held(job_id: int, exc: Exception) -> None:
                    conflict = await enqueue.holder_conflict(conn, job_id, what, exc)
                    log.warning("%s: %s", what, conflict)

                async with conn.transaction():
                    done = await bulk.run_isolated(
                        conn,
                        what=what,
                        bulk=repo.bulk,
                        keys=repo.ids,
                        one=repo.one,
                        on_conflict=held,
                    )
                    if wakes is not None:
                        jobs = JobRepo(conn)
                        for queue in sorted({job.queue for job in done.rows if wakes(job)}):
                            await jobs.wake(queue)
                return done.rows

        return await bulk.retry_deadlocks(once, what=what)
