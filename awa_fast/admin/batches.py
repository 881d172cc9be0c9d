"""Batch-operation admin (awa's ADR-030): :class:`BatchAdmin`, ``AsyncClient``'s batch-operation
methods over :mod:`awa_fast.batch_ops` (where the filter, statements and the leader's runner
are)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, cast

from awa_fast import batch_ops
from awa_fast.admin import paging
from awa_fast.admin.area import Area
from awa_fast.batch_ops import (
    BatchOperation,
    BatchOperationFilter,
    BatchOperationKind,
    BatchOperationPreview,
)
from awa_fast.errors import JobNotFound


def _filter(value: dict | None) -> BatchOperationFilter | None:
    # A plain dict is checked field by field by batch_ops.check_filter.
    return cast("BatchOperationFilter | None", value)


def _move_spec(queue: str, priority: int | None) -> dict:
    return {"queue": queue} if priority is None else {"queue": queue, "priority": priority}


class BatchAdmin(Area):
    """Preview, submit, list, get, cancel and purge batch operations (exposed as
    ``AsyncClient``'s methods of the same names, ADR 041). Raises ``ValidationError`` (naming
    the field) for a bad op kind, spec, filter or id; ``JobNotFound`` (get / cancel) for an
    unknown or finished one."""

    async def _on_connection(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        async with self._db.connection() as conn:
            return await fn(conn, *args)

    async def preview_batch_operation(
        self, op_kind: BatchOperationKind, *, spec: dict, filter: BatchOperationFilter | None = None
    ) -> BatchOperationPreview:
        """Count and sample the queued jobs an operation would change (no submission)."""
        return cast(
            BatchOperationPreview,
            await self._on_connection(batch_ops.preview, op_kind, spec, filter),
        )

    async def submit_batch_operation(
        self,
        op_kind: BatchOperationKind,
        *,
        spec: dict,
        filter: BatchOperationFilter | None = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        """Submit an operation for the maintenance leader to run; returns it (``pending``).
        ``submitted_by`` defaults to the database session user.
        """
        return cast(
            BatchOperation,
            await self._on_connection(
                batch_ops.submit, op_kind, spec, filter, submitted_by, allow_all
            ),
        )

    async def _submit(
        self,
        op_kind: BatchOperationKind,
        spec: dict,
        filter: dict | None,
        submitted_by: str | None,
        allow_all: bool,
    ) -> dict:
        found = await self._on_connection(
            batch_ops.submit, op_kind, spec, _filter(filter), submitted_by, allow_all
        )
        return dict(found)

    async def preview_set_priority(self, priority: int, *, filter: dict | None = None) -> dict:
        """:meth:`preview_batch_operation` of ``set_priority`` to ``priority`` (1-4)."""
        found = await self.preview_batch_operation(
            "set_priority", spec={"priority": priority}, filter=_filter(filter)
        )
        return dict(found)

    async def set_priority(
        self,
        priority: int,
        *,
        filter: dict | None = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> dict:
        """Submit ``set_priority`` (1-4) over the matched available / scheduled jobs."""
        spec = {"priority": priority}
        return await self._submit("set_priority", spec, filter, submitted_by, allow_all)

    async def preview_move_queue(
        self, queue: str, *, priority: int | None = None, filter: dict | None = None
    ) -> dict:
        """:meth:`preview_batch_operation` of ``move_queue`` to ``queue`` (and ``priority``)."""
        found = await self.preview_batch_operation(
            "move_queue", spec=_move_spec(queue, priority), filter=_filter(filter)
        )
        return dict(found)

    async def move_queue(
        self,
        queue: str,
        *,
        priority: int | None = None,
        filter: dict | None = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> dict:
        """Submit ``move_queue`` (optionally with a new priority) over the matched jobs."""
        spec = _move_spec(queue, priority)
        return await self._submit("move_queue", spec, filter, submitted_by, allow_all)

    async def list_batch_operations(
        self, *, state: str | None = None, limit: int = 100
    ) -> list[dict]:
        """Operations, newest first (``state`` filters).

        Raises:
            ValidationError: ``limit`` is out of range (1..2**63-1).
        """
        limit = paging.positive(limit, "limit")
        return await self._on_connection(batch_ops.list_all, state, limit)

    async def get_batch_operation(self, operation_id: str) -> dict:
        """One operation.

        Raises:
            JobNotFound: no such operation.
        """
        found = await self._on_connection(batch_ops.get, operation_id)
        if found is None:
            raise JobNotFound(f"no batch operation {operation_id}")
        return found

    async def cancel_batch_operation(self, operation_id: str) -> dict:
        """Cancel a pending operation, or ask the runner to stop an active one.

        Raises:
            JobNotFound: no such active operation.
        """
        found = await self._on_connection(batch_ops.cancel, operation_id)
        if found is None:
            raise JobNotFound(f"no active batch operation {operation_id}")
        return found

    async def purge_batch_operations(self, before: datetime, *, limit: int = 1000) -> int:
        """Delete finalized operations finalized before ``before``; returns how many.

        Raises:
            ValidationError: ``limit`` is out of range (1..2**63-1; nothing is
                deleted).
        """
        limit = paging.positive(limit, "limit")
        return await self._on_connection(batch_ops.purge, before, limit)
