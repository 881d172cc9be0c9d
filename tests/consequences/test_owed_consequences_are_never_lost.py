"""Regression tests on a real PostgreSQL for the flaws the settlement model found
(models/settlement.pml, invariant nothing_owed_is_lost; models/README.md "Findings"):

* prune deleted a corrected (``failed``) row whose failure consequence was still owed, once the
  failed retention passed: the debt was gone (NEG_PRUNE_OWED is the old statement);
* an admin cancel took a ``consequence_pending`` job to ``cancelled``, a state the reconciler
  never reads, so its owed consequence was never applied, then pruned (NEG_CANCEL_OWED);
* the failure path ran the effect before anything durable recorded the failure (invariant
  effect_repeats_only_as_repeat, NEG_EFFECT_FIRST): its regression test is in
  tests/consequences/test_consequences.py (test_killed_after_the_effect_on_a_non_final_attempt_...).
"""

from __future__ import annotations

import dataclasses

import awa_fast as awa
from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig
from tests import support
from tests.support import job_row, truncate, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "consequence_backoff_ms": 50, "heartbeat_staleness_ms": 500}


@dataclasses.dataclass
class Shipment:
    mode: str


@dataclasses.dataclass
class Ping:
    n: int


async def unavailable(failure: awa.JobFailure) -> None:
    raise RuntimeError("the compensation service is down")


async def test_prune_keeps_a_failed_row_whose_consequence_is_owed(dsn):
    await truncate(dsn)
    client = awa.AsyncClient(dsn)
    try:

        @client.task(Shipment, failure_consequence=unavailable)
        async def ship(job):
            return None

        @client.task(Ping, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
        async def ping(job):
            raise awa.TerminalError("no answer")

        shipped = await client.insert(Shipment("x"))
        failed = await client.insert(Ping(1))
        await client.start([("default", 2)], **FAST)
        await wait_state(client, shipped.id, "completed")
        await wait_state(client, failed.id, "failed")
        await client.correct_to_failed(shipped.id, error="the parcel was lost")
    finally:
        await client.close()
    row = await job_row(dsn, shipped.id)
    assert (row["state"], row["consequence_state"]) == ("failed", "owed")

    # One prune pass with every retention passed (a pass run by hand is not fenced).
    pools = awa.AsyncClient(dsn)
    try:
        config = MaintenanceConfig(completed_retention_hours=0, failed_retention_hours=0)
        assert await Maintenance(dsn, pools.pool, config).prune() >= 1
    finally:
        await pools.close()
    assert await job_row(dsn, failed.id) is None  # a settled failure is pruned
    row = await job_row(dsn, shipped.id)  # the owed one is kept, still owed
    assert row is not None and (row["state"], row["consequence_state"]) == ("failed", "owed")


async def test_cancel_leaves_a_consequence_pending_job_owed(dsn):
    await truncate(dsn)
    client = awa.AsyncClient(dsn)
    try:

        @client.task(Shipment, failure_consequence=unavailable)
        async def ship(job):
            raise awa.TerminalError("address rejected")

        job = await client.insert(Shipment("x"))
        await client.start([("default", 1)], **FAST)
        row = await wait_state(client, job.id, "consequence_pending")
        assert row["consequence_state"] == "owed"
        assert await client.cancel(job.id) is None
    finally:
        await client.close()
    row = await job_row(dsn, job.id)
    assert (row["state"], row["consequence_state"]) == ("consequence_pending", "owed")
