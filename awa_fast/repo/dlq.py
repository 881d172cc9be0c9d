"""The dead-letter queue's admin statements (``sql.dlq``, ADR-020): list, read, count, retry,
move, purge and dump entries. (Dead-lettering a failing job is the failure path's:
``ConsequenceRepo``.)"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from awa_fast import sql
from awa_fast.job import JOB_FIELDS, Job
from awa_fast.repo import Repo, shaped
from awa_fast.repo.jobs import JOBS


class DeadLettered(NamedTuple):
    """A DLQ row (``sql.DLQ_COLUMNS``): the job, why and when it was dead-lettered, and the
    run lease of its last attempt."""

    job: Job
    reason: str
    dlq_at: datetime
    original_run_lease: int


_N = len(JOB_FIELDS)


def _dead_lettered(values: Any) -> DeadLettered:
    return DeadLettered(Job.from_row(values), values[_N], values[_N + 1], values[_N + 2])


_DEAD_LETTERED = shaped(
    (*JOB_FIELDS, "dlq_reason", "dlq_at", "original_run_lease"), _dead_lettered, "DeadLettered"
)


class DlqRepo(Repo):
    """DLQ statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's transaction).
    ``match`` arguments are the entries filter's parameters: ``kind``, ``queue``, ``tag``,
    ``before_id``, ``before_dlq_at`` (``None``: any)."""

    async def newest(self, match: dict[str, Any], limit: int) -> list[DeadLettered]:
        """Up to ``limit`` matching entries, newest first (``dlq_at``, then id)."""
        return await self._all(_DEAD_LETTERED, sql.DLQ_LIST, {**match, "limit": limit})

    async def get(self, job_id: int) -> DeadLettered | None:
        """The entry of job ``job_id``, or ``None``."""
        return await self._one(_DEAD_LETTERED, sql.DLQ_GET, (job_id,))

    async def depth(self, queue: str | None) -> int:
        """Entries of ``queue`` (``None``: of every queue)."""
        value: int = await self._value(sql.DLQ_DEPTH, {"queue": queue})
        return value

    async def depth_by_queue(self) -> dict[str, int]:
        """``{queue: entries}`` for every queue with at least one."""
        cur = await self.conn.execute(sql.DLQ_DEPTH_BY_QUEUE)
        return {queue: n for queue, n in await cur.fetchall()}

    async def retry(self, params: dict[str, Any]) -> Job | None:
        """Entry ``params["id"]`` back in the hot table (``sql.DLQ_RETRY``: ``run_at``,
        ``priority``, ``to_queue`` overrides, ``stale_ms``); ``None`` if it is not in the DLQ
        or its last attempt still runs. A unique violation passes through."""
        return await self._one(JOBS, sql.DLQ_RETRY, params)

    async def attempt_still_runs(self, job_id: int, stale_ms: int) -> datetime | None:
        """The heartbeat of the dead-lettered job's last attempt whose handler still runs, or
        ``None``."""
        params = {"id": job_id, "stale_ms": stale_ms}
        value: datetime | None = await self._value(sql.DLQ_ATTEMPT_STILL_RUNS, params)
        return value

    async def move(self, job_id: int, reason: str) -> bool:
        """Move failed job ``job_id`` (settled: no consequence owed) to the DLQ; True if it
        moved."""
        params = {"id": job_id, "reason": reason, "kind": None, "queue": None}
        cur = await self.conn.execute(sql.DLQ_MOVE_ONE, params)
        return bool(cur.rowcount > 0)

    async def purge(self, job_id: int) -> bool:
        """Delete the entry of job ``job_id``; True if there was one."""
        cur = await self.conn.execute(sql.DLQ_PURGE_ONE, (job_id,))
        return bool(cur.rowcount > 0)

    async def dump(self, job_id: int) -> dict[str, Any] | None:
        """Every column of the entry as a JSON object, or ``None``."""
        value: dict[str, Any] | None = await self._value(sql.DUMP_DLQ_JOB, (job_id,))
        return value
