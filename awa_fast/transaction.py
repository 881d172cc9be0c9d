"""Transactional enqueue: :class:`Transaction` (async) on a pooled connection.

``async with await client.transaction() as tx`` commits on a clean exit and rolls back on an
exception; jobs inserted through ``tx`` exist if and only if it commits. Raw SQL uses awa's ``$n``
placeholders; rows come back as dicts.

The transaction runs at READ COMMITTED (the pool's sessions set it, whatever the database's
default). A job that holds a unique key cannot be inserted after ``SET TRANSACTION ISOLATION
LEVEL REPEATABLE READ`` or ``SERIALIZABLE``: the insert raises ``DatabaseError`` (SQLSTATE
0A000, chained to ``psycopg.errors.FeatureNotSupported``; migration 024: the key is checked
against finished jobs with a snapshot taken after its lock, which those levels do not take).

Every method raises driver errors (also of the caller's own SQL) as the awa-fast error tree
(``awa_fast.db_errors``): ``UniqueConflict``, ``ReadOnlyDatabase``, ``DatabaseUnavailable``,
``DatabaseError``..., naming the operation (``transaction.execute``), chained to the driver's.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from awa_fast import bulk, db_errors, enqueue, sql
from awa_fast.errors import AwaError, DatabaseUnavailable
from awa_fast.job import Job
from awa_fast.requests import check_statement_size, prepare

_PLACEHOLDER = re.compile(r"\$(\d+)")


def to_psycopg(query: str, args: tuple) -> tuple[str, dict]:
    """Rewrite awa-style ``$1`` placeholders to psycopg named parameters."""
    query = _PLACEHOLDER.sub(lambda m: f"%(p{m.group(1)})s", query.replace("%", "%%"))
    return query, {f"p{i}": v for i, v in enumerate(args, 1)}


@db_errors.boundary("transaction.")
class Transaction:
    """One database transaction on a connection borrowed from the client's pool.

    Use as ``async with await client.transaction() as tx``. After ``commit()`` or ``rollback()``
    the transaction is closed and further calls raise :class:`AwaError`.
    """

    def __init__(self, pool, conn: psycopg.AsyncConnection, off_queue: Any = None):
        """``off_queue``: the client's ``OffQueueWarner`` (``awa_fast.producer``), which warns
        about jobs inserted without ``queue=`` of a kind registered for another queue (None:
        no warning)."""
        self._pool = pool
        self._conn = conn
        self._open = True
        self._off_queue = off_queue

    @property
    def connection(self) -> psycopg.AsyncConnection:
        """The underlying psycopg connection (inside the transaction)."""
        return self._conn

    def _check(self) -> psycopg.AsyncConnection:
        if not self._open:
            raise AwaError("transaction already committed or rolled back")
        return self._conn

    async def insert(self, args: Any, **opts: Any) -> Job:
        """Insert a job inside this transaction (keywords as ``AsyncClient.insert``; without
        ``queue=`` a kind this client registered for another queue warns
        ``QueueMismatchWarning``, as there).

        Runs under a savepoint: a caught ``UniqueConflict`` leaves the transaction usable; a
        deadlock rolls back only the savepoint and is retried a bounded number of times, then
        raises ``DeadlockError``.
        """
        p = prepare(args, **opts)
        conn = self._check()
        if "queue" not in opts and self._off_queue is not None:  # as AsyncClient.insert
            self._off_queue.warn((p,), stacklevel=3)  # + the db_errors wrapper

        async def once() -> Job:
            async with conn.transaction():
                return await enqueue.insert_one(conn, p)

        return await bulk.retry_deadlocks(once, what="insert")

    async def insert_many(self, jobs: list, **opts: Any) -> list[Job]:
        """Insert many jobs with shared options inside this transaction (all or none, under a
        savepoint; a deadlock rolls back only the savepoint and is retried a bounded number of
        times, then raises ``DeadlockError``)."""
        rows = [prepare(a, **opts) for a in jobs]
        check_statement_size(rows, "insert them in smaller batches")
        conn = self._check()
        if "queue" not in opts and self._off_queue is not None:
            self._off_queue.warn(rows, stacklevel=3)

        async def once() -> list[Job]:
            async with conn.transaction():
                return await enqueue.insert_many(conn, rows)

        return await bulk.retry_deadlocks(once, what="insert_many")

    async def execute(self, query: str, *args: Any) -> int:
        """Run a statement; returns the affected row count."""
        cur = await self._check().execute(*to_psycopg(query, args))
        return cur.rowcount

    async def fetch_all(self, query: str, *args: Any) -> list[dict]:
        return await self._rows(query, args)

    async def fetch_optional(self, query: str, *args: Any) -> dict | None:
        rows = await self._rows(query, args)
        return rows[0] if rows else None

    async def fetch_one(self, query: str, *args: Any) -> dict:
        """Like :meth:`fetch_optional` but raises :class:`AwaError` on zero rows."""
        rows = await self._rows(query, args)
        if not rows:
            raise AwaError("query returned no rows")
        return rows[0]

    async def _rows(self, query: str, args: tuple) -> list[dict]:
        cur = self._check().cursor(row_factory=dict_row)
        await cur.execute(*to_psycopg(query, args))
        return await cur.fetchall()

    async def _finish(self, commit: bool) -> None:
        if not self._open:
            return
        self._open = False
        # A lost connection's transaction ended with it on the server: nothing to roll back,
        # and a ROLLBACK sent there would only hide the error that lost it.
        lost = self._conn.broken or self._conn.closed
        failed = lost or self._conn.info.transaction_status == TransactionStatus.INERROR
        try:
            if not lost:
                # Pooled connections are in autocommit mode; the client opened this one with
                # BEGIN.
                await self._conn.execute(
                    sql.TX_COMMIT if commit and not failed else sql.TX_ROLLBACK
                )
        finally:
            await self._pool.putconn(self._conn)
        if commit and lost:
            raise DatabaseUnavailable(
                "transaction.commit: the connection to the database was lost before the "
                "commit: nothing in the transaction was committed",
                operation="transaction.commit",
            )
        if commit and failed:
            raise AwaError(
                "the transaction was aborted by an earlier error and has been rolled "
                "back: nothing in it was committed"
            )

    async def commit(self) -> None:
        await self._finish(True)

    async def rollback(self) -> None:
        await self._finish(False)

    async def __aenter__(self) -> Transaction:
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            await self.commit()
        else:
            await self.rollback()
