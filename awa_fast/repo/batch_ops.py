"""awa's durable batch operations' statements (``sql.batch_ops``, migration 008, ADR-030):
preview, submit, read, cancel and purge operations; the leader's runner steps."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, NamedTuple

from psycopg.rows import dict_row

from awa_fast import sql
from awa_fast.repo import Repo, named


class Eligible(NamedTuple):
    """A job an operation's filter selects (``BATCH_PREVIEW``), with how many are eligible
    in all."""

    total_matched: int
    id: int
    kind: str
    queue: str
    state: str
    priority: int


class NextOperation(NamedTuple):
    """The oldest active operation, locked for the runner (``BATCH_NEXT``)."""

    id: uuid.UUID
    op_kind: str
    filter: dict[str, Any]
    spec: dict[str, Any]
    state: str


class Applied(NamedTuple):
    """A job an operation changed (``BATCH_APPLY``): its queue and state afterwards."""

    id: int
    queue: str
    state: str


_ELIGIBLE, _NEXT, _APPLIED = named(Eligible), named(NextOperation), named(Applied)


class BatchRepo(Repo):
    """Batch-operation statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction). An operation is returned as a dict of ``sql.BATCH_OPERATION_COLUMNS`` (a
    psycopg dict row: awa's ``BatchOperation`` is a dict)."""

    async def _operation(self, statement: str, params: Any) -> dict[str, Any] | None:
        cur = self.conn.cursor(row_factory=dict_row)
        await cur.execute(statement, params)
        row: dict[str, Any] | None = await cur.fetchone()
        return row

    async def preview(self, match: dict[str, Any], sample: int) -> list[Eligible]:
        """The first ``sample`` eligible jobs by id for filter parameters ``match``."""
        cur = self.conn.cursor(row_factory=_ELIGIBLE)
        await cur.execute(sql.BATCH_PREVIEW, {**match, "sample": sample})
        rows: list[Eligible] = await cur.fetchall()
        return rows

    async def submit(
        self, op_kind: str, filter_json: str, spec_json: str, submitted_by: str | None
    ) -> dict[str, Any] | None:
        """Store a ``pending`` operation (``submitted_by`` None: the session user)."""
        params = {
            "op_kind": op_kind,
            "filter": filter_json,
            "spec": spec_json,
            "submitted_by": submitted_by,
        }
        return await self._operation(sql.BATCH_SUBMIT, params)

    async def get(self, operation_id: uuid.UUID) -> dict[str, Any] | None:
        return await self._operation(sql.BATCH_GET, (operation_id,))

    async def list_all(self, state: str | None, limit: int) -> list[dict[str, Any]]:
        """Operations, newest first, in ``state`` (None: any)."""
        cur = self.conn.cursor(row_factory=dict_row)
        await cur.execute(sql.BATCH_LIST, {"state": state, "limit": limit})
        rows: list[dict[str, Any]] = await cur.fetchall()
        return rows

    async def cancel(self, operation_id: uuid.UUID, retention_s: float) -> dict[str, Any] | None:
        """Mark an unfinished operation ``cancelling``; None if there is none by that id."""
        params = {"id": operation_id, "retention_s": retention_s}
        return await self._operation(sql.BATCH_CANCEL, params)

    async def purge(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` operations finalized before ``before``; how many."""
        cur = await self.conn.execute(sql.BATCH_PURGE, {"before": before, "limit": limit})
        return int(cur.rowcount)

    async def next(self) -> NextOperation | None:
        """The oldest active operation, locked (``SKIP LOCKED``: one runner at a time)."""
        cur = self.conn.cursor(row_factory=_NEXT)
        await cur.execute(sql.BATCH_NEXT)
        row: NextOperation | None = await cur.fetchone()
        return row

    async def finalize(self, op: uuid.UUID, state: str, retention_s: float) -> None:
        """Finalize the operation as ``state``, kept ``retention_s`` seconds."""
        params = {"op": op, "state": state, "retention_s": retention_s}
        await self.conn.execute(sql.BATCH_FINALIZE, params)

    async def scan(self, op: uuid.UUID, match: dict[str, Any], runner: str) -> None:
        """Freeze the eligible job ids as the operation's items; it is ``running``."""
        await self.conn.execute(sql.BATCH_SCAN, {**match, "op": op, "runner": runner})

    async def pending_items(self, op: uuid.UUID, limit: int) -> list[int]:
        """Up to ``limit`` job ids of the operation not yet accounted, by id."""
        cur = await self.conn.execute(sql.BATCH_PENDING_ITEMS, {"op": op, "limit": limit})
        return [job_id for (job_id,) in await cur.fetchall()]

    async def apply(self, ids: list[int], change: dict[str, Any]) -> list[Applied]:
        """Apply ``change`` (``priority``, ``queue``: None keeps it) to the jobs of ``ids``
        still eligible."""
        cur = self.conn.cursor(row_factory=_APPLIED)
        await cur.execute(sql.BATCH_APPLY, {**change, "ids": ids})
        rows: list[Applied] = await cur.fetchall()
        return rows

    async def apply_one(self, job_id: int, change: dict[str, Any]) -> list[Applied]:
        """:meth:`apply` for one job (the row-by-row twin)."""
        cur = self.conn.cursor(row_factory=_APPLIED)
        await cur.execute(sql.BATCH_APPLY_ONE, {**change, "id": job_id})
        rows: list[Applied] = await cur.fetchall()
        return rows

    async def items_done(
        self, op: uuid.UUID, ids: list[int], done: list[int], failed: list[int], errors_json: str
    ) -> None:
        """Account items ``ids``: ``done`` processed, ``failed`` errored (``errors_json``: job
        id -> error text), the rest skipped."""
        params = {"op": op, "ids": ids, "done": done, "failed": failed, "errors": errors_json}
        await self.conn.execute(sql.BATCH_ITEMS_DONE, params)

    async def count(
        self,
        op: uuid.UUID,
        *,
        processed: int,
        errored: int,
        skipped: int,
        last_error: str | None,
        last_id: int,
    ) -> None:
        """Add a chunk's counts to the operation; ``last_id`` is its cursor."""
        params = {
            "op": op,
            "processed": processed,
            "errored": errored,
            "skipped": skipped,
            "last_error": last_error,
            "last_id": last_id,
        }
        await self.conn.execute(sql.BATCH_COUNTS, params)
