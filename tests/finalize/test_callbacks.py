"""External waits (ADR-021) on a real PostgreSQL, including the races: an early callback while
the handler still runs, a callback after its timeout rescue, admin cancel of a waiting job, and
ADR-046's rows for staged follow-ups across waits."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest

import awa_fast as awa
from tests.support import FAST, job_row, scalar, until, wait_state


@dataclasses.dataclass
class Ext:
    mode: str


@dataclasses.dataclass
class After:
    n: int


pytestmark = pytest.mark.usefixtures("clean")


def parking_handler(client, tokens):
    @client.task(Ext)
    async def ext(job):
        token = await job.register_callback(timeout_seconds=float(job.args.mode or 3600))
        tokens[job.id] = token.id
        return awa.WaitForCallback(token)


async def parked(dsn, client, tokens, *, max_attempts=3, timeout="3600"):
    job = await client.insert(Ext(timeout), max_attempts=max_attempts)
    row = await wait_state(client, job.id, "waiting_external")
    assert str(row["callback_id"]) == tokens[job.id]
    return job


async def test_park_then_complete_fail_retry_and_heartbeat(dsn, client):
    tokens = {}
    parking_handler(client, tokens)
    await client.start([("default", 4)], **FAST)

    a = await parked(dsn, client, tokens)
    done = await client.complete_external(tokens[a.id], {"ok": True})
    assert done.state == awa.JobState.Completed and done.callback_id is None

    b = await parked(dsn, client, tokens)
    failed = await client.fail_external(tokens[b.id], "provider said no")
    assert failed.state == awa.JobState.Failed
    assert failed.errors[-1]["error"] == "provider said no"

    c = await parked(dsn, client, tokens)
    before = (await job_row(dsn, c.id))["callback_timeout_at"]
    beat = await client.heartbeat_callback(tokens[c.id], timeout_seconds=7200)
    assert (await job_row(dsn, c.id))["callback_timeout_at"] > before and beat.id == c.id
    first_token = tokens[c.id]
    retried = await client.retry_external(first_token)
    assert retried.attempt == 0
    await until(lambda: _token_changed(tokens, c.id, first_token), client, what="re-run")
    await wait_state(client, c.id, "waiting_external")


async def _token_changed(tokens, job_id, old):
    return tokens.get(job_id) != old


async def test_bad_callback_ids_and_arguments(dsn, client):
    with pytest.raises(awa.CallbackNotFound):
        await client.complete_external(str(uuid.uuid4()))
    with pytest.raises(awa.ValidationError) as info:
        await client.fail_external("not-a-uuid", "x")
    assert info.value.field == "callback_id"
    errors = []

    @client.task(Ext)
    async def ext(job):
        for kwargs in (
            {"timeout_seconds": -1},
            {"timeout_seconds": float("inf")},
            {"filter": "payload.ok =="},
        ):
            try:
                await job.register_callback(**kwargs)
            except (ValueError, awa.ValidationError) as exc:
                errors.append(type(exc).__name__)

    job = await client.insert(Ext(""))
    await client.start([("default", 1)], **FAST)
    await wait_state(client, job.id, "completed")
    # awa-pg raises ValidationError (a ValueError) for a bad timeout too
    assert errors == ["ValidationError", "ValidationError", "ValidationError"]


async def test_wait_for_callback_resumes_repeatedly_and_rejects_stale_tokens(dsn, client):
    payloads, stale = [], []
    issued = asyncio.Queue()

    @client.task(Ext)
    async def ext(job):
        for _ in range(2):
            token = await job.register_callback(timeout_seconds=60)
            await issued.put(token.id)
            payloads.append(await job.wait_for_callback(token))
            try:
                await job.wait_for_callback(token)  # consumed: stale now
            except awa.ValidationError:
                stale.append(token.id)

    job = await client.insert(Ext(""))
    await client.start([("default", 1)], **FAST)
    for n in range(2):
        token = await issued.get()
        await wait_state(client, job.id, "waiting_external")
        resumed = await client.resume_external(token, {"n": n})
        assert resumed.state == awa.JobState.Running
    await wait_state(client, job.id, "completed")
    assert payloads == [{"n": 0}, {"n": 1}] and len(stale) == 2


async def test_early_callback_completes_a_still_running_job(dsn, client):
    registered, release = asyncio.Event(), asyncio.Event()
    tokens = {}

    @client.task(Ext)
    async def ext(job):
        tokens["t"] = (await job.register_callback()).id
        registered.set()
        await release.wait()
        return awa.WaitForCallback(tokens["t"])

    job = await client.insert(Ext(""))
    await client.start([("default", 1)], **FAST)
    await registered.wait()
    done = await client.complete_external(tokens["t"])
    assert done.state == awa.JobState.Completed
    release.set()
    await until(lambda: _stale(client), client, what="the park to be stale")
    assert (await job_row(dsn, job.id))["state"] == "completed"


async def _stale(client):
    return client.runtime.finalizer.stats["stale"] >= 1


async def test_callback_after_timeout_rescue_is_rejected(dsn, client):
    tokens = {}
    parking_handler(client, tokens)
    await client.start([("default", 2)], **{**FAST, "promote_interval_ms": 3_600_000})
    retry = await client.insert(Ext("0.1"), max_attempts=3)
    final = await client.insert(Ext("0.1"), max_attempts=1)
    r1 = await wait_state(client, retry.id, "retryable")
    r2 = await wait_state(client, final.id, "failed")
    assert r1["errors"][-1]["error"] == "callback timed out" and r1["callback_id"] is None
    assert r2["errors"][-1]["terminal"] is True
    for job, row in ((retry, r1), (final, r2)):
        with pytest.raises(awa.CallbackNotFound):
            await client.complete_external(tokens[job.id])
        assert await job_row(dsn, job.id) == row


async def test_admin_cancel_of_a_waiting_job(dsn, client):
    tokens = {}
    parking_handler(client, tokens)
    await client.start([("default", 1)], **FAST)
    job = await parked(dsn, client, tokens)
    cancelled = await client.cancel(job.id)
    assert cancelled.state == awa.JobState.Cancelled
    with pytest.raises(awa.CallbackNotFound):
        await client.resume_external(tokens[job.id])


async def test_staged_follow_ups_survive_a_resumed_wait(dsn, client):
    issued = asyncio.Queue()

    @client.task(Ext)
    async def ext(job):
        job.enqueue_on_completion(After(1))
        token = await job.register_callback(timeout_seconds=60)
        await issued.put(token.id)
        await job.wait_for_callback(token)
        job.enqueue_on_completion(After(2))

    job = await client.insert(Ext(""))
    await client.start([("default", 1)], **FAST)
    token = await issued.get()
    await wait_state(client, job.id, "waiting_external")
    await client.resume_external(token)
    await wait_state(client, job.id, "completed")
    assert await scalar(
        dsn,
        "SELECT array_agg((args->>'n')::int ORDER BY id) FROM awa_fast.jobs_all WHERE kind = 'after'",
    ) == [1, 2]


async def test_external_completion_discards_staged_follow_ups(dsn, client):
    issued = asyncio.Queue()
    outcome = []

    @client.task(Ext)
    async def ext(job):
        job.enqueue_on_completion(After(1))
        token = await job.register_callback(timeout_seconds=60)
        await issued.put(token.id)
        try:
            await job.wait_for_callback(token)
        except awa.AwaError as exc:
            outcome.append(str(exc))
            raise

    job = await client.insert(Ext(""))
    await client.start([("default", 1)], **FAST)
    token = await issued.get()
    await wait_state(client, job.id, "waiting_external")
    await client.complete_external(token)
    await until(lambda: outcome, client, what="the waiting handler to error")
    await until(lambda: _stale(client), client, what="stale outcome")
    assert (await job_row(dsn, job.id))["state"] == "completed"
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'after'") == 0


async def test_an_external_completion_into_a_held_key_is_cancelled_as_a_duplicate(dsn, client):
    # it raised UniqueConflict and the job stayed parked until its callback timed out: the
    # external result was lost (breaker helper)
    tokens: dict = {}
    parking_handler(client, tokens)
    completed_only = {"by_args": False, "states": 1 << 3}
    job = await client.insert(Ext(""), unique_opts=completed_only)
    await client.start([("default", 1)], **FAST)
    await wait_state(client, job.id, "waiting_external")
    holder = await scalar(
        dsn,
        "INSERT INTO awa_fast.jobs (kind, queue, args, state, unique_key, unique_states) "
        "SELECT 'other', 'nobody', '{}', 'available', unique_key, 10 FROM awa_fast.jobs "
        "WHERE id = %s RETURNING id",
        (job.id,),
    )
    done = await client.complete_external(tokens[job.id], {"ok": True})
    assert done.state == awa.JobState.Cancelled and done.callback_id is None
    assert done.errors[-1]["error"].startswith("cancelled as duplicate")
    row = await job_row(dsn, job.id)
    assert row["state"] == "cancelled" and not row["unique_states"] & (1 << 6)
    assert (await job_row(dsn, holder))["state"] == "available"


async def test_an_early_external_completion_into_a_held_key_keeps_the_running_mark(dsn, client):
    # the duplicate cancel cleared heartbeat_at, so retry() started a second attempt while the
    # first handler still ran (breaker helper)
    tokens, registered, release = {}, asyncio.Event(), asyncio.Event()

    @client.task(Ext)
    async def ext(job):
        token = await job.register_callback(timeout_seconds=3600)
        tokens[job.id] = token.id
        registered.set()
        await release.wait()  # still running when the callback comes

    job = await client.insert(Ext(""), unique_opts={"by_args": False, "states": 1 << 3})
    await client.start([("default", 1)], **FAST)
    await asyncio.wait_for(registered.wait(), 15)
    await scalar(
        dsn,
        "INSERT INTO awa_fast.jobs (kind, queue, args, state, unique_key, unique_states) "
        "SELECT 'other', 'nobody', '{}', 'available', unique_key, 10 FROM awa_fast.jobs "
        "WHERE id = %s RETURNING id",
        (job.id,),
    )
    done = await client.complete_external(tokens[job.id])
    assert done.state == awa.JobState.Cancelled
    assert (await job_row(dsn, job.id))["heartbeat_at"] is not None  # its handler lives on
    with pytest.raises(awa.AttemptStillRunning):
        await client.retry(job.id)
    release.set()
