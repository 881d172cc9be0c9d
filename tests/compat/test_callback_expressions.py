"""awa's CEL callback expressions (ADR-021, awa-model ``admin.rs``) on a real PostgreSQL: a
handler registers ``filter`` / ``on_fail`` / ``on_complete`` / ``transform`` and
``resolve_callback`` applies them in awa's order, with awa's fail-open rule, texts and error
entry; a bad expression is rejected at registration naming its field; the blocking client and
a handler alive in ``wait_for_callback`` resolve the same way."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

import awa_fast as awa
from awa_fast.sync_client import Client
from tests.support import FAST, job_row, scalar, wait_state

pytestmark = pytest.mark.usefixtures("clean")


@dataclasses.dataclass
class Hook:
    exprs: dict
    wait: bool = False


async def _start(client, outcomes: dict, tokens: asyncio.Queue):
    """A worker whose handler registers the job's expressions and parks (or waits)."""
    client.failure_consequence(Hook, awa.NO_FAILURE_CONSEQUENCE)

    @client.task(Hook)
    async def hook(job):
        try:
            token = await job.register_callback(timeout_seconds=600, **job.args.exprs)
        except awa.ValidationError as exc:
            outcomes[job.id] = exc
            return None
        await tokens.put((job.id, token.id))
        if job.args.wait:
            outcomes[job.id] = await job.wait_for_callback(token)
            return None
        return awa.WaitForCallback(token)

    await client.start([("default", 4)], **FAST)


async def _parked(dsn, client, tokens, exprs: dict, wait: bool = False) -> tuple[int, str]:
    job = await client.insert(Hook(exprs, wait))
    job_id, cid = await tokens.get()
    assert job_id == job.id
    await wait_state(client, job.id, "waiting_external")
    return job.id, cid


EXPRS = {
    "filter": 'payload.source == "bank"',
    "on_fail": 'payload.status == "declined"',
    "on_complete": 'payload.status == "paid"',
    "transform": '{"amount": payload.cents / 100, "ref": payload.ref}',
}


async def test_filter_on_fail_on_complete_transform_in_awas_order(dsn, client):
    outcomes, tokens = {}, asyncio.Queue()
    await _start(client, outcomes, tokens)

    job_id, cid = await _parked(dsn, client, tokens, EXPRS)
    # filter false: ignored with awa's reason, nothing changes (the callback stays usable)
    res = await client.resolve_callback(
        cid, {"source": "spam", "status": "paid"}, default_action="complete"
    )
    assert res.is_ignored() and res.reason == "filter expression returned false"
    assert res.job is None and (await job_row(dsn, job_id))["state"] == "waiting_external"
    # on_complete matched: completed, the result carries the transformed payload
    res = await client.resolve_callback(
        cid, {"source": "bank", "status": "paid", "cents": 1250, "ref": "r-1"}
    )
    assert res.is_completed() and res.payload == {"amount": 12, "ref": "r-1"}
    assert res.job.state == awa.JobState.Completed and res.job.id == job_id
    with pytest.raises(awa.CallbackNotFound):  # resolved once
        await client.resolve_callback(cid, {"source": "bank", "status": "paid"})

    # on_fail is evaluated before on_complete: both true -> failed, awa's error entry
    both = {"on_fail": "payload.bad", "on_complete": "payload.good"}
    job_id, cid = await _parked(dsn, client, tokens, both)
    res = await client.resolve_callback(cid, {"bad": True, "good": True})
    assert res.is_failed() and res.job.state == awa.JobState.Failed
    entry = (await job_row(dsn, job_id))["errors"][-1]
    assert entry["error"] == "callback failed: on_fail expression matched"
    assert entry["expression"] == "payload.bad" and entry["attempt"] == 1

    # nothing matched: default_action applies, with the untransformed payload
    job_id, cid = await _parked(dsn, client, tokens, EXPRS)
    res = await client.resolve_callback(cid, {"source": "bank", "status": "pending"})
    assert res.is_ignored() and res.reason == "no expressions configured, default is ignore"
    res = await client.resolve_callback(
        cid, {"source": "bank", "status": "pending"}, default_action="fail"
    )
    assert res.is_failed()
    assert (await job_row(dsn, job_id))["errors"][-1]["error"] == "callback failed: default action"


