"""External-callback admin (ADR-021): :class:`CallbackAdmin`, the callback-id operations of
``AsyncClient`` over :mod:`awa_fast.callbacks` (where the statements and rules are)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from awa_fast import callbacks
from awa_fast.admin.area import Area
from awa_fast.connections import Connections
from awa_fast.job import Job

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from awa_fast.worker.consequences import Settler
    from awa_fast.worker.specs import SpecRunner


class CallbackAdmin(Area):
    """Complete, fail, retry, resume, heartbeat or resolve the job waiting on a callback id
    (exposed as ``AsyncClient``'s methods of the same names, ADR 041). It is the
    :class:`~awa_fast.callbacks.CallbackDeps` the operations run with.

    Args:
        db: the connection source.
        specs: returns the registered follow-up specs (a completion inserts its Completed
            specs).
        settler: returns the settler (a failure: its consequence first, then failed / DLQ).
        staleness_ms: how old (ms) a heartbeat must be for its attempt to count as ended
            (``AsyncClient.staleness_ms``).
    """

    def __init__(
        self,
        db: Connections,
        specs: Callable[[], SpecRunner],
        settler: Callable[[], Settler],
        staleness_ms: Callable[[], int],
    ) -> None:
        super().__init__(db)
        self._specs = specs
        self._settler = settler
        self._staleness_ms = staleness_ms

    @property
    def specs(self) -> SpecRunner:
        """The registered follow-up specs."""
        return self._specs()

    @property
    def settler(self) -> Settler:
        """The settler failures go through."""
        return self._settler()

    async def pool(self) -> AsyncConnectionPool:
        """The open pool."""
        return await self._db.pool()

    def staleness_ms(self) -> int:
        """The heartbeat age (ms) after which an attempt counts as ended."""
        return self._staleness_ms()

    async def complete_external(self, callback_id: Any, payload: Any = None) -> Job:
        """Complete the job waiting on ``callback_id`` (see ``awa_fast.callbacks``).

        Raises:
            CallbackNotFound: unknown or expired callback id.
            ValidationError: malformed callback id.
        """
        return await callbacks.complete_external(self, callback_id, payload)

    async def fail_external(self, callback_id: Any, error: str) -> Job:
        """Fail the job waiting on ``callback_id`` through the failure path (its failure
        consequence first). Raises as :meth:`complete_external`.
        """
        return await callbacks.fail_external(self, callback_id, error)

    async def retry_external(self, callback_id: Any) -> Job:
        """Send the parked job back to available with attempt 0. Raises as
        :meth:`complete_external`.
        """
        return await callbacks.retry_external(self, callback_id)

    async def resume_external(self, callback_id: Any, payload: Any = None) -> Job:
        """Resume a handler blocked in ``wait_for_callback`` with ``payload``. Raises as
        :meth:`complete_external`.
        """
        return await callbacks.resume_external(self, callback_id, payload)

    async def heartbeat_callback(self, callback_id: Any, timeout_seconds: float = 3600.0) -> Job:
        """Extend the callback's timeout to now + ``timeout_seconds`` seconds."""
        return await callbacks.heartbeat_callback(self, callback_id, timeout_seconds)

    async def resolve_callback(
        self, callback_id: Any, payload: Any = None, default_action: str = "ignore"
    ) -> callbacks.ResolveResult:
        """Resolve the callback with the CEL expressions its handler registered (``filter``,
        ``on_fail``, ``on_complete`` + ``transform``, in awa's order), falling back to
        ``default_action`` (``"complete"``, ``"fail"``, ``"ignore"``); returns a
        :class:`~awa_fast.callbacks.ResolveResult`.

        Raises:
            CallbackNotFound: unknown callback id. ValidationError: malformed id or action.
        """
        return await callbacks.resolve_callback(self, callback_id, payload, default_action)
