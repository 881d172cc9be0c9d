"""An outcome into a unique key another job holds cancels that attempt alone, as a duplicate."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import awa_fast as awa
from tests import support
from tests.support import Job, job_row, scalar, until, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "consequence_backoff_ms": 50}

# The timing of the tests that run without maintenance.
WITHOUT_MAINTENANCE = {**support.FAST, "maintenance": False}

CANCELLED_BIT = 1 << 6

pytestmark = pytest.mark.usefixtures("clean", "no_presence_rows")


async def test_a_unique_collision_does_not_fail_a_whole_completion_batch(dsn, client):
    release = asyncio.Event()

    @client.task(Job)
    async def work(job):
        if job.args.mode == "held":
            await release.wait()

    # states=8: the key is held only once completed. Two such jobs complete in one batch.
    a = await client.insert(Job("held"), unique_opts={"states": 8})
    b = await client.insert(Job("held"), unique_opts={"states": 8})
    plain = [(await client.insert(Job("plain", i))).id for i in range(10)]
    await client.start([("default", 20)], **FAST)
    await until(lambda: _all_completed(dsn, plain), client, what="the plain jobs")
    release.set()
    rows = [await wait_state(client, j.id, "completed", "cancelled") for j in (a, b)]
    assert sorted(r["state"] for r in rows) == ["cancelled", "completed"]


async def _all_completed(dsn, ids):
    return await scalar(
        dsn,
        "SELECT count(*) FROM awa_fast.jobs_all WHERE id = ANY(%s) AND state = 'completed'",
        (ids,),
    ) == len(ids)


# Issue 9, class 1/2: an outcome whose state would take a key that a *cancelled* job holds. The
# attempt is cancelled as a duplicate -- which, with `cancelled` in the mask, collided with the same
# holder: a Cancel or a terminal failure became a retry ("finalize failed: UniqueViolation"), a
# retry or a completion left the row running until rescue.


@pytest.mark.parametrize(
    "mode, mask",
    [
        ("cancel", CANCELLED_BIT),
        ("fail", (1 << 5) | CANCELLED_BIT),
        ("retry", (1 << 4) | CANCELLED_BIT),
        ("snooze", (1 << 0) | CANCELLED_BIT),
        ("complete", (1 << 3) | CANCELLED_BIT),
    ],
)
async def test_outcome_into_a_key_a_cancelled_job_holds_settles(dsn, client, mode, mask):
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
    job = await client.insert(
        Job(mode), max_attempts=3, unique_opts={"by_args": False, "states": mask}
    )
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        holder = (
            await (
                await conn.execute(
                    "INSERT INTO awa_fast.jobs (kind, args, state, unique_key, unique_states, "
                    "finalized_at) SELECT 'job', '{}', 'cancelled', unique_key, unique_states, now() "
                    "FROM awa_fast.jobs_all WHERE id = %s RETURNING id",
                    (job.id,),
                )
            ).fetchone()
        )[0]
    await client.start([("default", 2)], **WITHOUT_MAINTENANCE)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    row = await wait_state(
        client, job.id, "cancelled", "retryable", "failed", "completed", "scheduled", timeout=5
    )
    assert row["state"] == "cancelled" and row["attempt"] == 1, row
    assert row["errors"][-1]["error"].startswith("cancelled as duplicate"), row["errors"]
    assert not row["unique_states"] & CANCELLED_BIT  # the duplicate does not hold the key
    assert (await job_row(dsn, holder))["state"] == "cancelled"


# Issue 9, class 1/2: an inline wait_for_callback whose waiting_external state would take a key
# another parked job holds raised a raw psycopg UniqueViolation into the handler, and the attempt
# was retried (to collide again) -- while a WaitForCallback result into the same key is cancelled as
# a duplicate. Both now resolve the same way; the handler gets an AwaError saying so.


async def test_inline_park_into_a_held_key_cancels_as_a_duplicate(dsn, client):
    raised = []

    @client.task(Job, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def park(job):
        token = await job.register_callback(timeout_seconds=60)
        try:
            await job.wait_for_callback(token)
        except awa.AwaError as exc:
            raised.append((job.id, str(exc)))
            raise

    mask = {"unique_opts": {"by_args": False, "states": 1 << 7}}  # waiting_external only
    jobs = [await client.insert(Job(str(i)), **mask) for i in range(2)]
    await client.start([("default", 2)], **WITHOUT_MAINTENANCE)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    rows = {j.id: await job_row(dsn, j.id) for j in jobs}
    assert sorted(r["state"] for r in rows.values()) == ["cancelled", "waiting_external"]
    loser = next(i for i, r in rows.items() if r["state"] == "cancelled")
    assert rows[loser]["attempt"] == 1
    assert rows[loser]["errors"][-1]["error"].startswith("cancelled as duplicate")
    assert raised == [
        (
            loser,
            f"job {loser} could not park: another job holds its unique key "
            "in waiting_external; cancelled as a duplicate",
        )
    ]
