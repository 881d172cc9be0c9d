"""The data-access boundary (ADR 034): one repository per concern over ``awa_fast/sql/``.

A repository is bound to one connection, and so to the caller's transaction: it runs named
statements and returns named rows (a ``NamedTuple`` per statement shape, or a :class:`Job` for
whole jobs), so nothing above it calls ``.execute`` or reads a column by position. It never
opens a connection, begins or commits a transaction: that scope is the caller's decision. Where
a statement's failure is part of a method's contract (a unique key held elsewhere), the method
takes a savepoint and says so in its result. Errors of the driver pass through unchanged
(``db_errors`` maps them at the public boundary).

What stays outside: the hot paths whose decoding is a tuple-speed path of its own (the claim's
``JobContext`` construction, the finalizer's compact completions) and the modules listed in
``tests/structure/test_data_access.py`` with the reason each is not converted yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from psycopg.rows import BaseRowFactory, RowMaker

R = TypeVar("R")


class RowShapeError(RuntimeError):
    """A statement's columns are not the named row's fields (a bug: the statement or the row
    type changed without the other)."""


def named(row_type: type[R]) -> BaseRowFactory[R]:
    """A psycopg row factory making ``row_type`` (a ``NamedTuple``) from each row, after
    checking once per result that the statement's column names are its fields, in order.

    Raises:
        RowShapeError: the columns differ (names the statement's and the type's).
    """
    shape: Any = row_type  # a NamedTuple class: _fields and _make are its own
    return shaped(shape._fields, shape._make, row_type.__name__)


def shaped(columns: tuple[str, ...], make: Callable[[Any], R], name: str) -> BaseRowFactory[R]:
    """A psycopg row factory calling ``make`` on each row's values, after checking once per
    result that the statement's column names are ``columns``, in order (``name``: the row's
    name in the error). :func:`named` for a row that is not a ``NamedTuple`` (a ``Job``, a
    job with leading columns of its own).

    Raises:
        RowShapeError: the columns differ (names the statement's and ``columns``).
    """

    def factory(cursor: Any) -> RowMaker[R]:
        described = cursor.description
        if described is not None:
            found = tuple(column.name for column in described)
            if found != columns:
                raise RowShapeError(f"the statement returns columns {found}; {name} has {columns}")
        return make

    return factory


class Repo:
    """A repository: bound to ``conn`` (a psycopg ``AsyncConnection``), and so to the
    caller's transaction; its methods run named statements and return named rows."""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def _all(self, rows: BaseRowFactory[R], statement: str, params: Any = None) -> list[R]:
        """Every row of ``statement``, made by the row factory ``rows``."""
        cur = self.conn.cursor(row_factory=rows)
        await cur.execute(statement, params)
        found: list[R] = await cur.fetchall()
        return found

    async def _one(self, rows: BaseRowFactory[R], statement: str, params: Any = None) -> R | None:
        """The first row of ``statement`` made by ``rows``, or ``None``."""
        cur = self.conn.cursor(row_factory=rows)
        await cur.execute(statement, params)
        found: R | None = await cur.fetchone()
        return found

    async def _value(self, statement: str, params: Any = None) -> Any:
        """The first column of the first row of ``statement``, or ``None``."""
        row = await (await self.conn.execute(statement, params)).fetchone()
        return None if row is None else row[0]
