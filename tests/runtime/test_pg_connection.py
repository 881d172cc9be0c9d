"""awa_fast.pg_connection.Connection: a statement cancelled mid-way (an asyncio timeout) is
cancelled in the server the way libpq does it, and never blocks the process (ADR 023). Real
PostgreSQL; the frozen server of the ADR is in test_hardening_shutdown.py and test_dashboard.py."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from awa_fast.pg_connection import Connection

pytestmark = pytest.mark.integration


def _as_role(dsn: str, role: str, **extra: str) -> str:
    params = conninfo_to_dict(dsn)
    params.update(user=role, **extra)
    return make_conninfo(**params)


async def _cancelled_sleep(url: str) -> tuple[Connection, int, float]:
    conn = await Connection.connect(url, autocommit=True)
    pid = conn.info.backend_pid
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await conn.execute("SELECT pg_sleep(30)")
    return conn, pid, time.monotonic() - started


def _state(dsn: str, pid: int) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return None if row is None else row[0]


async def _cancelled_and_idle(dsn: str, url: str) -> None:
    """A sleep on ``url`` cancelled by a timeout: promptly, its backend idle, the connection
    reusable."""
    conn, pid, took = await _cancelled_sleep(url)
    try:
        assert took < 3 and not conn.closed, took
        assert _state(dsn, pid) == "idle"
        assert (await (await conn.execute("SELECT 1")).fetchone()) == (1,)
    finally:
        await conn.close()


async def test_a_cancelled_statement_ends_in_the_server_and_the_connection_is_reused(dsn):
    await _cancelled_and_idle(dsn, dsn)


async def test_the_cancel_needs_no_second_connection_slot(dsn):
    # A cancel sent as pg_cancel_backend over a second connection failed when the server had
    # no slot left for it (max_connections, a role's CONNECTION LIMIT): the statement ran on
    # (breaker helper). The protocol's cancel request takes no slot.
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP ROLE IF EXISTS awa_fast_one_slot")
        c.execute("CREATE ROLE awa_fast_one_slot LOGIN CONNECTION LIMIT 1")
    await _cancelled_and_idle(dsn, _as_role(dsn, "awa_fast_one_slot"))


async def test_the_cancel_works_for_a_session_acting_as_another_role(dsn):
    # Logged in as one role, acting as another (options=-c role=...): pg_cancel_backend from a
    # second session was refused by its privilege check (breaker helper).
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP ROLE IF EXISTS awa_fast_acting")
        c.execute("CREATE ROLE awa_fast_acting NOLOGIN")
    params = conninfo_to_dict(dsn)
    params["options"] = "-c role=awa_fast_acting"
    await _cancelled_and_idle(dsn, make_conninfo(**params))
