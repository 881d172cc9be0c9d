"""Issue 28, class 4: one classification of database errors (``awa_fast/retryable.py``), and no
retry of what cannot succeed. Each class is met as a real error from a real server; the
finalizer, heartbeat and maintenance loops act on it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import psycopg
import pytest

import awa_fast as awa
from awa_fast import bulk
from awa_fast.retryable import Retry, classify, retryable
from tests.support import FAST, passes, until

pytestmark = pytest.mark.usefixtures("clean")


@dataclasses.dataclass
class Hold:
    n: int = 0


async def _error(dsn: str, statement: str, setup: str | None = None) -> BaseException:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        if setup:
            await conn.execute(setup)
        with pytest.raises(psycopg.Error) as info:
            await conn.execute(statement)
        return info.value


async def test_a_lock_timeout_and_a_lost_connection_are_transient(dsn):
    async with await psycopg.AsyncConnection.connect(dsn) as holder:
        await holder.execute("CREATE TABLE IF NOT EXISTS retry_probe (x int)")
        await holder.commit()
        await holder.execute("LOCK TABLE retry_probe IN ACCESS EXCLUSIVE MODE")
        timed_out = await _error(dsn, "SELECT * FROM retry_probe", "SET lock_timeout = '10ms'")
        await holder.rollback()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as victim:
        pid = victim.info.backend_pid
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as killer:
            await killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.Error) as lost:
            await victim.execute("SELECT 1")
    assert classify(timed_out) is Retry.TRANSIENT and retryable(timed_out)
    assert classify(lost.value) is Retry.TRANSIENT and retryable(lost.value)


async def test_a_refused_row_and_a_value_too_large_are_row_errors(dsn):
    refused = await _error(dsn, "SELECT 1/0")
    too_large = await _error(dsn, "SELECT repeat('x', 1024*1024*1024)")  # program limit (54)
    for exc in (refused, too_large):
        assert classify(exc) is Retry.ROW and not retryable(exc)
        assert bulk.is_row_error(exc)  # the bulk statements redo such a batch row by row


async def test_a_write_refused_as_read_only_is_retried_on_a_new_connection(dsn):
    # (a standby, or a primary fenced for a switchover: the next connection libpq opens on a
    # multi-host URL reaches the writable server; ADR 035)
    exc = await _error(
        dsn,
        "CREATE TABLE retry_read_only (x int)",
        "SET default_transaction_read_only = on",
    )
    assert isinstance(exc, psycopg.errors.ReadOnlySqlTransaction)
    assert classify(exc) is Retry.TRANSIENT and retryable(exc)
    assert not bulk.is_row_error(exc)


async def test_an_invalid_transaction_state_blocks_every_statement(dsn):
    exc = await _error(dsn, "SELECT 1; SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", "BEGIN")
    assert isinstance(exc, psycopg.errors.ActiveSqlTransaction)  # 25001
    assert classify(exc) is Retry.BLOCKED and not retryable(exc)


async def test_a_closed_pool_is_closed_for_good(dsn):
    client = awa.AsyncClient(dsn)
    pool = await client.pool()
    await client.close()
    with pytest.raises(psycopg.Error) as info:
        async with pool.connection():
            pass
    assert classify(info.value) is Retry.CLOSED and not retryable(info.value)
    # the typed wrapper is classified by its cause
    wrapped = awa.DatabaseError("insert failed")
    wrapped.__cause__ = info.value
    assert classify(wrapped) is Retry.CLOSED


async def test_the_finalizer_does_not_retry_into_a_closed_pool(dsn, caplog):
    client = awa.AsyncClient(dsn)
    gate = asyncio.Event()

    @client.task(Hold)
    async def hold(job):
        await gate.wait()

    await client.start([("default", 40)], **FAST)
    ids = [j.id for j in await client.insert_many([Hold(i) for i in range(30)])]
    runtime = client.runtime
    await until(lambda: len(runtime.in_flight) == len(ids), runtime, what="30 attempts running")
    finalizer = runtime.finalizer
    await (await client.pool()).close()  # the pool closes under the running attempts
    caplog.set_level(logging.WARNING)
    gate.set()
    await runtime.wait_attempts_ended(len(ids))
    assert finalizer.stats["retries"] == 0
    retried = [r for r in caplog.records if "retry" in r.getMessage()]
    assert not retried, retried[:3]
    # each attempt: one line at most, none "finalizing it alone" or "recording a prompt failure"
    per_job = [r for r in caplog.records if "alone" in r.getMessage() or "prompt" in r.getMessage()]
    assert not per_job, per_job[:3]
    await client.shutdown(timeout_ms=2000)
    client._pool = None  # closed above
    await client.close()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM awa_fast.jobs WHERE id = ANY(%s) AND state = 'running'", (ids,)
        )
        # nothing could be written: they stay running for the rescue (no second execution)
        assert (await cur.fetchone())[0] == len(ids)


async def test_maintenance_loops_stop_once_the_pool_is_closed(dsn, caplog):
    client = awa.AsyncClient(dsn)

    @client.task(Hold)
    async def hold(job):
        pass

    await client.start([("default", 1)], **FAST)
    runtime = client.runtime
    maintenance = runtime.maintenance
    await until(lambda: maintenance.is_leader, maintenance.leadership, what="leadership")
    promote = passes(client, "promote")
    await promote.after(promote.count)
    caplog.set_level(logging.INFO)
    await (await client.pool()).close()
    ended = await until(
        lambda: [
            t
            for t in maintenance.scheduler.tasks
            if t.get_name() == "awa-maint-promote" and t.done()
        ],
        promote,
        what="the promote loop to end",
    )
    assert ended and not maintenance.loops["promote"].alive
    assert "PoolClosed" in (maintenance.loops["promote"].last_error or "")
    backed_off = [r for r in caplog.records if "maintenance promote failed" in r.getMessage()]
    assert not backed_off
    await client.shutdown(timeout_ms=2000)
    client._pool = None
    await client.close()


async def test_a_lost_heartbeat_connection_is_classified_transient_and_reopened(dsn):
    from awa_fast.worker.heartbeat import Heartbeat

    client = awa.AsyncClient(dsn)
    gate = asyncio.Event()

    @client.task(Hold)
    async def hold(job):
        await gate.wait()

    await client.start([("default", 1)], **FAST)
    runtime = client.runtime
    await client.insert(Hold())
    await until(lambda: runtime.in_flight, runtime, what="an attempt running")
    beat = Heartbeat(client.pool, lambda: list(runtime.in_flight.values()), 60, database_url=dsn)
    await beat.beat()
    first = beat._conn
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as killer:
        await killer.execute("SELECT pg_terminate_backend(%s)", (first.info.backend_pid,))
    with pytest.raises(psycopg.OperationalError):
        await beat.beat()
    assert beat._conn is None  # transient: dropped, reopened at the next beat
    await beat.beat()
    assert beat._conn is not None and beat._conn is not first
    await beat.close()
    gate.set()
    await client.shutdown(timeout_ms=2000)
    await client.close()
