"""Issue 9, class 4: shutdown and admin never produce two concurrent executions or stuck rows.

Each test asserts the final rows; waits are on runtime signals (``wait_attempts_ended``, the
dispatchers' claim counters) or on the database state the fault leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psycopg
import pytest

import awa_fast as awa
from tests import support
from tests.support import (
    Recorder,
    job_row,
    poll_until,
    scalar,
    sigint_as_at_a_terminal,
    until,
    wait_lock_waiter,
    wait_state,
)

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "maintenance": False}

pytestmark = pytest.mark.usefixtures("clean")


@dataclasses.dataclass
class Job:
    mode: str = ""


async def test_class4_def_handler_thread_still_running_is_not_released_at_shutdown(dsn):
    # Worker A's def handler outlives A's shutdown: its attempt must not go back to
    # 'available' (worker B would run it while A's thread still does) until the thread ends.
    spans: list[tuple[str, float, float]] = []
    gate, entered = threading.Event(), threading.Event()

    def work_a(job):
        start = time.monotonic()
        entered.set()
        gate.wait(30)
        spans.append(("a", start, time.monotonic()))

    def work_b(job):
        start = time.monotonic()
        spans.append(("b", start, time.monotonic()))

    a, b = awa.AsyncClient(dsn), awa.AsyncClient(dsn)
    try:
        a.task(Job)(work_a)
        b.task(Job)(work_b)
        job = await a.insert(Job())
        await a.start([("default", 2)], **FAST)
        await asyncio.to_thread(entered.wait, 10)
        await a.shutdown(timeout_ms=100)
        row = await job_row(dsn, job.id)
        assert row["state"] == "running" and row["run_lease"] == 1  # kept, not released
        assert a._runtime is None
        await b.start([("default", 2)], **FAST)
        poll = b.runtime.idle_poll
        await until(lambda: poll.polled.count >= 3, poll.polled, what="B polled a few times")
        assert spans == []  # B has not run it
        gate.set()  # A's thread ends: only now is the attempt given back, and B runs it
        await asyncio.wait_for(b.runtime.wait_attempts_ended(1), 30)
        row = await job_row(dsn, job.id)
        assert row["state"] == "completed" and row["run_lease"] == 2
        (_, a_start, a_end), (_, b_start, _) = sorted(spans, key=lambda s: s[0])
        assert b_start >= a_end  # never two executions at once
    finally:
        gate.set()
        await a.close()
        await b.close()


async def test_class4_cancel_then_retry_never_overlaps(dsn, client):
    first_running, release_first = asyncio.Event(), asyncio.Event()
    running = []

    @client.task(Job)
    async def work(job):
        running.append(job.attempt)
        assert len(running) - 2 * running.count("done") <= 1  # never two at once
        if not first_running.is_set():
            first_running.set()
            await release_first.wait()  # ignores is_cancelled()
        running.append("done")

    job = await client.insert(Job())
    await client.start([("default", 4)], **FAST)
    await first_running.wait()
    await client.cancel(job.id)
    with pytest.raises(awa.AttemptStillRunning) as exc:
        await client.retry(job.id)
    assert exc.value.job_id == job.id
    row = await job_row(dsn, job.id)
    assert row["state"] == "cancelled" and row["heartbeat_at"] is not None
    await client.runtime.heartbeat.beat()  # the mark stays fresh while the handler runs
    with pytest.raises(awa.AttemptStillRunning):
        await client.retry(job.id)
    release_first.set()  # the cancelled attempt ends: the worker acknowledges it
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 30)
    assert (await job_row(dsn, job.id))["heartbeat_at"] is None
    retried = await client.retry(job.id)
    assert retried is not None
    await asyncio.wait_for(client.runtime.wait_attempts_ended(2), 30)
    row = await job_row(dsn, job.id)
    assert row["state"] == "completed" and row["run_lease"] == 2
    assert running == [1, "done", 1, "done"]


async def test_class4_retry_after_the_cancelled_workers_death(dsn):
    # A cancelled attempt whose worker was SIGKILLed is over once its mark is stale.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import asyncio, sys
        import awa_fast as awa
        from tests.runtime.test_shutdown_never_doubles_an_execution import Job
        async def main():
            c = awa.AsyncClient({dsn!r})
            @c.task(Job)
            async def work(job):
                print("running", flush=True)
                await asyncio.sleep(3600)
            await c.start([("default", 1)], poll_interval_ms=50, heartbeat_interval_ms=100,
                          maintenance=False)
            await asyncio.sleep(3600)
        asyncio.run(main())
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    admin = awa.AsyncClient(dsn)
    try:
        job = await admin.insert(Job())
        assert await asyncio.to_thread(proc.stdout.readline) == "running\n"
        await admin.cancel(job.id)
        with pytest.raises(awa.AttemptStillRunning):
            await admin.retry(job.id)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

        # An admin runtime with a short staleness judges the dead worker's mark.
        @admin.task(Job, queue="elsewhere")
        async def unused(job):
            pass

        await admin.start([("elsewhere", 1)], heartbeat_staleness_ms=1000, **FAST)

        async def retried():
            try:
                return await admin.retry(job.id)
            except awa.AttemptStillRunning:
                return None

        # polled: the killed worker's mark goes stale with time alone (no step of a process)
        assert await poll_until(retried, what="the dead worker's mark to go stale")
        assert (await job_row(dsn, job.id))["state"] == "available"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await admin.close()


async def test_class4_shutdown_hands_over_a_claim_in_flight(dsn, client):
    # A claim blocked in the database when shutdown starts returns rows after it: they must be
    # run or given back before the finalizer and the pool close -- never left 'running'.
    @client.task(Job)
    def work(job):  # def handlers, per-job finalize (a follow-up each)
        job.enqueue_on_completion(Job("child"), kind="child")

    await client.start([("default", 8)], **FAST)
    first = client.runtime.dispatchers["default"].claims
    d = client.runtime.dispatchers["default"]
    await until(lambda: d.claims > first, d.claim_ran, what="an idle claim")
    async with await psycopg.AsyncConnection.connect(dsn) as locker:
        await locker.execute("LOCK TABLE awa_fast.queue_meta IN ACCESS EXCLUSIVE MODE")
        ids = [(await client.insert(Job())).id for _ in range(6)]

        await wait_lock_waiter(dsn, query_like="%queue_meta%", what="the claim to block")
        stopping = asyncio.create_task(client.shutdown(timeout_ms=5000))
        await asyncio.sleep(0)  # shutdown has begun with the claim still blocked
        await locker.rollback()  # the claim returns its rows now
    await stopping
    await client.close()
    states = {(await job_row(dsn, i))["state"] for i in ids}
    assert "running" not in states
    assert states <= {"completed", "available"}


def test_class4_ctrl_c_during_the_demo_leaves_nothing_running(dsn):
    # The reported defect: SIGINT to `awa-fast demo` right after its workers are ready. The
    # demo deletes its unfinished rows afterwards, so the row counts it took after draining its
    # workers (--json) are what shows whether a drained worker left a row 'running'.
    import json

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "awa_fast",
            "--database-url",
            dsn,
            "demo",
            "--limit",
            "1500",
            "--processes",
            "2",
            "--json",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_at_a_terminal,
    )
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if " ready (queues" in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    log = "".join(seen) + err
    assert proc.returncode == 130, log[-3000:]
    counts = json.loads(out)["counts"]
    running = {k: n for k, n in counts.items() if k.endswith(":running")}
    assert not any(running.values()), (running, log[-3000:])
    assert "already closed" not in log and "until rescue" not in log


async def test_class4_a_cancel_racing_the_dispatchers_wake_is_not_lost(client):
    # Python 3.11's asyncio.wait_for returns the inner result when it completes in the same
    # iteration as the cancel, swallowing the cancel: asyncio.run() would then wait forever.
    @client.task(Job)
    async def work(job):
        pass

    # A long poll interval: after its first claim the dispatcher sits in wait_for(wake).
    await client.start([("default", 2)], **{**FAST, "poll_interval_ms": 3_600_000})
    rt = client.runtime
    for d in rt.dispatchers.values():
        task = next(t for t in rt._tasks if t.get_name() == f"awa-dispatch-{d.queue}")
        await until(lambda: d.claims >= 1, d.claim_ran, what="the first claim")  # noqa: B023 - awaited in this iteration
        d.notify()  # the wake completes in the same loop iteration as the cancel
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=10)
        assert task in done and task.cancelled()


def test_class4_main_raising_without_shutdown_exits(dsn, tmp_path):
    # An application whose main raises (no shutdown()) must exit: asyncio.run cancels every
    # task once, and none may swallow that cancel.
    app = tmp_path / "app.py"
    app.write_text(
        textwrap.dedent(f"""
        import asyncio, dataclasses
        import awa_fast as awa

        @dataclasses.dataclass
        class Busy:
            n: int

        async def main():
            c = awa.AsyncClient({dsn!r})
            enough = asyncio.Event()
            done = []

            @c.task(Busy)
            async def work(job):
                done.append(job.id)
                if len(done) >= 200:
                    enough.set()

            await c.insert_many([Busy(i) for i in range(1000)])
            await c.start([("default", 4)], poll_interval_ms=50, heartbeat_interval_ms=100)
            await enough.wait()
            raise RuntimeError("application bug")

        asyncio.run(main())
        """)
    )
    for _ in range(3):
        r = subprocess.run(
            [sys.executable, str(app)], capture_output=True, text=True, timeout=60, cwd=os.getcwd()
        )
        assert r.returncode == 1 and "application bug" in r.stderr
        with psycopg.connect(dsn, autocommit=True) as conn:
            # An abnormal exit, like a crash: attempts cut short may stay 'running' for rescue,
            # but nothing is lost or failed.
            states = dict(
                conn.execute(
                    "SELECT state::text, count(*) FROM awa_fast.jobs_all GROUP BY 1"
                ).fetchall()
            )
            assert set(states) <= {"completed", "available", "running"}
            assert sum(states.values()) == 1000  # nothing lost
            conn.execute("TRUNCATE awa_fast.jobs")


def test_class4_shutdown_behind_a_database_that_stopped_answering_ends(tmp_path):
    # The server frozen (SIGSTOP: a hung host) while handlers run: shutdown cancels statements
    # in flight, and libpq's blocking cancel (libpq < 17) held the interpreter until the server
    # answered: the whole process froze, every thread with it. Run in a child process with
    # its own server, so that a freeze fails this test instead of hanging the suite.
    app = tmp_path / "frozen.py"
    app.write_text(
        textwrap.dedent("""
        import asyncio, dataclasses, os, signal, subprocess, threading, time
        import awa_fast as awa
        from awa_fast import embedded

        @dataclasses.dataclass
        class Slow:
            n: int

        async def main():
            srv = embedded.start_temp()
            print(f"server {srv.pid}", flush=True)
            c = awa.AsyncClient(srv.dsn)
            await c.migrate()
            started = asyncio.Event()

            @c.task(Slow)
            async def slow(job):
                started.set()
                await asyncio.sleep(60)

            await c.insert_many([Slow(i) for i in range(3)])
            await c.start([("default", 3)], poll_interval_ms=50)
            await started.wait()
            kids = subprocess.run(
                ["pgrep", "-P", str(srv.pid)], capture_output=True, text=True
            ).stdout.split()
            frozen = [srv.pid, *map(int, kids)]
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
            ticks = []  # a plain thread: it runs only while nothing holds the interpreter
            threading.Thread(
                target=lambda: [ticks.append(time.sleep(0.1)) for _ in range(300)], daemon=True
            ).start()
            t0 = time.monotonic()
            await c.shutdown(timeout_ms=200)
            took = time.monotonic() - t0
            print(f"shutdown {took:.1f} s, ticks {len(ticks)}", flush=True)
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
            await c.close()
            srv.stop()

        asyncio.run(main())
        """)
    )
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "w") as o, open(err, "w") as e:  # files: the server's processes inherit them
        proc = subprocess.Popen([sys.executable, str(app)], stdout=o, stderr=e, cwd=os.getcwd())
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:  # frozen: wake its server so that both can be ended
        server = re.search(r"server (\d+)", out.read_text())
        if server is not None:
            pids = subprocess.run(
                ["pgrep", "-P", server.group(1)], capture_output=True, text=True
            ).stdout.split()
            for pid in [server.group(1), *pids]:
                os.kill(int(pid), signal.SIGCONT)
        proc.kill()
        proc.wait()
        raise AssertionError("the process froze behind the stopped server") from None
    assert proc.returncode == 0, err.read_text()
    took, ticks = re.search(r"shutdown ([\d.]+) s, ticks (\d+)", out.read_text()).groups()
    # bounded (drain 0.2 s, then each bounded step of docs/architecture.md "Shutdown"), and
    # the other thread went on ticking while it waited
    assert float(took) < 60 and int(ticks) >= 10 * float(took) * 0.5, out.read_text()


async def test_class4_superseded_attempt_stays_supervised(dsn, client):
    # Attempt 1 is superseded (rescued and re-claimed) while its handler still runs. Both
    # attempts stay supervised: the deadline sweeper abandons both, each under its own key.
    cancelled, started = [], Recorder()

    @client.task(Job)
    async def work(job):
        started.append(job.run_lease)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(job.run_lease)
            raise

    job = await client.insert(Job())
    await client.start(
        [{"name": "default", "max_workers": 4, "deadline_duration_ms": 3000}], **FAST
    )
    await started.until(lambda: len(started) == 1, what="attempt 1")
    await scalar(
        dsn, "UPDATE awa_fast.jobs SET state = 'available' WHERE id = %s RETURNING id", (job.id,)
    )
    await started.until(lambda: len(started) == 2, what="attempt 2")
    in_flight = client.runtime.in_flight
    assert set(in_flight) == {(job.id, 1), (job.id, 2)}
    # A cancel NOTIFY names an attempt: it reaches the superseded one, and only it.
    await scalar(
        dsn, "SELECT pg_notify('awa_fast_cancel', %s)", (f'{{"job_id": {job.id}, "run_lease": 1}}',)
    )
    await until(lambda: in_flight[(job.id, 1)].is_cancelled(), client, what="cancel flag")
    assert not in_flight[(job.id, 2)].is_cancelled()
    await asyncio.wait_for(client.runtime.wait_attempts_ended(2), 30)
    assert sorted(cancelled) == [1, 2]  # both abandoned at their deadlines
    assert client.runtime.outcomes.get("abandoned") == 2


async def test_class4_heartbeat_acks_progress_only_for_rows_it_beat(dsn, client):
    gate, started = asyncio.Event(), Recorder()

    @client.task(Job)
    async def work(job):
        job.set_progress(10, job.args.mode)
        started.append(job)
        await gate.wait()

    jobs = [await client.insert(Job(m)) for m in ("locked", "free")]
    await client.start(
        [("default", 4)],
        **{**FAST, "heartbeat_interval_ms": 3_600_000, "heartbeat_staleness_ms": 36_000_000},
    )
    await started.until(lambda: len(started) == 2, what="both running")
    ctxs = {c.args.mode: c for c in started}
    async with await psycopg.AsyncConnection.connect(dsn) as locker:
        await locker.execute("SELECT 1 FROM awa_fast.jobs WHERE id = %s FOR UPDATE", (jobs[0].id,))
        await client.runtime.heartbeat.beat()  # SKIP LOCKED skips the locked row
        assert ctxs["free"].progress_snapshot() is None  # written
        assert ctxs["locked"].progress_snapshot() is not None  # still pending
        assert (await job_row(dsn, jobs[0].id))["progress"] is None
        await locker.rollback()
    await client.runtime.heartbeat.beat()
    assert (await job_row(dsn, jobs[0].id))["progress"]["message"] == "locked"
    gate.set()
    await asyncio.wait_for(client.runtime.wait_attempts_ended(2), 30)


def _early_callback_handler(client, effect=False):
    """A handler whose first attempt registers a callback (its id put on ``tokens``) and keeps
    running until ``release`` is set: an early callback fails its job while it runs. With
    ``effect`` the kind has a failure consequence: the failure path then commits twice (owed,
    then applied and settled), and the mark must survive both."""
    tokens, release, runs, applied = asyncio.Queue(), asyncio.Event(), [], []
    if effect:
        client.failure_consequence(Job, lambda failure: applied.append(failure.job.id))

    @client.task(Job)
    async def work(job):
        runs.append(job.run_lease)
        if job.run_lease == 1:
            token = await job.register_callback(timeout_seconds=60)
            await tokens.put(token.id)
            await release.wait()  # still running when the early callback fails the job

    return tokens, release, runs, applied


@pytest.mark.parametrize("effect", [False, True])
async def test_class4_fail_external_of_a_running_job_then_retry_never_overlaps(dsn, client, effect):
    tokens, release, runs, applied = _early_callback_handler(client, effect)

    job = await client.insert(Job(), max_attempts=1)
    await client.start([("default", 4)], **FAST)
    token = await tokens.get()
    failed = await client.fail_external(token, "provider said no")
    assert failed.state == awa.JobState.Failed and applied == ([job.id] if effect else [])
    assert (await job_row(dsn, job.id))["heartbeat_at"] is not None  # the mark, kept
    with pytest.raises(awa.AttemptStillRunning):
        await client.retry(job.id)
    skipped = await client.retry_failed(kind=job.kind)  # the bulk path waits too
    assert skipped.jobs == [] and skipped.matched == 1
    release.set()
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 30)
    assert [j.id for j in await client.retry_failed(kind=job.kind)] == [job.id]
    await asyncio.wait_for(client.runtime.wait_attempts_ended(2), 30)
    assert (await job_row(dsn, job.id))["state"] == "completed" and runs == [1, 2]


async def test_class4_retry_of_a_live_callback_wait_is_refused(dsn, client):
    tokens, ended = asyncio.Queue(), []

    @client.task(Job)
    async def work(job):
        token = await job.register_callback(timeout_seconds=60)
        await tokens.put(token.id)
        try:
            return await job.wait_for_callback(token)  # the handler lives on, parked
        except awa.AwaError:
            ended.append(job.run_lease)
            raise

    job = await client.insert(Job())
    await client.start([("default", 4)], **{**FAST, "callback_poll_interval_ms": 20})
    token = await tokens.get()
    await wait_state(client, job.id, "waiting_external")
    with pytest.raises(awa.AttemptStillRunning):
        await client.retry_external(token)
    with pytest.raises(awa.AttemptStillRunning):
        await client.retry(job.id)
    assert (await job_row(dsn, job.id))["state"] == "waiting_external"
    await client.cancel(job.id)  # the waiting handler notices, ends, and acknowledges
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 30)
    assert ended == [1]
    assert (await client.retry(job.id)) is not None
    await tokens.get()
    await wait_state(client, job.id, "waiting_external")
    assert (await job_row(dsn, job.id))["run_lease"] == 2


def _maint(dsn: str, client) -> Maintenance:  # noqa: F821 - imported below, lazily
    from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig

    return Maintenance(dsn, client.pool, MaintenanceConfig(heartbeat_staleness_ms=1000))


async def _mark_outlives_staleness(dsn: str, job_id: int, since) -> None:
    # The mark is refreshed past the 1 s staleness the maintenance pass judges it with.
    async def refreshed():
        row = await job_row(dsn, job_id)
        return (
            row["heartbeat_at"] is not None and (row["heartbeat_at"] - since).total_seconds() > 1.2
        )

    # polled: the mark is refreshed by the lingering thread's own connection (worker/lingering.py
    # runs off the event loop), and "past the staleness" is a matter of time passing
    await poll_until(refreshed, what="the mark refreshed past the staleness")


async def test_class4_def_handler_past_its_deadline_never_overlaps_its_rerun(dsn, client):
    # A def handler's thread runs on past its deadline: deadline rescue takes the attempt,
    # but the job is not promoted (so not re-run) until the thread has ended.
    spans, gate, entered = [], threading.Event(), threading.Event()

    @client.task(Job)
    def work(job):
        start = time.monotonic()
        if job.run_lease == 1:
            entered.set()
            gate.wait(30)
        spans.append((job.run_lease, start, time.monotonic()))

    job = await client.insert(Job())
    await client.start([{"name": "default", "max_workers": 2, "deadline_duration_ms": 300}], **FAST)
    m = _maint(dsn, client)
    try:
        await asyncio.to_thread(entered.wait, 10)
        await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 30)  # abandoned
        assert client.runtime.outcomes.get("abandoned") == 1
        # The lingering thread's attempt still beats: a heartbeat holding the row lock at this
        # instant makes the rescue skip it (SKIP LOCKED), and the next pass takes it.
        for _ in range(20):
            if rescued := await m.rescue():
                break
        assert [(r[0], r[2], r[3]) for r in rescued] == [(job.id, "retryable", "deadline_exceeded")]
        row = await job_row(dsn, job.id)
        assert row["state"] == "retryable" and row["heartbeat_at"] is not None  # marked
        await _mark_outlives_staleness(dsn, job.id, row["heartbeat_at"])
        assert await m.promote() == 0  # the thread still runs: the job waits
        assert (await m.rescue()) == [] and spans == []
        gate.set()
        assert await asyncio.to_thread(client.runtime.lingering.wait_ended, 1, 30)
        assert (await job_row(dsn, job.id))["heartbeat_at"] is None  # mark cleared
        assert await m.promote() == 1
        await asyncio.wait_for(client.runtime.wait_attempts_ended(2), 30)
        row = await job_row(dsn, job.id)
        assert row["state"] == "completed" and row["run_lease"] == 2
        (_, _, first_end), (_, second_start, _) = sorted(spans)
        assert second_start >= first_end  # never two executions at once
    finally:
        gate.set()


async def test_class4_def_handler_outliving_shutdown_past_the_staleness_is_not_rescued(dsn):
    # A's def handler thread outlives A's shutdown by more than heartbeat_staleness_ms in a
    # live process: its attempt keeps beating, so rescue leaves it; given back once it ends.
    gate, entered, runs = threading.Event(), threading.Event(), []

    def work(job):
        runs.append(job.run_lease)
        if job.run_lease == 1:
            entered.set()
            gate.wait(30)

    a = awa.AsyncClient(dsn)
    try:
        a.task(Job)(work)
        job = await a.insert(Job())
        await a.start([("default", 2)], **FAST)
        await asyncio.to_thread(entered.wait, 10)
        lingering = a.runtime.lingering
        await a.shutdown(timeout_ms=100)
        row = await job_row(dsn, job.id)
        await _mark_outlives_staleness(dsn, job.id, row["heartbeat_at"])
        m = _maint(dsn, a)
        assert await m.rescue() == []
        assert (await job_row(dsn, job.id))["state"] == "running"
        gate.set()
        assert await asyncio.to_thread(lingering.wait_ended, 1, 30)
        row = await job_row(dsn, job.id)
        assert row["state"] == "available" and row["attempt"] == 0 and row["heartbeat_at"] is None
        assert runs == [1]
    finally:
        gate.set()
        await a.close()


@pytest.mark.parametrize("effect", [False, True])
async def test_class4_fail_external_into_the_dlq_then_dlq_retry_never_overlaps(dsn, client, effect):
    # An early fail_external dead-letters the job while its handler still runs: the DLQ entry
    # carries the "still running" mark, so a DLQ retry waits for the handler.
    tokens, release, runs, applied = _early_callback_handler(client, effect)

    job = await client.insert(Job(), max_attempts=1)
    await client.start([{"name": "default", "max_workers": 4, "dlq": True}], **FAST)
    token = await tokens.get()
    await client.fail_external(token, "provider said no")
    assert applied == ([job.id] if effect else [])
    entry = await client.get_dlq_job(job.id)
    assert entry is not None and await job_row(dsn, job.id) is None
    marked = await scalar(dsn, "SELECT heartbeat_at FROM awa_fast.dlq WHERE id = %s", (job.id,))
    assert marked is not None
    with pytest.raises(awa.AttemptStillRunning) as exc:
        await client.retry_from_dlq(job.id)
    assert exc.value.job_id == job.id
    assert await client.bulk_retry_from_dlq(kind=job.kind) == 0  # the bulk path waits too
    await client.runtime.heartbeat.beat()  # the worker keeps the DLQ entry's mark fresh
    assert (
        await scalar(dsn, "SELECT heartbeat_at FROM awa_fast.dlq WHERE id = %s", (job.id,)) > marked
    )
    assert (await client.get_dlq_job(job.id)) is not None and runs == [1]
    release.set()  # the handler ends: the worker clears the mark on the DLQ entry
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 30)
    assert (
        await scalar(dsn, "SELECT heartbeat_at FROM awa_fast.dlq WHERE id = %s", (job.id,)) is None
    )
    assert (await client.retry_from_dlq(job.id)) is not None
    await asyncio.wait_for(client.runtime.wait_attempts_ended(2), 30)
    assert (await job_row(dsn, job.id))["state"] == "completed" and runs == [1, 2]


def test_class4_a_late_beat_does_not_mark_an_attempt_acknowledged_as_abandoned(dsn):
    # The race behind a CI failure of the test below: a beat built while the attempt was in
    # flight ran after the worker had abandoned it at its deadline and cleared its mark
    # (ACK_ATTEMPT_ENDED), marked the row again, and rescue kept that fresh mark. A beat now
    # leaves a running row past its deadline unmarked once its mark is cleared; one whose
    # handler lives on (its mark not cleared: a def handler's thread) is still beaten.
    from awa_fast import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        abandoned, lingering = (
            r[0]
            for r in conn.execute(
                "INSERT INTO awa_fast.jobs (kind, state, attempt, run_lease, heartbeat_at, "
                "deadline_at) VALUES ('k', 'running', 1, 1, now(), now() - interval '1 second'), "
                "('k', 'running', 1, 1, now() - interval '1 second', "
                "now() - interval '1 second') RETURNING id"
            )
        )
        conn.execute(sql.ACK_ATTEMPT_ENDED, {"id": abandoned, "lease": 1})
        beaten = conn.execute(
            sql.HEARTBEAT, ([abandoned, lingering], [1, 1], [None, None])
        ).fetchall()
        marks = dict(
            conn.execute(
                "SELECT id, heartbeat_at > now() - interval '1 second' FROM awa_fast.jobs"
            ).fetchall()
        )
    assert beaten == [(lingering, 1)]
    assert marks == {abandoned: None, lingering: True}


async def test_class4_async_handler_abandoned_at_its_deadline_leaves_no_mark(dsn, client):
    # An async handler is cancelled at its deadline and its task ends: the worker clears the
    # heartbeat, so deadline rescue leaves no mark and the retry is promoted at once.
    started = []

    @client.task(Job)
    async def work(job):
        started.append(job.run_lease)
        if job.run_lease == 1:
            await asyncio.Event().wait()  # never returns by itself

    job = await client.insert(Job())
    await client.start([{"name": "default", "max_workers": 2, "deadline_duration_ms": 300}], **FAST)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 30)  # abandoned
    m = _maint(dsn, client)
    assert [r[0] for r in await m.rescue()] == [job.id]
    row = await job_row(dsn, job.id)
    assert row["state"] == "retryable" and row["heartbeat_at"] is None
    assert await m.promote() == 1
    await asyncio.wait_for(client.runtime.wait_attempts_ended(2), 30)
    assert (await job_row(dsn, job.id))["state"] == "completed" and started == [1, 2]


async def test_concurrent_starts_run_one_runtime_and_shutdown_stops_it(dsn):
    # Both start() calls used to succeed: one runtime kept claiming after shutdown()
    client = awa.AsyncClient(dsn)
    try:
        client.task(Job)(lambda job: None)
        results = await asyncio.gather(
            client.start([("default", 1)], **FAST),
            client.start([("default", 1)], **FAST),
            return_exceptions=True,
        )
        assert sorted(type(r).__name__ for r in results) == ["NoneType", "RuntimeError"]
        runtime = client.runtime
        await client.shutdown()
        assert all(t.done() for t in runtime._tasks)
    finally:
        await client.close()


async def test_a_shutdown_during_start_stops_what_the_start_started(dsn):
    client = awa.AsyncClient(dsn)
    try:
        client.task(Job)(lambda job: None)
        starting = asyncio.ensure_future(client.start([("default", 1)], **FAST))
        await asyncio.sleep(0)  # start() is inside its first await
        await client.shutdown()
        await starting
        assert client.runtime is None
    finally:
        await client.close()


@pytest.mark.parametrize("bad", [None, "abc", math.nan, True])
async def test_a_bad_shutdown_timeout_is_rejected_before_anything_stops(dsn, bad):
    client = awa.AsyncClient(dsn)
    try:
        client.task(Job)(lambda job: None)
        await client.start([("default", 1)], **FAST)
        with pytest.raises(awa.ValidationError) as err:
            await client.shutdown(bad)
        assert err.value.field == "timeout_ms"
        assert client.runtime is not None  # still running, still stoppable
        runtime = client.runtime
        await client.shutdown()
        assert all(t.done() for t in runtime._tasks)
    finally:
        await client.close()


async def test_a_handler_that_ignores_its_cancellation_cannot_hold_shutdown(
    dsn, monkeypatch, caplog
):
    # shutdown waited for it without bound after the drain (breaker helper): forever
    from awa_fast.worker import shutdown as shutdown_module

    monkeypatch.setattr(shutdown_module, "SHUTDOWN_GRACE_S", 0.5)
    started, release = asyncio.Event(), asyncio.Event()
    ended = []

    async def stubborn(job):
        started.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                pass  # swallowed, as a retry loop with a bare except does
        ended.append(job.id)

    client = awa.AsyncClient(dsn)
    try:
        client.task(Job)(stubborn)
        job = await client.insert(Job())
        await client.start([("default", 1)], **FAST)
        await asyncio.wait_for(started.wait(), 15)
        runtime = client.runtime
        await asyncio.wait_for(client.shutdown(timeout_ms=100), 15)
        # left running for heartbeat rescue, and said so
        assert (await job_row(dsn, job.id))["state"] == "running"
        assert any(
            "left running for heartbeat rescue" in r.getMessage() and str(job.id) in r.getMessage()
            for r in caplog.records
        )
        # when it does return, its task ends at once and touches no database: it waited
        # forever on the closed finalizer's buffer (and asyncio.run() with it), then reopened
        # the closed client's pool (breaker helpers); the attempt is left for rescue
        await client.close()
        release.set()
        tasks = list(runtime._handler_tasks.values())
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
        assert ended == [job.id]
        assert client._pool is None
        assert (await job_row(dsn, job.id))["state"] == "running"
        assert any("ended after shutdown had returned" in r.getMessage() for r in caplog.records)
    finally:
        release.set()
        await client.close()


ALIVE = "SELECT count(*) FROM awa_fast.workers WHERE instance = %s"
SERVING = "SELECT count(*) FROM awa_fast.workers WHERE %s = ANY(queues)"


async def test_close_during_a_shutdown_waits_for_it_and_leaves_no_pool(dsn):
    # close() returned at once and the draining shutdown opened a new pool nobody closed
    client = awa.AsyncClient(dsn)
    client.task(Job)(lambda job: None)
    await client.start([("default", 1)], **FAST)
    instance = client.runtime.instance
    await asyncio.gather(client.shutdown(5000), client.close())
    assert client._pool is None
    assert client.runtime is None
    assert await scalar(dsn, ALIVE, (instance,)) == 0


async def test_a_start_cancelled_part_way_leaves_nothing_running(dsn):
    # a caller's wait_for cancelling start() left its presence row (and, later in start, the
    # finalizer's tasks) behind (breaker helper)
    client = awa.AsyncClient(dsn)
    try:
        client.task(Job)(lambda job: None)
        async with await psycopg.AsyncConnection.connect(dsn) as blocker:
            # start() writes its presence row, then the queue's DLQ policy: hold it there
            await blocker.execute("LOCK TABLE awa_fast.queue_meta IN EXCLUSIVE MODE")
            starting = asyncio.ensure_future(
                client.start([{"name": "q_cancelled", "max_workers": 1, "dlq": True}], **FAST)
            )
            await wait_lock_waiter(dsn, query_like="%queue_meta%")
            assert await scalar(dsn, SERVING, ("q_cancelled",)) == 1
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            await blocker.rollback()
        assert client.runtime is None
        assert await scalar(dsn, SERVING, ("q_cancelled",)) == 0
        left = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("awa-")]
        assert [n for n in left if n != "awa-fast-pool-guard"] == []
    finally:
        await client.close()


async def test_a_def_thread_outliving_shutdown_is_given_back_when_the_program_exits(dsn):
    # asyncio.run(main()) returning after close(): the interpreter waited for the handler
    # thread, then killed the (daemon) lingering thread before it gave the attempt back or
    # removed the presence row (breaker helper)
    admin = awa.AsyncClient(dsn)
    try:
        job = await admin.insert(Job(), queue="exit_q")
    finally:
        await admin.close()
    script = textwrap.dedent(f"""
        import asyncio, threading
        import awa_fast as awa
        from tests.runtime.test_shutdown_never_doubles_an_execution import Job
        gate = threading.Event()
        async def main():
            c = awa.AsyncClient({dsn!r})
            def work(job):
                print("running", flush=True)
                gate.wait(30)
            c.task(Job, queue="exit_q")(work)
            await c.start([("exit_q", 1)], poll_interval_ms=50, maintenance=False)
            await asyncio.to_thread(input)  # the test says when
            await c.shutdown(timeout_ms=100)
            await c.close()
            threading.Timer(0.5, gate.set).start()  # the thread ends after main() returned
        asyncio.run(main())
        """)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=os.getcwd()
    )
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"running\n"
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    row = await job_row(dsn, job.id)
    assert (row["state"], row["attempt"], row["heartbeat_at"]) == ("available", 0, None)
    assert await scalar(dsn, SERVING, ("exit_q",)) == 0


async def test_a_cancelled_shutdown_still_releases_everything_and_close_waits_for_it(dsn):
    # a caller's wait_for cut shutdown short: the finalizer's tasks, the LISTEN and heartbeat
    # connections and the presence row stayed, and close() could not help (breaker helper)
    started = asyncio.Event()

    async def work(job):
        started.set()
        await asyncio.sleep(0.3)

    client = awa.AsyncClient(dsn)
    client.task(Job, queue="cut_q")(work)
    await client.insert(Job(), queue="cut_q")
    await client.start([("cut_q", 1)], **FAST)
    runtime = client.runtime
    await asyncio.wait_for(started.wait(), 15)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(client.shutdown(timeout_ms=2000), 0.01)
    await client.close()
    assert runtime.released is not None and runtime.released.done()
    left = [t for t in asyncio.all_tasks() if t.get_name().startswith("awa-")]
    assert [t.get_name() for t in left if not t.cancelling()] == []  # (close() cancels its guard)
    assert await scalar(dsn, ALIVE, (runtime.instance,)) == 0
    assert client._pool is None
    assert runtime.listener.conn.closed
