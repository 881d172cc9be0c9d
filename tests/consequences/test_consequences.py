"""Per-kind failure consequences (ADR-PFM-OPS-003 as issue 5 states it) on a real PostgreSQL:
every failure reason, both settlement paths, a SIGKILLed worker, a failing effect, a correction
that must survive restarts, a crash between effect and commit, and the registration check."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import threading

import psycopg
import pytest

import awa_fast as awa
from awa_fast.testing import UndeclaredFailureConsequences, assert_failure_consequences_declared
from tests import support
from tests.consequence_app import Reserve, release_reservation
from tests.support import Recorder, job_row, passes, scalar, truncate, until, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "consequence_backoff_ms": 50, "heartbeat_staleness_ms": 500}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
async def business(dsn):
    await truncate(dsn)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("""
            CREATE TABLE IF NOT EXISTS public.released (job_id bigint PRIMARY KEY, reason text);
            CREATE TABLE IF NOT EXISTS public.effect_log (job_id bigint, reason text);
            CREATE TABLE IF NOT EXISTS public.reservations (
                job_id bigint PRIMARY KEY, qty int NOT NULL, released boolean NOT NULL DEFAULT false);
            CREATE TABLE IF NOT EXISTS public.stock (item text PRIMARY KEY, available int NOT NULL);
            TRUNCATE public.released, public.effect_log, public.reservations, public.stock;
            INSERT INTO public.stock VALUES ('widget', 10);""")


@dataclasses.dataclass
class Order:
    mode: str


def with_release(client, calls, fail_times=0):
    """A repeat-safe effect writing on the settlement connection; fails ``fail_times`` times."""

    async def release(failure: awa.JobFailure) -> None:
        calls.append((failure.id, failure.path, failure.reason, failure.idempotency_key))
        await failure.conn.execute(
            "INSERT INTO public.released (job_id, reason) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (failure.id, failure.reason),
        )
        if len([c for c in calls if c[0] == failure.id]) <= fail_times:
            raise RuntimeError("inventory service unavailable")

    return release


async def released(dsn) -> dict:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT job_id, reason FROM public.released")
        return dict(await cur.fetchall())


async def test_each_failure_reason_applies_and_retries_or_success_never_do(dsn, client):
    calls = []

    @client.task(Order, failure_consequence=with_release(client, calls))
    async def order(job):
        mode = job.args.mode
        if mode == "terminal":
            raise awa.TerminalError("declined")
        if mode in ("exhausted", "retry"):
            raise ValueError("flaky")
        if mode == "poison":
            try:
                job.enqueue_on_completion(Order("x"), priority=0)
            except awa.StagingError:
                pass
            return None
        if mode == "retry_after":
            return awa.RetryAfter(60)
        if mode in ("external", "timeout"):
            token = await job.register_callback(timeout_seconds=0.1 if mode == "timeout" else 60)
            return awa.WaitForCallback(token)
        return None

    ids = {}
    for mode, attempts in (
        ("terminal", 3),
        ("exhausted", 1),
        ("poison", 3),
        ("retry", 3),
        ("retry_after", 3),
        ("ok", 3),
        ("external", 3),
        ("timeout", 1),
    ):
        ids[mode] = (await client.insert(Order(mode), max_attempts=attempts)).id
    # Rescue on the final attempt (stale heartbeat / passed deadline) and with attempts left.
    for mode, attempts in (("stale", 1), ("deadline", 1), ("stale_retry", 3)):
        job = await client.insert(Order("ok"), max_attempts=attempts, queue="elsewhere")
        ids[mode] = job.id
        await _simulate_running(dsn, job.id, deadline=(mode == "deadline"))
    await client.start([("default", 8)], **{**FAST, "promote_interval_ms": 3_600_000})
    await wait_state(client, ids["external"], "waiting_external")
    token = str((await job_row(dsn, ids["external"]))["callback_id"])
    await client.fail_external(token, "provider failed")
    await wait_state(client, ids["ok"], "completed")
    correct = await client.correct_to_failed(ids["ok"], error="shipment never left")
    assert correct.state == awa.JobState.Failed

    expect = {
        "terminal": "terminal_error",
        "exhausted": "exhausted",
        "poison": "terminal_error",
        "external": "callback_failed",
        "timeout": "callback_timeout",
        "stale": "rescue_exhausted",
        "deadline": "deadline_exhausted",
        "ok": "corrected",
    }
    for mode, reason in expect.items():
        row = await wait_state(client, ids[mode], "failed")
        assert (row["consequence_state"], row["consequence_reason"]) == ("applied", reason), mode
        assert row["consequence_applied_at"] is not None
        assert row["consequence_path"] == ("reconciliation" if mode == "ok" else "failure")
    await wait_state(client, ids["retry"], "retryable")
    await wait_state(client, ids["retry_after"], "retryable")
    row = await wait_state(client, ids["stale_retry"], "retryable", "available")
    assert row["consequence_state"] is None and row["attempt"] == 1
    assert await released(dsn) == {ids[m]: r for m, r in expect.items()}
    assert sorted(c[0] for c in calls) == sorted(ids[m] for m in expect)  # each exactly once


async def _simulate_running(dsn, job_id, *, deadline=False):
    """An attempt whose worker died (stale heartbeat) or overran its deadline."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET state = 'running', attempt = attempt + 1, "
            "run_lease = run_lease + 1, heartbeat_at = now() - interval '1 hour' * %s, "
            "deadline_at = CASE WHEN %s THEN now() - interval '1 second' END WHERE id = %s",
            (0 if deadline else 1, deadline, job_id),
        )


