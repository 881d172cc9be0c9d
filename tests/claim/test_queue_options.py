"""awa-pg's start() and per-queue options: each is honoured or rejected by name (never ignored).

Rate limiting (token bucket bounding claims) and priority aging (an old low-priority job
overtakes a newer high-priority one) are observed on a real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

import awa_fast as awa
from awa_fast.worker.aging import age_once
from tests import support
from tests.support import job_row, poll_until, scalar

pytestmark = pytest.mark.usefixtures("clean")

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "maintenance": False}


@dataclasses.dataclass
class Tick:
    n: int


@pytest.mark.parametrize(
    "queue, key",
    [
        ({"name": "q", "max_workers": 2, "no_such_option": 1}, "no_such_option"),
    ],
)
async def test_unknown_queue_keys_are_rejected_by_name(client, queue, key):
    with pytest.raises(awa.ValidationError, match=f"{key} is not implemented by awa-fast yet") as e:
        await client.start([queue])
    assert e.value.field == key
    assert client.runtime is None


@pytest.mark.parametrize(
    "rate_limit", [(0, 1), (-1.0, 5), (10.0, 0), (10.0, 1.5), "fast", (float("inf"), 1), (True, 1)]
)
async def test_bad_rate_limit_is_a_validation_error(client, rate_limit):
    with pytest.raises(awa.ValidationError, match="rate_limit") as e:
        await client.start([{"name": "q", "max_workers": 1, "rate_limit": rate_limit}])
    assert e.value.field == "rate_limit"


@pytest.mark.parametrize("rate_limit", ["fast", "ab", 5, ("x", 1), (1.0, "2"), (1.0, 2, 3)])
async def test_a_rate_limit_of_the_wrong_type_is_also_a_type_error(client, rate_limit):
    # awa raises TypeError for a rate_limit that is not a (max_rate, burst) pair
    with pytest.raises(TypeError, match="rate_limit") as e:
        await client.start([{"name": "q", "max_workers": 1, "rate_limit": rate_limit}])
    assert isinstance(e.value, awa.ValidationError) and e.value.field == "rate_limit"
    assert client.runtime is None


async def test_a_rate_limit_out_of_range_is_not_a_type_error(client):
    with pytest.raises(awa.ValidationError) as e:
        await client.start([{"name": "q", "max_workers": 1, "rate_limit": (0, 1)}])
    assert not isinstance(e.value, TypeError)


@pytest.mark.parametrize("options", [{}, {"global_max_workers": 4}])
async def test_zero_weight_is_refused_for_its_value_in_either_mode(client, options):
    # awa: "weight must be > 0" whether or not weighted mode is on
    with pytest.raises(awa.ValidationError, match="weight must be > 0") as e:
        await client.start([{"name": "q", "max_workers": 2, "weight": 0}], **options)
    assert e.value.field == "weight"
    assert client.runtime is None


async def test_bad_aging_interval_is_a_validation_error(client):
    with pytest.raises(awa.ValidationError, match="priority_aging_interval_ms"):
        await client.start([{"name": "q", "max_workers": 1, "priority_aging_interval_ms": -5}])


async def test_accepted_defaults_start(client):
    # awa's defaults, given explicitly, start fine.
    client.task(Tick, queue="q")(lambda job: None)
    await client.start(
        [{"name": "q", "max_workers": 1, "claimers": 1}],
        storage_transition_role="auto",
        queue_storage_schema=None,
        **FAST,
    )
    await client.shutdown()


async def test_rate_limit_bounds_claims_per_second(dsn, client):
    rate, burst, total = 20.0, 5, 30
    started: list[float] = []
    done = asyncio.Event()

    @client.task(Tick, queue="rl")
    async def tick(job):
        started.append(time.monotonic())
        if len(started) == total:
            done.set()

    await client.insert_many([Tick(i) for i in range(total)], queue="rl")
    t0 = time.monotonic()
    await client.start([{"name": "rl", "max_workers": 50, "rate_limit": (rate, burst)}], **FAST)
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await client.shutdown()
    started.sort()
    # Token bucket: the i-th claimed job (1-based) cannot be claimed before (i - burst) / rate
    # seconds after the bucket was made (after t0). Without the limit all 30 start at once.
    for i, at in enumerate(started, start=1):
        assert at - t0 >= (i - burst) / rate - 0.005, (i, at - t0)
    assert client.runtime is None


async def test_priority_aging_lets_an_old_low_priority_job_overtake(dsn, client):
    order: list[str] = []
    done = asyncio.Event()

    @dataclasses.dataclass
    class Aged:
        name: str

    @client.task(Aged, queue="aging")
    async def run(job):
        order.append(job.args.name)
        if len(order) == 2:
            done.set()

    old = await client.insert(Aged("old"), queue="aging", priority=4)
    # It has waited 1 s, i.e. 5 intervals of 200 ms (set directly: the test does not sleep).
    await scalar(
        dsn,
        "UPDATE awa_fast.jobs SET run_at = now() - interval '1 second' WHERE id = %s RETURNING 1",
        (old.id,),
    )
    await client.insert(Aged("new"), queue="aging", priority=2)
    await client.pause_queue("aging")
    await client.start(
        [{"name": "aging", "max_workers": 1, "priority_aging_interval_ms": 200}], **FAST
    )
    try:

        async def aged():
            return (await job_row(dsn, old.id))["priority"] == 1

        # polled: the aging loop (worker/aging.py) fires no signal
        await poll_until(aged, what="the aging pass to raise the old job's priority")
        row = await job_row(dsn, old.id)
        assert row["metadata"]["_awa_original_priority"] == 4
        await client.resume_queue("aging")
        await asyncio.wait_for(done.wait(), 15)
    finally:
        await client.shutdown()
    assert order == ["old", "new"]


async def test_aging_pass_is_idempotent_and_bounded_by_wait(dsn, client):
    fresh = await client.insert({"n": 1}, kind="k", queue="age2", priority=3)
    waited = await client.insert({"n": 2}, kind="k", queue="age2", priority=4)
    await scalar(
        dsn,
        "UPDATE awa_fast.jobs SET run_at = now() - interval '25 s' WHERE id = %s RETURNING 1",
        (waited.id,),
    )
    pool = await client.pool()
    assert await age_once(pool, "age2", 10_000) == 1
    assert await age_once(pool, "age2", 10_000) == 0  # a repeated pass changes nothing
    assert (await job_row(dsn, waited.id))["priority"] == 2  # 2 whole intervals waited
    assert (await job_row(dsn, fresh.id))["priority"] == 3


async def test_start_without_handlers_says_to_register_a_worker(client):
    # awa: an AwaError saying "register at least one worker before starting the runtime"
    with pytest.raises(
        awa.AwaError, match="register at least one worker before starting the runtime"
    ) as e:
        await client.start([("nobody_handles", 1)])
    assert isinstance(e.value, awa.ConfigError) and e.value.field == "handlers"
    assert client.runtime is None
