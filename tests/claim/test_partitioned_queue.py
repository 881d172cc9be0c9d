"""awa's PartitionedQueue: names, key and index routing (key routing checked against values
produced by awa-pg 0.6.9), queue_configs(), validation, and start() running its configs."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

import awa_fast as awa

pytestmark = pytest.mark.usefixtures("clean")

# awa-pg 0.6.9: [PartitionedQueue("customer-updates", 4).queue_for_key(f"k{i}") for i in 0..11]
AWA_ROUTES = ["__p1", "", "", "__p3", "", "__p2", "__p3", "", "__p2", "__p2", "__p2", "__p2"]


def test_names_and_key_routing_match_awa():
    pq = awa.PartitionedQueue("customer-updates", 4)
    assert pq.logical_queue == "customer-updates" and pq.partitions == 4 and len(pq) == 4
    assert pq.physical_queues == [
        "customer-updates",
        "customer-updates__p1",
        "customer-updates__p2",
        "customer-updates__p3",
    ]
    assert [pq.queue_for_key(f"k{i}") for i in range(12)] == [
        "customer-updates" + s for s in AWA_ROUTES
    ]
    assert (
        pq.queue_for_key("customer-42")
        == pq.queue_for_key(b"customer-42")
        == "customer-updates__p3"
    )
    assert pq.route_by_key("customer-42") == {
        "queue": "customer-updates__p3",
        "ordering_key": b"customer-42",
    }
    assert awa.PartitionedQueue("email", 1).physical_queues == ["email"]


def test_index_routing_and_explicit_queues():
    pq = awa.PartitionedQueue("email", 4)
    assert pq.queue_for_index(0) == "email" and pq.queue_for_index(5) == "email__p1"
    assert pq.route_by_index(5) == {"queue": "email__p1"}
    with pytest.raises(awa.ValidationError, match="index must be >= 0"):
        pq.queue_for_index(-1)
    ex = awa.PartitionedQueue.from_physical_queues("email", ["email-fast", "email-slow"])
    assert ex.physical_queues == ["email-fast", "email-slow"] and ex.partitions == 2


def test_queue_configs():
    pq = awa.PartitionedQueue("email", 2)
    assert pq.queue_configs(
        max_workers_per_partition=8, rate_limit_per_partition=(100.0, 200), claim_batch_size=64
    ) == [
        {"name": "email", "max_workers": 8, "rate_limit": (100.0, 200), "claim_batch_size": 64},
        {"name": "email__p1", "max_workers": 8, "rate_limit": (100.0, 200), "claim_batch_size": 64},
    ]
    assert pq.queue_configs(min_workers_per_partition=0, weight=3) == [
        {"name": "email", "min_workers": 0, "weight": 3},
        {"name": "email__p1", "min_workers": 0, "weight": 3},
    ]


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: awa.PartitionedQueue("", 4), "logical queue must not be empty"),
        (lambda: awa.PartitionedQueue("email", 0), "partitions must be > 0"),
        (lambda: awa.PartitionedQueue.from_physical_queues("email", []), "partitions must be > 0"),
        (lambda: awa.PartitionedQueue.from_physical_queues("e", ["a", ""]), "must not be empty"),
        (lambda: awa.PartitionedQueue.from_physical_queues("e", ["a", "a"]), "duplicated"),
        (
            lambda: awa.PartitionedQueue("e", 2).queue_for_key(object()),
            "ordering_key must be bytes-like or str",
        ),
        (
            lambda: awa.PartitionedQueue("e", 2).queue_configs(),
            "requires max_workers_per_partition",
        ),
        (
            lambda: awa.PartitionedQueue("e", 2).queue_configs(1, min_workers_per_partition=1),
            "not both",
        ),
        (
            lambda: awa.PartitionedQueue("e", 2).queue_configs(0),
            "max_workers_per_partition must be > 0",
        ),
        (lambda: awa.PartitionedQueue("e", 2).queue_configs(1, claimers=0), "claimers must be > 0"),
    ],
)
def test_validation_errors(build, message):
    with pytest.raises(awa.ValidationError, match=message):
        build()


@dataclasses.dataclass
class Routed:
    key: str


async def test_start_runs_every_partition(dsn, client):
    pq = awa.PartitionedQueue("routed", 3)
    seen: dict[str, str] = {}
    done = asyncio.Event()
    keys = [f"k{i}" for i in range(12)]

    @client.task(Routed, queue="routed")
    async def run(job):
        seen[job.args.key] = job.queue
        if len(seen) == len(keys):
            done.set()

    for key in keys:
        await client.insert(Routed(key), **pq.route_by_key(key))
    await client.start(
        pq.queue_configs(max_workers_per_partition=2), poll_interval_ms=50, maintenance=False
    )
    try:
        await asyncio.wait_for(done.wait(), 15)
    finally:
        await client.shutdown()
    assert seen == {k: pq.queue_for_key(k) for k in keys}
    assert set(seen.values()) == set(pq.physical_queues)


async def test_weighted_partition_configs_need_global_max_workers(client):
    pq = awa.PartitionedQueue("w", 2)
    with pytest.raises(awa.ValidationError, match="min_workers") as info:
        await client.start(pq.queue_configs(min_workers_per_partition=1))
    assert info.value.field == "min_workers" and client.runtime is None

    @client.task(Routed, queue="w")
    async def routed(job):
        return None

    await client.start(
        pq.queue_configs(min_workers_per_partition=1), global_max_workers=4, maintenance=False
    )
    assert sorted(client.runtime.dispatchers) == sorted(pq.physical_queues)
    await client.shutdown()
