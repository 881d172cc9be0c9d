"""What a running attempt (``worker/context.py``'s ``JobContext``) may use of the process that
runs it: connections, the client's ``QueueMismatchWarning`` for follow-ups, the runtime's loop.
Apart from ``worker/services.py`` (which re-exports them) so that the job a handler receives
imports nothing that imports it back (issue 30: no import circle, type-only imports included).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from awa_fast.producer import OffQueueWarner
    from awa_fast.schema_binding import SchemaBinding


class ConnectionSource(Protocol):
    """Where a lower layer gets its connections: the process's pool (opened on first call,
    ``DatabaseError`` when the database cannot be reached in 30 s) and the database URL (for
    the few dedicated connections: LISTEN, heartbeat, a blocking progress flush)."""

    @property
    def database_url(self) -> str: ...

    @property
    def pooler(self) -> str | None:
        """The connection mode (``awa_fast.pooler``): ``None``, ``"session"`` or
        ``"transaction"`` (then no session state on a dedicated connection either)."""
        ...

    @property
    def schema(self) -> SchemaBinding:
        """The schema the dedicated connections are bound to (``pg_connection``)."""
        ...

    async def pool(self) -> AsyncConnectionPool: ...


class AttemptServices(ConnectionSource, Protocol):
    """What a running attempt uses of the services: connections and the client's
    ``QueueMismatchWarning`` for follow-ups staged without ``queue=`` (None: no warning)."""

    @property
    def off_queue(self) -> OffQueueWarner | None: ...


class AttemptRuntime(Protocol):
    """What a running attempt (``JobContext``) uses of its runtime: connections, the event
    loop the runtime runs on (a ``def`` handler's thread flushes progress through it) and how
    often a parked ``wait_for_callback`` polls (seconds)."""

    @property
    def services(self) -> AttemptServices: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...

    @property
    def callback_poll_interval_s(self) -> float: ...
