"""Driver errors become the awa-fast error tree: one mapping, applied where a call leaves awa-fast.

Every public call (the clients' and their transactions' methods, ``awa_fast.migrate``, the
bridge's inserts, a handler's database calls on its job, the test client) raises a typed
:class:`~awa_fast.errors.AwaError` in place of a driver's exception (psycopg, psycopg_pool, and
through the bridge asyncpg, psycopg2, SQLAlchemy and Django), naming the operation, with the
driver's exception as its ``__cause__``. The code below those calls raises and catches the
driver's exceptions among itself (the finalizer and the maintenance loops decide retries from
them): the mapping is made once, at the boundary, by :func:`translate`, through
:func:`boundary` (a class's coroutine methods), :func:`maps` (one function) or :func:`mapped`
(a block).

By SQLSTATE (awa-pg's names where it has one: ``UniqueConflict``, ``SchemaNotMigrated``,
``DatabaseError``):

=================================  ===================================================
23505 unique_violation             :class:`UniqueConflict` (``constraint``)
23514 check_violation on awa_fast  :class:`ValidationError` (``field`` = constraint)
42P01 / 3F000 / 42883 on awa_fast  :class:`SchemaNotMigrated` (table, schema, function)
40P01 deadlock_detected            :class:`DeadlockError`
25006 read_only_sql_transaction    :class:`ReadOnlyDatabase`
08xxx, 57P01-03, no SQLSTATE,      :class:`DatabaseUnavailable`
pool timeout (not PoolBusy),
closed pool
anything else                      :class:`DatabaseError`
=================================  ===================================================

Every error carries ``operation`` and ``sqlstate`` (``DatabaseError``'s attributes) where it is a
``DatabaseError``; its message is one line: ``"<operation>: <what>: <driver text>"``.
Decision and alternatives: docs/adr/025-typed-database-errors-and-job-size-bounds.md.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from awa_fast.errors import (
    AwaError,
    DatabaseError,
    DatabaseUnavailable,
    DeadlockError,
    ReadOnlyDatabase,
    SchemaNotMigrated,
    UniqueConflict,
    ValidationError,
)

UNIQUE_INDEX = "idx_awa_fast_jobs_unique"
SCHEMA = "awa_fast"
# The server shutting down, crashed, or starting up: its connections are gone (SQLSTATE 57P0x).
SERVER_GONE = frozenset({"57P01", "57P02", "57P03"})
_MISSING_OBJECT = frozenset({"42P01", "3F000", "42883"})  # table, schema, function

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)


def sqlstate_of(exc: BaseException) -> tuple[str | None, BaseException]:
    """``(SQLSTATE, the driver's own exception)`` of ``exc``, looking through SQLAlchemy's
    ``.orig`` and Django's ``__cause__`` wrappers (psycopg and asyncpg: ``sqlstate``, psycopg2:
    ``pgcode``); ``(None, exc)`` when none carries one."""
    seen = exc
    for _ in range(4):
        code = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if isinstance(code, str):
            return code, seen
        nxt = getattr(seen, "orig", None) or seen.__cause__
        if nxt is None:
            break
        seen = nxt
    return None, exc


def is_driver_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a database driver's error: a psycopg (or psycopg_pool) one, or any
    exception carrying a SQLSTATE (asyncpg, psycopg2, SQLAlchemy and Django wrappers)."""
    return isinstance(exc, psycopg.Error) or sqlstate_of(exc)[0] is not None


