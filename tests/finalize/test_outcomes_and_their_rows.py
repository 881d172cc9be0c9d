"""The worker runtime on a real PostgreSQL: every outcome and its row, stale completions,
crash rescue, graceful shutdown, cancellation, pause, progress, promotion, leader election."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import awa_fast as awa
from awa_fast.worker.executor import backoff_seconds
from tests.support import FAST, Recorder, job_row, scalar, until, wait_state


@dataclasses.dataclass
class Work:
    mode: str
    n: int = 0


pytestmark = pytest.mark.usefixtures("clean")


def register_modes(client: awa.AsyncClient) -> None:
    @client.task(Work)
    async def work(job):
        mode = job.args.mode
        if mode == "complete":
            return None
        if mode == "value":
            return {"anything": 1}
        if mode == "retry_after":
            return awa.RetryAfter(60)
        if mode == "snooze":
            return awa.Snooze(60)
        if mode == "cancel":
            return awa.Cancel("nope")
        if mode == "terminal":
            raise awa.TerminalError("fatal")
        if mode == "boom":
            raise ValueError("boom")
        raise AssertionError(mode)


async def test_every_outcome_and_its_row(dsn, client):
    register_modes(client)
    ids = {}
    for mode in ("complete", "value", "retry_after", "snooze", "cancel", "terminal", "boom"):
        ids[mode] = (await client.insert(Work(mode), max_attempts=3)).id
    ids["retry_after_final"] = (await client.insert(Work("retry_after"), max_attempts=1)).id
    ids["boom_final"] = (await client.insert(Work("boom"), max_attempts=1)).id
    ids["unknown"] = (await client.insert({"x": 1}, kind="nobody_handles_this")).id
    ids["bad_args"] = (await client.insert({"unexpected": 1}, kind="work")).id
    await client.start([("default", 20)], **FAST)
    expect = {
        "complete": "completed",
        "value": "completed",
        "retry_after": "retryable",
        "snooze": "scheduled",
        "cancel": "cancelled",
        "terminal": "failed",
        "boom": "retryable",
        "retry_after_final": "failed",
        "boom_final": "failed",
        "bad_args": "failed",
    }
    rows = {m: await wait_state(client, ids[m], expect[m]) for m in expect}
    now = datetime.now(UTC)

    assert rows["complete"]["finalized_at"] is not None and rows["complete"]["progress"] is None
    assert rows["complete"]["errors"] == [] and rows["complete"]["attempt"] == 1
    # RetryAfter: rescheduled, attempt kept, no error entry
    assert rows["retry_after"]["errors"] == [] and rows["retry_after"]["attempt"] == 1
    assert now + timedelta(seconds=50) < rows["retry_after"]["run_at"] < now + timedelta(seconds=70)
    # Snooze: the attempt is not counted
    assert rows["snooze"]["attempt"] == 0 and rows["snooze"]["errors"] == []
    assert rows["cancel"]["errors"][-1]["error"] == "cancelled: nope"
    assert rows["terminal"]["errors"][-1]["terminal"] is True
    assert rows["terminal"]["errors"][-1]["error"].startswith("TerminalError: fatal")
    boom = rows["boom"]["errors"][-1]
    assert boom["error"].startswith("ValueError: boom") and "Traceback" in boom["error"]
    assert boom["attempt"] == 1 and "terminal" not in boom
    # backoff 2^1 s + up to 25 % (executor.backoff_seconds), counted from when the outcome was
    # built (the error's "at") to the run_at the finalize wrote; the finalize's own latency
    # under load may add to it, never as much as attempt 2's 4 s.
    assert all(2.0 <= backoff_seconds(1) <= 2.5 for _ in range(200))
    failed_at = datetime.fromisoformat(boom["at"])
    delay = (rows["boom"]["run_at"] - failed_at).total_seconds()
    assert 1.95 <= delay < 4.0
    assert rows["retry_after_final"]["finalized_at"] is not None
    assert rows["boom_final"]["errors"][-1]["error"].startswith("ValueError: boom")
    # A kind without a handler here is never claimed (so never failed): it waits for a worker
    # that has one (tests/runtime/test_bad_configuration_is_refused_by_name.py covers the class).
    unknown = await job_row(dsn, ids["unknown"])
    assert (unknown["state"], unknown["attempt"], unknown["errors"]) == ("available", 0, [])
    assert rows["bad_args"]["errors"][-1]["error"].startswith("args conversion failed")


async def test_retry_is_promoted_and_runs_again(dsn, client):
    calls = []

    @client.task(Work)
    async def work(job):
        calls.append(job.attempt)
        return awa.RetryAfter(0) if job.attempt == 1 else None

    job = await client.insert(Work("x"))
    await client.start([("default", 2)], **FAST)
    row = await wait_state(client, job.id, "completed")
    assert calls == [1, 2] and row["attempt"] == 2


async def test_sync_handler_runs_in_thread_and_never_blocks_the_loop(dsn, client):
    release = threading.Event()
    seen_thread = Recorder()

    @client.task(Work, kind="blocking")
    def blocking(job):  # plain def: must run off the loop
        seen_thread.append(threading.current_thread().name)
        assert release.wait(10), "the async handler never ran: the loop was blocked"
        return None

    @client.task(Work, kind="releaser")
    async def releaser(job):
        release.set()

    a = await client.insert(Work("a"), kind="blocking")
    await client.start([("default", 4)], **FAST)
    await seen_thread.until(lambda: seen_thread, what="sync handler start")
    b = await client.insert(Work("b"), kind="releaser")
    await wait_state(client, b.id, "completed")
    await wait_state(client, a.id, "completed")
    assert seen_thread[0].startswith("awa-fast-handler")


async def test_every_worker_slot_can_run_a_def_handler_at_once(dsn, client):
    """A queue's ``max_workers`` counts def handlers too: their threads defaulted to Python's
    executor size (cores + 4, at most 32), so the 33rd of 40 slots waited for a thread while its
    deadline ran (a breaker's finding: attempts spent on jobs that never started)."""
    slots = 40
    together = threading.Barrier(slots, timeout=30)  # broken unless all 40 run at once

    @client.task(Work, kind="def_slot")
    def def_slot(job):
        together.wait()

    jobs = await client.insert_many([Work(str(i)) for i in range(slots)], kind="def_slot")
    await client.start([("default", slots)], **FAST)
    for job in jobs:
        row = await wait_state(client, job.id, "completed")
        assert row["attempt"] == 1 and row["errors"] == []
    assert client.runtime.thread_pool._max_workers == slots


async def test_a_def_handler_abandoned_at_its_deadline_keeps_its_slot_until_its_thread_ends(
    dsn, client
):
    """A thread cannot be stopped: a def handler abandoned at its deadline still holds its
    handler thread, and its slot was given back at once, so a job claimed into it waited for a
    thread while its own deadline ran (a breaker's repro: 6 attempts spent on jobs that never
    started). The slot now comes back when the thread ends."""
    release = threading.Event()

    @client.task(Work, kind="stuck_def")
    def stuck(job):
        release.wait(30)

    @client.task(Work, kind="quick_def")
    def quick(job):
        return None

    await client.insert_many([Work("a"), Work("b")], kind="stuck_def")
    await client.start([{"name": "default", "max_workers": 2, "deadline_duration_ms": 300}], **FAST)
    try:
        await client.runtime.wait_attempts_ended(2)  # both abandoned at their deadline
        assert client.runtime.dispatchers["default"].free == 0  # their threads run on
        quick_jobs = await client.insert_many([Work(str(i)) for i in range(4)], kind="quick_def")
    finally:
        release.set()
    for job in quick_jobs:
        row = await wait_state(client, job.id, "completed")
        assert row["attempt"] == 1 and row["errors"] == []


def test_task_registration_without_a_running_loop(dsn):
    client = awa.AsyncClient(dsn)

    @client.task(Work, kind="registered_outside")
    async def handler(job):
        return None

    assert client.registry.get("registered_outside").fn is handler


async def test_stale_completion_changes_nothing(dsn, client):
    started, release = asyncio.Event(), asyncio.Event()

    @client.task(Work)
    async def work(job):
        started.set()
        await release.wait()

    job = await client.insert(Work("x"), max_attempts=3)
    # A heartbeat between the UPDATE below and the rescue would make the attempt fresh again:
    # none comes within the test (10 s apart).
    await client.start(
        [("default", 1)], **{**FAST, "heartbeat_interval_ms": 10_000}, maintenance=False
    )
    await started.wait()
    # The attempt is rescued (its heartbeat looks stale) before the handler returns.
    async with (await client.pool()).connection() as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s",
            (job.id,),
        )
    rescued = await _rescue_directly(client)
    assert [r[0] for r in rescued] == [job.id]
    before = await job_row(dsn, job.id)
    assert before["state"] == "retryable"
    release.set()
    await until(lambda: client.runtime.finalizer.stats["stale"], client, what="stale outcome")
    after = await job_row(dsn, job.id)
    assert after == before


