"""The runtime's LISTEN connection: new-job wake-ups per queue and cancel requests, heard on a
connection of its own, reconnected with a short backoff while the dispatchers poll."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from awa_fast import pg_connection
from awa_fast import pooler as pooler_mode
from awa_fast.repo.workers import WorkerRepo
from awa_fast.worker.cancellation import raise_if_cancelling
from awa_fast.worker.services import Services

log = logging.getLogger("awa_fast.runtime")
# The LISTEN loop's longest pause between reconnects (the other loops': MAX_BACKOFF_S, 30 s):
# after a failover it is back within seconds of the promotion however long the outage was
# (docs/deployment.md, "Failover"); meanwhile the dispatchers poll.
LISTEN_BACKOFF_MAX_S = 5.0


class Listener:
    """Hears the schema's channels and hands each notification to ``on_notify(channel,
    payload)``; after each (re)connect calls ``on_connect()`` (notifications may have been
    missed meanwhile).

    Args:
        services: the process's services (URLs, pooler mode, schema binding).
        poll_interval_s: seconds; the first reconnect backoff, doubled per failure up to
            ``LISTEN_BACKOFF_MAX_S``.
    """

    def __init__(
        self,
        services: Services,
        poll_interval_s: float,
        on_notify: Callable[[str, str], None],
        on_connect: Callable[[], None],
    ):
        self.services = services
        self.poll_interval_s = poll_interval_s
        self.on_notify = on_notify
        self.on_connect = on_connect
        self.conn: psycopg.AsyncConnection | None = None  # None: not connected (polling)

    @property
    def url(self) -> str | None:
        """Where the LISTEN connection goes: ``database_url``, unless that is a transaction
        pooler (LISTEN there hears nothing): then ``listen_url``, or none (polling)."""
        if pooler_mode.session_state_allowed(self.services.pooler):
            return self.services.database_url
        return self.services.listen_url

    async def connect(self) -> psycopg.AsyncConnection:
        """Open the connection and LISTEN (psycopg's errors pass through)."""
        url = self.url
        assert url is not None  # the listen loop runs only with a URL
        conn = await pg_connection.connection_class(self.services.schema).connect(
            url, autocommit=True, connect_timeout=10
        )
        await WorkerRepo(conn).listen()
        self.conn = conn
        return conn

    async def run(self) -> None:
        """Hear notifications until cancelled; survives every error (backed off)."""
        failures = 0
        while True:
            try:
                conn = self.conn
                if conn is None or conn.closed:
                    conn = await self.connect()
                    failures = 0
                    self.on_connect()
                async for note in conn.notifies():
                    self.on_notify(note.channel, note.payload)
            except Exception as exc:  # the listen loop must survive every error
                # Backed off like every loop (a database down for minutes must not log a
                # line per poll interval); the dispatchers poll meanwhile.
                failures += 1
                delay = min(self.poll_interval_s * 2 ** (failures - 1), LISTEN_BACKOFF_MAX_S)
                log.warning(
                    "LISTEN connection lost (%s: %s); polling until it is back "
                    "(reconnecting in %.2f s)",
                    type(exc).__name__,
                    exc,
                    delay,
                )
                self.conn = None
                raise_if_cancelling()  # see worker/cancellation.py
                await asyncio.sleep(delay)

    def leave_server(self) -> None:
        """The pool left a server that takes no writes (a switchover): reconnect, since the
        LISTEN connection is on it too and would hear nothing again (awa_fast/primary.py)."""
        conn = self.conn
        if conn is None or conn.closed or self.services.pooler == "transaction":
            return  # (through a transaction pooler it listens on listen_url: its own server)
        self.conn = None
        log.warning("the LISTEN connection's server takes no writes; reconnecting")
        # closing it ends the listen loop's wait, which then reconnects (libpq chooses again)
        task = asyncio.get_running_loop().create_task(conn.close())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def close(self) -> None:
        """Close the connection, if open."""
        if self.conn is not None:
            await self.conn.close()
