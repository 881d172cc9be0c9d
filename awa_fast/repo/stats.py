"""Counts over the live jobs that the metrics read (``sql.dashboard``'s bounded statements:
partial indexes, never the finished rows)."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from awa_fast.repo import Repo, named
from awa_fast.sql import dashboard as dsql


class QueueDepth(NamedTuple):
    """Jobs of one queue in one live state; ``oldest``: the earliest ``run_at`` of its
    available jobs (``None`` for the other states)."""

    queue: str
    state: str
    n: int
    oldest: datetime | None


class ConsequenceCounts(NamedTuple):
    """Jobs whose failure consequence is owed, and how many of them are overdue."""

    owed: int
    overdue: int


_DEPTH, _COUNTS = named(QueueDepth), named(ConsequenceCounts)


class StatsRepo(Repo):
    """Count statements on ``conn`` (a psycopg ``AsyncConnection``)."""

    async def queue_depth(self) -> list[QueueDepth]:
        """Per queue and live state, the jobs in it (states with none are absent)."""
        cur = self.conn.cursor(row_factory=_DEPTH)
        await cur.execute(dsql.QUEUE_DEPTH)
        rows: list[QueueDepth] = await cur.fetchall()
        return rows

    async def consequence_counts(self) -> ConsequenceCounts:
        """Owed and overdue consequences (an aggregate: always one row)."""
        cur = self.conn.cursor(row_factory=_COUNTS)
        await cur.execute(dsql.CONSEQUENCE_COUNTS)
        row: ConsequenceCounts | None = await cur.fetchone()
        return ConsequenceCounts(0, 0) if row is None else row