async def _rescue_directly(client):
    from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig

    m = Maintenance(
        client.database_url, client.pool, MaintenanceConfig(heartbeat_staleness_ms=1000)
    )
    return await m.rescue()


async def test_sigkilled_worker_job_is_rescued_and_completed_elsewhere(dsn, client):
    job = await client.insert({"k": 1}, kind="hang", queue="kill_q", max_attempts=3)
    env = {**os.environ, "AWA_FAST_APP_DSN": dsn}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.worker_app",
        env=env,
        stdout=subprocess.PIPE,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.decode().split() == ["started", str(job.id)]
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert (await job_row(dsn, job.id))["state"] == "running"

    @client.task(dict, kind="hang", queue="kill_q")
    async def finish(job):
        return None

    await client.start([("kill_q", 2)], **{**FAST, "heartbeat_staleness_ms": 500})
    row = await wait_state(client, job.id, "completed", timeout=30)
    assert row["attempt"] == 2
    assert row["errors"][0]["error"] == "heartbeat stale: worker presumed dead"


async def test_graceful_shutdown_finishes_or_releases_and_loses_nothing(dsn, client):
    started = asyncio.Event()
    saw_cancel = []

    @client.task(Work)
    async def work(job):
        if job.args.mode == "quick":
            return None
        started.set()
        while not job.is_cancelled():
            await asyncio.sleep(0.01)
        saw_cancel.append(job.id)
        await asyncio.Event().wait()  # ignores the flag: shutdown must release it

    quick = [(await client.insert(Work("quick"))).id for _ in range(5)]
    slow = (await client.insert(Work("slow"), priority=1)).id
    await client.start([("default", 10)], **FAST)
    await started.wait()
    await until(lambda: _all_state(dsn, quick, "completed"), client, what="quick jobs")
    await client.shutdown(timeout_ms=300)
    row = await job_row(dsn, slow)
    assert row["state"] == "available" and row["attempt"] == 0
    assert saw_cancel == [slow]
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE state = 'running'") == 0


