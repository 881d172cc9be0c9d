"""A failure consequence stays owed until its effect is applied; no retry runs meanwhile."""

from __future__ import annotations

import psycopg
import pytest

import awa_fast as awa
from tests import support
from tests.support import Job, job_row, passes, until, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "consequence_backoff_ms": 50}

pytestmark = pytest.mark.usefixtures("clean")


async def test_an_effect_that_swallows_its_own_sql_error_does_not_settle(dsn, client):
    calls = []

    async def sloppy(failure):
        calls.append(1)
        try:
            await failure.conn.execute("SELECT 1/0")
        except psycopg.Error:
            pass  # the settlement transaction is aborted now

    @client.task(Job, failure_consequence=sloppy)
    async def work(job):
        raise awa.TerminalError("no")

    job = await client.insert(Job("x"), max_attempts=1)
    await client.start([("default", 1)], **FAST)
    row = await wait_state(client, job.id, "consequence_pending")
    # the settlement keeps failing: the reconciler's passes say so, none settles the job
    await until(
        lambda: _attempts_at_least(dsn, job.id, 2),
        passes(client, "reconcile"),
        what="backed-off retries",
    )
    row = await job_row(dsn, job.id)
    assert "aborted" in row["consequence_error"]


async def _attempts_at_least(dsn, job_id, n):
    return (await job_row(dsn, job_id))["consequence_attempts"] >= n


async def test_fail_external_from_a_process_without_the_declaration_leaves_it_owed(dsn, client):
    worker = awa.AsyncClient(dsn)
    effects = []

    async def effect(failure):
        effects.append(failure.reason)

    @worker.task(Job, failure_consequence=effect)
    async def park(job):
        return awa.WaitForCallback(await job.register_callback(timeout_seconds=60))

    try:
        job = await client.insert(Job("x"))
        await worker.start([("default", 1)], **FAST, maintenance=False)
        await wait_state(worker, job.id, "waiting_external")
        token = str((await job_row(dsn, job.id))["callback_id"])
        api = awa.AsyncClient(dsn)  # knows nothing of the kind
        try:
            await api.fail_external(token, "declined")
        finally:
            await api.close()
        row = await job_row(dsn, job.id)
        assert row["state"] == "consequence_pending" and row["consequence_state"] == "owed"
        await worker.shutdown()
        await worker.start([("default", 1)], **FAST)  # now with maintenance: it reconciles
        row = await wait_state(worker, job.id, "failed")
        assert row["consequence_state"] == "applied" and effects == ["callback_failed"]
    finally:
        await worker.close()


async def test_no_retry_while_a_consequence_is_owed(dsn, client):
    async def failing(failure):
        raise RuntimeError("service down")

    @client.task(Job, failure_consequence=failing)
    async def work(job):
        return None

    job = await client.insert(Job("x"))
    await client.start([("default", 1)], **FAST)
    await wait_state(client, job.id, "completed")
    await client.correct_to_failed(job.id, error="not actually done")
    assert await client.retry(job.id) is None
    assert (await job_row(dsn, job.id))["state"] == "failed"