def _text(exc: BaseException) -> str:
    """The driver's message on one line (DETAIL and HINT lines joined)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _diag(orig: BaseException, name: str) -> str | None:
    value = getattr(getattr(orig, "diag", None), name, None)
    if value is None:
        value = getattr(orig, name, None)  # asyncpg's attributes
    return value if isinstance(value, str) else None


def _on_awa_fast(orig: BaseException) -> bool:
    """Whether the error names an awa_fast object (a user's own SQL in a transaction or the
    bridge may fail on objects of its own: those are not an unmigrated awa_fast schema)."""
    if _diag(orig, "schema_name") == SCHEMA:
        return True
    return f"{SCHEMA}." in str(orig) or f'"{SCHEMA}"' in str(orig)


def _unavailable(exc: BaseException, code: str | None) -> bool:
    if isinstance(exc, (psycopg_pool.PoolClosed, psycopg_pool.PoolTimeout)):
        # connections.PoolBusy (a PoolTimeout): every connection was in use, the database is up
        return not getattr(exc, "database_reachable", False)
    if code is None:
        return isinstance(exc, psycopg.OperationalError)  # libpq's own: connect failed / lost
    return code.startswith("08") or code in SERVER_GONE


def translate(exc: BaseException, operation: str) -> AwaError:
    """The awa-fast error for the driver error ``exc`` raised by ``operation`` (the module's
    table); an :class:`AwaError` is returned as is. The caller raises it ``from exc``."""
    if isinstance(exc, AwaError):
        return exc
    code, orig = sqlstate_of(exc)
    text = _text(orig)
    where = operation
    if code == "23505":
        constraint = _diag(orig, "constraint_name")
        return UniqueConflict(
            f"unique key already held by another job ({constraint or UNIQUE_INDEX})",
            constraint=constraint,
        )
    if code == "23514" and _on_awa_fast(orig):
        return ValidationError(text, field=_diag(orig, "constraint_name"))
    if code in _MISSING_OBJECT and _on_awa_fast(orig):
        return SchemaNotMigrated(
            f"{where}: the awa_fast schema is missing or incomplete ({text}): "
            "run `awa-fast migrate`"
        )
    if code == "40P01":
        return DeadlockError(
            f"{where}: deadlocked with concurrent work; nothing was written: {text}",
            operation=operation,
            sqlstate=code,
        )
    if code == "25006":
        return ReadOnlyDatabase(
            f"{where}: the database is read-only (default_transaction_read_only, a hot "
            f"standby or a read-only transaction), nothing was written: {text}",
            operation=operation,
            sqlstate=code,
        )
    if code == "53200" and "shared memory" in text:
        return DatabaseError(
            f"{where}: the database's shared lock table is full (out of shared memory): too "
            "many transactions hold locks at once; nothing was written, retry it. Unique keys "
            "take at most max_locks_per_transaction / 2 one-by-one locks per transaction "
            "(migration 027); raise max_locks_per_transaction, or hold fewer or shorter "
            "transactions open",
            operation=operation,
            sqlstate=code,
        )
    if _unavailable(exc, code):
        return DatabaseUnavailable(
            f"{where}: the database is unreachable or the connection was lost: {text}",
            operation=operation,
            sqlstate=code,
        )
    state = f" (SQLSTATE {code})" if code else ""
    return DatabaseError(
        f"{where}: database error{state}: {text}", operation=operation, sqlstate=code
    )


@contextlib.contextmanager
def mapped(operation: str) -> Iterator[None]:
    """Raise the block's driver errors as :func:`translate` maps them for ``operation``,
    chained. An :class:`AwaError` (a public call made inside, which named itself) and any
    other exception pass unchanged."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, AwaError) or not is_driver_error(exc):
            raise
        raise translate(exc, operation) from exc


def maps(operation: str) -> Callable[[F], F]:
    """Decorator: the (coroutine) function's driver errors are raised as :func:`translate`
    maps them for ``operation``, chained (as :func:`mapped`, without its generator's cost)."""

    def decorate(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await fn(*args, **kwargs)
                except Exception as exc:
                    if isinstance(exc, AwaError) or not is_driver_error(exc):
                        raise
                    raise translate(exc, operation) from exc

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if isinstance(exc, AwaError) or not is_driver_error(exc):
                    raise
                raise translate(exc, operation) from exc

        return run  # type: ignore[return-value]

    return decorate


def boundary(prefix: str = "") -> Callable[[C], C]:
    """Class decorator: every public coroutine method defined in the class body maps driver
    errors as :func:`maps` does, for the operation ``prefix + method name`` (``"insert"``,
    ``"transaction.commit"``). A public call made inside another names itself."""

    def decorate(cls: C) -> C:
        for name, value in list(vars(cls).items()):
            if not name.startswith("_") and inspect.iscoroutinefunction(value):
                setattr(cls, name, maps(prefix + name)(value))
        return cls

    return decorate