async def _all_state(dsn, ids, state):
    n = await scalar(
        dsn,
        "SELECT count(*) FROM awa_fast.jobs_all WHERE id = ANY(%s) AND state = %s",
        (ids, state),
    )
    return n == len(ids)


async def test_admin_cancel_reaches_the_running_handler(dsn, client):
    started, flagged = asyncio.Event(), asyncio.Event()

    @client.task(Work)
    async def work(job):
        started.set()
        while not job.is_cancelled():
            await asyncio.sleep(0.01)
        flagged.set()
        return None  # completing now is stale: the row is already cancelled

    job = await client.insert(Work("x"))
    await client.start([("default", 1)], **FAST)
    await started.wait()
    cancelled = await client.cancel(job.id)
    assert cancelled.state == awa.JobState.Cancelled
    await asyncio.wait_for(flagged.wait(), 10)
    await until(lambda: client.runtime.finalizer.stats["stale"], client, what="stale completion")
    assert (await job_row(dsn, job.id))["state"] == "cancelled"


async def test_paused_queue_is_not_claimed_until_resumed(dsn, client):
    @client.task(Work, queue="pq")
    async def work(job):
        return None

    await client.pause_queue("pq", paused_by="test")
    job = await client.insert(Work("x"), queue="pq")
    await client.start([("pq", 1)], **FAST)
    # parked after its first claim; the idle poll skips a paused queue
    poll, d = client.runtime.idle_poll, client.runtime.dispatchers["pq"]
    await until(lambda: poll.polled.count >= 1, poll.polled, what="an idle poll")
    claims = d.claims
    await until(lambda: poll.polled.count >= 4, poll.polled, what="three more idle polls")
    assert d.claims == claims
    assert (await job_row(dsn, job.id))["state"] == "available"
    assert [s.paused for s in await client.queue_stats() if s.queue == "pq"] == [True]
    await client.resume_queue("pq")
    await wait_state(client, job.id, "completed")


