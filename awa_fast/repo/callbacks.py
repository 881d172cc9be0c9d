"""The external-wait statements (``sql.callbacks``, ADR-021) that the client-side callback
operations run (``awa_fast/callbacks.py``): lock a job by its callback, complete, retry, resume
or heartbeat it, read its CEL expressions."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from awa_fast import sql
from awa_fast.job import Job
from awa_fast.repo import Repo, named
from awa_fast.repo.consequences import LockedJob
from awa_fast.rows import one_row

_LOCKED = named(LockedJob)


class StillRunning(NamedTuple):
    """A job whose handler still waits on its callback (``wait_for_callback``)."""

    id: int
    heartbeat_at: datetime | None


_STILL_RUNNING = named(StillRunning)


class CallbackRepo(Repo):
    """Callback statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction). ``cid``: a callback id."""

    async def _job(self, statement: str, params: Any) -> Job | None:
        cur = await self.conn.execute(statement, params)
        row = await cur.fetchone()
        return None if row is None else Job.from_row(row)

    async def lock(self, cid: uuid.UUID) -> LockedJob | None:
        """The job waiting on ``cid`` (``waiting_external``, or ``running``: an early
        callback), locked; else ``None``."""
        cur = self.conn.cursor(row_factory=_LOCKED)
        await cur.execute(sql.LOCK_BY_CALLBACK, (cid,))
        row: LockedJob | None = await cur.fetchone()
        return row

    async def expressions(self, job_id: int, cid: uuid.UUID) -> dict[str, Any] | None:
        """The CEL expressions registered with ``cid`` (read under :meth:`lock`'s lock)."""
        cur = await self.conn.execute(sql.CALLBACK_EXPRESSIONS, (job_id, cid))
        row = await cur.fetchone()
        return None if row is None else row[0]

    async def complete(self, job_id: int) -> Job | None:
        """Complete the locked job, under a savepoint; ``None`` (rolled back) when another
        job holds the unique key the completed job would hold
        (:meth:`complete_as_duplicate`)."""
        try:
            async with self.conn.transaction():
                return await self._job(sql.COMPLETE_EXTERNAL, (job_id,))
        except psycopg.errors.UniqueViolation:
            return None

    async def complete_as_duplicate(self, job_id: int) -> Job:
        """Cancel the locked job as a duplicate of the job that holds its key.

        Raises:
            LookupError: the job is gone (it is locked by the caller: a bug).
        """
        cur = await self.conn.execute(sql.COMPLETE_EXTERNAL_AS_DUPLICATE, (job_id,))
        return Job.from_row(await one_row(cur))

    async def retry(self, cid: uuid.UUID, stale_ms: int) -> Job | None:
        """Send the job parked on ``cid`` back to ``available`` (attempt 0) unless its handler
        may still run (a heartbeat newer than ``stale_ms``); ``None`` if no such job.

        Raises:
            psycopg.errors.UniqueViolation: the available job would take a key another job
                holds.
        """
        return await self._job(sql.RETRY_EXTERNAL, {"cid": cid, "stale_ms": stale_ms})

    async def still_running(self, cid: uuid.UUID, stale_ms: int) -> StillRunning | None:
        """The job on ``cid`` whose handler still waits for it, if any."""
        cur = self.conn.cursor(row_factory=_STILL_RUNNING)
        await cur.execute(sql.ATTEMPT_STILL_RUNS_BY_CALLBACK, {"cid": cid, "stale_ms": stale_ms})
        row: StillRunning | None = await cur.fetchone()
        return row

    async def job_id(self, cid: uuid.UUID) -> int | None:
        """The id of the live job holding ``cid``, if any."""
        cur = await self.conn.execute(sql.JOB_BY_CALLBACK, (cid,))
        row = await cur.fetchone()
        return None if row is None else int(row[0])

    async def resume(self, cid: uuid.UUID, payload_json: str) -> Job | None:
        """Resume the handler blocked on ``cid`` (``running`` again) with ``payload_json``
        (``{"_awa_callback_result": ...}`` as JSON text) merged into its metadata."""
        return await self._job(sql.RESUME_EXTERNAL, (payload_json, cid))

    async def heartbeat(self, cid: uuid.UUID, timeout_s: float) -> Job | None:
        """Push the callback's timeout to now + ``timeout_s`` seconds."""
        return await self._job(sql.HEARTBEAT_CALLBACK, (timeout_s, cid))
