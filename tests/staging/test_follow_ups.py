"""Handler-staged follow-ups (ADR-046) and registered specs (ADR-029) on a real PostgreSQL:
every row of the ADR's commit table, each guarantee, each StagingError reason, the dedup
consequences, finalize retries under injected faults, and the test-harness parity."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import warnings

import psycopg
import pytest

import awa_fast as awa
from awa_fast import sql
from awa_fast.testing import AwaTestClient, HandlerJob
from awa_fast.worker import executor as ex
from tests.support import (
    FAST,
    exploding_inserts,
    job_row,
    scalar,
    until,
    wait_state,
    wakeups_until_marker,
)


@dataclasses.dataclass
class StageA:
    item: str
    mode: str = "complete"


@dataclasses.dataclass
class StageB:
    item: str


pytestmark = pytest.mark.usefixtures("clean")


async def b_items(dsn) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT args->>'item' FROM awa_fast.jobs_all WHERE kind = 'stage_b' ORDER BY id"
        )
        return [r[0] for r in await cur.fetchall()]


async def settled(dsn, kind="stage_a") -> bool:
    n = await scalar(
        dsn,
        "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = %s AND state IN "
        "('available', 'running', 'scheduled')",
        (kind,),
    )
    return n == 0


def b_handler(client):
    @client.task(StageB)
    async def stage_b(job):
        return None


# -- the pipeline of the ADR's Context section ----------------------------------------------------


async def test_pipeline_one_b_per_distinct_value_and_none_for_failed_a(dsn, client):
    b_handler(client)

    @client.task(StageA)
    async def stage_a(job):
        value = job.args.item.split("-")[0]  # computed: many As resolve to the same value
        job.enqueue_on_completion(StageB(item=value), unique_opts={})
        if job.args.mode == "fail":
            raise awa.TerminalError("A did not complete")

    items = [f"v{i % 7}-{i}" for i in range(60)]
    await client.insert_many([StageA(i) for i in items], max_attempts=1)
    await client.insert(StageA("only_failed-1", mode="fail"), max_attempts=1)
    await client.start([("default", 16)], **FAST)
    await until(lambda: settled(dsn), client, what="A jobs settled")
    await until(lambda: settled(dsn, "stage_b"), client, what="B jobs settled")
    assert sorted(await b_items(dsn)) == sorted(f"v{i}" for i in range(7))
    # A second wave while the first Bs are completed: still one B per value (completed holds).
    await client.insert_many([StageA(f"v{i}-again") for i in range(7)])
    await until(lambda: settled(dsn), client, what="second wave")
    assert sorted(await b_items(dsn)) == sorted(f"v{i}" for i in range(7))
    assert client.runtime.finalizer.stats["follow_ups_skipped"] >= 53 + 7


async def test_both_completion_paths_in_one_run(dsn, client):
    b_handler(client)

    @client.task(StageA)
    async def stage_a(job):
        if job.args.mode == "stage":
            job.enqueue_on_completion(StageB(job.args.item))

    await client.insert_many([StageA(f"p{i}", "plain") for i in range(40)])
    await client.insert_many([StageA(f"s{i}", "stage") for i in range(10)])
    await client.start([("default", 16)], **FAST)
    await until(lambda: settled(dsn), client, what="As")
    await until(lambda: settled(dsn, "stage_b"), client, what="Bs")
    stats = client.runtime.finalizer.stats
    assert stats["per_job"] == 10  # the stagers
    assert stats["compact"] == 40 + 10  # plain As and the Bs
    assert len(await b_items(dsn)) == 10


# -- the commit table -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode,state",
    [
        ("retry_after", "retryable"),
        ("snooze", "scheduled"),
        ("cancel", "cancelled"),
        ("error", "retryable"),
        ("terminal", "failed"),
        ("wait", "failed"),
    ],
)
async def test_discarded_on_every_other_outcome(dsn, client, mode, state, caplog):
    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageB("x"))
        if mode == "retry_after":
            return awa.RetryAfter(60)
        if mode == "snooze":
            return awa.Snooze(60)
        if mode == "cancel":
            return awa.Cancel("no")
        if mode == "error":
            raise RuntimeError("err")
        if mode == "terminal":
            raise awa.TerminalError("t")
        return awa.WaitForCallback("00000000-0000-0000-0000-000000000000")

    before = ex.metrics["staged_discarded_on_wait_for_callback"]
    job = await client.insert(StageA("a"), max_attempts=5)
    with caplog.at_level(logging.WARNING, logger="awa_fast.executor"):
        await client.start([("default", 1)], **FAST)
        await wait_state(client, job.id, state)
    assert await b_items(dsn) == []
    if mode == "wait":
        assert ex.metrics["staged_discarded_on_wait_for_callback"] == before + 1
        assert any(
            f"job {job.id} (stage_a) returned WaitForCallback: discarding 1" in r.message
            for r in caplog.records
        )


async def test_stale_completion_discards_follow_ups(dsn, client):
    started, release = asyncio.Event(), asyncio.Event()

    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageB("x"))
        started.set()
        await release.wait()

    job = await client.insert(StageA("a"), max_attempts=3)
    await client.start([("default", 1)], **FAST, maintenance=False)
    await started.wait()
    async with (await client.pool()).connection() as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s",
            (job.id,),
        )
    from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig

    await Maintenance(dsn, client.pool, MaintenanceConfig()).rescue()
    release.set()
    await until(lambda: client.runtime.finalizer.stats["stale"], client, what="stale")
    assert (await job_row(dsn, job.id))["state"] == "retryable"
    assert await b_items(dsn) == []


async def test_poisoned_attempt_fails_terminally_and_inserts_nothing(dsn, client):
    exhausted = []
    client.on_exhausted_enqueue(StageA, lambda args, job, error, attempt: exhausted.append(error))

    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageB("good"))
        try:
            job.enqueue_on_completion(StageB("bad"), priority=9)
        except awa.StagingError:
            pass  # swallowed: must not let A complete
        return None

    job = await client.insert(StageA("a"), max_attempts=5)
    await client.start([("default", 1)], **FAST)
    row = await wait_state(client, job.id, "failed")
    assert row["errors"][-1]["terminal"] is True
    assert row["errors"][-1]["error"].startswith("StagingError:")
    assert "priority" in row["errors"][-1]["error"]
    assert await b_items(dsn) == []
    assert len(exhausted) == 1 and exhausted[0].startswith("StagingError")


async def test_sealed_after_return_and_retry_starts_empty(dsn, client):
    late_errors = []
    handles = []

    @client.task(StageA)
    async def stage_a(job):
        fu = job.follow_ups()
        handles.append(fu)
        fu.enqueue_on_completion(StageB(f"attempt{job.attempt}"))
        if job.attempt == 1:
            return awa.RetryAfter(0)
        return None

    job = await client.insert(StageA("a"), max_attempts=3)
    await client.start([("default", 1)], **FAST)
    await wait_state(client, job.id, "completed")
    for fu in handles:
        with pytest.raises(awa.StagingError) as info:
            fu.enqueue_on_completion(StageB("late"))
        late_errors.append(info.value.reason)
    assert late_errors == ["sealed", "sealed"]
    assert await b_items(dsn) == ["attempt2"]


async def test_staging_error_reasons_and_limits(dsn, client):
    reasons = {}

    @client.task(StageA)
    async def stage_a(job):
        mode = job.args.mode
        try:
            if mode == "too_many":
                for i in range(17):
                    job.enqueue_on_completion(StageB(f"n{i}"))
            elif mode == "too_large":
                job.enqueue_on_completion(StageB("x" * 40000))
                job.enqueue_on_completion(StageB("y" * 30000))
            elif mode == "invalid":
                job.enqueue_on_completion({"a": object()}, kind="stage_b")
            elif mode == "sixteen":
                for i in range(16):
                    job.enqueue_on_completion(StageB(f"s{i}"))
                return None
        except awa.StagingError as exc:
            reasons[mode] = (exc.reason, exc.limit, type(exc.__cause__).__name__, job.id)
            raise
        return None

    ids = {
        m: (await client.insert(StageA(m, m), max_attempts=3)).id
        for m in ("too_many", "too_large", "invalid", "sixteen")
    }
    await client.start([("default", 4)], **FAST)
    for m in ("too_many", "too_large", "invalid"):
        row = await wait_state(client, ids[m], "failed")
        assert row["errors"][-1]["terminal"] is True  # StagingError is a TerminalError
    await wait_state(client, ids["sixteen"], "completed")
    assert reasons["too_many"][:2] == ("too_many", 16)
    assert reasons["too_large"][:2] == ("too_large", 65536)
    assert reasons["invalid"][0] == "invalid" and reasons["invalid"][2] == "SerializationError"
    assert sorted(await b_items(dsn)) == sorted(f"s{i}" for i in range(16))


async def test_insert_error_other_than_duplicate_rolls_the_completion_back(dsn, client):
    async with exploding_inserts(dsn):

        @client.task(StageA)
        async def stage_a(job):
            job.enqueue_on_completion(StageB("fine"))
            job.enqueue_on_completion({"x": 1}, kind="explode")

        job = await client.insert(StageA("a"))
        await client.start([("default", 1)], **FAST, maintenance=False)
        await until(lambda: client.runtime.outcomes.get("completed"), client, what="handler")
        await until(lambda: _no_in_flight(client), client, what="finalize attempt over")
        # ADR-046 prompt failure: a failed attempt at once, with the error (not left running).
        row = await job_row(dsn, job.id)
        assert row["state"] == "retryable" and row["run_lease"] == 1
        assert "trigger added outside awa-fast" in row["errors"][-1]["error"]
        assert await b_items(dsn) == []


async def _no_in_flight(client):
    return not client.runtime.in_flight


# -- dedup consequences ---------------------------------------------------------------------------


async def test_follow_up_colliding_with_its_own_trigger_is_skipped(dsn, client):
    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageA(job.args.item, job.args.mode), unique_opts={})

    job = await client.insert(StageA("same"), unique_opts={})
    await client.start([("default", 1)], **FAST)
    await wait_state(client, job.id, "completed")
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'stage_a'") == 1
    assert client.runtime.finalizer.stats["follow_ups_skipped"] == 1


async def test_two_identical_stagings_collapse_to_one(dsn, client):
    b_handler(client)

    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageB("dup"), unique_opts={})
        job.enqueue_on_completion(awa.EnqueueRequest(StageB("dup")).unique({}))
        job.enqueue_on_completion(StageB("other"), unique_opts={"by_args": False})

    job = await client.insert(StageA("a"))
    await client.start([("default", 1)], **FAST)
    await wait_state(client, job.id, "completed")
    # by_args=False collides with the first key only if same kind+no args: it is a new key.
    assert sorted(await b_items(dsn)) == ["dup", "other"]


# -- provenance, trace, EnqueueRequest -------------------------------------------------------------


async def test_provenance_and_trace_context_reach_the_follow_up(dsn, client):
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    @client.task(StageA)
    async def stage_a(job):
        req = awa.EnqueueRequest(StageB("t"), queue="bq", priority=1).metadata({"note": "n"})
        job.enqueue_on_completion(req)

    job = await client.insert(StageA("a"), metadata={"awa:traceparent": trace})
    await client.start([("default", 1)], **FAST)
    await wait_state(client, job.id, "completed")
    row = await _b_row(dsn)
    assert row["queue"] == "bq" and row["priority"] == 1  # .metadata() kept the other options
    assert row["metadata"] == {"note": "n", "awa:triggered_by": job.id, "awa:traceparent": trace}


async def test_staging_without_queue_a_kind_registered_elsewhere_warns_once_as_insert(dsn, client):
    # insert() warned (QueueMismatchWarning); staging put it on 'default' silently
    client.task(StageB, queue="bq")(lambda job: None)

    @client.task(StageA)
    async def stage_a(job):
        if job.args.mode == "explicit":
            job.enqueue_on_completion(StageB("e"), queue="default")
            job.enqueue_on_completion(awa.EnqueueRequest(StageB("r"), queue="default"))
        else:
            job.enqueue_on_completion(StageB(job.args.item))  # the warning points here

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = await client.insert(StageA("explicit", "explicit"))
        await client.start([("default", 1), ("bq", 1)], **FAST)
        await wait_state(client, first.id, "completed")
        assert not [w for w in caught if issubclass(w.category, awa.QueueMismatchWarning)]
        jobs = [await client.insert(StageA(f"x{i}")) for i in range(2)]
        for job in jobs:
            await wait_state(client, job.id, "completed")
    mismatch = [w for w in caught if issubclass(w.category, awa.QueueMismatchWarning)]
    assert len(mismatch) == 1, [str(w.message) for w in caught]  # once per kind and client
    assert re.match(
        r"job kind 'stage_b' is registered for queue 'bq' on this client but was staged "
        r"without queue=, so it went to 'default'",
        str(mismatch[0].message),
    ), str(mismatch[0].message)
    assert mismatch[0].filename == __file__  # the handler's line
    queues = await scalar(
        dsn, "SELECT array_agg(DISTINCT queue) FROM awa_fast.jobs_all WHERE kind = 'stage_b'"
    )
    assert queues == ["default"]  # awa-pg's semantics are kept


async def _b_row(dsn):
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute("SELECT * FROM awa_fast.jobs_all WHERE kind = 'stage_b'")
        return await cur.fetchone()


def test_enqueue_request_copies_are_non_destructive():
    base = awa.EnqueueRequest(StageB("x"), queue="q", priority=3)
    uniq = base.unique({"by_queue": True})
    meta = uniq.metadata({"a": 1})
    assert base.options == {"queue": "q", "priority": 3}
    assert uniq.options == {"queue": "q", "priority": 3, "unique_opts": {"by_queue": True}}
    assert meta.options["metadata"] == {"a": 1} and meta.options["unique_opts"] == {
        "by_queue": True
    }
    with pytest.raises(awa.ValidationError):
        awa.EnqueueRequest(StageB("x"), colour="red")


# -- finalize retry under injected faults -----------------------------------------------------------


async def test_finalize_retry_after_a_terminated_backend_inserts_once(dsn, client):
    b_handler(client)
    calls = []

    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageB("once"))

    async def kill_before_commit(conn, statement, requests):
        if statement is not sql.COMPLETE_WITH_FOLLOW_UPS:
            return  # B's compact completion
        calls.append(requests[0].attempt.id)
        if len(calls) == 1:
            pid = conn.info.backend_pid
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
                await other.execute("SELECT pg_terminate_backend(%s)", (pid,))

    job = await client.insert(StageA("a"))
    await client.start([("default", 1)], **FAST)
    client.runtime.finalizer.inject_faults(before_commit=kill_before_commit)
    await wait_state(client, job.id, "completed")
    assert len(calls) == 2 and client.runtime.finalizer.stats["retries"] == 1
    assert await b_items(dsn) == ["once"]


async def test_lost_commit_acknowledgement_replays_as_stale(dsn, client):
    results = []

    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageB("once"))

    async def lose_ack(conn, statement, requests):
        if statement is sql.COMPLETE_WITH_FOLLOW_UPS and not results:
            results.append("lost")
            raise psycopg.OperationalError("simulated: connection lost after COMMIT was sent")

    job = await client.insert(StageA("a"))
    await client.start([("default", 1)], **FAST)
    client.runtime.finalizer.inject_faults(after_commit=lose_ack)
    await wait_state(client, job.id, "completed")
    await until(lambda: client.runtime.finalizer.stats["stale"], client, what="stale replay")
    assert await b_items(dsn) == ["once"]


def _shape(text: str) -> str:
    """A statement with its placeholders (psycopg's ``%s`` or the server's ``$n``) unified."""
    return re.sub(r"%s|\$\d+", "?", text).strip()


async def test_fault_hooks_wrap_the_statements_production_runs(dsn, client):
    # The hooks never change the path: a completion with follow-ups still commits through
    # sql.COMPLETE_WITH_FOLLOW_UPS (the constant itself), a plain one through the compact
    # sql.COMPLETE_MANY, a retry through sql.TRANSITION -- and right after the commit, the
    # backend's last statement (pg_stat_activity, read from another session) is that text.
    seen: dict[str, list] = {"before": [], "after": []}

    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageB("x"))
        if job.args.mode == "retry":
            return awa.RetryAfter(3600)

    b_handler(client)

    async def before(conn, statement, requests):
        seen["before"].append((statement, requests[0].attempt.kind, requests[0].outcome.kind))

    async def after(conn, statement, requests):
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            cur = await other.execute(
                "SELECT query FROM pg_stat_activity WHERE pid = %s", (conn.info.backend_pid,)
            )
            (ran,) = await cur.fetchone()
        seen["after"].append((statement, ran))

    await client.start([("default", 1)], **FAST)
    client.runtime.finalizer.inject_faults(before_commit=before, after_commit=after)
    await client.insert(StageA("a"))
    await client.insert(StageA("r", mode="retry"))
    await until(lambda: len(seen["after"]) >= 3, client, what="three commits")
    kinds = {(kind, outcome): statement for statement, kind, outcome in seen["before"]}
    assert kinds[("stage_a", ex.COMPLETED)] is sql.COMPLETE_WITH_FOLLOW_UPS
    assert kinds[("stage_b", ex.COMPLETED)] is sql.COMPLETE_MANY
    assert kinds[("stage_a", ex.RETRY)] is sql.TRANSITION
    for statement, ran in seen["after"]:
        if statement is sql.TRANSITION:
            assert ran == "COMMIT"  # a transaction: the hook ran just before its COMMIT
        else:  # pg_stat_activity keeps the first 1024 bytes (track_activity_query_size)
            full, got = _shape(statement), _shape(ran)
            assert full.startswith(got) and (got == full or len(ran.encode()) >= 1000)


# -- wake-ups of committed follow-ups (migration 009) ------------------------------------------


async def test_deferred_notify_keeps_the_insert_trigger_silent_in_that_transaction(dsn, client):
    # The one-statement completion sets awa_fast.defer_notify for its own transaction: the
    # insert trigger sends nothing then (a NOTIFY would serialize such commits database-wide);
    # any other insert still notifies in its transaction.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN awa_fast")
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await conn.execute("SELECT set_config('awa_fast.defer_notify', 'on', true)")
            await conn.execute(
                "INSERT INTO awa_fast.jobs (kind, queue, args) VALUES ('x', 'deferred_q', '{}')"
            )
            await conn.commit()
            await conn.execute(  # the setting was transaction-local
                "INSERT INTO awa_fast.jobs (kind, queue, args) VALUES ('x', 'plain_q', '{}')"
            )
            await conn.commit()
        assert await wakeups_until_marker(listener, dsn, "marker") == ["plain_q"]


@pytest.mark.parametrize("inline", [False, True])
async def test_a_completion_wakes_its_follow_ups_queue_after_commit(dsn, client, inline):
    # The finalizer's statement inserts the follow-up without a NOTIFY; the finalizer sends the
    # wake-up itself once the completion committed, so a dispatcher that only polls every
    # minute still starts the follow-up at once.
    other = awa.AsyncClient(dsn)
    done = asyncio.Event()

    @other.task(StageB, queue="woken")
    async def stage_b(job):
        done.set()

    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageB("wake"), queue="woken")

    try:
        await other.start([("woken", 1)], poll_interval_ms=60_000)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
            await listener.execute("LISTEN awa_fast")
            if inline:
                await client.insert(StageA("a"))
                result = await AwaTestClient(client).work_one(StageA, stage_a)
                assert result.is_completed()
            else:
                await client.start([("default", 1)], **FAST)
                await client.insert(StageA("a"))
            await asyncio.wait_for(done.wait(), 30)  # a signal: the NOTIFY woke the dispatcher
            payloads = await wakeups_until_marker(listener, dsn, "marker")
        assert payloads.count("woken") == 1  # one wake-up for the committed follow-up
        assert await b_items(dsn) == ["wake"]
    finally:
        await other.close()


# -- registered specs (ADR-029) ---------------------------------------------------------------------


async def test_registered_specs_fire_in_the_outcome_transaction(dsn, client):
    client.on_completed_enqueue(
        StageA, lambda a, job: StageB(f"done-{a.item}") if a.mode == "complete" else None
    )
    client.on_retried_enqueue(
        StageA, lambda a, job, err, attempt, nxt: StageB(f"retried-{attempt}")
    )
    client.on_exhausted_enqueue(StageA, lambda a, job, err, attempt: StageB(f"exhausted-{a.item}"))
    client.on_cancelled_enqueue(StageA, lambda a, job, reason: StageB(f"cancelled-{reason}"))

    @client.task(StageA)
    async def stage_a(job):
        job.enqueue_on_completion(StageB(f"staged-{job.args.item}"))
        if job.args.mode == "skip":
            return None
        if job.args.mode == "retry":
            raise RuntimeError("once") if job.attempt == 1 else awa.TerminalError("then fail")
        if job.args.mode == "cancel":
            return awa.Cancel("why")

    await client.insert(StageA("c"))
    await client.insert(StageA("s", "skip"))
    await client.insert(StageA("r", "retry"), max_attempts=3)
    await client.insert(StageA("x", "cancel"))
    await client.start([("default", 4)], **FAST)
    await until(lambda: _count_b(dsn, 6), client, what="six follow-ups")
    await until(lambda: settled(dsn), client, what="As settled")
    # Completed specs come first, then staged requests in staging order.
    assert sorted(await b_items(dsn)) == sorted(
        ["done-c", "staged-c", "staged-s", "retried-1", "exhausted-r", "cancelled-why"]
    )
    ids = {item: i for i, item in enumerate(await b_items(dsn))}
    assert ids["done-c"] < ids["staged-c"]
    with pytest.raises(RuntimeError):
        client.on_completed_enqueue(StageA, lambda a, j: None)


async def _count_b(dsn, n):
    return await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'stage_b'") >= n


async def test_rescued_spec_runs_after_the_rescue(dsn, client):
    client.on_rescued_enqueue(StageA, lambda a, job, reason: StageB(f"rescued-{reason}"))
    job = await client.insert(StageA("a"), max_attempts=3)
    async with (await client.pool()).connection() as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET state = 'running', attempt = 1, "
            "heartbeat_at = now() - interval '1 hour' WHERE id = %s",
            (job.id,),
        )
    await client.start([("none", 1)], **{**FAST, "heartbeat_rescue_interval_ms": 50})
    await until(lambda: _count_b(dsn, 1), client, what="rescued follow-up")
    assert await b_items(dsn) == ["rescued-stale_heartbeat"]
    assert (await job_row(dsn, job.id))["state"] in ("retryable", "available")


# -- test harness parity ---------------------------------------------------------------------------


async def test_work_one_inserts_in_its_completion_and_discards_otherwise(dsn, client):
    harness = AwaTestClient(client)

    async def stage(job):
        job.enqueue_on_completion(StageB(job.args.item))
        if job.args.mode == "retry":
            return awa.RetryAfter(5)
        if job.args.mode == "poison":
            try:
                job.enqueue_on_completion(StageB("bad"), max_attempts=0)
            except awa.StagingError:
                pass
        return 42  # any other value: completed

    await client.insert(StageA("ok"))
    res = await harness.work_one(StageA, stage)
    assert res.is_completed() and res.applied
    await client.insert(StageA("r", "retry"))
    assert (await harness.work_one(StageA, stage)).is_retryable()
    await client.insert(StageA("p", "poison"))
    res = await harness.work_one(StageA, stage)
    assert res.is_failed() and res.error.startswith("StagingError")
    assert (await harness.work_one(StageA, stage)).is_no_job()
    assert await b_items(dsn) == ["ok"]


def test_handler_job_records_staged_requests_with_the_same_rules():
    job = HandlerJob(args=StageA("a"), id=7, metadata={"traceparent": "00-ab-cd-01"})
    job.enqueue_on_completion(StageB("x"), priority=1, unique_opts={})
    assert job.staged[0]["kind"] == "stage_b" and job.staged[0]["args"] == {"item": "x"}
    assert job.staged[0]["priority"] == 1 and job.staged[0]["unique_states"] == 31
    assert job.staged[0]["metadata"] == {"awa:triggered_by": 7, "awa:traceparent": "00-ab-cd-01"}
    with pytest.raises(awa.StagingError) as info:
        job.enqueue_on_completion(StageB("y"), queue="")
    assert info.value.reason == "invalid" and isinstance(info.value.__cause__, awa.ValidationError)
    assert info.value.field == "queue"  # the original error's field, not only its text
    job = HandlerJob(args=StageA("a"), id=8)
    with pytest.raises(awa.StagingError) as info:  # a NaN was staged as null
        job.enqueue_on_completion({"x": float("nan")}, kind="stage_b")
    assert (info.value.reason, info.value.field) == ("invalid", "args.x")
    job = HandlerJob(args=StageA("a"), id=7)
    job.enqueue_on_completion(StageB("x"), priority=1, unique_opts={})
    for i in range(15):
        job.enqueue_on_completion(StageB(f"n{i}"))
    with pytest.raises(awa.StagingError) as info:
        job.enqueue_on_completion(StageB("17th"))
    assert (info.value.reason, info.value.limit) == ("too_many", 16)
    assert len(job.staged) == 16


async def test_a_released_attempt_wakes_its_queue_after_the_commit(dsn, client):
    # A release (shutdown, no handler) makes the job available in a per-job transaction: its
    # wake-up is sent by the finalizer's Waker after the commit, not by a NOTIFY inside it
    # (which would hold the notify lock through that commit's WAL flush; ADR 018).
    from awa_fast import sql
    from awa_fast.worker.context import JobContext
    from awa_fast.worker.finalize_request import Finalized, FinalizeRequest
    from awa_fast.worker.finalizer import Finalizer

    job = await client.insert(StageB("released"), queue="given_back")
    await client._producer.waker.flush()  # the insert's own wake-up, before we listen
    pool = await client.pool()
    async with pool.connection() as conn:
        cur = await conn.execute(sql.CLAIM_ONE_OF_KIND, {"queue": "given_back", "kind": job.kind})
        ctx = JobContext(await cur.fetchone(), None)
    finalizer = Finalizer.inline(client.pool)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN awa_fast")
        assert await finalizer.submit(FinalizeRequest.release(ctx)) is Finalized.APPLIED
        assert await wakeups_until_marker(listener, dsn, "marker") == ["given_back"]
    assert finalizer._waker.sent == 1  # sent by the waker, in a transaction of its own
    assert (await job_row(dsn, job.id))["state"] == "available"
