"""Bulk statements that one bad row cannot fail for the others, and bounded deadlock retry.

Every bulk statement of awa-fast (claim, promote, rescue, heartbeat, complete, retry_failed,
drain_queue, DLQ bulk retry) runs through :func:`run_isolated`: the bulk statement first; if it
fails because of a row (a unique collision, a trigger that raises, bad data) it is redone row by
row with the row-by-row twin statement, which carries the same guard fragment (``awa_fast.sql``
builds both from one fragment; ``tests/test_hardening_wedge.py`` checks every pair). A row that
fails alone gets its caller's documented outcome (``on_conflict`` for a unique collision, e.g.
cancel as duplicate; otherwise it is left unchanged and logged) and the others proceed.
``docs/architecture.md`` ("Failure path of every statement") lists each outcome.

Errors that are not about a row -- a lost connection, a deadlock, a serialization failure, a
cancelled query (``psycopg.OperationalError``) -- fail the whole call: its caller retries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus

from awa_fast.errors import DeadlockError

log = logging.getLogger("awa_fast.bulk")

DEADLOCK_RETRIES = 3


def is_row_error(exc: BaseException) -> bool:
    """True for a database error caused by the data of a statement (constraint, trigger, data
    error), False for one about the session or the server: connection, deadlock, cancel
    (``OperationalError``), an unsupported feature (SQLSTATE class 0A) and the transaction's
    state (25, e.g. a read-only transaction), which every row would meet the same way. (A
    privilege or a missing object, class 42, is about the role or the schema too, but a
    trigger may raise such a code for one row: see :func:`run_isolated`.)"""
    if not isinstance(exc, psycopg.DatabaseError) or isinstance(exc, psycopg.OperationalError):
        return False
    return not _sqlstate(exc).startswith(("0A", "25"))


def _sqlstate(exc: BaseException) -> str:
    return getattr(exc, "sqlstate", None) or ""


def _atomic(conn: psycopg.AsyncConnection):
    # Outside a transaction (autocommit) one statement is its own transaction: no savepoint
    # round trips on the hot path. Inside one, a savepoint isolates the statement.
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        return contextlib.nullcontext()
    return conn.transaction()


@dataclasses.dataclass
class Isolated:
    """What :func:`run_isolated` did: ``rows`` returned by the statements that succeeded;
    ``failed`` maps each key whose row failed alone to its error (after its outcome ran);
    ``by_row`` is True when the bulk statement failed and rows were redone one by one."""

    rows: list
    failed: dict
    by_row: bool = False


async def run_isolated(
    conn: psycopg.AsyncConnection,
    *,
    what: str,
    bulk: Callable[[], Awaitable[list]],
    keys: Iterable | Callable[[], Awaitable[Iterable]],
    one: Callable[[Any], Awaitable[list]],
    on_conflict: Callable[[Any, Exception], Awaitable[None]] | None = None,
    on_error: Callable[[Any, Exception], Awaitable[None]] | None = None,
) -> Isolated:
    """Run ``bulk()`` (one statement); if a row makes it fail, run ``one(key)`` (one statement)
    for every key of ``keys`` (a list, or an async callable returning the candidate keys).

    On ``conn`` in autocommit mode each statement is its own transaction; inside the caller's
    transaction each runs under a savepoint. A key whose statement fails with a unique
    violation gets ``on_conflict(key, exc)``, any other row error ``on_error(key, exc)``; each
    runs under its own savepoint, and if it fails too the row is left unchanged (logged).

    Raises:
        psycopg.OperationalError: connection lost, deadlock, ... (the caller retries the call).
    """
    try:
        async with _atomic(conn):
            return Isolated(await bulk(), {})
    except psycopg.DatabaseError as exc:
        if not is_row_error(exc):
            raise
        bulk_error = exc
        log.warning(
            "%s: the bulk statement failed (%s: %s); redoing it row by row",
            what,
            type(exc).__name__,
            exc,
        )
    candidates = await keys() if callable(keys) else keys
    result = Isolated([], {}, by_row=True)
    succeeded = 0
    for key in candidates:
        try:
            async with _atomic(conn):
                result.rows.extend(await one(key))
            succeeded += 1
        except psycopg.DatabaseError as exc:
            if not is_row_error(exc):
                raise
            result.failed[key] = exc
            handler = on_conflict if isinstance(exc, pg_errors.UniqueViolation) else on_error
            await _outcome(conn, what, key, exc, handler)
    # Refused for want of a privilege or an object (a role that may not write) and no row
    # went through: the statement could never run, and its caller must not report "0 changed".
    if _sqlstate(bulk_error).startswith("42") and not succeeded:
        raise bulk_error
    return result


async def _outcome(
    conn,
    what: str,
    key: Any,
    exc: Exception,
    handler: Callable[[Any, Exception], Awaitable[None]] | None,
) -> None:
    if handler is not None:
        try:
            async with _atomic(conn):
                await handler(key, exc)
            return
        except psycopg.DatabaseError as again:
            if not is_row_error(again):
                raise
            exc = again
    log.warning("%s: row %s left unchanged: %s: %s", what, key, type(exc).__name__, exc)


async def retry_deadlocks(
    fn: Callable[[], Awaitable[Any]], *, what: str, retries: int = DEADLOCK_RETRIES
) -> Any:
    """Await ``fn()`` (a whole transaction); on a deadlock run it again, at most ``retries``
    more times with a short jittered pause (deadlocks left after awa-fast's own global lock
    order involve other writers).

    Raises:
        DeadlockError: still deadlocking after the retries (nothing of ``fn`` was committed).
    """
    for attempt in range(retries + 1):
        try:
            return await fn()
        except pg_errors.DeadlockDetected as exc:
            if attempt == retries:
                raise DeadlockError(
                    f"{what}: deadlocked with concurrent work {retries + 1} "
                    f"times; nothing was written: {exc}"
                ) from exc
            log.info("%s deadlocked (%s); retry %d", what, exc, attempt + 1)
            await asyncio.sleep(random.uniform(0.005, 0.05) * (attempt + 1))
    raise AssertionError("unreachable")
