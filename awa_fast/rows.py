"""The row of a statement that always returns exactly one (an aggregate, ``SELECT f(...)``, an
``UPDATE ... RETURNING`` of a row that exists): typed, so callers index it without a check."""

from __future__ import annotations

from typing import Any

import psycopg


async def one_row(cur: psycopg.AsyncCursor[Any]) -> tuple[Any, ...]:
    """The next row of ``cur`` (a tuple row factory).

    Raises:
        LookupError: the statement returned no row (it always returns one: a bug, not a state
            of the database).
    """
    row = await cur.fetchone()
    if row is None:
        raise LookupError("a statement that always returns one row returned none")
    return tuple(row)


def one_row_sync(cur: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """Blocking twin of :func:`one_row`."""
    row = cur.fetchone()
    if row is None:
        raise LookupError("a statement that always returns one row returned none")
    return tuple(row)
