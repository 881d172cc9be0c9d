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
