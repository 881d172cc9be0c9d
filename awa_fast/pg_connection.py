"""The async PostgreSQL connection every awa-fast component opens: psycopg's, with a query
cancel that never blocks the process.

When a task awaiting a statement is cancelled (``asyncio.timeout``, a shutdown), psycopg asks
the server to cancel the statement (``AsyncConnection.cancel_safe``), waits up to 5 s for it to
end and otherwise closes the connection. With libpq 17 or later that cancel request is
non-blocking and bounded. Built against an older libpq (Debian 12's is 15), psycopg's C
implementation falls back to libpq's ``PQcancel`` in a thread, which holds the GIL while it waits
for the server's answer: against a server that accepts connections but does not answer (stopped,
swapped out, overloaded) the whole process froze, every thread and the event loop with it,
for as long as the server did. :class:`Connection` sends that cancel as
``pg_cancel_backend(pid)`` over a second, short-lived connection instead: the same signal to the
same backend, awaited on the event loop and bounded by the cancel's timeout.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg import capabilities
from psycopg.conninfo import make_conninfo

from awa_fast.sql.runtime import CANCEL_BACKEND


class Connection(psycopg.AsyncConnection[Any]):
    """``psycopg.AsyncConnection`` whose :meth:`cancel_safe` never blocks the event loop (see
    the module docstring). Open it as psycopg's: ``await Connection.connect(conninfo, ...)``, or
    pass it as a pool's ``connection_class``."""

    async def cancel_safe(self, *, timeout: float = 30.0) -> None:
        """Ask the server to cancel this connection's current statement, waiting at most
        ``timeout`` seconds (psycopg passes 5 when a task is cancelled mid-statement).

        Raises:
            psycopg.errors.CancellationTimeout: no answer within ``timeout`` seconds.
            psycopg.OperationalError: the second connection failed (the server refused it).
        """
        if capabilities.has_cancel_safe():  # libpq >= 17: psycopg's own is non-blocking
            await super().cancel_safe(timeout=timeout)
            return
        if self.closed:
            return
        pid = self.pgconn.backend_pid
        # the options this connection was opened with, password included
        params = {o.keyword.decode(): o.val.decode() for o in self.pgconn.info if o.val is not None}
        try:
            async with asyncio.timeout(timeout or None):
                other = await _Canceller.connect(make_conninfo("", **params), autocommit=True)
                async with other:
                    await other.execute(CANCEL_BACKEND, (pid,))
        except TimeoutError:
            raise psycopg.errors.CancellationTimeout(
                f"cancelling the statement of backend {pid}: no answer within {timeout:g} s"
            ) from None


class _Canceller(psycopg.AsyncConnection[Any]):
    """The second connection of :meth:`Connection.cancel_safe`: cancelled itself (the server
    does not answer it either), it sends no cancel of its own; psycopg then closes it."""

    async def cancel_safe(self, *, timeout: float = 30.0) -> None:
        return None