async def test_effect_failing_twice_keeps_the_job_pending_and_visible_then_settles(dsn, client):
    calls, handled = Recorder(), []
    gate = asyncio.Event()

    async def flaky(failure):
        if len(calls) == 2:
            # The third application (the one that succeeds) waits, so the test looks at the
            # job while it is still pending after two failed applications.
            await gate.wait()
        await with_release(client, calls, fail_times=2)(failure)

    @client.task(Order, failure_consequence=flaky)
    async def order(job):
        handled.append(job.attempt)
        raise awa.TerminalError("declined")

    job = await client.insert(Order("x"), max_attempts=5)
    await client.start([("default", 2)], **FAST)
    await calls.until(lambda: _calls(calls, 2), what="second application")
    row = await job_row(dsn, job.id)
    assert row["state"] == "consequence_pending" and row["consequence_state"] == "owed"
    assert (await client.get_job(job.id)).state == awa.JobState.ConsequencePending
    assert [j.id for j in await client.list_jobs(state="consequence_pending")] == [job.id]
    stats = {s.queue: s for s in await client.queue_stats()}
    assert stats["default"].consequence_pending == 1
    assert stats["default"].consequences_owed == 1 and stats["default"].consequences_overdue == 1
    owed = await client.consequences_owed()
    assert owed[0]["id"] == job.id and owed[0]["overdue"] is True
    assert "inventory service unavailable" in owed[0]["error"]
    gate.set()
    row = await wait_state(client, job.id, "failed")
    assert row["consequence_state"] == "applied" and row["consequence_attempts"] == 2
    assert handled == [1]  # never handed to its handler again
    assert len(calls) == 3 and len({c[3] for c in calls}) == 1  # one idempotency key
    assert await released(dsn) == {job.id: "terminal_error"}  # written once


async def _calls(calls, n):
    return len(calls) >= n


