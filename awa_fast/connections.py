"""How the client and its admin areas reach the database: the client's pool (:class:`Pool`,
:func:`pool_options`, :func:`open_pool`) and :class:`Connections`, the one dependency every
area of :mod:`awa_fast.admin` shares (the client's pool, opened on first use)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson
import psycopg
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from awa_fast import pg_connection, primary, sql
from awa_fast import pooler as pooler_mode
from awa_fast.database_url import url_source
from awa_fast.errors import DatabaseUnavailable
from awa_fast.pg_connection import Connection

log = logging.getLogger("awa_fast.admin")

# Seconds an admin read waits for a pooled connection before reporting the database unreachable
# (the pool's own 30 s wait would stall a probe that must answer while postgres is down).
ADMIN_POOL_WAIT_S = 3.0
# Seconds of failed connects after which the pool starts its pauses again from 1 s (Pool).
RECONNECT_S = 5.0
# Seconds between two drains of the pool off a read-only server, at least (Pool).
READ_ONLY_DRAIN_S = 1.0
# Seconds the first statement of a new pool (its pooler check) may wait for an answer: a pooler
# whose server connections are all taken queues it (PgBouncer: up to query_wait_timeout, no
# bound when 0), and a start() must fail rather than wait for ever.
FIRST_ANSWER_S = 10.0


class Pool(AsyncConnectionPool[Any]):
    """psycopg_pool's async pool, which never hands out a connection the server closed while it
    sat idle in the pool (``pg_terminate_backend``, a restart, ``idle_session_timeout``): such
    a connection failed its next caller, an insert, a handler's own insert (an attempt spent),
    an admin read or a wake-up. Such a connection has the server's goodbye waiting to be read:
    a healthy checkout costs one ``select`` call. A dead one is closed and given back, which
    makes the pool replace it, and the next is taken at once, so a caller passes every dead
    connection a restart left in microseconds each. (The pool's own ``check`` waits 1 s, then
    2 s, before each further try of one caller; its ``check()`` sweep takes every idle
    connection out of the pool with no timeout and swallows a cancel.) A connection dropped
    without a word (a network partition) is not caught here: TCP keepalives are for that.
    ``closed_by_server`` counts the connections passed so.
    """

    closed_by_server = 0
    # connections handed out by getconn and not yet given back by putconn
    in_use = 0
    # connections closed because their server took no writes (primary.py), and the drains of
    # every other connection that followed
    left_read_only = 0
    read_only_drains = 0
    # times reconnect_timeout passed with no connect succeeding (the pool then started over)
    reconnects_failed = 0

    def __init__(self, conninfo: str = "", *args: Any, **kwargs: Any) -> None:
        # a statement cancelled mid-way never freezes the process (pg_connection)
        kwargs.setdefault("connection_class", Connection)
        # psycopg_pool doubles the pause between reconnect attempts without bound (1, 2, 4 ...
        # s): after an outage of T seconds (a failover) the next attempt came up to T seconds
        # after the database was back. Giving up after RECONNECT_S and starting again
        # (reconnect_failed) keeps every pause under RECONNECT_S / 2.
        kwargs.setdefault("reconnect_timeout", RECONNECT_S)
        super().__init__(conninfo, *args, **kwargs)
        # a read-only server left is acted on only where libpq will choose another one
        self.wants_primary = primary.wants_primary(conninfo)
        # called (no arguments, on the pool's loop) after the pool left a read-only server
        self.on_read_only: list[Callable[[], None]] = []
        self._left_at = 0.0  # time.monotonic() of the last drain off a read-only server

    async def reconnect_failed(self) -> None:
        """psycopg_pool's hook after ``reconnect_timeout`` seconds of failed connects: try
        again at once, with fresh pauses (``check()`` grows a pool that has no connection)."""
        self.reconnects_failed += 1
        if not self.closed:
            await self.check()

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[Any]:
        """``AsyncConnectionPool.connection``; a connection whose statement was refused as
        read-only (SQLSTATE 25006) is left when given back (:meth:`putconn`)."""
        async with super().connection(timeout) as conn:
            try:
                yield conn
            except Exception as exc:
                if self.wants_primary and primary.read_only_error(exc):
                    conn._awa_read_only = True
                raise

    async def getconn(self, timeout: float | None = None) -> Any:
        """A connection, as ``AsyncConnectionPool.getconn``, within ``timeout`` seconds (the
        pool's ``timeout`` by default) for all the connections it passes.

        Raises:
            PoolBusy: no connection within ``timeout`` while every one the pool may open
                (``max_size``) was in use: the database was up, its callers were slow.
            psycopg_pool.PoolTimeout: no live connection within ``timeout`` otherwise (the
                database refused or did not answer the pool's connects).
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            try:
                conn = await super().getconn(max(0.0, deadline - time.monotonic()))
            except PoolTimeout as exc:
                if self.in_use >= self.max_size:
                    raise PoolBusy(
                        f"every connection of the pool ({self.in_use} of {self.max_size}) "
                        f"stayed in use: {exc}"
                    ) from None
                raise
            try:
                alive = await _alive(conn)  # (reads what the server sent: its reports too)
                if alive and self.wants_primary and primary.server_read_only(conn):
                    await self._leave_read_only(conn)
                    await super().putconn(conn)
                    continue
                if alive:
                    self.in_use += 1
                    return conn
            except BaseException:
                await super().putconn(conn)
                raise
            self.closed_by_server += 1
            await super().putconn(conn)  # closed: the pool discards it and opens another

    async def putconn(self, conn: Any) -> None:
        """Give back a connection :meth:`getconn` handed out. With a URL that asks libpq for a
        writable server (``target_session_attrs=read-write``), one whose server takes no
        writes (a statement refused as read-only, or the server's own report) is closed, and
        so is every other connection the pool had opened before (``drain``): the pool's new
        connections are chosen by libpq again, the promoted primary's after a failover. (With
        any other URL a new connection would reach the same server: the connection stays, and
        its writes fail with ``ReadOnlyDatabase``.)"""
        self.in_use -= 1
        if self.wants_primary and (
            getattr(conn, "_awa_read_only", False) or primary.server_read_only(conn)
        ):
            await self._leave_read_only(conn)
        await super().putconn(conn)

    async def _leave_read_only(self, conn: Any) -> None:
        self.left_read_only += 1
        with contextlib.suppress(Exception):  # closed: the pool discards it and opens another
            await conn.close()
        # The others may be on that server too: replace them all, once a READ_ONLY_DRAIN_S at
        # most (a server that stays read-only -- one host, no other to go to -- would make every
        # refused write reconnect the whole pool).
        now = time.monotonic()
        if self.read_only_drains and now - self._left_at < READ_ONLY_DRAIN_S:
            return
        self.read_only_drains += 1
        self._left_at = now
        log.warning(
            "a connection's server takes no writes (read-only, or a standby): every connection "
            "of the pool opened before now is replaced (a failover or switchover; the new ones "
            "go where libpq's target_session_attrs finds a writable server)"
        )
        await self.drain()
        for listener in self.on_read_only:
            listener()


class PoolBusy(PoolTimeout):
    """No connection within the wait because every connection of the pool was in use (a
    ``PoolTimeout``: callers that catch that one catch this)."""

    # the database answered: a DatabaseError, not DatabaseUnavailable (awa_fast.db_errors)
    database_reachable = True


async def _alive(conn: psycopg.AsyncConnection[Any]) -> bool:
    """False when the server closed ``conn`` (closing it here if it still looked open)."""
    if conn.closed:
        return False
    try:
        pending, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        pending = [True]
    if not pending:
        return True
    try:  # the server sent something unasked: a goodbye, or a notice on a live connection
        await AsyncConnectionPool.check_connection(conn)
        return True
    except psycopg.Error:
        await conn.close()
        return False


class Connections:
    """The pool an admin area uses, and its connections (each area runs its statements on
    one through a repository, :mod:`awa_fast.repo`).

    Args:
        pool: an async callable returning the open pool (``AsyncClient.pool``: opens it on first
            call; raises ``DatabaseUnavailable`` if the database is unreachable within 30
            seconds).
    """

    def __init__(self, pool: Callable[[], Awaitable[AsyncConnectionPool]]) -> None:
        self._pool = pool

    async def pool(self) -> AsyncConnectionPool:
        """The open pool (see the constructor for the errors)."""
        return await self._pool()

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[Any]:
        """A pooled connection (autocommit: each statement its own transaction unless the
        caller opens one). ``timeout`` bounds the wait for it, in seconds (the pool's own wait
        when ``None``).

        Raises:
            psycopg_pool.PoolTimeout: no connection within the wait (including a pool not yet
                open that did not open within it).
        """
        async with (await self._open_pool(timeout)).connection(timeout=timeout) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def bounded_connection(self) -> AsyncIterator[Any]:
        """:meth:`connection` waiting at most ``ADMIN_POOL_WAIT_S`` seconds.

        Raises:
            DatabaseUnavailable: the database refused or did not answer the pool's connects
                within that wait.
            PoolBusy: every connection of the pool stayed in use for that wait.
        """
        try:
            async with self.connection(timeout=ADMIN_POOL_WAIT_S) as conn:
                yield conn
        except PoolBusy:
            raise
        except PoolTimeout as exc:
            raise DatabaseUnavailable(
                f"database unreachable: no connection within {ADMIN_POOL_WAIT_S:g} s: {exc}"
            ) from exc

    async def _open_pool(self, timeout: float | None) -> AsyncConnectionPool:
        if timeout is None:
            return await self._pool()
        # The first open goes on in the background past our wait (cancelling it half-way would
        # leave the pool's workers behind); its own failure is then the next caller's.
        opening = asyncio.ensure_future(self._pool())
        try:
            return await asyncio.wait_for(asyncio.shield(opening), timeout)
        except TimeoutError:
            opening.add_done_callback(lambda t: t.cancelled() or t.exception())
            raise PoolTimeout(f"the connection pool did not open within {timeout:g} s") from None


async def _configure(conn: psycopg.AsyncConnection) -> None:
    set_json_loads(orjson.loads, conn)
    await conn.execute(sql.SESSION_READ_COMMITTED)


async def _configure_pooled(conn: psycopg.AsyncConnection) -> None:
    # through a transaction pooler a session SET would stay on whichever server connection
    # ran it: the database's own default must be READ COMMITTED (pooler.check_connection)
    set_json_loads(orjson.loads, conn)


def pool_options(max_connections: int, pooler: str | None, binding: Any) -> dict[str, Any]:
    """psycopg_pool options of a client's pool: ``max_connections`` connections at most, in
    ``pooler`` mode (:mod:`awa_fast.pooler`), every statement in ``binding``'s schema (a
    :class:`~awa_fast.schema_binding.SchemaBinding`, ADR 027); its ``timeout`` (30 s) also
    bounds the first open."""
    return dict(
        min_size=1,
        max_size=max_connections,
        kwargs={"autocommit": True, **pooler_mode.connect_options(pooler)},
        configure=(_configure if pooler_mode.session_state_allowed(pooler) else _configure_pooled),
        timeout=30,
        connection_class=pg_connection.connection_class(binding),
    )


async def open_pool(
    url: str, options: dict[str, Any], pooler: str | None, explicit_url: str | None
) -> Pool:
    """A :class:`Pool` on ``url`` with ``options`` (:func:`pool_options`), open, its first
    connection checked against ``pooler`` before anything is written.

    Raises:
        DatabaseUnavailable: no connection within the pool's ``timeout`` (the message says
            where the URL came from: ``explicit_url`` given, or the environment, and why one
            more connect is refused, as a pooler's ``max_client_conn``); or no answer
            to the first statement within ``FIRST_ANSWER_S`` (a pooler with every server
            connection taken; the pool is closed again).
        ConfigError: the connection does not match ``pooler``
            (:func:`awa_fast.pooler.check_connection`); the pool is closed again.
    """
    pool = Pool(url, open=False, **options)
    try:
        await pool.open(wait=True, timeout=pool.timeout)
    except PoolTimeout as exc:
        await pool.close()
        raise DatabaseUnavailable(
            f"could not connect to the database (the URL {url_source(explicit_url)}): {exc}"
            + await _connect_refusal(url),
            operation="pool",
        ) from exc
    except BaseException:
        # Cancelled mid-open (an admin call's bounded wait gave up, then the loop ended): the
        # pool's workers ignore cancellation, so an open pool left here kept asyncio.run()
        # (or a test's loop teardown) waiting for ever.
        await pool.close()
        raise
    try:
        async with pool.connection() as conn:
            try:
                await asyncio.wait_for(
                    pooler_mode.check_connection(conn, pooler, url), FIRST_ANSWER_S
                )
            except TimeoutError:
                raise DatabaseUnavailable(
                    f"the database answered no statement within {FIRST_ANSWER_S:g} s of "
                    f"connecting (the URL {url_source(explicit_url)}): through a pooler, every "
                    "server connection it may open for this database and user is in use and it "
                    "queues clients (PgBouncer: raise default_pool_size / max_db_connections / "
                    "max_user_connections, or end the transactions holding them)",
                    operation="pool",
                ) from None
    except BaseException:
        await pool.close()
        raise
    return pool


async def _connect_refusal(url: str) -> str:
    """Why one more connect to ``url`` fails ("; last refusal: ..."), or "" if it succeeds:
    psycopg_pool's timeout names no reason (only its log does), and a pooler's refusal (say
    PgBouncer's ``max_client_conn``) is what the operator has to act on."""
    try:
        conn = await psycopg.AsyncConnection.connect(url, connect_timeout=5)
    except psycopg.Error as exc:
        return "; last refusal: " + " ".join(str(exc).split())
    await conn.close()
    return ""


async def close_pool_on_cancel(pool: AsyncConnectionPool) -> None:
    """Close ``pool`` when this task is cancelled, as ``asyncio.run()`` does to every task at exit.

    psycopg_pool's async workers and scheduler catch ``CancelledError`` (a connect cancelled
    mid-way logs "error connecting in 'pool-1': " and is retried), so a pool left open when
    ``main()`` returns without ``AsyncClient.close`` keeps ``asyncio.run()`` waiting
    forever. Closing queues a stop for each of them, which they do honour.
    """
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        try:
            await pool.close()
        except asyncio.CancelledError:
            pass  # a worker that ended cancelled fails close()'s gather; its stop is queued
        raise


# Set while awa-fast's own loaders import an application (``awa-fast worker``'s preflight and
# children, ``awa-fast check``: :func:`awa_fast.app_loader.load_client`): a client built at
# import skips its construction-time connect, so ``--database-url`` can override its URL before
# anything connects and ``check`` never touches the database. The launcher's children then
# connect (and fail with one line) with the URL they use. Ordinary library use keeps the check.
_deferred_checks = 0


@contextlib.contextmanager
def deferred_reachability_check() -> Iterator[None]:
    """Within it, ``AsyncClient(url)`` does not connect at construction (the application
    loaders of ``awa-fast worker`` and ``awa-fast check`` import the application in it)."""
    global _deferred_checks
    _deferred_checks += 1
    try:
        yield
    finally:
        _deferred_checks -= 1


def check_reachable(url: str) -> None:
    """Connect once and close (awa-pg connects at construction). Raises DatabaseUnavailable."""
    try:
        psycopg.connect(url, connect_timeout=10, autocommit=True).close()
    except psycopg.Error as exc:
        raise DatabaseUnavailable(
            "could not connect to the database (the URL given to the client): "
            + " ".join(str(exc).split()),
            operation="AsyncClient()",
            sqlstate=exc.sqlstate,
        ) from exc


def reachability_check_deferred() -> bool:
    """Inside a :func:`deferred_reachability_check`."""
    return _deferred_checks > 0
