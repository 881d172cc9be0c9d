"""Periodic schedules' statements (``sql.cron``, migration 003): register, scan, lock and
advance a schedule, list and delete them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from psycopg.rows import dict_row

from awa_fast import sql
from awa_fast.repo import Repo, named
from awa_fast.rows import one_row


class Schedule(NamedTuple):
    """A schedule locked for firing (``CRON_LOCK``), with the statement's time ``now``."""

    name: str
    cron_expr: str
    timezone: str
    kind: str
    queue: str
    args: Any
    priority: int
    max_attempts: int
    tags: list[str] | None
    metadata: Any
    missed_fire_policy: str
    last_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime
    now: datetime


class Candidate(NamedTuple):
    """A schedule as the unlocked scan sees it (``CRON_SCAN``): ``definition`` is its stored
    definition as text (tells an edited schedule from one already warned about)."""

    name: str
    cron_expr: str
    timezone: str
    last_fire_at: datetime | None
    created_at: datetime
    now: datetime
    definition: str


_SCHEDULE, _CANDIDATE = named(Schedule), named(Candidate)


class CronRepo(Repo):
    """Schedule statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction)."""

    async def now(self) -> datetime:
        """The statement's time on the server (every fire time is judged by it)."""
        value: datetime = (await one_row(await self.conn.execute(sql.CRON_NOW)))[0]
        return value

    async def upsert(self, params: dict[str, Any]) -> None:
        """Register a schedule (``PeriodicJob.params``; see ``sql.CRON_UPSERT``)."""
        await self.conn.execute(sql.CRON_UPSERT, params)

    async def scan(self) -> list[Candidate]:
        """Every schedule, by name, unlocked."""
        cur = self.conn.cursor(row_factory=_CANDIDATE)
        await cur.execute(sql.CRON_SCAN)
        rows: list[Candidate] = await cur.fetchall()
        return rows

    async def lock(self, name: str) -> Schedule | None:
        """Schedule ``name``, locked for this transaction; None if it is gone."""
        cur = self.conn.cursor(row_factory=_SCHEDULE)
        await cur.execute(sql.CRON_LOCK, (name,))
        row: Schedule | None = await cur.fetchone()
        return row

    async def advance(self, name: str, last_fire_at: datetime) -> None:
        """Record ``last_fire_at`` as the schedule's latest fire time enqueued."""
        await self.conn.execute(sql.CRON_ADVANCE, (last_fire_at, name))

    async def list_all(self) -> list[dict[str, Any]]:
        """Every schedule as a dict of ``sql.CRON_COLUMNS``, by name."""
        cur = self.conn.cursor(row_factory=dict_row)
        await cur.execute(sql.CRON_LIST)
        rows: list[dict[str, Any]] = await cur.fetchall()
        return rows

    async def delete(self, name: str) -> bool:
        """Delete schedule ``name``; True if there was one."""
        cur = await self.conn.execute(sql.CRON_DELETE, (name,))
        return bool(cur.rowcount > 0)