async def test_correction_whose_effect_fails_survives_a_restart_of_every_process(dsn):
    first = awa.AsyncClient(dsn)
    calls = Recorder()
    try:

        @first.task(Order, failure_consequence=with_release(first, calls, fail_times=10**6))
        async def order(job):
            return None

        job = await first.insert(Order("x"))
        await first.start([("default", 1)], **FAST)
        await wait_state(first, job.id, "completed")
        await first.correct_to_failed(job.id, error="the parcel was lost")
        row = await job_row(dsn, job.id)
        assert row["state"] == "failed" and row["consequence_state"] == "owed"
        await calls.until(lambda: _calls(calls, 2), what="reconciler retry")
    finally:
        await first.close()
    assert await released(dsn) == {}
    assert (await job_row(dsn, job.id))["consequence_state"] == "owed"

    second = awa.AsyncClient(dsn)
    calls2 = []
    try:
        second.failure_consequence(Order, with_release(second, calls2))
        await second.start([("other", 1)], **FAST)  # a maintenance-only process
        row = await until(lambda: _applied(dsn, job.id), second, what="owed consequence applied")
        assert (
            row["consequence_path"] == "reconciliation" and row["consequence_reason"] == "corrected"
        )
        assert await released(dsn) == {job.id: "corrected"}
    finally:
        await second.close()


async def _applied(dsn, job_id):
    row = await job_row(dsn, job_id)
    return row if row["consequence_state"] == "applied" else None


async def test_verify_success_corrects_jobs_reported_not_done(dsn, client):
    calls = []

    @client.task(
        Order,
        failure_consequence=with_release(client, calls),
        verify_success=lambda job: job.args.mode != "lost",
    )
    async def order(job):
        return None

    good = await client.insert(Order("fine"))
    lost = await client.insert(Order("lost"))
    await client.start([("default", 2)], **FAST)
    row = await until(lambda: _applied(dsn, lost.id), client, what="correction")
    assert row["state"] == "failed" and row["errors"][-1]["corrected"] is True
    await until(
        lambda: _verified(dsn, good.id), passes(client, "reconcile"), what="good job verified"
    )
    assert (await job_row(dsn, good.id))["state"] == "completed"
    assert [c[0] for c in calls] == [lost.id]


async def _verified(dsn, job_id):
    return (await job_row(dsn, job_id))["verified_at"] is not None


async def _start_app(dsn, *args, **env):
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.consequence_app",
        *args,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "AWA_FAST_APP_DSN": dsn, **env},
    )
    return proc


async def test_sigkilled_worker_on_the_final_attempt_gets_its_consequence(dsn, client):
    job = await client.insert(Reserve("widget", 3, "hang"), max_attempts=1)
    proc = await _start_app(dsn)
    try:
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)).split()[0] == b"ready"
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.split() == [b"started", str(job.id).encode()]
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    from tests.consequence_app import release_reservation

    await _reserve(dsn, job.id, 3)
    client.failure_consequence(Reserve, release_reservation)
    await client.start([("nothing", 1)], **FAST)  # maintenance only: rescue + reconcile
    row = await wait_state(client, job.id, "failed", timeout=30)
    assert (row["consequence_state"], row["consequence_reason"]) == ("applied", "rescue_exhausted")
    assert await scalar(dsn, "SELECT available FROM public.stock") == 10  # reservation released


async def _reserve(dsn, job_id, qty):
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO public.reservations (job_id, qty) VALUES (%s, %s)", (job_id, qty)
        )
        await conn.execute("UPDATE public.stock SET available = available - %s", (qty,))


async def _killed_after_the_effect(dsn, client, max_attempts: int):
    """A worker whose attempt fails terminally is SIGKILLed inside the effect, after its outside
    part ran and before anything else commits; returns the job's row afterwards."""
    job = await client.insert(Reserve("widget", 4, "fail"), max_attempts=max_attempts)
    await _reserve(dsn, job.id, 4)
    return await _killed_in_the_effect(dsn, job.id)


async def _killed_in_the_effect(dsn, job_id: int, *args: str) -> dict:
    """Run tests.consequence_app (with ``args``) until it SIGKILLs itself inside the effect of
    job ``job_id``; returns the job's row, which must hold the failure as owed."""
    proc = await _start_app(dsn, *args, CRASH_AFTER_EFFECT="1")
    try:
        assert await asyncio.wait_for(proc.wait(), 30) == -signal.SIGKILL
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    row = await job_row(dsn, job_id)
    # the failure was recorded as owed before the effect ran; the settlement never committed
    assert (row["state"], row["consequence_state"]) == ("consequence_pending", "owed")
    return row