async def test_progress_is_piggybacked_on_heartbeats_and_cleared_on_completion(dsn, client):
    release = asyncio.Event()

    @client.task(Work)
    async def work(job):
        job.set_progress(40, "halfway")
        job.update_metadata({"cursor": 7})
        await release.wait()

    job = await client.insert(Work("x"))
    await client.start([("default", 1)], **FAST)

    async def progress():
        row = await job_row(dsn, job.id)
        return row["progress"]

    assert await until(progress, client.runtime.heartbeat.beaten, what="progress flushed") == {
        "percent": 40,
        "message": "halfway",
        "metadata": {"cursor": 7},
    }
    release.set()
    row = await wait_state(client, job.id, "completed")
    assert row["progress"] is None


async def test_scheduled_job_is_promoted_and_runs(dsn, client):
    @client.task(Work)
    async def work(job):
        return None

    job = await client.insert(Work("x"), run_at=datetime.now(UTC) + timedelta(seconds=0.3))
    assert job.state == awa.JobState.Scheduled
    await client.start([("default", 1)], **FAST)
    await wait_state(client, job.id, "completed")


async def test_notify_wakes_an_idle_worker_before_its_poll(dsn, client):
    @client.task(Work)
    async def work(job):
        return None

    await client.start([("default", 1)], **{**FAST, "poll_interval_ms": 600_000})
    d = client.runtime.dispatchers["default"]
    await until(lambda: d.claims >= 1, d.claim_ran, what="first claim")
    job = await client.insert(Work("x"))
    await wait_state(client, job.id, "completed", timeout=10)


