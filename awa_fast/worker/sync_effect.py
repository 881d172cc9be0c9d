"""A plain ``def`` failure consequence runs in a thread, off the event loop (ADR 031), with a
synchronous view of the settlement's connection: each call is run on the loop, in the
settlement transaction, so the effect's writes still commit if and only if the consequence is
recorded as applied.

:class:`LoopConnection` is what such an effect gets as ``failure.conn``. Called from the
effect's thread, ``execute`` / ``executemany`` block until the statement ran on the loop and
return a :class:`LoopCursor` (``fetchone``, ``fetchall``, ``fetchmany``, ``rowcount``,
``description``, iteration). Called on the loop itself (an effect that returns a coroutine),
they return the async connection's awaitables unchanged. Once the effect ended or timed out,
:meth:`LoopConnection.close` refuses every later call: a thread that outlived its timeout can
write nothing into the settlement.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import psycopg


class EffectEnded(RuntimeError):
    """A statement from a ``def`` effect after it ended or timed out (nothing was sent)."""


class LoopCursor:
    """A synchronous view of an async cursor, its calls run on ``loop``."""

    def __init__(self, owner: LoopConnection, cursor: psycopg.AsyncCursor):
        self._owner = owner
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def description(self) -> Any:
        return self._cursor.description

    def fetchone(self) -> Any:
        return self._owner._run(self._cursor.fetchone)

    def fetchall(self) -> list:
        return self._owner._run(self._cursor.fetchall)

    def fetchmany(self, size: int = 0) -> list:
        return self._owner._run(lambda: self._cursor.fetchmany(size))

    def __iter__(self) -> Iterator:
        return iter(self.fetchall())


class LoopConnection:
    """``failure.conn`` of a ``def`` effect: the settlement's async connection, usable from the
    effect's thread (module docstring).

    Raises (from its methods):
        EffectEnded: called after the effect ended or timed out.
        psycopg.Error: the statement failed (the settlement's savepoint is then rolled back).
    """

    def __init__(self, conn: psycopg.AsyncConnection, loop: asyncio.AbstractEventLoop):
        self._conn = conn
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._closed = False

    @property
    def info(self) -> Any:
        return self._conn.info

    def close(self) -> None:
        """Refuse every later call (on the loop: a call already queued is refused too)."""
        self._closed = True

    def _on_loop(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def _run(self, make: Any) -> Any:
        async def call() -> Any:
            if self._closed:  # checked on the loop, where close() runs
                raise EffectEnded("the failure consequence already ended or timed out")
            return await make()

        if self._closed:
            raise EffectEnded("the failure consequence already ended or timed out")
        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if self._on_loop():
            return self._conn.execute(query, params, **kwargs)
        return LoopCursor(self, self._run(lambda: self._conn.execute(query, params, **kwargs)))

    def executemany(self, query: Any, params_seq: Any) -> Any:
        if self._on_loop():

            async def many() -> None:
                async with self._conn.cursor() as cur:
                    await cur.executemany(query, params_seq)

            return many()

        async def many_sync() -> None:
            async with self._conn.cursor() as cur:
                await cur.executemany(query, params_seq)

        return self._run(many_sync)