def _recorded_release(client) -> tuple[list, list]:
    """Declare Reserve here with release_reservation as its effect; returns the idempotency keys
    the effect ran under and the attempts the handler ran (a retry would complete the job)."""
    keys, runs = [], []

    async def effect(failure: awa.JobFailure) -> None:
        keys.append(failure.idempotency_key)
        await release_reservation(failure)

    @client.task(Reserve, failure_consequence=effect)
    async def reserve(job):
        runs.append(job.attempt)

    return keys, runs


async def test_killed_after_the_effect_on_a_non_final_attempt_repeats_it_never_retries(dsn, client):
    # models/settlement.pml NEG_EFFECT_FIRST: with the effect run before the failure was durable,
    # rescue retried this attempt and its next failure ran the effect under another key.
    job_id = (await _killed_after_the_effect(dsn, client, max_attempts=2))["id"]
    keys, runs = _recorded_release(client)
    await client.start([("default", 1)], **FAST)
    row = await wait_state(client, job_id, "failed", timeout=30)
    assert (row["consequence_state"], row["attempt"]) == ("applied", 1)
    assert keys == [f"awa-fast:{job_id}:lease-1:failed"] and runs == []  # the repeat, same key
    assert await scalar(dsn, "SELECT count(*) FROM public.effect_log") == 2
    assert await scalar(dsn, "SELECT available FROM public.stock") == 10  # released once


@pytest.mark.parametrize("how", ["fail_external", "resolve"])
async def test_client_killed_after_the_effect_of_fail_external_repeats_it_never_retries(
    dsn, client, how
):
    # models/settlement.pml NEG_EFFECT_FIRST on the client path: fail_external (and a CEL on_fail)
    # ran the effect and settled in one transaction, so a client process killed after the
    # effect's outside part left the job parked on its callback; the callback timeout then
    # retried it (attempt 1 of 2), and a later failure ran the effect under another key.
    parker = awa.AsyncClient(dsn)

    @parker.task(Reserve, failure_consequence=release_reservation)
    async def park(job):  # the callback times out at once: only maintenance could act on it
        return awa.WaitForCallback(
            await job.register_callback(timeout_seconds=0.1, on_fail='payload.status == "declined"')
        )

    job = await client.insert(Reserve("widget", 4, "park"), max_attempts=2)
    await _reserve(dsn, job.id, 4)
    try:
        await parker.start([("default", 1)], **{**FAST, "maintenance": False})
        callback_id = (await wait_state(parker, job.id, "waiting_external"))["callback_id"]
    finally:
        await parker.close()
    row = await _killed_in_the_effect(dsn, job.id, how, str(callback_id))
    assert row["callback_id"] is None and row["heartbeat_at"] is None
    assert await scalar(dsn, "SELECT count(*) FROM public.effect_log") == 1
    keys, runs = _recorded_release(client)
    await client.start([("default", 1)], **FAST)  # callback rescue, promotion, reconciler
    row = await wait_state(client, job.id, "failed", timeout=30)
    assert (row["consequence_state"], row["consequence_reason"], row["attempt"]) == (
        "applied",
        "callback_failed",
        1,
    )
    assert keys == [f"awa-fast:{job.id}:lease-1:failed"] and runs == []  # the repeat, same key
    assert await scalar(dsn, "SELECT count(*) FROM public.effect_log") == 2
    assert await scalar(dsn, "SELECT available FROM public.stock") == 10  # released once


