"""Admin reads with postgres down answer within a bounded wait, not the pool's 30 s."""

from __future__ import annotations

import asyncio
import time

import pytest

import awa_fast as awa
from awa_fast.connections import ADMIN_POOL_WAIT_S

pytestmark = pytest.mark.integration


async def test_health_check_and_queue_stats_answer_promptly_with_postgres_down(own_server):
    c = awa.AsyncClient(own_server.awa_dsn)
    try:
        assert (await c.health_check()).postgres_connected  # the pool is open
        await asyncio.to_thread(own_server.halt, "immediate")
        bound = ADMIN_POOL_WAIT_S + 2  # a few seconds, far below the pool's 30 s

        t0 = time.monotonic()
        health = await asyncio.wait_for(c.health_check(), bound)
        assert not health.postgres_connected and not health.healthy
        assert time.monotonic() - t0 < bound

        with pytest.raises(awa.DatabaseError, match="unreachable"):
            await asyncio.wait_for(c.queue_stats(), bound)
    finally:
        await asyncio.to_thread(own_server.restart)
        await c.close()


async def test_health_check_answers_promptly_with_postgres_down_before_the_pool_opened(own_server):
    # The bounded wait covered a pool already open; a client whose first call found the
    # database down still waited the pool's 30 s open.
    c = awa.AsyncClient(own_server.awa_dsn)  # connects once at construction (as awa-pg)
    await asyncio.to_thread(own_server.halt, "immediate")
    try:
        bound = ADMIN_POOL_WAIT_S + 2
        health = await asyncio.wait_for(c.health_check(), bound)
        assert not health.postgres_connected
        with pytest.raises(awa.DatabaseError, match="unreachable"):
            await asyncio.wait_for(c.queue_stats(), bound)
    finally:
        await asyncio.to_thread(own_server.restart)
        await c.close()


async def test_an_open_cancelled_half_way_leaves_no_pool_running(own_server):
    # A bounded admin call's first open goes on in the background; cancelled mid-open (the
    # loop ending), it left the pool's workers, which ignore cancellation, running: the loop's
    # teardown then waited for ever.
    c = awa.AsyncClient(own_server.awa_dsn)
    await asyncio.to_thread(own_server.halt, "immediate")
    before = asyncio.all_tasks()  # (an earlier test's pool may still be opening: not ours)
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(c.pool(), 0.5)
        left = [
            t.get_name()
            for t in asyncio.all_tasks() - before
            if "-worker-" in t.get_name() or t.get_name().endswith("-scheduler")
        ]
        assert not left
    finally:
        await asyncio.to_thread(own_server.restart)
        await c.close()


async def test_an_open_that_outlives_close_closes_its_pool(own_server):
    c = awa.AsyncClient(own_server.awa_dsn)
    await asyncio.to_thread(own_server.halt, "immediate")
    opening = asyncio.ensure_future(c.pool())  # as a bounded admin call leaves it
    await asyncio.sleep(0)  # (it takes the pool lock and starts connecting)
    await c.close()
    await asyncio.to_thread(own_server.restart)
    with pytest.raises(awa.DatabaseUnavailable, match="closed while its pool was opening"):
        await opening
    assert c._pool is None