async def _insert_silently(dsn: str, queue: str) -> int:
    """A job inserted with the NOTIFY trigger held back (``defer_notify``) and never sent:
    only a poll can find it."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute("SELECT set_config('awa_fast.defer_notify', 'on', true)")
        cur = await conn.execute(
            "INSERT INTO awa_fast.jobs (kind, queue, args) VALUES ('work', %s, "
            """'{"mode": "x"}') RETURNING id""",
            (queue,),
        )
        (job_id,) = await cur.fetchone()
    return job_id


async def test_one_idle_poll_covers_every_idle_queue_and_wakes_only_the_one_with_work(dsn, client):
    @client.task(Work)
    async def work(job):
        return None

    queues = [f"q{i}" for i in range(20)]
    await client.start([(q, 1) for q in queues], **FAST)
    runtime = client.runtime
    poll = runtime.idle_poll
    await until(lambda: sorted(poll.parked) == sorted(queues), poll.polled, what="all parked")
    claims = {q: d.claims for q, d in runtime.dispatchers.items()}
    polls = poll.polled.count
    job_id = await _insert_silently(dsn, "q7")
    await wait_state(client, job_id, "completed")
    # found by the shared poll: one statement for 20 queues, and only q7 claimed again
    assert poll.polled.count > polls
    assert {q: d.claims - claims[q] for q, d in runtime.dispatchers.items() if q != "q7"} == {
        q: 0 for q in queues if q != "q7"
    }
    assert runtime.dispatchers["q7"].claims > claims["q7"]


def caplog_has_poll_failure(caplog) -> bool:
    return any(
        r.name == "awa_fast.idle_poll"
        and "idle poll of 3 queue(s) failed: UndefinedTable" in r.message
        for r in caplog.records
    )


async def test_a_failed_idle_poll_wakes_every_parked_queue_and_the_poll_recovers(
    dsn, client, caplog
):
    @client.task(Work)
    async def work(job):
        return None

    queues = ["a", "b", "c"]
    await client.start([(q, 1) for q in queues], **FAST)
    runtime = client.runtime
    poll = runtime.idle_poll
    await until(lambda: sorted(poll.parked) == queues, poll.polled, what="all parked")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # a real failure of the poll's statement (and of every claim) while the table is gone
        await conn.execute("ALTER TABLE awa_fast.queue_meta RENAME TO queue_meta_away")
        try:
            # the failed poll hands every parked queue back to its own claim
            await until(
                lambda: sorted(poll.polled.last or []) == queues, poll.polled, what="a failed poll"
            )
            assert caplog_has_poll_failure(caplog)
        finally:
            await conn.execute("ALTER TABLE awa_fast.queue_meta_away RENAME TO queue_meta")
    await until(lambda: sorted(poll.parked) == queues, poll.polled, what="parked again")
    job_id = await _insert_silently(dsn, "b")
    await wait_state(client, job_id, "completed")


async def test_prune_deletes_terminal_jobs_past_retention(dsn, client):
    old = await client.insert(Work("x"))
    young = await client.insert(Work("y"))
    async with (await client.pool()).connection() as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET state = 'completed', finalized_at = now() - "
            "interval '2 hours' WHERE id = %s",
            (old.id,),
        )
        await conn.execute(
            "UPDATE awa_fast.jobs SET state = 'completed', finalized_at = now() WHERE id = %s",
            (young.id,),
        )
    from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig

    m = Maintenance(dsn, client.pool, MaintenanceConfig(completed_retention_hours=1))
    assert await m.prune() == 1
    assert await job_row(dsn, old.id) is None and await job_row(dsn, young.id) is not None


async def test_exactly_one_maintenance_leader(dsn):
    clients = [awa.AsyncClient(dsn) for _ in range(3)]
    try:
        for c in clients:
            c.failure_consequence("nothing_here", awa.NO_FAILURE_CONSEQUENCE)  # maintenance-only
            await c.start([("nothing_here", 1)], **FAST)

        async def one_leader():
            leaders = [c.runtime.maintenance.is_leader for c in clients]
            return leaders.count(True) == 1

        await until(
            one_leader, [c.runtime.maintenance.leadership for c in clients], what="a leader"
        )
        leader = next(c for c in clients if c.runtime.maintenance.is_leader)
        await leader.shutdown()
        rest = [c for c in clients if c is not leader]

        async def new_leader():
            return [c.runtime.maintenance.is_leader for c in rest].count(True) == 1

        await until(
            new_leader, [c.runtime.maintenance.leadership for c in rest], what="a new leader"
        )
    finally:
        for c in clients:
            await c.close()


async def test_start_rejects_bad_queue_configs(client):
    with pytest.raises(ValueError):
        await client.start([{"name": "q", "max_workers": 2, "min_workers": 1}])
    with pytest.raises(ValueError):
        await client.start([("q", 2)], global_max_workers=4)
    with pytest.raises(ValueError):
        await client.start([{"name": "q", "min_workers": 1, "weight": 0}], global_max_workers=4)
    with pytest.raises(ValueError):
        await client.start([("q", 0)])
    with pytest.raises(TypeError):
        await client.start([("q", 1)], not_an_option=1)
    assert client.runtime is None


async def test_deadline_abandons_the_handler_and_rescue_retries_it(dsn, client):
    attempts, cancelled = [], []

    @client.task(Work)
    async def work(job):
        attempts.append(job.attempt)
        if job.attempt == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(job.id)
                raise
        return None

    job = await client.insert(Work("x"), max_attempts=3)
    await client.start([{"name": "default", "max_workers": 1, "deadline_duration_ms": 300}], **FAST)
    row = await wait_state(client, job.id, "completed")
    assert attempts == [1, 2] and cancelled == [job.id]
    assert row["errors"][0]["error"] == "hard deadline exceeded"
    assert client.runtime.outcomes.get("abandoned") == 1


async def test_start_freezes_the_startup_heap_and_shutdown_returns_it(dsn, client):
    """gc_freeze (default True): start() moves what exists to the permanent generation, so a
    full collection during the run does not walk it; shutdown() gives it back. A handler's
    cyclic garbage made during the run is still collected."""
    import gc

    register_modes(client)
    gc.unfreeze()  # whatever an earlier test of this worker process left
    await client.start([("default", 4)], poll_interval_ms=50)
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 1000, frozen
        job = await client.insert(Work("complete"))
        await wait_state(client, job.id, "completed")

        class Cycle:
            pass

        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        del a, b
        assert gc.collect() >= 2  # made during the run: not frozen
    finally:
        await client.shutdown()
    assert gc.get_freeze_count() == 0


async def test_gc_freeze_off_leaves_the_collector_alone_and_a_non_bool_is_rejected(dsn, client):
    import gc

    register_modes(client)
    gc.unfreeze()
    with pytest.raises(awa.ConfigError) as err:
        await client.start([("default", 4)], gc_freeze="yes")
    assert err.value.field == "gc_freeze"
    await client.start([("default", 4)], gc_freeze=False)
    try:
        assert gc.get_freeze_count() == 0
    finally:
        await client.shutdown()
