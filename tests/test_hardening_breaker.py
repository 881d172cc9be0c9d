"""Issue 9, more cases of its classes (an adversarial pass after the named defects were fixed).

Real PostgreSQL throughout; each test names the class it belongs to.
"""

from __future__ import annotations

import asyncio
import dataclasses

import psycopg
import pytest

import awa_fast as awa
from awa_fast.errors import ConfigError
from tests.support import job_row, scalar, wait_state

FAST = dict(poll_interval_ms=50, heartbeat_interval_ms=100, maintenance=False)
CANCELLED_BIT = 1 << 6

pytestmark = pytest.mark.usefixtures("clean")


@dataclasses.dataclass
class Job:
    mode: str = ""


# ---------------------------------------------------------------------------------------------
# class 1/2: an outcome whose state would take a key that a *cancelled* job holds. The attempt
# is cancelled as a duplicate -- which, with `cancelled` in the mask, collided with the same
# holder: a Cancel or a terminal failure became a retry ("finalize failed: UniqueViolation"),
# a retry or a completion left the row running until rescue.


@pytest.mark.parametrize("mode, mask", [
    ("cancel", CANCELLED_BIT),
    ("fail", (1 << 5) | CANCELLED_BIT),
    ("retry", (1 << 4) | CANCELLED_BIT),
    ("snooze", (1 << 0) | CANCELLED_BIT),
    ("complete", (1 << 3) | CANCELLED_BIT),
])
async def test_class2_outcome_into_a_key_a_cancelled_job_holds_settles(dsn, client, mode, mask):
    async def handler(job):
        if mode == "cancel":
            return awa.Cancel("bye")
        if mode == "fail":
            raise awa.TerminalError("boom")
        if mode == "retry":
            raise RuntimeError("again")
        if mode == "snooze":
            return awa.Snooze(100)

    client.task(Job)(handler)
    job = await client.insert(Job(mode), max_attempts=3,
                              unique_opts={"by_args": False, "states": mask})
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        holder = (await (await conn.execute(
            "INSERT INTO awa_fast.jobs (kind, args, state, unique_key, unique_states, "
            "finalized_at) SELECT 'job', '{}', 'cancelled', unique_key, unique_states, now() "
            "FROM awa_fast.jobs WHERE id = %s RETURNING id", (job.id,))).fetchone())[0]
    await client.start([("default", 2)], **FAST)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    row = await wait_state(dsn, job.id, "cancelled", "retryable", "failed", "completed",
                           "scheduled", timeout=5)
    assert row["state"] == "cancelled" and row["attempt"] == 1, row
    assert row["errors"][-1]["error"].startswith("cancelled as duplicate"), row["errors"]
    assert not row["unique_states"] & CANCELLED_BIT  # the duplicate does not hold the key
    assert (await job_row(dsn, holder))["state"] == "cancelled"


# ---------------------------------------------------------------------------------------------
# class 5: maintenance and consequence settings start() accepted but no pass could use: NaN /
# inf retention or staleness (every prune / rescue pass failed with "interval out of range",
# or start() itself raised a raw psycopg error), wrong types (a raw TypeError), "no" taken as
# true for a bool keyword, and a raw ValueError without the field.


@pytest.mark.parametrize("options, field", [
    ({"completed_retention_hours": float("nan")}, "completed_retention_hours"),
    ({"failed_retention_hours": float("inf")}, "failed_retention_hours"),
    ({"dlq_retention_days": -1}, "dlq_retention_days"),
    ({"heartbeat_staleness_ms": float("nan")}, "heartbeat_staleness_ms"),
    ({"heartbeat_interval_ms": 10**15, "heartbeat_staleness_ms": 10**16},
     "heartbeat_staleness_ms"),
    ({"promote_interval_ms": "100"}, "promote_interval_ms"),
    ({"cleanup_batch_size": 0.5}, "cleanup_batch_size"),
    ({"consequence_timeout_ms": float("nan")}, "consequence_timeout_ms"),
    ({"consequence_backoff_ms": "5"}, "consequence_backoff_ms"),
    ({"dlq_enabled_by_default": "no"}, "dlq_enabled_by_default"),
    ({"maintenance": "no"}, "maintenance"),
    ({"queue_subset": 1}, "queue_subset"),
    ({"staged_completions": None}, "staged_completions"),
])
async def test_class5_start_rejects_settings_no_pass_could_use(dsn, client, options, field):
    client.task(Job)(lambda job: None)
    with pytest.raises(ConfigError) as err:
        await client.start([("default", 1)], **{**FAST, **options})
    assert err.value.field == field, str(err.value)
    assert client.runtime is None
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.workers") == 0
