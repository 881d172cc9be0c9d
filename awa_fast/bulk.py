"""Bulk statements that one bad row cannot fail for the others, and bounded deadlock retry.

Every bulk statement of awa-fast (claim, promote, rescue, heartbeat, complete, retry_failed,
drain_queue, DLQ bulk retry) runs through :func:`run_isolated`: the bulk statement first; if it
fails because of a row (a unique collision, a trigger that raises, bad data) it is redone row by
row with the row-by-row twin statement, which carries the same guard fragment (``awa_fast.sql``
builds both from one fragment; ``tests/faults/test_one_row_never_wedges_a_statement.py`` checks every pair). A row that
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
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus

from awa_fast.errors import DeadlockError
from awa_fast.retryable import Retry, classify

log = logging.getLogger("awa_fast.bulk")

DEADLOCK_RETRIES = 3
REMEMBERED = 10_000  # rows a maintenance pass remembers as left unchanged (Recurring.left)


def is_row_error(exc: BaseException) -> bool:
    """True for a database error caused by the data of a statement (constraint, trigger, data
    error, a value past a program limit): ``retryable.classify`` calls it ``ROW``. False for one
    about the session or the server -- connection, deadlock, cancel, an unsupported feature
    (SQLSTATE class 0A), the transaction's state (25, e.g. a read-only transaction) -- which
    every row would meet the same way. (A privilege or a missing object, class 42, is about the
    role or the schema too, but a trigger may raise such a code for one row: see
    :func:`run_isolated`.)"""
    return isinstance(exc, psycopg.DatabaseError) and classify(exc) is Retry.ROW


def _sqlstate(exc: BaseException) -> str:
    return getattr(exc, "sqlstate", None) or ""


class Recurring:
    """The warnings of one maintenance pass about stored rows it cannot process (a cron row
    whose expression does not parse, a job row a trigger refuses): the row fails the same way
    every pass, and a warning per pass would repeat for ever.

    A problem (``key``: which row) is warned about once; while later passes report it with the
    same ``signature`` (the row's definition and the error), it is logged at DEBUG. It is
    warned about again when its signature changes, or when it comes back after a pass that ran
    without it (:meth:`pass_done`: the row was fixed or left, and failed anew). Errors that are
    not about a row (a lost connection, a lock wait) never come here: they are logged as they
    happen. One instance per pass and per process: a new leader warns once again.
    """

    def __init__(self) -> None:
        self._warned: dict[Hashable, Hashable] = {}
        self._this_pass: set[Hashable] = set()
        # Rows the pass's row-by-row redo left unchanged, oldest first (at most REMEMBERED):
        # its next redo takes its fresh candidates without them, so they cannot hide the rows
        # behind them, and retries them apart (``run_isolated`` with ``batch``).
        self.left: dict[Any, None] = {}

    def keep(self, key: Hashable) -> None:
        """``key`` was not tried this pass but still stands (a remembered row whose retry
        waits its turn): keep its warning as if reported."""
        self._this_pass.add(key)

    def warn(
        self, logger: logging.Logger, key: Hashable, signature: Hashable, msg: str, *args: Any
    ) -> None:
        """Log ``msg % args`` at WARNING, or at DEBUG if ``key`` was warned about with this
        ``signature`` and reported in every pass since."""
        self._this_pass.add(key)
        if key in self._warned and self._warned[key] == signature:
            logger.debug(msg, *args)
            return
        self._warned[key] = signature
        logger.warning(msg + " (warned once: repeats go to DEBUG until it changes)", *args)

    def pass_done(self) -> None:
        """End of a complete pass: forget the problems it did not report (call it only when
        the pass saw every row it covers; a pass cut short keeps what it had)."""
        self._warned = {k: v for k, v in self._warned.items() if k in self._this_pass}
        self._this_pass = set()

    def remember(self, key: Any) -> None:
        """``key``'s row was left unchanged (again): to the back of :attr:`left`, dropping the
        oldest beyond ``REMEMBERED`` (a dropped row becomes a fresh candidate again)."""
        self.left.pop(key, None)
        self.left[key] = None
        while len(self.left) > REMEMBERED:
            del self.left[next(iter(self.left))]


def error_signature(exc: BaseException) -> tuple[str, ...]:
    """What makes two errors "the same" for :class:`Recurring`: type and message; for a
    database error (or one raised from it, as the insert's typed errors are) its SQLSTATE,
    primary message and constraint, not its DETAIL (which may quote the failing row, with a
    new id or timestamp on every try)."""
    db = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    primary = db.diag.message_primary if isinstance(db, psycopg.Error) else None
    if isinstance(db, psycopg.Error) and primary is not None:
        diag = db.diag
        return (
            type(exc).__name__,
            diag.sqlstate or "",
            primary,
            diag.constraint_name or "",
        )
    return type(exc).__name__, str(exc)


def warn_row(
    recurring: Recurring | None,
    logger: logging.Logger,
    key: Hashable,
    signature: Hashable,
    msg: str,
    *args: Any,
) -> None:
    """:meth:`Recurring.warn`, or a plain warning without ``recurring`` (a call by hand)."""
    if recurring is None:
        logger.warning(msg, *args)
    else:
        recurring.warn(logger, key, signature, msg, *args)


def _warn(recurring: Recurring | None, key: Hashable, exc: Exception, msg: str, *args) -> None:
    warn_row(recurring, log, key, error_signature(exc), msg, *args)


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
    ``by_row`` is True when the bulk statement failed and rows were redone one by one.
    ``left`` is how many rows the pass remembers as left unchanged (with ``batch``: this call's
    and earlier calls' not yet cleared; otherwise this call's, a handled conflict included)."""

    rows: list
    failed: dict
    by_row: bool = False
    left: int = 0


async def run_isolated(
    conn: psycopg.AsyncConnection,
    *,
    what: str,
    bulk: Callable[[], Awaitable[list]],
    keys: Iterable | Callable[..., Awaitable[Iterable]],
    one: Callable[[Any], Awaitable[list]],
    on_conflict: Callable[[Any, Exception], Awaitable[None]] | None = None,
    on_error: Callable[[Any, Exception], Awaitable[None]] | None = None,
    recurring: Recurring | None = None,
    ends_pass: bool = True,
    batch: int | None = None,
    most: int | None = None,
) -> Isolated:
    """Run ``bulk()`` (one statement); if a row makes it fail, run ``one(key)`` (one statement)
    for every key of ``keys`` (a list, or an async callable returning the candidate keys).

    On ``conn`` in autocommit mode each statement is its own transaction; inside the caller's
    transaction each runs under a savepoint. A key whose statement fails with a unique
    violation gets ``on_conflict(key, exc)``, any other row error ``on_error(key, exc)``; each
    runs under its own savepoint, and if it fails too the row is left unchanged (logged).

    ``recurring``: a maintenance pass that meets the same rows every pass passes its own; each
    call is one pass of it, so a row left unchanged pass after pass is warned about once. A
    pass made of several calls (chunks) passes ``ends_pass=False`` and calls
    :meth:`Recurring.pass_done` itself after its last.

    ``batch`` (a pass that takes ``LIMIT batch`` candidates, with ``recurring``): ``keys`` is
    then ``keys(skip)``, the candidates without the keys in ``skip``. The redo takes its fresh
    candidates without the rows earlier passes left unchanged (``recurring.left``), so a
    batch's worth of refused rows at the head cannot hide the rows behind them (ADR 009), and
    then retries at most ``batch`` of the remembered rows, oldest first (one that goes through
    or no longer matches is forgotten; one that fails again goes to the back). Each pass runs
    at most ``2 * batch`` row statements and one candidate statement.

    ``most``: the redo stops after that many rows (a claim takes no more than its free slots).

    Raises:
        psycopg.OperationalError: connection lost, deadlock, ... (the caller retries the call).
    """
    try:
        async with _atomic(conn):
            rows = await bulk()
        if recurring is not None and ends_pass:
            recurring.pass_done()
            recurring.left.clear()  # the head went through: forget (the rest meet it anew)
        return Isolated(rows, {})
    except psycopg.DatabaseError as exc:
        if not is_row_error(exc):
            raise
        bulk_error = exc
        _warn(
            recurring,
            "bulk",
            exc,
            "%s: the bulk statement failed (%s: %s); redoing it row by row",
            what,
            type(exc).__name__,
            exc,
        )
    remembered: list = []
    if batch is not None and recurring is not None:
        remembered = list(recurring.left)
    if not callable(keys):
        candidates = keys
    elif batch is not None:
        candidates = await keys(remembered)
    else:
        candidates = await keys()
    by_row = _RowByRow(conn, what, one, on_conflict, on_error, recurring, batch, most)
    await by_row.run(candidates, remembered)
    # Refused for want of a privilege or an object (a role that may not write) and no row
    # went through: the statement could never run, and its caller must not report "0 changed".
    if _sqlstate(bulk_error).startswith("42") and not by_row.succeeded:
        raise bulk_error
    if recurring is not None and ends_pass:
        recurring.pass_done()
    result = by_row.result
    result.left = len(recurring.left) if batch is not None and recurring else len(result.failed)
    return result


class _RowByRow:
    """The redo of :func:`run_isolated` after its bulk statement failed: one statement per key,
    each under its own savepoint (or transaction), with what each refused row leads to."""

    def __init__(
        self,
        conn: psycopg.AsyncConnection,
        what: str,
        one: Callable[[Any], Awaitable[list]],
        on_conflict: Callable[[Any, Exception], Awaitable[None]] | None,
        on_error: Callable[[Any, Exception], Awaitable[None]] | None,
        recurring: Recurring | None,
        batch: int | None,
        most: int | None,
    ):
        self.conn, self.what, self.one = conn, what, one
        self.on_conflict, self.on_error = on_conflict, on_error
        self.recurring, self.batch, self.most = recurring, batch, most
        self.result = Isolated([], {}, by_row=True)
        self.succeeded = 0

    def full(self) -> bool:
        return self.most is not None and self.succeeded >= self.most

    async def run(self, candidates: Iterable, remembered: list) -> None:
        """Redo the fresh ``candidates``, then (a batched pass) at most ``batch`` of the rows
        earlier passes left unchanged, oldest first."""
        tried = set()
        for key in candidates:
            if self.full():
                break
            tried.add(key)
            await self.redo(key)
        if self.batch is None or self.recurring is None:
            return
        for i, key in enumerate(remembered):
            if key in tried:
                continue
            if i < self.batch and not self.full():
                await self.redo(key)
            else:  # waits its turn: still left unchanged, still warned about once
                self.recurring.keep(("row", key))

    async def redo(self, key: Any) -> None:
        recurring = self.recurring
        try:
            async with _atomic(self.conn):
                self.result.rows.extend(await self.one(key))
            self.succeeded += 1
            if recurring is not None:
                recurring.left.pop(key, None)
        except psycopg.DatabaseError as exc:
            if not is_row_error(exc):
                raise
            self.result.failed[key] = exc
            unique = isinstance(exc, pg_errors.UniqueViolation)
            handler = self.on_conflict if unique else self.on_error
            left = await _outcome(self.conn, self.what, key, exc, handler, recurring)
            if recurring is not None and self.batch is not None:
                if left:
                    recurring.remember(key)
                else:  # its outcome ran (cancelled as a duplicate): not left unchanged
                    recurring.left.pop(key, None)


async def _outcome(
    conn,
    what: str,
    key: Any,
    exc: Exception,
    handler: Callable[[Any, Exception], Awaitable[None]] | None,
    recurring: Recurring | None,
) -> bool:
    """Run the failed row's outcome; True when the row is left unchanged (no handler, or it
    failed too; logged)."""
    if handler is not None:
        try:
            async with _atomic(conn):
                await handler(key, exc)
            return False
        except psycopg.DatabaseError as again:
            if not is_row_error(again):
                raise
            exc = again
    _warn(
        recurring,
        ("row", key),
        exc,
        "%s: row %s left unchanged: %s: %s",
        what,
        key,
        type(exc).__name__,
        exc,
    )
    return True


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
