"""awa's weighted mode (``start(global_max_workers=N)`` with per-queue ``min_workers`` and
``weight``) on a real PostgreSQL: awa's configuration rules, the shares observed under
contention (each queue converges to ``ceil(pool * weight / contending weight)``, the total never
exceeds N), work conservation (a lone busy queue takes the whole pool) and the guaranteed
minimum (a queue keeps its ``min_workers`` against a much heavier one)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

import awa_fast as awa
from awa_fast.worker.observe import Signal
from tests import support
from tests.support import until

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "maintenance": False}

pytestmark = pytest.mark.usefixtures("clean")


@dataclasses.dataclass
class Work:
    n: int = 0


@pytest.mark.parametrize(
    "queues, options, field",
    [
        (None, {"global_max_workers": 4}, "queues"),
        ([("a", 2)], {"global_max_workers": 4}, "queues"),
        (
            [{"name": "a", "min_workers": 3}, {"name": "b", "min_workers": 2}],
            {"global_max_workers": 4},
            "global_max_workers",
        ),
        ([{"name": "a", "min_workers": 1, "weight": 0}], {"global_max_workers": 4}, "weight"),
        ([{"name": "a", "min_workers": -1}], {"global_max_workers": 4}, "min_workers"),
        ([{"name": "a", "min_workers": 1}], {"global_max_workers": 0}, "global_max_workers"),
        ([{"name": "a", "min_workers": 1}], {}, "min_workers"),  # needs weighted mode
        ([{"name": "a", "max_workers": 2, "weight": 2}], {}, "weight"),
    ],
)
async def test_awas_weighted_mode_rules(client, queues, options, field):
    with pytest.raises(awa.ValidationError) as info:
        await client.start(queues, **options)
    assert info.value.field == field
    assert client.runtime is None


class Gate:
    """Handlers hold their slot until the test opens the current round's gate."""

    def __init__(self):
        self.event = asyncio.Event()
        self.inflight: dict[int, str] = {}
        self.peak = 0
        self.entered = Signal("handler entered")  # the test waits on it

    async def hold(self, job) -> None:
        self.inflight[job.id] = job.queue
        self.peak = max(self.peak, len(self.inflight))
        self.entered.fire(job.id)
        event = self.event
        try:
            await event.wait()
        finally:
            del self.inflight[job.id]

    def split(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for q in self.inflight.values():
            out[q] = out.get(q, 0) + 1
        return out


async def _running(gate: Gate, full: int) -> dict[str, int]:
    async def filled():
        return len(gate.inflight) == full or None

    await until(filled, gate.entered, what=f"{full} attempts holding")
    return gate.split()


async def _rounds(gate: Gate, full: int, n: int) -> list[dict[str, int]]:
    splits = []
    for _ in range(n):
        previous, old = gate.event, set(gate.inflight)
        gate.event = asyncio.Event()
        previous.set()

        async def refilled():
            return (len(gate.inflight) == full and not (set(gate.inflight) & old)) or None  # noqa: B023 - awaited in this iteration

        await until(refilled, gate.entered, what=f"{full} new attempts holding")
        splits.append(gate.split())
    return splits


async def _start(client, gate: Gate, queues, global_max: int, jobs: dict[str, int]):
    @client.task(Work)
    async def work(job):
        await gate.hold(job)

    for queue, count in jobs.items():
        await client.insert_many([Work(i) for i in range(count)], queue=queue)
    await client.start(queues, global_max_workers=global_max, **FAST)


async def test_shares_under_contention_follow_the_weights(client):
    gate = Gate()
    await _start(
        client,
        gate,
        [{"name": "heavy", "weight": 3}, {"name": "light", "weight": 1}],
        8,
        {"heavy": 40, "light": 40},
    )
    try:
        await _running(gate, 8)  # whoever claimed first may hold more than its share now
        # once both queues ask, each gets ceil(8 * w / 4): 6 and 2, every round
        for split in await _rounds(gate, 8, 3):
            assert split == {"heavy": 6, "light": 2}, split
        assert gate.peak == 8  # never more than global_max_workers at once
    finally:
        gate.event.set()
        await client.shutdown()


async def test_a_lone_busy_queue_takes_the_whole_pool_and_minimums_hold(client):
    gate = Gate()
    await _start(
        client,
        gate,
        [
            {"name": "busy", "weight": 1},
            {"name": "idle", "weight": 5},
            {"name": "small", "min_workers": 1, "weight": 1},
        ],
        6,
        {"busy": 30},
    )
    try:
        # work-conserving: the idle queues' shares go to the busy one (6 = the whole budget:
        # 5 overflow permits and not small's reserved slot, which only small may use)
        assert await _running(gate, 5) == {"busy": 5}
        assert gate.split() == {"busy": 5}
        # small's guaranteed slot is there at once, whatever busy holds
        await client.insert_many([Work(i) for i in range(4)], queue="small")
        split = await _running(gate, 6)
        assert split["small"] >= 1 and split["busy"] <= 5
    finally:
        gate.event.set()
        await client.shutdown()
