"""The dashboard's startup and shutdown: both pools (the page reads' and the actions' client)
opened within one bound, waiting for a database that is still coming up, and closed at the end."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from psycopg_pool import PoolTimeout
from starlette.applications import Starlette

from awa_fast.client import AsyncClient
from awa_fast.errors import DatabaseError, DatabaseUnavailable
from awa_fast.schema_binding import SchemaBinding
from awa_fast.web import reads as _reads
from awa_fast.web.reads import CLIENT_CONNECTIONS, Reads, bounded


class _Client(AsyncClient):
    """The client the actions use: its pool waits for the database as the reads' does."""

    def _pool_options(self, url: str) -> dict[str, Any]:
        return bounded(url, super()._pool_options(url))


class StartupError(DatabaseUnavailable):
    """The dashboard's pools found no database connection within its startup bound
    (``reads.STARTUP_S``): the application does not start."""


class _LastConnectError(logging.Filter):
    """Keeps psycopg.pool's warnings (one per failed connect, several a second while a startup
    retries) off the log and the last one's first line as :attr:`last`."""

    last = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if str(record.msg).startswith("error connecting") and record.args:
            # "error connecting in %r: %s", (pool name, the connect's exception)
            self.last = str(record.args[-1]).splitlines()[0]  # type: ignore[index]
        return False


async def _open(reads: Reads, new_client: Callable[[], AsyncClient], timeout: float) -> AsyncClient:
    """Open the reads' pool and a client's (``new_client()``) within ``timeout`` seconds,
    starting new connects while the database refuses them (each pool alone gives up after one
    failed connect, see ``bounded``); returns the client.

    Raises:
        StartupError: no connection when ``timeout`` ran out (its message ends with the last
            connect error).
    """
    deadline = time.monotonic() + timeout
    errors = _LastConnectError()
    pool_log = logging.getLogger("psycopg.pool")
    pool_log.addFilter(errors)
    try:
        try:
            await reads.open(timeout)
        except PoolTimeout:
            raise StartupError(_no_database(timeout, errors.last)) from None
        while True:
            client = None
            try:
                # the database answered the reads: the client's check at construction (one
                # connect) and its pool's open (up to DB_WAIT_S) are short
                client = new_client()
                await client.pool()
                return client
            except DatabaseError as exc:
                if client is not None:
                    await client.close()
                if time.monotonic() >= deadline:
                    last = errors.last or str(exc).splitlines()[0]
                    raise StartupError(_no_database(timeout, last)) from None
    except StartupError:
        # The reads' pool goes on connecting until it is closed: closed here, while the filter
        # still holds its warnings (the lifespan's close after this finds it closed).
        await reads.close()
        raise
    finally:
        pool_log.removeFilter(errors)


def _no_database(timeout: float, last: str) -> str:
    return (
        f"the database accepted no connection within {timeout:.0f} s of the dashboard's "
        f"startup (the last attempt: {last or 'no answer'})"
    )


def lifespan(
    database_url: str, binding: SchemaBinding, startup_s: float | None
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """The application's lifespan: open the pools into ``app.state.dashboard`` (waiting up to
    ``startup_s``, default ``reads.STARTUP_S``), close them at shutdown. A startup that found no
    database raises :class:`StartupError`, also kept as ``app.state.startup_error``."""

    @contextlib.asynccontextmanager
    async def run(app: Starlette) -> AsyncIterator[None]:
        d = app.state.dashboard
        d.reads_ = Reads(database_url, binding=binding)
        d.client_ = None
        try:
            # the client's pool now: a first open failing later (database down) closes the
            # pool, waiting on its connects, and the next page builds another
            wait_s = _reads.STARTUP_S if startup_s is None else startup_s
            try:
                d.client_ = await _open(
                    d.reads_,
                    lambda: _Client(
                        database_url, max_connections=CLIENT_CONNECTIONS, schema=binding.name
                    ),
                    wait_s,
                )
            except StartupError as exc:
                app.state.startup_error = exc  # awa-fast serve reports it on one line
                raise
            yield
        finally:
            await d.reads_.close()
            if d.client_ is not None:
                await d.client_.close()

    return run
