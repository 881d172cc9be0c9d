"""Regression tests for defects an adversarial review reproduced (each failed before its fix)."""

from __future__ import annotations

import asyncio
import dataclasses

import psycopg
import pytest

import awa_fast as awa
from tests import support
from tests.support import job_row, passes, scalar, until, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "consequence_backoff_ms": 50}

pytestmark = pytest.mark.usefixtures("clean")


@dataclasses.dataclass
class Job:
    mode: str = ""
    n: int = 0


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


async def test_a_reclaimed_job_keeps_its_in_flight_bookkeeping(dsn, client):
    first_started, release_first = asyncio.Event(), asyncio.Event()
    second_started, release_second = asyncio.Event(), asyncio.Event()

    @client.task(Job)
    async def work(job):
        if job.attempt == 1 and not first_started.is_set():
            first_started.set()
            await release_first.wait()  # ignores the cancel flag
        else:
            second_started.set()
            await release_second.wait()

    job = await client.insert(Job("x"))
    await client.start([("default", 4)], **FAST)
    await first_started.wait()
    # Superseded as rescue would (cancel + retry now refuses while the attempt runs):
    # the row is re-claimed under lease 2 while the first handler still runs.
    await scalar(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'available', heartbeat_at = NULL "
        "WHERE id = %s RETURNING id",
        (job.id,),
    )
    await second_started.wait()
    release_first.set()  # the old attempt ends while the new one runs
    await until(lambda: client.runtime.finalizer.stats["stale"], client, what="stale old attempt")
    ctx = client.runtime.in_flight.get((job.id, 2))
    assert ctx is not None and ctx.run_lease == 2  # still tracked: heartbeats continue
    release_second.set()
    row = await wait_state(client, job.id, "completed")
    assert row["run_lease"] == 2


async def test_a_caught_unique_conflict_in_a_transaction_keeps_its_other_writes(dsn, client):
    async with await client.transaction() as tx:
        await tx.execute("CREATE TABLE IF NOT EXISTS orders (id int)")
        await tx.execute("INSERT INTO orders VALUES (1)")
        await tx.insert(Job("audit"), unique_opts={})
        with pytest.raises(awa.UniqueConflict):
            await tx.insert(Job("audit"), unique_opts={})
    assert await scalar(dsn, "SELECT count(*) FROM orders") == 1
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all") == 1


async def test_a_commit_after_an_aborting_error_raises_instead_of_rolling_back_silently(client):
    with pytest.raises(awa.AwaError, match="rolled back"):
        async with await client.transaction() as tx:
            with pytest.raises(awa.DatabaseError) as info:  # typed, the driver's chained
                await tx.execute("SELECT 1/0")
            assert isinstance(info.value.__cause__, psycopg.errors.DivisionByZero)


async def test_cancelled_error_from_handler_code_counts_the_attempt(dsn, client):
    @client.task(Job)
    async def work(job):
        inner = asyncio.ensure_future(asyncio.sleep(10))
        inner.cancel()
        await inner  # raises CancelledError inside the handler

    job = await client.insert(Job("x"), max_attempts=2)
    await client.start([("default", 1)], **FAST)
    row = await wait_state(client, job.id, "retryable")
    assert row["attempt"] == 1 and row["errors"][-1]["error"].startswith("CancelledError")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, 1e12])
def test_retry_after_and_snooze_reject_unbounded_delays(value):
    with pytest.raises(ValueError):
        awa.RetryAfter(value)
    with pytest.raises(ValueError):
        awa.Snooze(value)


async def test_idempotency_key_differs_per_failure_of_the_same_job(dsn, client):
    keys = []

    async def effect(failure):
        keys.append(failure.idempotency_key)

    @client.task(Job, failure_consequence=effect)
    async def work(job):
        raise awa.TerminalError("no")

    job = await client.insert(Job("x"), max_attempts=1)
    await client.start([{"name": "default", "max_workers": 1, "dlq": True}], **FAST)
    await until(lambda: len(keys) == 1, client, what="first failure")
    await until(lambda: client.get_dlq_job(job.id), client, what="dead-lettered")
    await client.retry_from_dlq(job.id)
    await until(lambda: len(keys) == 2, client, what="second failure")
    assert keys[0] != keys[1]


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


async def test_a_def_handler_returning_a_coroutine_is_awaited(dsn, client):
    done = []

    async def real(job):
        done.append(job.id)

    client.task(Job)(lambda job: real(job))  # a plain callable returning a coroutine
    job = await client.insert(Job("x"))
    await client.start([("default", 1)], **FAST)
    await wait_state(client, job.id, "completed")
    assert done == [job.id]


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


@pytest.mark.parametrize("field", ["kind", "queue", "tags", "ordering_key"])
async def test_lone_surrogates_are_validation_errors(client, field):
    opts = {"kind": "k", "queue": "q"}
    bad = "a\ud800"
    opts[field] = [bad] if field == "tags" else bad
    with pytest.raises(awa.ValidationError) as info:
        await client.insert({"x": 1}, **opts)
    assert info.value.field == field


@pytest.mark.parametrize(
    "override", [{"priority": 40000}, {"priority": True}, {"queue": "a\x00b"}, {"queue": 5}]
)
async def test_dlq_retry_overrides_are_validated(client, override):
    with pytest.raises(awa.ValidationError):
        await client.retry_from_dlq(1, **override)


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
