"""Rescue and promotion into a held unique key cancel the duplicate, never a completed job."""

from __future__ import annotations

import psycopg
import pytest

import awa_fast as awa
from tests import support
from tests.support import Job, job_row, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "consequence_backoff_ms": 50}

pytestmark = pytest.mark.usefixtures("clean")


async def test_callback_timeout_rescue_survives_a_unique_collision(dsn, client):
    tokens = {}

    @client.task(Job)
    async def park(job):
        # Long enough that the duplicate is inserted while the first job is still parked
        # (expired, it would be retryable and hold the key itself) on a loaded machine.
        token = await job.register_callback(timeout_seconds=1.5)
        tokens[job.id] = token.id
        return awa.WaitForCallback(token)

    await client.start([("default", 4)], **{**FAST, "promote_interval_ms": 3_600_000})
    # Parked (waiting_external is not in the default mask), so a duplicate can be inserted.
    first = await client.insert(Job("dup"), unique_opts={}, max_attempts=3)
    await wait_state(client, first.id, "waiting_external")
    dup = await client.insert(Job("dup"), unique_opts={}, queue="unserved")  # holds the key
    other = await client.insert(Job("other"), max_attempts=3)
    await wait_state(client, other.id, "waiting_external", "retryable")
    # The first job's rescue would re-take the key the duplicate holds: it is cancelled as a
    # duplicate, and rescue of the other job goes on.
    row = await wait_state(client, first.id, "cancelled")
    assert "duplicate" in row["errors"][-1]["error"]
    await wait_state(client, other.id, "retryable")
    assert (await job_row(dsn, dup.id))["state"] == "available"


async def test_rescue_duplicate_cancel_leaves_a_job_that_completed_meanwhile(dsn, client):
    from awa_fast import sql

    job = await client.insert(Job("x"))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # The rescue saw it stale, then its worker completed it before the cancel ran.
        await conn.execute(
            "UPDATE awa_fast.jobs SET state = 'completed', finalized_at = now() WHERE id = %s",
            (job.id,),
        )
        cur = await conn.execute(
            sql.CANCEL_RESCUED_DUPLICATE, {"id": job.id, "stale_ms": 1, "own": []}
        )
        assert cur.rowcount == 0
        # ... and a promotion fallback leaves a job that is no longer due alone too.
        cur = await conn.execute(sql.CANCEL_AS_DUPLICATE, {"id": job.id, "stale_ms": 1, "own": []})
        assert cur.rowcount == 0
    assert (await job_row(dsn, job.id))["state"] == "completed"