async def test_errors_fail_open(dsn, client):
    outcomes, tokens = {}, asyncio.Queue()
    await _start(client, outcomes, tokens)
    # a missing field errors: the filter passes, on_fail / on_complete do not match; a
    # transform that errors returns the payload unchanged; a non-bool is an error too
    exprs = {
        "filter": "payload.nope == 1",
        "on_fail": "payload.nope",
        "on_complete": "payload.n",
        "transform": "payload.nope.deeper",
    }
    job_id, cid = await _parked(dsn, client, tokens, exprs)
    res = await client.resolve_callback(cid, {"n": 5}, default_action="ignore")
    assert res.is_ignored() and res.reason == "no expressions configured, default is ignore"
    res = await client.resolve_callback(cid, {"n": True, "x": [1]})
    assert res.is_completed() and res.payload == {"n": True, "x": [1]}


async def test_bad_expressions_are_rejected_at_registration_naming_the_field(dsn, client):
    outcomes, tokens = {}, asyncio.Queue()
    await _start(client, outcomes, tokens)
    cases = {
        "filter": "payload.ok ==",
        "on_complete": "secret == 1",
        "transform": 42,
        "on_fail": "payload.items.exists(i, i > limit)",
    }
    ids = {}
    for field, source in cases.items():
        ids[field] = (await client.insert(Hook({field: source}))).id
    for field, job_id in ids.items():
        await wait_state(client, job_id, "completed")
        exc = outcomes[job_id]
        assert isinstance(exc, awa.ValidationError) and exc.field == field
    assert "invalid CEL expression for filter" in str(outcomes[ids["filter"]])
    assert "undeclared variable(s): secret" in str(outcomes[ids["on_complete"]])
    assert "undeclared variable(s): limit" in str(outcomes[ids["on_fail"]])
    # nothing was registered for the rejected calls
    assert (
        await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE callback_id IS NOT NULL")
        == 0
    )
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.callback_expressions") == 0


async def test_a_handler_in_wait_for_callback_and_the_blocking_client(dsn, client):
    outcomes, tokens = {}, asyncio.Queue()
    await _start(client, outcomes, tokens)
    # the blocking Client resolves through the same expressions
    job_id, cid = await _parked(dsn, client, tokens, {"on_complete": "payload.size() == 2"})
    sync = await asyncio.to_thread(Client, dsn)
    try:
        res = await asyncio.to_thread(sync.resolve_callback, cid, [1, 2])
        assert res.is_completed() and res.payload == [1, 2]
    finally:
        await asyncio.to_thread(sync.close)
    # a handler alive in wait_for_callback: on_fail fails the job, the handler learns it left
    job_id, cid = await _parked(dsn, client, tokens, {"on_fail": "!payload.ok"}, wait=True)
    res = await client.resolve_callback(cid, {"ok": False})
    assert res.is_failed() and res.job.state == awa.JobState.Failed
    await wait_state(client, job_id, "failed")


async def test_concurrent_resolves_act_once(dsn, client):
    outcomes, tokens = {}, asyncio.Queue()
    await _start(client, outcomes, tokens)
    job_id, cid = await _parked(dsn, client, tokens, {"on_complete": "payload.ok"})
    results = await asyncio.gather(
        *(client.resolve_callback(cid, {"ok": True}) for _ in range(4)), return_exceptions=True
    )
    done = [r for r in results if isinstance(r, awa.ResolveResult)]
    assert len(done) == 1 and done[0].is_completed()
    assert all(isinstance(r, awa.CallbackNotFound) for r in results if r not in done)
