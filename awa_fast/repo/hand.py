"""The statements :class:`~awa_fast.testing.AwaTestClient` drives one job with by hand: claim
one job of a kind (``sql.CLAIM_ONE_OF_KIND``, the runtime's claim for a single row), read it
back as awa's ``testing.JobRow`` columns, and empty the tables."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from psycopg.rows import dict_row

from awa_fast import sql
from awa_fast.repo import Repo, named


class Claimed(NamedTuple):
    """A claimed job, in the claim's columns (the tuple ``JobContext`` is built from):
    ``errors`` and ``metadata`` as JSON text, decoded by the context when read."""

    id: int
    kind: str
    queue: str
    args: Any
    priority: int
    attempt: int
    max_attempts: int
    run_at: datetime
    deadline_at: datetime | None
    created_at: datetime
    errors: str
    metadata: str
    tags: list[str]
    run_lease: int
    progress: Any


_CLAIMED = named(Claimed)


class HandRepo(Repo):
    """By-hand statements on ``conn`` (a psycopg ``AsyncConnection``; autocommit: each its
    own transaction)."""

    __slots__ = ()

    async def claim(self, queue: str, kind: str) -> Claimed | None:
        """Claim the next available job of ``kind`` in ``queue`` (its run lease bumped), or
        ``None``."""
        return await self._one(_CLAIMED, sql.CLAIM_ONE_OF_KIND, {"queue": queue, "kind": kind})

    async def job_row(self, job_id: int) -> dict[str, Any] | None:
        """Job ``job_id`` (live or finished) as a dict of ``sql.TESTING_JOB_ROW``'s columns, or
        ``None`` (it was dead-lettered)."""
        return await self._one(dict_row, sql.TESTING_JOB_ROW, (job_id,))

    async def clean(self) -> None:
        """Delete every job, queue setting, DLQ entry, schedule, descriptor and batch
        operation (``sql.CLEAN``, TRUNCATE)."""
        await self.conn.execute(sql.CLEAN)
