"""Issue 28, class 5: many concurrent transactions inserting unique jobs do not fill the shared
lock table (migration 027), and a full one reaches the caller as a typed error.

A server of the module's own with ``max_locks_per_transaction = 10`` (the least PostgreSQL
takes): its lock table holds a few thousand entries. Migration 026 locked up to 64 keys one by
one, each with its bucket shared: 100 transactions of 64 unique jobs each held about 12,800
entries at once and about a third of them failed with "out of shared memory"."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import awa_fast as awa
from tests.support import poll_until

N = 100  # concurrent transactions (the server allows 200 connections)
K = 64  # unique jobs each: 026 locked all of them one by one


@pytest.fixture(scope="module")
def small_lock_table(own_server):
    with psycopg.connect(own_server.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_locks_per_transaction = 10")
    own_server.restart()
    return own_server.awa_dsn


async def _lock_waiters_and_holders(dsn: str, holders: list) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        )
        waiting = (await cur.fetchone())[0]
    return waiting + len(holders) >= N


async def test_concurrent_unique_inserts_stay_within_the_lock_table(small_lock_table):
    dsn = small_lock_table
    client = awa.AsyncClient(dsn, max_connections=N + 2)
    release = asyncio.Event()
    holders: list[int] = []
    errors: list[BaseException] = []

    async def one(t: int) -> None:
        try:
            async with await client.transaction() as tx:
                await tx.insert_many(
                    [{"t": t, "i": i} for i in range(K)], kind="keyed", unique_opts={}
                )
                holders.append(t)
                await release.wait()  # every transaction holds its locks at once
        except Exception as exc:
            errors.append(exc)

    tasks = [asyncio.create_task(one(t)) for t in range(N)]
    try:
        # server state: each transaction has inserted (and holds its locks) or waits for a
        # lock another holds -- or failed
        await poll_until(
            lambda: _lock_waiters_and_holders(dsn, holders + errors),
            timeout=120,
            what="every transaction inserted or waiting",
        )
        release.set()
        await asyncio.gather(*tasks)
        assert not errors, [f"{type(e).__name__}: {e}" for e in errors[:3]]
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cur = await conn.execute("SELECT count(*) FROM awa_fast.jobs WHERE kind = 'keyed'")
            assert (await cur.fetchone())[0] == N * K
    finally:
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("DELETE FROM awa_fast.jobs WHERE kind = 'keyed'")
        await client.close()


async def test_a_full_lock_table_is_a_typed_error_naming_the_setting(small_lock_table):
    dsn = small_lock_table
    client = awa.AsyncClient(dsn, max_connections=1)
    await client.insert({"i": 0}, kind="keyed_full")  # its connection is open before the hog
    async with await psycopg.AsyncConnection.connect(dsn) as hog:
        # take advisory locks until the table is full (each in its own subtransaction: the
        # one that fails is undone, the others are held to the end of the transaction)
        await hog.execute(
            """DO $$ BEGIN FOR i IN 1..1000000 LOOP
                 BEGIN PERFORM pg_advisory_xact_lock(42, i);
                 EXCEPTION WHEN out_of_memory THEN EXIT; END;
               END LOOP; END $$"""
        )
        with pytest.raises(awa.DatabaseError) as info:
            await client.insert_many(
                [{"i": i} for i in range(200)], kind="keyed_full", unique_opts={}
            )
        assert "max_locks_per_transaction" in str(info.value)
        assert isinstance(info.value.__cause__, psycopg.errors.OutOfMemory)
        from awa_fast.retryable import retryable

        assert retryable(info.value)  # the finalizer and the loops retry it
        await hog.rollback()
    assert await client.insert({"i": 1}, kind="keyed_full", unique_opts={})  # room again
    await client.close()
