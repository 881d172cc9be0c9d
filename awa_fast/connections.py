"""How an admin area reaches the database: :class:`Connections`, the one dependency every area
of :mod:`awa_fast.admin` shares (the client's pool, opened on first use)."""

from __future__ import annotations

import logging
import select
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from awa_fast import bulk, enqueue, sql

log = logging.getLogger("awa_fast.admin")


class IdleCheck:
    """A pool's ``check`` (``AsyncConnectionPool(check=IdleCheck())``, then set :attr:`pool`):
    runs when a connection leaves the pool, and raises if the server closed it while it sat idle
    there (``pg_terminate_backend``, a restart, an idle timeout), so the pool discards it and
    hands out another instead of failing the caller's statement. Such a connection has the
    server's goodbye waiting to be read; a healthy checkout costs one ``select`` call, not a
    round trip. A dead one found means the others idle beside it are likely dead too (a restart
    closes them all), so they are checked at once (``AsyncConnectionPool.check``, one round trip
    each): the pool waits a second, then two, before each further try of one caller, and would
    otherwise make it pay that for every dead connection in turn. A connection dropped without
    a word (a network partition) is not caught here: TCP keepalives are for that.

    Raises:
        psycopg.OperationalError: the connection is closed or broken.
    """

    def __init__(self) -> None:
        self.pool: AsyncConnectionPool | None = None

    async def __call__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if not conn.closed:
            try:
                pending, _, _ = select.select([conn.fileno()], [], [], 0)
            except (OSError, ValueError):
                pending = [True]
            if not pending:
                return
            try:
                await AsyncConnectionPool.check_connection(conn)
                return  # readable, but alive (a message the server sent unasked)
            except psycopg.Error:
                pass
        if self.pool is not None:
            await self.pool.check()
        raise psycopg.OperationalError("the pooled connection was closed by the server")


class Connections:
    """The pool an admin area uses, and the two ways the areas run statements on it.

    Args:
        pool: an async callable returning the open pool (``AsyncClient.pool``: opens it on first
            call; raises ``DatabaseError`` if the database is unreachable within 30 seconds).
    """

    def __init__(self, pool: Callable[[], Awaitable[AsyncConnectionPool]]) -> None:
        self._pool = pool

    async def pool(self) -> AsyncConnectionPool:
        """The open pool (see the constructor for the errors)."""
        return await self._pool()

    async def fetch(self, query: str, params: Any = None) -> list[tuple]:
        """Run one statement on a pooled connection (autocommit: its own transaction); its rows,
        or ``[]`` for a statement that returns none."""
        async with (await self._pool()).connection() as conn:
            cur = await conn.execute(query, params)
            return await cur.fetchall() if cur.description else []

    async def run_isolated(
        self,
        what: str,
        bulk_sql: str,
        ids_sql: str,
        one_sql: str,
        params: dict,
        notify: Callable[[tuple], bool] | None = None,
    ) -> list[tuple]:
        """One transaction: ``bulk_sql``, or -- where a row fails it -- ``one_sql`` for each id
        ``ids_sql`` returns (:func:`awa_fast.bulk.run_isolated`); a row that fails alone is left
        unchanged and logged (a unique collision names the holder). All three statements take
        ``params`` (``one_sql`` also ``id``) and return rows whose third column is the queue;
        queues with a returned row that ``notify`` accepts are woken. Returns the rows changed.

        Raises:
            DeadlockError: kept deadlocking with concurrent writers after bounded retries of
                the whole transaction (nothing changed).
        """

        async def once() -> list[tuple]:
            async with (await self._pool()).connection() as conn:

                async def fetch(query: str, extra: dict | None = None) -> list[tuple]:
                    cur = await conn.execute(query, {**params, **(extra or {})})
                    return await cur.fetchall() if cur.description else []

                async def ids() -> list[int]:
                    return [r[0] for r in await fetch(ids_sql)]

                async def held(job_id: int, exc: Exception) -> None:
                    conflict = await enqueue.holder_conflict(conn, job_id, what, exc)
                    log.warning("%s: %s", what, conflict)

                async with conn.transaction():
                    done = await bulk.run_isolated(
                        conn,
                        what=what,
                        bulk=lambda: fetch(bulk_sql),
                        keys=ids,
                        one=lambda job_id: fetch(one_sql, {"id": job_id}),
                        on_conflict=held,
                    )
                    if notify is not None:
                        for q in sorted({r[2] for r in done.rows if notify(r)}):
                            await conn.execute(sql.NOTIFY_QUEUE, (q,))
                return done.rows

        return await bulk.retry_deadlocks(once, what=what)
