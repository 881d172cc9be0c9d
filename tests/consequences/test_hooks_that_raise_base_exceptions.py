"""An effect, verifier or follow-up spec raising SystemExit fails its own step, not the process."""

from __future__ import annotations

import asyncio
import dataclasses

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


# Issue 9, class 2/3: user code the runtime calls besides the handler -- a failure consequence
# effect, a verify_success hook, a follow-up spec -- raising SystemExit (a library calling
# sys.exit): it escaped `except Exception` and ended the worker's event loop (the whole process). It
# is that code's failure: the consequence stays owed and is retried, the job stays unverified, the
# attempt is recorded as a failed finalize; the process lives on.


async def _settle(client, dsn, job_id, *, ticks=5) -> dict:
    for _ in range(ticks):
        await client.runtime.reconcile()
        row = await job_row(dsn, job_id)
        if row["consequence_state"] == "applied":
            return row
        await asyncio.sleep(0.2)  # the consequence's backoff (consequence_backoff_ms)
    return row


async def test_failure_consequence_raising_system_exit_stays_owed(dsn, client):
    calls = []

    async def effect(failure):
        calls.append(failure.job.id)
        if len(calls) == 1:
            raise SystemExit("effect called sys.exit")

    @client.task(Job, failure_consequence=effect)
    async def handler(job):
        raise awa.TerminalError("gone")

    job = await client.insert(Job(), max_attempts=1)
    await client.start([("default", 1)], **FAST, consequence_backoff_ms=100)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    row = await _settle(client, dsn, job.id)
    assert (row["state"], row["consequence_state"]) == ("failed", "applied"), row
    assert calls == [job.id, job.id]
    assert (await client.health_check()).poll_loop_alive


async def test_verify_success_raising_system_exit_is_verified_again(dsn, client):
    calls = []

    def verify(job):
        calls.append(job.id)
        if len(calls) == 1:
            raise SystemExit("verifier called sys.exit")
        return False  # not done: corrected to failed

    @client.task(Job, failure_consequence=lambda failure: None, verify_success=verify)
    async def handler(job):
        return None

    job = await client.insert(Job())
    await client.start([("default", 1)], **FAST)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    await wait_state(client, job.id, "completed", timeout=5)
    row = await _settle(client, dsn, job.id, ticks=20)  # the raise backs it off 1 s (ADR 019)
    assert row["state"] == "failed" and row["errors"][-1]["corrected"] is True, row
    assert calls == [job.id, job.id]


@pytest.mark.parametrize("outcome", ["completed", "cancelled"])
async def test_follow_up_spec_raising_system_exit_fails_the_finalize(dsn, client, outcome):
    def spec(*_):
        raise SystemExit("spec called sys.exit")

    @client.task(Job, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def handler(job):
        return awa.Cancel("no") if outcome == "cancelled" else None

    getattr(client, f"on_{outcome}_enqueue")(Job, spec)
    job = await client.insert(Job(), max_attempts=2)
    await client.start([("default", 1)], **FAST)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    row = await wait_state(client, job.id, "retryable", "failed", timeout=5)
    assert row["state"] == "retryable" and row["attempt"] == 1, row
    assert "raised SystemExit: spec called sys.exit" in row["errors"][-1]["error"]
    assert (await client.health_check()).poll_loop_alive
