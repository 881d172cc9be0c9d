"""The admin's bulk changes run row-isolated (``bulk.run_isolated``; their families are
registered in ``sql.isolated``): each an :class:`Operation` -- the bulk statement, the
candidates of its row-by-row redo, the one-row statement, and the rows they return."""

from __future__ import annotations

from typing import Any, NamedTuple

from psycopg.rows import BaseRowFactory

from awa_fast import sql
from awa_fast.repo import Repo, named
from awa_fast.repo.jobs import JOBS


class Changed(NamedTuple):
    """A row an operation changed that returns only its id."""

    id: int


class Operation(NamedTuple):
    """One bulk change: ``bulk`` (every matching row), ``ids`` (the candidates of the redo,
    by id), ``one`` (one candidate, ``%(id)s``); all three take the operation's parameters.
    ``rows``: what ``bulk`` and ``one`` return (``Job`` or :class:`Changed` rows)."""

    bulk: str
    ids: str
    one: str
    rows: BaseRowFactory[Any]


_CHANGED = named(Changed)

RETRY_FAILED = Operation(sql.RETRY_FAILED, sql.FAILED_IDS, sql.RETRY_FAILED_ONE, JOBS)
DISCARD_FAILED = Operation(
    sql.DISCARD_FAILED, sql.SETTLED_FAILED_IDS, sql.DISCARD_FAILED_ONE, _CHANGED
)
DRAIN_QUEUE = Operation(sql.DRAIN_QUEUE, sql.DRAINABLE_IDS, sql.DRAIN_ONE, _CHANGED)
DLQ_RETRY = Operation(sql.DLQ_RETRY_BULK, sql.DLQ_MATCHING_IDS, sql.DLQ_RETRY_ONE, JOBS)
DLQ_MOVE = Operation(sql.DLQ_MOVE_BULK, sql.SETTLED_FAILED_IDS, sql.DLQ_MOVE_ONE, _CHANGED)
DLQ_PURGE = Operation(sql.DLQ_PURGE, sql.DLQ_MATCHING_IDS, sql.DLQ_PURGE_MATCHING_ONE, _CHANGED)


class IsolatedRepo(Repo):
    """``operation`` with ``params`` on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction): the three steps ``bulk.run_isolated`` takes."""

    __slots__ = ("operation", "params")

    def __init__(self, conn: Any, operation: Operation, params: dict[str, Any]) -> None:
        super().__init__(conn)
        self.operation = operation
        self.params = params

    async def bulk(self) -> list[Any]:
        """Every matching row changed (one statement)."""
        return await self._all(self.operation.rows, self.operation.bulk, self.params)

    async def ids(self) -> list[int]:
        """The ids of the matching rows, in id order."""
        cur = await self.conn.execute(self.operation.ids, self.params)
        return [job_id for (job_id,) in await cur.fetchall()]

    async def one(self, job_id: int) -> list[Any]:
        """Row ``job_id`` changed if it still matches (one statement)."""
        params = {**self.params, "id": job_id}
        return await self._all(self.operation.rows, self.operation.one, params)
