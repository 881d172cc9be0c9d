"""The opt-in batched path for completions with follow-ups (start(staged_completions=
"batched")): the same ADR-046 guarantees as the per-job transaction, many jobs per commit."""

from __future__ import annotations

import asyncio
import dataclasses

import psycopg
import pytest

import awa_fast as awa
from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig
from tests import support
from tests.support import exploding_inserts, job_row, poll_until, scalar, until, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "staged_completions": "batched"}

pytestmark = pytest.mark.usefixtures("clean")


@dataclasses.dataclass
class StageA:
    item: str
    mode: str = "complete"


@dataclasses.dataclass
class StageB:
    item: str


async def b_items(dsn) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT args->>'item' FROM awa_fast.jobs_all WHERE kind = 'stage_b' ORDER BY id"
        )
        return [r[0] for r in await cur.fetchall()]


async def settled(dsn) -> bool:
    return (
        await scalar(
            dsn,
            "SELECT count(*) FROM awa_fast.jobs_all WHERE state IN "
            "('available', 'running', 'scheduled')",
        )
        == 0
    )


async def test_pipeline_batched_one_b_per_value_none_for_failed_a(dsn, client):
    @client.task(StageB)
    async def stage_b(job):
        return None

    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageB(job.args.item.split("-")[0]), unique_opts={})
        if job.args.mode == "fail":
            raise awa.TerminalError("no")

    await client.insert_many([StageA(f"v{i % 5}-{i}") for i in range(80)])
    await client.insert(StageA("lonely-1", "fail"), max_attempts=1)
    await client.start([("default", 32)], **FAST)
    await until(lambda: settled(dsn), client, what="everything settled")
    assert sorted(await b_items(dsn)) == [f"v{i}" for i in range(5)]
    stats = client.runtime.finalizer.stats
    assert stats["staged_batched"] == 80 and stats["per_job"] == 1  # the failure is per job
    assert stats["batches"] < 80 + 5  # completions shared statements


async def test_batched_dedup_consequences_and_order(dsn, client):
    client.on_completed_enqueue(StageA, lambda a, job: StageB(f"spec-{a.item}"))

    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageA(job.args.item), unique_opts={})  # collides with itself
        job.enqueue_on_completion(StageB("dup"), unique_opts={})
        job.enqueue_on_completion(StageB("dup"), unique_opts={})  # collapses

    job = await client.insert(StageA("self"), unique_opts={})
    await client.start([("default", 1)], **FAST)
    await wait_state(client, job.id, "completed")
    assert await b_items(dsn) == ["spec-self", "dup"]  # specs first, then staged, deduplicated
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'stage_a'") == 1


async def test_one_bad_follow_up_rolls_back_only_its_own_completion(dsn, client):
    async with exploding_inserts(dsn):
        gate = asyncio.Event()

        @client.task(StageA)
        async def stage_a(job):
            await gate.wait()  # let all of them finish together: one batch
            job.enqueue_on_completion(StageB(job.args.item))
            if job.args.mode == "bad":
                job.enqueue_on_completion({"x": 1}, kind="explode")

        good = [(await client.insert(StageA(f"g{i}"))).id for i in range(5)]
        bad = await client.insert(StageA("bad", "bad"))
        await client.start([("default", 8)], **FAST, maintenance=False)
        await until(lambda: _running(dsn, 6), client, what="all six running")
        gate.set()
        for job_id in good:
            await wait_state(client, job_id, "completed")
        await until(lambda: _idle(client), client, what="finalization over")
        # ADR-046 prompt failure: a failed attempt at once, with the error (not left running).
        row = await job_row(dsn, bad.id)
        assert row["state"] == "retryable" and row["run_lease"] == 1
        assert "trigger added outside awa-fast" in row["errors"][-1]["error"]
        assert sorted(await b_items(dsn)) == [f"g{i}" for i in range(5)]


async def _running(dsn, n):
    return await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE state = 'running'") == n


async def _idle(client):
    return not client.runtime.in_flight


async def test_batched_stale_completion_inserts_nothing(dsn, client):
    started, release = asyncio.Event(), asyncio.Event()

    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageB("x"))
        started.set()
        await release.wait()

    job = await client.insert(StageA("a"), max_attempts=3)
    await client.start([("default", 1)], **FAST, maintenance=False)
    await started.wait()
    await client.cancel(job.id)
    release.set()
    await until(lambda: _stale(client), client, what="stale")
    assert await b_items(dsn) == []


async def _stale(client):
    return client.runtime.finalizer.stats["stale"] >= 1


async def test_unknown_mode_is_rejected(client):
    with pytest.raises(ValueError):
        await client.start([("q", 1)], staged_completions="sometimes")


async def test_two_attempts_of_one_job_in_one_batch_only_the_current_inserts(dsn, client):
    both = asyncio.Event()
    leases = []

    @client.task(StageA)
    async def stage_a(job):
        leases.append(job.run_lease)
        if len(leases) >= 2:
            both.set()
        await both.wait()  # both attempts return in the same tick: one batch
        job.enqueue_on_completion(StageB(f"lease-{job.run_lease}"))

    job = await client.insert(StageA("a"), max_attempts=5)
    # Heartbeats off (the liveness thread is stopped, its lease check with it): another
    # process's rescue takes the first attempt while its handler still runs (a process never
    # rescues its own), and this runtime claims the job again.
    await client.start(
        [("default", 4)],
        **{**FAST, "heartbeat_staleness_ms": 300, "maintenance": False},
    )
    await client.runtime.liveness.close()
    other = Maintenance(dsn, client.pool, MaintenanceConfig(heartbeat_staleness_ms=300))
    # the rescue is another process's step: polled
    await poll_until(other.rescue, what="the first attempt rescued by another process")
    await other.promote()
    row = await wait_state(client, job.id, "completed", timeout=20)
    await until(lambda: _stale(client), client, what="the first attempt reported stale")
    assert row["run_lease"] == 2 and leases == [1, 2]
    assert await b_items(dsn) == ["lease-2"]
