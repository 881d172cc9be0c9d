"""The dashboard's reads (``sql.dashboard``, ADR 008): bounded statements whose rows are dicts
(the pages' templates read them by column name, whole rows included: ``JOB_DETAIL`` is every
column). Each read runs in a transaction of its own with a statement timeout
(:meth:`DashboardRepo.limit_statement_time`, ``SET LOCAL``: never the session's, which through a
transaction pooler would stay on a server connection another client gets next)."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from awa_fast.repo import Repo
from awa_fast.sql import dashboard as q

Row = dict[str, Any]


class DashboardRepo(Repo):
    """Dashboard statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction, one per read: see the module). Every row is a dict of the statement's
    columns."""

    __slots__ = ()

    async def limit_statement_time(self) -> None:
        """``statement_timeout`` = ``sql.dashboard.STATEMENT_TIMEOUT_MS`` for the rest of the
        caller's transaction."""
        await self.conn.execute(q.SET_STATEMENT_TIMEOUT)

    async def _rows(self, statement: str, params: dict[str, Any] | None = None) -> list[Row]:
        return await self._all(dict_row, statement, params)

    async def _aggregate(self, statement: str) -> Row:
        # an aggregate returns exactly one row
        row = await self._one(dict_row, statement)
        if row is None:
            raise LookupError(f"an aggregate returned no row: {statement.strip()[:60]!r}")
        return row

    async def id_bounds(self) -> Row:
        """``{"min", "max"}``: the oldest and newest job id (``None`` without jobs)."""
        return await self._aggregate(q.ID_BOUNDS)

    async def queue_depth(self) -> list[Row]:
        """``{"queue", "state", "n", "oldest"}`` per queue and live state with jobs."""
        return await self._rows(q.QUEUE_DEPTH)

    async def queue_recent(self, floor: int) -> list[Row]:
        """Per queue, the outcomes among job ids >= ``floor``."""
        return await self._rows(q.QUEUE_RECENT, {"floor": floor})

    async def queue_meta(self) -> list[Row]:
        """Every queue's settings row (paused, by whom and when; DLQ)."""
        return await self._rows(q.QUEUE_META)

    async def job_page(self, filters: dict[str, Any], before: int, floor: int) -> list[Row]:
        """Up to ``PAGE_ROWS`` jobs with ids in ``[floor, before)`` matching ``filters``
        (``queue``, ``kind``, ``state``; ``None``: any), newest first."""
        params = {**filters, "before": before, "floor": floor, "limit": q.PAGE_ROWS}
        return await self._rows(q.JOB_PAGE, params)

    async def job(self, job_id: int) -> Row | None:
        """Every column of job ``job_id`` (live or finished, ``in_dlq`` false), or ``None``."""
        return await self._one(dict_row, q.JOB_DETAIL, {"id": job_id})

    async def dlq_job(self, job_id: int) -> Row | None:
        """Every column of the DLQ entry of ``job_id`` (``in_dlq`` true), or ``None``."""
        return await self._one(dict_row, q.DLQ_DETAIL, {"id": job_id})

    async def job_summary(self, job_id: int) -> Row | None:
        """The id, kind, queue, state and ``in_dlq`` of job ``job_id``, or ``None``."""
        return await self._one(dict_row, q.JOB_SUMMARY, {"id": job_id})

    async def job_children(self, job_id: int) -> list[Row]:
        """Up to ``CHILD_ROWS`` follow-ups job ``job_id`` staged."""
        return await self._rows(q.JOB_CHILDREN, {"id": job_id, "limit": q.CHILD_ROWS})

    async def dlq_page(self, queue: str | None, kind: str | None, before: int) -> list[Row]:
        """Up to ``PAGE_ROWS`` DLQ entries with ids below ``before``, newest first."""
        params = {"queue": queue, "kind": kind, "before": before, "limit": q.PAGE_ROWS}
        return await self._rows(q.DLQ_PAGE, params)

    async def consequence_counts(self) -> Row:
        """``{"owed", "overdue"}``: consequences owed, and how many are overdue."""
        return await self._aggregate(q.CONSEQUENCE_COUNTS)

    async def consequences_owed(self) -> list[Row]:
        """The first ``OWED_ROWS`` owed consequences, oldest retry first."""
        return await self._rows(q.CONSEQUENCES_OWED, {"limit": q.OWED_ROWS})

    async def consequences_applied(self, floor: int) -> list[Row]:
        """Up to ``PAGE_ROWS`` applied consequences among job ids >= ``floor``."""
        return await self._rows(q.CONSEQUENCES_APPLIED, {"floor": floor, "limit": q.PAGE_ROWS})

    async def leader(self, lock_key: int) -> Row | None:
        """The backend holding the leader lock ``lock_key``, or ``None``."""
        return await self._one(dict_row, q.LEADER, {"key": lock_key})

    async def leader_lease(self) -> Row | None:
        """The leader lease row, or ``None``."""
        return await self._one(dict_row, q.LEADER_LEASE)

    async def presence(self) -> list[Row]:
        """The live processes' presence rows (at most ``PRESENCE_ROWS``)."""
        return await self._rows(q.PRESENCE, {"limit": q.PRESENCE_ROWS})

    async def connections(self) -> list[Row]:
        """Client connections to this database, per application."""
        return await self._rows(q.CONNECTIONS)

    async def running_count(self) -> int:
        """Attempts running now."""
        count: int = (await self._aggregate(q.RUNNING_COUNT))["count"]
        return count

    async def running(self) -> list[Row]:
        """The running attempts (at most ``RUNNING_ROWS``)."""
        return await self._rows(q.RUNNING, {"limit": q.RUNNING_ROWS})
