"""A settlement or correction into a unique key another job holds settles once, without the key."""

from __future__ import annotations

import asyncio
import dataclasses

import psycopg
import pytest

import awa_fast as awa
from tests import support
from tests.support import job_row, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "maintenance": False}

pytestmark = pytest.mark.usefixtures("clean", "no_presence_rows")


@dataclasses.dataclass
class Job:
    mode: str = ""


# Issue 9, class 2/3: a settlement that would make a second holder of a unique key. A failure whose
# mask holds 'failed' (not 'running') takes its key only when it settles: the consequence settlement
# collided with a live holder, rolled back, and the reconciler ran the effect again every tick for
# as long as the holder lived; a verify_success correction into such a key was retried every tick
# with no back-off (the hook ran about once a second) and then dropped.


FAILED_BIT = 1 << 5


async def _hold_key_of(dsn, job_id) -> int:
    """A second job holding ``job_id``'s unique key while available, on a queue nobody serves."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "INSERT INTO awa_fast.jobs (kind, queue, args, state, unique_key, unique_states) "
            "SELECT 'job', 'nobody', '{}', 'available', unique_key, %s FROM awa_fast.jobs_all "
            "WHERE id = %s RETURNING id",
            ((1 << 1) | FAILED_BIT, job_id),
        )
        return (await cur.fetchone())[0]


async def test_a_consequence_settlement_into_a_held_key_settles_once(dsn, client):
    calls = []

    @client.task(Job, failure_consequence=lambda failure: calls.append(failure.job.id))
    async def handler(job):
        raise awa.TerminalError("boom")

    job = await client.insert(
        Job(), max_attempts=1, unique_opts={"by_args": False, "states": FAILED_BIT}
    )
    holder = await _hold_key_of(dsn, job.id)
    await client.start([("default", 1)], **FAST, consequence_backoff_ms=100)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    for _ in range(3):  # the reconciler finds nothing left to settle
        await client.runtime.reconcile()
    row = await job_row(dsn, job.id)
    assert (row["state"], row["consequence_state"]) == ("cancelled", "applied"), row
    assert row["errors"][-1]["error"].startswith("cancelled as duplicate"), row["errors"]
    assert calls == [job.id]  # the effect ran once
    assert (await job_row(dsn, holder))["state"] == "available"


async def test_a_correction_into_a_held_key_fails_without_the_key(dsn, client):
    verdicts, calls = [], []

    def verify(job):
        verdicts.append(job.id)
        return False  # not done

    @client.task(
        Job, failure_consequence=lambda failure: calls.append(failure.job.id), verify_success=verify
    )
    async def handler(job):
        return None

    job = await client.insert(Job(), unique_opts={"by_args": False, "states": FAILED_BIT})
    holder = await _hold_key_of(dsn, job.id)
    await client.start([("default", 1)], **FAST)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    await wait_state(client, job.id, "completed", timeout=5)
    for _ in range(3):
        await client.runtime.reconcile()
    row = await job_row(dsn, job.id)
    assert (row["state"], row["consequence_state"]) == ("failed", "applied"), row
    assert "failed without its unique key" in row["errors"][-1]["error"], row["errors"]
    assert row["errors"][-1]["corrected"] is True
    assert not row["unique_states"] & FAILED_BIT  # it does not hold the key
    assert (verdicts, calls) == ([job.id], [job.id])
    assert (await job_row(dsn, holder))["state"] == "available"
