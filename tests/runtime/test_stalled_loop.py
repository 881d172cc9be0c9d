"""A handler that blocks its event loop for several heartbeat periods never makes a job run twice
at once (issue 28, class 1): the heartbeat beats from the liveness thread, a process never
rescues an attempt it still runs, and the stall is logged at WARNING and counted.

Executions are recorded by the handlers themselves (tests/stall_app.py: start and end of every
execution, per attempt and process), so an overlap is seen whatever the database says."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import psycopg
import pytest

import awa_fast as awa
from awa_fast import metrics
from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig
from tests import stall_app
from tests.runtime.test_launcher import Launcher, poll
from tests.stall_app import Await, Block, Work
from tests.support import scalar, until

KINDS = ["block", "await", "work"]


@pytest.fixture
def stall_log(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "executions.log")
    monkeypatch.setenv("AWA_FAST_STALL_LOG", path)
    return path


@pytest.fixture(autouse=True)
def clean(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE awa_fast.jobs, awa_fast.queue_meta, awa_fast.dlq, awa_fast.workers")


def _jobs() -> list:
    return [Block(3.0)] + [Await(2.0) for _ in range(4)] + [Work(2.0) for _ in range(2)]


def _finished_sql(ids: list[int]) -> tuple[str, tuple]:
    return (
        "SELECT count(*) FROM awa_fast.jobs_all WHERE id = ANY(%s) AND state = 'completed'",
        (ids,),
    )


def _stalls() -> float:
    counter = getattr(metrics, "LOOP_STALLS", None)  # absent before issue 28
    return 0.0 if counter is None else counter._value.get()


def _assert_each_ran_once(path: str, ids: list[int]) -> None:
    runs = stall_app.executions(path)
    for job_id in ids:
        assert stall_app.overlaps(runs.get(job_id, [])) == [], (job_id, runs.get(job_id))
        assert len(runs.get(job_id, [])) == 1, (job_id, runs.get(job_id))


async def test_a_blocked_loop_in_one_process_never_runs_its_own_attempts_again(
    dsn, stall_log, caplog
):
    caplog.set_level(logging.WARNING, logger="awa_fast")
    stalls_before = _stalls()
    client = awa.AsyncClient(dsn)
    stall_app.register(client)
    jobs = await client.insert_many(_jobs(), queue=stall_app.QUEUE)
    ids = [j.id for j in jobs]
    await client.start([(stall_app.QUEUE, 10)], **stall_app.START_OPTIONS)
    try:
        query, params = _finished_sql(ids)

        async def done() -> bool:
            return await scalar(dsn, query, params) == len(ids)

        await until(done, client, timeout=30, what="every job completed")
    finally:
        await client.shutdown(timeout_ms=5000)
        await client.close()
    _assert_each_ran_once(stall_log, ids)
    attempts = await scalar(
        dsn, "SELECT max(attempt) FROM awa_fast.jobs_all WHERE id = ANY(%s)", (ids,)
    )
    assert attempts == 1
    blocked = [
        r for r in caplog.records if r.name == "awa_fast.stall" and "was blocked" in r.message
    ]
    assert blocked, [r.getMessage() for r in caplog.records]
    assert f"job {jobs[0].id} (kind 'block')" in blocked[0].getMessage()
    assert blocked[0].levelno == logging.WARNING and blocked[0].stall_s >= 2.5
    assert _stalls() >= stalls_before + 1
    assert metrics.LOOP_STALL_SECONDS._value.get() >= 2.5


def _two_processes(dsn: str, stall_log: str) -> Launcher:
    """``awa-fast worker tests.stall_app:client`` with two worker processes, both ready."""
    launcher = Launcher(
        dsn,
        "--processes",
        "2",
        "--queues",
        f"{stall_app.QUEUE}:10",
        app="tests.stall_app:client",
        env={"AWA_FAST_STALL_LOG": stall_log},
    )
    try:
        launcher.ready_pids(2)
    except BaseException:
        launcher.stop()
        raise
    return launcher


def test_a_blocked_loop_in_one_of_two_processes_is_not_taken_over_by_the_other(dsn, stall_log):
    launcher = _two_processes(dsn, stall_log)
    try:
        with awa.Client(dsn) as c:
            ids = [j.id for j in c.insert_many(_jobs(), queue=stall_app.QUEUE)]
        query, params = _finished_sql(ids)

        def done() -> bool:
            with psycopg.connect(dsn) as conn:
                return conn.execute(query, params).fetchone()[0] == len(ids)

        poll(done, 40, "every job completed")
        launcher.proc.send_signal(signal.SIGTERM)
        assert launcher.wait(30) == 0
        transcript = launcher.transcript()
    finally:
        launcher.stop()
    _assert_each_ran_once(stall_log, ids)
    with psycopg.connect(dsn) as conn:
        assert (
            conn.execute(
                "SELECT max(attempt) FROM awa_fast.jobs_all WHERE id = ANY(%s)", (ids,)
            ).fetchone()[0]
            == 1
        )
    assert "was blocked for" in transcript and f"job {ids[0]} (kind 'block')" in transcript, (
        transcript
    )


# -- the parts, one at a time ---------------------------------------------------------------


async def test_heartbeats_go_on_while_a_handler_blocks_the_event_loop(dsn):
    client = awa.AsyncClient(dsn)
    seen: dict[str, object] = {}

    def heartbeat_at(job_id: int):
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute(
                "SELECT heartbeat_at FROM awa_fast.jobs WHERE id = %s", (job_id,)
            ).fetchone()[0]

    @client.task(Block, queue=stall_app.QUEUE)
    async def block(job):
        seen["before"] = heartbeat_at(job.id)
        time.sleep(2.0)  # the loop is blocked for four heartbeat periods and past staleness
        seen["after"] = heartbeat_at(job.id)

    job = await client.insert(Block(2.0), queue=stall_app.QUEUE)
    await client.start([(stall_app.QUEUE, 1)], **{**stall_app.START_OPTIONS, "maintenance": False})
    try:
        await until(lambda: "after" in seen, client, what="the handler returned")
    finally:
        await client.shutdown(timeout_ms=5000)
        await client.close()
    assert (seen["after"] - seen["before"]).total_seconds() >= 1.0, (job.id, seen)


async def test_a_process_never_rescues_an_attempt_it_still_runs(dsn):
    client = awa.AsyncClient(dsn)
    release = asyncio.Event()
    started = asyncio.Event()

    @client.task(Await, queue=stall_app.QUEUE)
    async def wait(job):
        started.set()
        await release.wait()

    job = await client.insert(Await(0), queue=stall_app.QUEUE)
    # Beats every minute: no beat refreshes the heartbeat between the test's backdating and
    # the two rescue passes (a rescuer takes it after 2 minutes, min_stale_ms: ADR 020).
    await client.start(
        [(stall_app.QUEUE, 1)],
        **{
            **stall_app.START_OPTIONS,
            "heartbeat_interval_ms": 60_000,
            "heartbeat_staleness_ms": 120_000,
        },
    )
    try:
        await asyncio.wait_for(started.wait(), 15)
        with psycopg.connect(dsn, autocommit=True) as conn:  # as a beat that stalled would leave it
            conn.execute(
                "UPDATE awa_fast.jobs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s",
                (job.id,),
            )
        assert await client.runtime.maintenance.rescue() == []  # its own live attempt
        # ... which another process (a maintenance of its own) does rescue
        other = Maintenance(dsn, client.pool, MaintenanceConfig(heartbeat_staleness_ms=120_000))
        assert [r[0] for r in await other.rescue()] == [job.id]
    finally:
        release.set()
        await client.shutdown(timeout_ms=5000)
        await client.close()


async def test_an_attempt_whose_beats_stop_committing_is_ended_before_its_lease_runs_out(
    dsn, caplog
):
    caplog.set_level(logging.WARNING, logger="awa_fast")
    expired_before = metrics.LEASES_EXPIRED._value.get()
    client = awa.AsyncClient(dsn)
    runs = stall_app.recording(client, Await, stall_app.QUEUE)

    # A slow heartbeat statement (a real trigger, sleeping 5 s per beaten row) holds every beat
    # for longer than the 1 s staleness.
    with stall_app.slow_beats(dsn, 5):
        job = await client.insert(Await(30.0), queue=stall_app.QUEUE)
        await client.start(
            [(stall_app.QUEUE, 1)], **{**stall_app.START_OPTIONS, "maintenance": False}
        )
        try:
            await until(
                lambda: (1, "cancelled") in runs, client, timeout=20, what="the attempt cancelled"
            )
        finally:
            await client.shutdown(timeout_ms=5000)
            await client.close()
    # Given back, the job may be claimed again before the shutdown, and that run ends the same
    # way: executions alternate, never two at once.
    assert runs[:2] == [(1, "start"), (1, "cancelled")]
    assert [w for _, w in runs] == ["start", "cancelled"] * (len(runs) // 2), runs
    lost = [r for r in caplog.records if "no heartbeat committed" in r.getMessage()]
    assert lost and f"job {job.id} (await)" in lost[0].getMessage(), caplog.text
    assert metrics.LEASES_EXPIRED._value.get() >= expired_before + 1
    # given back, uncounted: a worker runs it again
    with psycopg.connect(dsn) as conn:
        state, attempt = conn.execute(
            "SELECT state::text, attempt FROM awa_fast.jobs WHERE id = %s", (job.id,)
        ).fetchone()
    assert state in ("available", "running") and attempt <= 1, (state, attempt)


def test_a_stopped_process_resumed_after_its_rescue_does_no_more_work_for_it(dsn, stall_log):
    # SIGSTOP of the whole worker process holding the job, past the staleness: it is taken for
    # dead and the other process runs the job again; once resumed (SIGCONT), the stopped one's
    # lease check cancels its handler at the next await, so it never ends its work or
    # finalizes (docs/architecture.md, "Which executions can overlap").
    launcher = _two_processes(dsn, stall_log)
    try:
        with awa.Client(dsn) as c:
            job = c.insert(Await(4.0), queue=stall_app.QUEUE)

        def started(attempt: int):  # the log is written by the worker processes: polled
            return (
                next(
                    (
                        ln
                        for ln in stall_app.lines(stall_log)
                        if ln[1] == attempt and ln[3] == "start"
                    ),
                    None,
                )
                if os.path.exists(stall_log)
                else None
            )

        holder = poll(lambda: started(1), 20, "attempt 1 started")[2]
        os.kill(holder, signal.SIGSTOP)
        try:
            poll(lambda: started(2), 30, "attempt 2 started by the other process")
        finally:
            os.kill(holder, signal.SIGCONT)
        poll(
            lambda: any(
                ln[3] == "cancelled" and ln[2] == holder for ln in stall_app.lines(stall_log)
            ),
            20,
            "the resumed holder's handler cancelled",
        )

        def done() -> bool:
            with psycopg.connect(dsn) as conn:
                row = conn.execute(
                    "SELECT state::text FROM awa_fast.jobs_all WHERE id = %s", (job.id,)
                ).fetchone()
                return row is not None and row[0] == "completed"

        poll(done, 30, "the job completed")
        launcher.proc.send_signal(signal.SIGTERM)
        launcher.wait(30)
    finally:
        launcher.stop()
    log = stall_app.lines(stall_log)
    assert [(ln[1], ln[3]) for ln in log if ln[2] == holder] == [(1, "start"), (1, "cancelled")]
    assert [(ln[1], ln[3]) for ln in log if ln[2] != holder] == [(2, "start"), (2, "end")]
