"""A live attempt keeps its heartbeat once its row is re-claimed, and with every connection held."""

from __future__ import annotations

import asyncio

import pytest

import awa_fast as awa
from tests import support
from tests.support import Job, scalar, until, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "consequence_backoff_ms": 50}

pytestmark = pytest.mark.usefixtures("clean", "no_presence_rows")


async def test_a_reclaimed_job_keeps_its_in_flight_bookkeeping(dsn, client):
    first_started, release_first = asyncio.Event(), asyncio.Event()
    second_started, release_second = asyncio.Event(), asyncio.Event()

    @client.task(Job)
    async def work(job):
        if job.attempt == 1 and not first_started.is_set():
            first_started.set()
            await release_first.wait()  # ignores the cancel flag
        else:
            second_started.set()
            await release_second.wait()

    job = await client.insert(Job("x"))
    await client.start([("default", 4)], **FAST)
    await first_started.wait()
    # Superseded as rescue would (cancel + retry now refuses while the attempt runs):
    # the row is re-claimed under lease 2 while the first handler still runs.
    await scalar(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'available', heartbeat_at = NULL "
        "WHERE id = %s RETURNING id",
        (job.id,),
    )
    await second_started.wait()
    release_first.set()  # the old attempt ends while the new one runs
    await until(lambda: client.runtime.finalizer.stats["stale"], client, what="stale old attempt")
    ctx = client.runtime.in_flight.get((job.id, 2))
    assert ctx is not None and ctx.run_lease == 2  # still tracked: heartbeats continue
    release_second.set()
    row = await wait_state(client, job.id, "completed")
    assert row["run_lease"] == 2


# Issue 9, class 4/5: handlers that hold every pool connection (max_connections below the slots,
# each handler in a transaction of its own) starved the heartbeat of a connection: the leader
# rescued the live attempts as "heartbeat stale" and ran them again, over and over (the jobs never
# completed). Beats now go over a connection of their own.


async def test_handlers_holding_every_pool_connection_do_not_go_stale(dsn):
    worker = awa.AsyncClient(dsn, max_connections=2)
    leader = awa.AsyncClient(dsn)
    runs = []

    @worker.task(Job, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def hold(job):
        runs.append((job.id, job.run_lease))
        async with await worker.transaction() as tx:
            await tx.execute("SELECT pg_sleep(1.6)")  # longer than the staleness

    leader.failure_consequence(Job, awa.NO_FAILURE_CONSEQUENCE)  # a maintenance-only process
    try:
        jobs = await worker.insert_many([Job(str(i)) for i in range(3)])
        await worker.start(
            [("default", 3)],
            poll_interval_ms=50,
            heartbeat_interval_ms=100,
            heartbeat_staleness_ms=1000,
            maintenance=False,
        )
        await leader.start(
            [("idle_q", 1)],
            poll_interval_ms=50,
            heartbeat_interval_ms=100,
            heartbeat_staleness_ms=1000,
            heartbeat_rescue_interval_ms=100,
            leader_election_interval_ms=100,
            promote_interval_ms=50,
        )
        for job in jobs:
            row = await wait_state([worker, leader], job.id, "completed", timeout=20)
            assert row["errors"] == [] and row["run_lease"] == 1, row
        assert sorted(runs) == [(j.id, 1) for j in jobs]  # each ran once
    finally:
        await worker.close()
        await leader.close()