async def test_crash_between_effect_and_commit_repeats_a_repeat_safe_effect(dsn, client):
    job_id = (await _killed_after_the_effect(dsn, client, max_attempts=1))["id"]
    assert await scalar(dsn, "SELECT count(*) FROM public.effect_log") == 1
    assert await scalar(dsn, "SELECT available FROM public.stock") == 10  # released once
    client.failure_consequence(Reserve, release_reservation)
    await client.start([("nothing", 1)], **FAST)
    row = await wait_state(client, job_id, "failed", timeout=30)
    assert row["consequence_state"] == "applied"
    assert await scalar(dsn, "SELECT count(*) FROM public.effect_log") == 2  # ran again
    assert await scalar(dsn, "SELECT available FROM public.stock") == 10  # still recovered once


def test_registration_check(dsn):
    client = awa.AsyncClient(dsn)

    @client.task(Order, kind="undeclared_one")
    async def a(job):
        return None

    @client.task(Order, kind="declared_none", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def b(job):
        return None

    @client.task(Order, kind="declared_elsewhere")
    async def c(job):
        return None

    client.failure_consequence("declared_elsewhere", awa.NO_FAILURE_CONSEQUENCE)
    with pytest.raises(UndeclaredFailureConsequences) as info:
        assert_failure_consequences_declared(client)
    assert info.value.kinds == ["undeclared_one"]
    client.failure_consequence("undeclared_one", awa.NO_FAILURE_CONSEQUENCE)
    assert_failure_consequences_declared(client)
    with pytest.raises(TypeError):
        client.failure_consequence("x", "not callable")


def test_check_command_lists_undeclared_kinds(dsn, tmp_path):
    import subprocess as sp

    app = tmp_path / "check_app.py"
    app.write_text(
        "import awa_fast as awa\n"
        f"client = awa.AsyncClient({dsn!r})\n"  # connects once at construction, as awa-pg
        "@client.task(dict, kind='alpha')\n"
        "async def a(job): pass\n"
        "@client.task(dict, kind='beta', failure_consequence=awa.NO_FAILURE_CONSEQUENCE)\n"
        "async def b(job): pass\n"
    )
    run = lambda: sp.run(
        [sys.executable, "-m", "awa_fast", "check", "check_app:client"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    res = run()
    assert res.returncode == 1 and "alpha" in res.stdout and "beta" not in res.stdout
    app.write_text(
        app.read_text().replace(
            "kind='alpha'", "kind='alpha', failure_consequence=awa.NO_FAILURE_CONSEQUENCE"
        )
    )
    res = run()
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[:2] == [
        "start() would accept this configuration (2 registered kinds)",
        "all 2 registered kinds declare a failure consequence",
    ]


async def test_a_def_effect_runs_off_the_loop_and_its_writes_settle_with_the_job(dsn, client):
    # A plain def effect ran on the event loop: while it waited, nothing else of the process
    # ran (here: the task that sets the event it waits for). Now it runs in a thread with a
    # synchronous view of the settlement connection; its write commits with the settlement,
    # and the write of an effect that then raises is undone with it.
    loop_ran = threading.Event()
    seen: list = []

    def release(failure: awa.JobFailure) -> None:
        asyncio.run_coroutine_threadsafe(_set_soon(loop_ran), loop)
        seen.append(loop_ran.wait(10))  # the loop must be free to set it
        cur = failure.conn.execute(
            "INSERT INTO public.released (job_id, reason) VALUES (%s, %s) RETURNING job_id",
            (failure.id, failure.reason),
        )
        assert cur.fetchone() == (failure.id,)
        if failure.job.args.mode == "flaky" and len(seen) == 1:
            raise RuntimeError("inventory service unavailable")

    loop = asyncio.get_running_loop()

    @client.task(Order, failure_consequence=release)
    async def order(job):
        raise awa.TerminalError("declined")

    job = await client.insert(Order("flaky"))
    await client.start([("default", 1)], **FAST)
    row = await wait_state(client, job.id, "failed")
    assert seen == [True, True]  # the second run is the reconciler's retry
    assert row["consequence_state"] == "applied"
    assert await released(dsn) == {job.id: "terminal_error"}  # the first run's write undone


async def _set_soon(event: threading.Event) -> None:
    event.set()
