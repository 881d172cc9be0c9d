"""The async PostgreSQL connection every awa-fast component opens: psycopg's, with a query
cancel that never blocks the process.

When a task awaiting a statement is cancelled (``asyncio.timeout``, a shutdown), psycopg asks
the server to cancel the statement (``cancel_safe``), waits up to 5 s for it to end and
otherwise closes the connection. With libpq 17 or later that cancel request is non-blocking and
bounded. Built against an older libpq (Debian 12's is 15), psycopg's C implementation falls back
to libpq's ``PQcancel`` in a thread, and holds the GIL while it waits for the server's answer:
against a server that accepts connections but does not answer (stopped, swapped out,
overloaded) the whole process froze, every thread and the event loop with it, for as long as
the server did. :class:`Connection` sends the same cancel request (libpq's ``PQcancel``: the
protocol's CancelRequest with the backend's key, which needs no connection slot and no
privilege) through ``ctypes``, which releases the GIL during the call, in a daemon thread the
event loop waits for within the cancel's timeout (ADR 023).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import os
import threading
from typing import Any

import psycopg
from psycopg import capabilities

# Registers the packed bigint[] dumper before any connection exists: a connection copies
# psycopg's adapters when it is made (a pool opened by insert() before start() imported the
# finalizer sent its arrays as bytea).
from awa_fast import pg_arrays  # noqa: F401  (imported for its registration)
from awa_fast.schema_binding import DEFAULT, SchemaBinding

_LIBPQ: ctypes.CDLL | None = None


def _libpq() -> ctypes.CDLL:
    """The libpq psycopg uses (the one mapped into this process; else the system's), with the
    three cancel functions typed."""
    global _LIBPQ
    if _LIBPQ is None:
        path = None
        with contextlib.suppress(OSError):  # Linux: the library psycopg's build linked
            with open("/proc/self/maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libpq"):
                        path = fields[5].strip()
                        break
        lib = ctypes.CDLL(path or ctypes.util.find_library("pq") or "libpq.so.5")
        lib.PQgetCancel.argtypes = [ctypes.c_void_p]
        lib.PQgetCancel.restype = ctypes.c_void_p
        lib.PQcancel.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        lib.PQcancel.restype = ctypes.c_int
        lib.PQfreeCancel.argtypes = [ctypes.c_void_p]
        lib.PQfreeCancel.restype = None
        _LIBPQ = lib
    return _LIBPQ


class Connection(psycopg.AsyncConnection[Any]):
    """``psycopg.AsyncConnection`` whose :meth:`cancel_safe` never blocks the event loop (see
    the module docstring). Open it as psycopg's: ``await Connection.connect(conninfo, ...)``, or
    pass it as a pool's ``connection_class``."""

    async def cancel_safe(self, *, timeout: float = 30.0) -> None:
        """Ask the server to cancel this connection's current statement, waiting at most
        ``timeout`` seconds (psycopg passes 5 when a task is cancelled mid-statement).

        Raises:
            psycopg.errors.CancellationTimeout: no answer within ``timeout`` seconds (the
                request's thread is left to end when the server answers).
            psycopg.OperationalError: the request could not be sent (libpq's message).
        """
        if capabilities.has_cancel_safe():  # libpq >= 17: psycopg's own is non-blocking
            await super().cancel_safe(timeout=timeout)
            return
        ptr = getattr(self.pgconn, "pgconn_ptr", None)  # both implementations have it
        if self.closed or ptr is None:
            return
        lib = _libpq()
        # a copy of the backend's address and key: valid whatever happens to this connection
        handle = lib.PQgetCancel(ptr)
        if not handle:
            raise psycopg.OperationalError("cancel: libpq gave no cancel handle")
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[str | None] = loop.create_future()

        def settle(error: str | None) -> None:
            if not answered.done():  # else timed out meanwhile
                answered.set_result(error)

        def send() -> None:
            buf = ctypes.create_string_buffer(256)
            try:
                ok = lib.PQcancel(handle, buf, len(buf))  # ctypes releases the GIL
            finally:
                lib.PQfreeCancel(handle)
            error = None if ok else buf.value.decode(errors="replace").strip()
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(settle, error)

        # a daemon thread, not the default executor: one stuck behind a frozen server must not
        # hold the process's exit (asyncio.run and interpreter exit join executor threads)
        threading.Thread(target=send, name="awa-fast-cancel", daemon=True).start()
        try:
            async with asyncio.timeout(timeout or None):
                error = await answered
        except TimeoutError:
            raise psycopg.errors.CancellationTimeout(
                f"cancel request: no answer from the server within {timeout:g} s"
            ) from None
        if error is not None:
            raise psycopg.OperationalError(f"cancel request failed: {error}")


# -- the schema a connection's statements are bound to (schema_binding, ADR 027) ----------------


def _bound_cursor(base: type, binding: SchemaBinding) -> type:
    """A subclass of the cursor class ``base`` whose statements are rewritten for ``binding``
    (one dict lookup per statement once a text has been seen)."""
    rewrite = binding.rewrite

    def text(query: Any) -> Any:
        return rewrite(query) if isinstance(query, str) else query

    if issubclass(base, psycopg.AsyncCursor):

        class AsyncBound(base):
            async def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
                return await super().execute(text(query), params, **kw)

            async def executemany(self, query: Any, params_seq: Any, **kw: Any) -> None:
                await super().executemany(text(query), params_seq, **kw)

            def copy(self, statement: Any, params: Any = None, **kw: Any) -> Any:
                return super().copy(text(statement), params, **kw)

            def stream(self, query: Any, params: Any = None, **kw: Any) -> Any:
                return super().stream(text(query), params, **kw)

        return AsyncBound

    class Bound(base):
        def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
            return super().execute(text(query), params, **kw)

        def executemany(self, query: Any, params_seq: Any, **kw: Any) -> None:
            super().executemany(text(query), params_seq, **kw)

        def copy(self, statement: Any, params: Any = None, **kw: Any) -> Any:
            return super().copy(text(statement), params, **kw)

        def stream(self, query: Any, params: Any = None, **kw: Any) -> Any:
            return super().stream(text(query), params, **kw)

    return Bound


def _bound_connection(base: type, cursor_base: type, binding: SchemaBinding, label: str) -> Any:
    """A subclass of the connection class ``base`` whose cursors (``cursor_base`` bound by
    :func:`_bound_cursor`) rewrite each statement for ``binding``; named ``label[schema]``."""
    cursor = _bound_cursor(cursor_base, binding)

    class BoundConnection(base):
        schema = binding

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.cursor_factory = cursor

    BoundConnection.__name__ = f"{label}[{binding.name}]"
    return BoundConnection


@functools.cache
def connection_class(binding: SchemaBinding = DEFAULT) -> type[Connection]:
    """The async connection class of ``binding``'s schema: :class:`Connection` itself for the
    default schema (nothing rewritten, no cost), else a subclass whose cursors rewrite each
    statement for the schema (``binding.rewrite``). Open it as :class:`Connection`, or pass it
    as a pool's ``connection_class``."""
    if binding.is_default:
        return Connection
    return _bound_connection(Connection, psycopg.AsyncCursor, binding, "Connection")


@functools.cache
def sync_connection_class(binding: SchemaBinding = DEFAULT) -> type[psycopg.Connection[Any]]:
    """As :func:`connection_class`, for ``psycopg.Connection`` (the blocking connections:
    migrations, the lingering-attempt thread, a progress flush from the loop's own thread)."""
    if binding.is_default:
        return psycopg.Connection
    return _bound_connection(psycopg.Connection, psycopg.Cursor, binding, "SyncConnection")
