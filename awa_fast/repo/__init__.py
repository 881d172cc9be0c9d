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
    fields: tuple[str, ...] = shape._fields
    make = shape._make

    def factory(cursor: Any) -> RowMaker[R]:
        described = cursor.description
        if described is not None:
            columns = tuple(column.name for column in described)
            if columns != fields:
                raise RowShapeError(
                    f"the statement returns columns {columns}; {row_type.__name__} has {fields}"
                )
        return make

    return factory
