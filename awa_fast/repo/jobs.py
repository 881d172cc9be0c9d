"""Jobs by id: whole-job reads, the admin's single-job changes (retry, cancel) and dumps, and
the wake-up of a queue -- the statements several concerns share."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

import orjson
from psycopg.rows import BaseRowFactory

from awa_fast import sql
from awa_fast.job import JOB_FIELDS, Job
from awa_fast.repo import Repo, shaped

# Whole jobs: a statement returning ``sql.JOB_COLUMNS`` gives ``Job`` objects.
JOBS: BaseRowFactory[Job] = shaped(JOB_FIELDS, Job.from_row, "Job")


class Cancelled(NamedTuple):
    """A job ``CANCEL_JOB`` cancelled: its state and run lease before, and the job after."""

    old_state: str
    old_run_lease: int
    job: Job


def _cancelled(values: Any) -> Cancelled:
    return Cancelled(values[0], values[1], Job.from_row(values[2:]))


_CANCELLED = shaped(("old_state", "old_run_lease", *JOB_FIELDS), _cancelled, "Cancelled")


class JobRepo(Repo):
    """Job statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's transaction)."""

    async def get(self, job_id: int) -> Job | None:
        """The job, live or finished (``awa_fast.jobs_all``); ``None`` if there is none."""
        return await self._one(JOBS, sql.GET_JOB, (job_id,))

    async def newest(
        self, state: str | None, kind: str | None, queue: str | None, limit: int
    ) -> list[Job]:
        """Up to ``limit`` jobs, newest first, of ``state`` / ``kind`` / ``queue`` (``None``:
        any)."""
        params = {"state": state, "kind": kind, "queue": queue, "limit": limit}
        return await self._all(JOBS, sql.LIST_JOBS, params)

    async def retry(self, job_id: int, stale_ms: int) -> Job | None:
        """Job ``job_id`` made available with attempt 0 if it is failed, cancelled or parked,
        owes no consequence and its last attempt has ended (a heartbeat older than
        ``stale_ms`` counts as ended); ``None`` otherwise. A unique violation (its key taken
        meanwhile) passes through."""
        return await self._one(JOBS, sql.RETRY_JOB, {"id": job_id, "stale_ms": stale_ms})

    async def attempt_still_runs(self, job_id: int, stale_ms: int) -> datetime | None:
        """The heartbeat of job ``job_id``'s attempt whose handler still runs (a heartbeat
        newer than ``stale_ms``), or ``None``."""
        value: datetime | None = await self._value(
            sql.ATTEMPT_STILL_RUNS, {"id": job_id, "stale_ms": stale_ms}
        )
        return value

    async def cancel(self, job_id: int) -> Cancelled | None:
        """Cancel job ``job_id`` unless it is terminal or consequence_pending (then ``None``).
        A unique violation (its mask holds ``cancelled``, another job holds the key) passes
        through."""
        return await self._one(_CANCELLED, sql.CANCEL_JOB, (job_id,))

    async def tell_cancelled(self, job_id: int, run_lease: int) -> None:
        """NOTIFY the worker running attempt ``run_lease`` of job ``job_id`` that it is
        cancelled (sent at the caller's commit)."""
        payload = orjson.dumps({"job_id": job_id, "run_lease": run_lease}).decode()
        await self.conn.execute(sql.NOTIFY_CANCEL, (payload,))

    async def live_with_unique_key(self, key: bytes) -> int | None:
        """The oldest non-terminal job holding unique key ``key``, or ``None``."""
        value: int | None = await self._value(sql.CANCEL_BY_UNIQUE_KEY, (key,))
        return value

    async def failed_matching(self, kind: str | None, queue: str | None, stale_ms: int) -> int:
        """How many ``failed`` jobs of ``kind`` / ``queue`` ``retry_failed`` would consider."""
        params = {"kind": kind, "queue": queue, "stale_ms": stale_ms}
        value: int = await self._value(sql.FAILED_MATCHING, params)
        return value

    async def dump(self, job_id: int) -> dict[str, Any] | None:
        """Every column of job ``job_id`` (``jobs_all``) as a JSON object, or ``None``."""
        value: dict[str, Any] | None = await self._value(sql.DUMP_JOB, (job_id,))
        return value

    async def wake(self, queue: str) -> None:
        """NOTIFY the queue's workers now (in the caller's transaction: sent at its commit)."""
        await self.conn.execute(sql.NOTIFY_QUEUE, (queue,))

    async def wake_all(self, queues: list[str]) -> None:
        """NOTIFY each of ``queues`` (jobs committed without their own NOTIFY), with
        ``synchronous_commit`` off for the transaction: on an autocommit connection the
        statement is its own, which then holds the notify lock only for moments (ADR 018)."""
        await self.conn.execute(sql.WAKE_QUEUES, (queues,))
