"""Shared helpers for the integration tests (real PostgreSQL, no mocks)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg


async def wait_for(
    predicate: Callable[[], Awaitable[Any]], timeout: float = 15.0, what: str = "condition"
) -> Any:
    """Poll ``predicate`` (an async callable) until it returns a truthy value; bounded by
    ``timeout`` seconds. Database state has no push signal, so tests poll it."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def job_row(dsn: str, job_id: int) -> dict:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute("SELECT * FROM awa_fast.jobs WHERE id = %s", (job_id,))
        return await cur.fetchone()


async def wait_state(dsn: str, job_id: int, *states: str, timeout: float = 15.0) -> dict:
    """Wait until job ``job_id`` is in one of ``states``; returns its row."""

    async def check():
        row = await job_row(dsn, job_id)
        return row if row and row["state"] in states else None

    return await wait_for(check, timeout, f"job {job_id} in {states}")


async def scalar(dsn: str, query: str, params: Any = None) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(query, params)
        return (await cur.fetchone())[0]


async def truncate(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "TRUNCATE awa_fast.jobs, awa_fast.queue_meta, awa_fast.dlq, "
            "awa_fast.callback_expressions, awa_fast.queue_descriptors, "
            "awa_fast.job_kind_descriptors, awa_fast.batch_operations CASCADE"
        )


@contextlib.asynccontextmanager
async def failing_rows(
    dsn: str,
    when: str,
    *,
    event: str = "INSERT",
    table: str = "awa_fast.jobs",
    name: str = "explode",
):
    """A trigger added outside awa-fast that fails every ``event`` (INSERT / UPDATE) of a row
    of ``table`` matching ``when`` (an SQL condition over NEW/OLD), as an unpredictable
    per-row error would (ADR-046's example); removed afterwards."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"""
            CREATE OR REPLACE FUNCTION public.{name}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'trigger added outside awa-fast'; END $$;
            DROP TRIGGER IF EXISTS {name} ON {table};
            CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW
                WHEN ({when}) EXECUTE FUNCTION public.{name}();""")
    try:
        yield
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f"DROP TRIGGER {name} ON {table}; DROP FUNCTION public.{name}()")


def exploding_inserts(dsn: str, kind: str = "explode"):
    """:func:`failing_rows` for every insert of ``kind`` into ``awa_fast.jobs``."""
    return failing_rows(dsn, f"NEW.kind = '{kind}'")
