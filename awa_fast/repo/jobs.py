"""Whole-job reads by id and the wake-up of a queue: the statements several concerns share."""

from __future__ import annotations

from typing import Any

from awa_fast import sql
from awa_fast.job import Job


class JobRepo:
    """Job reads on ``conn`` (a psycopg ``AsyncConnection``; the caller's transaction)."""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def get(self, job_id: int) -> Job | None:
        """The job, live or finished (``awa_fast.jobs_all``); ``None`` if there is none."""
        cur = await self.conn.execute(sql.GET_JOB, (job_id,))
        row = await cur.fetchone()
        return None if row is None else Job.from_row(row)

    async def wake(self, queue: str) -> None:
        """NOTIFY the queue's workers now (in the caller's transaction: sent at its commit)."""
        await self.conn.execute(sql.NOTIFY_QUEUE, (queue,))

    async def wake_all(self, queues: list[str]) -> None:
        """NOTIFY each of ``queues`` (jobs committed without their own NOTIFY), with
        ``synchronous_commit`` off for the transaction: on an autocommit connection the
        statement is its own, which then holds the notify lock only for moments (ADR 018)."""
        await self.conn.execute(sql.WAKE_QUEUES, (queues,))
