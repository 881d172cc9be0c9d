"""Issue 9, class 3: exhaustion, correction and maintenance are as reliable as the worker path.

Real faults only: a SIGKILLed worker subprocess, an attempt past its deadline, a trigger that
fails the correction statement, ``pg_terminate_backend`` of the leader's lock connection, a
renamed table under a running leader loop. Maintenance passes are called directly (or their
loop health is waited on), never slept on.
"""

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
from awa_fast.errors import AwaError
from awa_fast.worker.maintenance import Deposed, Maintenance, MaintenanceConfig
from tests.support import (
    failing_rows,
    job_row,
    passes,
    poll_until,
    truncate,
    until,
    wait_lock_waiter,
    wait_state,
    wakeups_until_marker,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IDLE = [("idle_q", 1)]  # the test's own runtime claims nothing of interest
QUIET = dict(poll_interval_ms=50, heartbeat_interval_ms=100, maintenance=False)


@pytest.fixture(autouse=True)
async def _clean(dsn):
    await truncate(dsn)


@dataclasses.dataclass
class Compensate:
    job_id: int
    reason: str


async def follow_ups(dsn) -> list[dict]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT args FROM awa_fast.jobs_all WHERE kind = 'compensate' ORDER BY id"
        )
        return [r[0] for r in await cur.fetchall()]


def leader_of(client) -> Maintenance:
    """A maintenance instance of ``client``'s runtime, with the runtime's settle rules, that the
    test drives pass by pass."""
    rt = client.runtime
    return Maintenance(
        client.database_url,
        client.pool,
        MaintenanceConfig(heartbeat_staleness_ms=300),
        consequence_kinds=rt.leader_tasks.settled_by_reconciler,
        known_kinds=client.consequences.known_kinds,
    )


async def rescued(m: Maintenance, job_id: int):
    async def once():
        return any(r[0] == job_id for r in await m.rescue())

    # polled: the killed worker's heartbeat goes stale with time alone; each try is one
    # rescue pass run by hand
    await poll_until(once, what=f"the rescue of job {job_id}")


# ---------------------------------------------------------------------------------------------
# exhausted specs fire however the job is exhausted


async def test_class3_exhausted_spec_fires_on_rescue_after_sigkill(dsn, client):
    job = await client.insert({"n": 1}, kind="hang", queue="kill_q", max_attempts=1)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.worker_app",
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "AWA_FAST_APP_DSN": dsn},
    )
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.split() == [b"started", str(job.id).encode()]
        proc.send_signal(signal.SIGKILL)  # on its final attempt
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    @client.task(dict, kind="hang", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def hang(job):
        return None

    client.on_exhausted_enqueue(
        dict, lambda args, j, error, attempt: Compensate(j.id, error), kind="hang"
    )
    await client.start(IDLE, **QUIET)
    m = leader_of(client)
    await rescued(m, job.id)
    assert (await job_row(dsn, job.id))["state"] == "consequence_pending"  # owed its settlement
    await client.runtime.reconcile()
    row = await job_row(dsn, job.id)
    assert (row["state"], row["consequence_state"], row["consequence_reason"]) == (
        "failed",
        "none",
        "rescue_exhausted",
    )
    assert await follow_ups(dsn) == [
        {"job_id": job.id, "reason": "heartbeat stale: worker presumed dead"}
    ]
    await client.runtime.reconcile()  # settled once: nothing more
    assert len(await follow_ups(dsn)) == 1


async def test_class3_exhausted_spec_fires_on_deadline_expiry(dsn, client):
    started = asyncio.Event()

    @client.task(dict, kind="slow", queue="dl", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def slow(job):
        started.set()
        await asyncio.Event().wait()  # never returns: the deadline abandons it

    client.on_exhausted_enqueue(
        dict, lambda args, j, error, attempt: Compensate(j.id, error), kind="slow"
    )
    job = await client.insert({"n": 1}, kind="slow", queue="dl", max_attempts=1)
    await client.start([{"name": "dl", "max_workers": 1, "deadline_duration_ms": 200}], **QUIET)
    await asyncio.wait_for(started.wait(), 15)
    m = leader_of(client)
    await rescued(m, job.id)

    async def settled():
        return (await client.runtime.reconcile())["reconciled"].get(job.id)

    # The handler still runs, so the worker's heartbeat (every 100 ms) keeps the rescued row's
    # "still running" mark fresh and locks the row for an instant each time; a tick that meets
    # that lock skips the job (SKIP LOCKED) and the next tick settles it. Each try is one
    # reconciler tick run by hand.
    await poll_until(settled, what=f"the settlement of job {job.id}")
    row = await job_row(dsn, job.id)
    assert (row["state"], row["consequence_reason"]) == ("failed", "deadline_exhausted")
    assert await follow_ups(dsn) == [{"job_id": job.id, "reason": "hard deadline exceeded"}]


# ---------------------------------------------------------------------------------------------
# the verify_success verdict and its correction commit together


async def completed_but_not_done(dsn, client) -> tuple:
    """A completed ``ship`` job whose ``verify_success`` says not done (verdicts recorded)."""
    verdicts = []

    def not_done(job):
        verdicts.append(job.id)
        return False

    @client.task(
        dict, kind="ship", failure_consequence=awa.NO_FAILURE_CONSEQUENCE, verify_success=not_done
    )
    async def ship(job):
        return None

    job = await client.insert({"n": 1}, kind="ship", queue="idle_q")
    await client.start(IDLE, **QUIET)
    await wait_state(client, job.id, "completed")
    return job, verdicts


async def test_class3_verdict_and_correction_commit_together(dsn, client):
    job, verdicts = await completed_but_not_done(dsn, client)
    # A fault between the verdict and the correction: the correction statement fails (it
    # brings the completed row back from awa_fast.jobs_done as failed, ADR 016).
    async with failing_rows(
        dsn, "NEW.state = 'failed' AND NEW.consequence_reason = 'corrected'", event="INSERT"
    ):
        result = await client.runtime.reconcile()
    assert result["corrected"] == []
    row = await job_row(dsn, job.id)
    assert (row["state"], row["verified_at"]) == ("completed", None)  # the verdict is not lost
    # ... and backed off (not verified again every tick): let the back-off pass
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "UPDATE awa_fast.verify_due SET next_try_at = now() WHERE job_id = %s "
            "AND tries = 1 AND next_try_at > now() RETURNING 1",
            (job.id,),
        )
        assert await cur.fetchone() is not None
    result = await client.runtime.reconcile()  # verified again, corrected this time
    assert result["corrected"] == [job.id] and verdicts == [job.id, job.id]
    row = await job_row(dsn, job.id)
    assert row["state"] == "failed" and row["verified_at"] is not None
    assert row["consequence_reason"] == "corrected"
    assert [e.get("corrected") for e in row["errors"]] == [True]
    assert (await client.runtime.reconcile())["corrected"] == []  # never twice
    with pytest.raises(AwaError):  # an admin correction of a corrected job is refused
        await client.correct_to_failed(job.id, error="again")


def finished_rows(dsn: str, kind: str, ages_s: list[float]) -> list[int]:
    """Completed jobs of ``kind`` finalized ``ages_s`` seconds ago, written as an admin INSERT
    does (they move to their slices in the statement, migration 013)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            r[0]
            for r in conn.execute(
                "INSERT INTO awa_fast.jobs (kind, queue, state, attempt, finalized_at) "
                "SELECT %s, 'idle_q', 'completed', 1, now() - a * interval '1 second' "
                "FROM unnest(%s::float8[]) a RETURNING id",
                (kind, ages_s),
            ).fetchall()
        ]


def kinds_of(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT kind FROM awa_fast.verifier_kinds ORDER BY 1")]


def verify_list(dsn: str) -> tuple[list, list]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        kinds = conn.execute("SELECT kind, state FROM awa_fast.verifier_kinds").fetchall()
        due = conn.execute("SELECT job_id FROM awa_fast.verify_due ORDER BY 1").fetchall()
    return kinds, [r[0] for r in due]


async def test_the_verify_pass_reads_the_list_completions_write(dsn, client):
    """Migration 020: the verify pass reads ``verify_due``, which every completion of a kind in
    ``verifier_kinds`` writes, instead of searching the window's slices every tick. The first
    tick makes ``verifier_kinds`` the leader's verifier kinds and lists the window's completed
    jobs that were finished before (and once more when the transactions older than that have
    ended); a job outside the window
    and another kind's jobs are never listed; a verified job leaves the list; a listed job that
    left its slice (retried) is dropped from the list; a leader without the hook empties both."""
    verdicts = []

    def done(job):
        verdicts.append(job.id)
        return True

    @client.task(
        dict, kind="ship", failure_consequence=awa.NO_FAILURE_CONSEQUENCE, verify_success=done
    )
    async def ship(job):
        return None

    before = finished_rows(dsn, "ship", [60, 1800])
    outside = finished_rows(dsn, "ship", [7200])
    other = finished_rows(dsn, "other", [60])
    assert verify_list(dsn) == ([], [])  # no verifier kind yet: nothing listed
    await client.start(IDLE, **QUIET)
    await client.runtime.reconcile()
    assert sorted(verdicts) == sorted(before)
    # 'active' at once when no older transaction runs, else on a later tick
    assert kinds_of(dsn) == ["ship"] and verify_list(dsn)[1] == []

    after = finished_rows(dsn, "ship", [0, 0])
    finished_rows(dsn, "other", [0])
    assert verify_list(dsn)[1] == after  # listed by their completion
    retried = after[0]
    with psycopg.connect(dsn, autocommit=True) as conn:  # leaves its slice before the pass
        conn.execute("DELETE FROM awa_fast.jobs_done WHERE id = %s", (retried,))
    await client.runtime.reconcile()
    assert verdicts[len(before) :] == [after[1]]
    assert verify_list(dsn) == ([("ship", "active")], [])
    assert outside[0] not in verdicts and other[0] not in verdicts

    client.runtime.services.registry.verifiers.clear()  # a leader without the hook
    finished_rows(dsn, "ship", [0])
    await client.runtime.reconcile()
    assert verify_list(dsn)[1] == []
    finished_rows(dsn, "ship", [0])
    await client.runtime.reconcile()
    assert verify_list(dsn) == ([], [])
    finished_rows(dsn, "ship", [0])
    assert verify_list(dsn) == ([], [])


def running_row(dsn: str, kind: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "INSERT INTO awa_fast.jobs (kind, queue, state, attempt) "
            "VALUES (%s, 'idle_q', 'running', 1) RETURNING id",
            (kind,),
        ).fetchone()[0]


def complete_uncommitted(dsn: str, job_id: int) -> psycopg.Connection:
    """A completion whose transaction stays open (committed by the caller)."""
    conn = psycopg.connect(dsn)
    conn.execute(
        "UPDATE awa_fast.jobs SET state = 'completed', finalized_at = now() WHERE id = %s",
        (job_id,),
    )
    return conn


def ship_verifier(client, verdicts: list, raising: set | None = None) -> None:
    def verify(job):
        verdicts.append(job.id)
        if raising and job.id in raising:
            raise RuntimeError("the verifier's service is down")
        return True

    @client.task(
        dict, kind="ship", failure_consequence=awa.NO_FAILURE_CONSEQUENCE, verify_success=verify
    )
    async def ship(job):
        return None


async def test_a_completion_committed_long_after_its_kind_was_added_is_verified(dsn, client):
    """A completion that looked at ``verifier_kinds`` before the leader added its kind, and
    committed ticks later: the kind stays 'adding' until that transaction has ended, and its job
    is listed from the slice then (found by a breaker helper: the first version listed twice,
    one tick apart, and missed it)."""
    verdicts: list[int] = []
    ship_verifier(client, verdicts)
    late = complete_uncommitted(dsn, running_row(dsn, "ship"))
    await client.start(IDLE, **QUIET)
    for _ in range(3):
        await client.runtime.reconcile()
    assert verify_list(dsn) == ([("ship", "adding")], [])  # still waiting for it
    late.commit()
    late.close()
    for _ in range(2):
        await client.runtime.reconcile()
    assert len(verdicts) == 1 and verify_list(dsn) == ([("ship", "active")], [])


async def test_a_late_completion_of_a_dropped_kind_leaves_no_listing(dsn, client):
    """A completion that listed its job while the kind was hooked and committed after the leader
    dropped the kind: the listing is deleted when that transaction has ended, not an hour
    later (breaker helper)."""
    verdicts: list[int] = []
    ship_verifier(client, verdicts)
    await client.start(IDLE, **QUIET)
    await client.runtime.reconcile()
    await client.runtime.reconcile()
    late = complete_uncommitted(dsn, running_row(dsn, "ship"))
    client.runtime.services.registry.verifiers.clear()
    await client.runtime.reconcile()
    late.commit()
    late.close()
    await client.runtime.reconcile()
    assert verify_list(dsn) == ([], []) and verdicts == []


async def test_a_leader_with_a_longer_window_lists_what_a_shorter_one_expired(dsn, client):
    """Leader 1 verifies within 60 s and expires older listings; leader 2 (an hour) lists the
    window's completed jobs from the slices again (breaker helper)."""
    verdicts: list[int] = []
    ship_verifier(client, verdicts)
    await client.start(IDLE, **QUIET)
    runtime = client.runtime
    hour = runtime.maintenance_config
    runtime.maintenance_config = dataclasses.replace(hour, verify_window_s=60)
    await runtime.reconcile()
    old = finished_rows(dsn, "ship", [600])
    await runtime.reconcile()
    assert verify_list(dsn)[1] == [] and verdicts == []
    runtime.maintenance_config = hour
    await runtime.reconcile()
    assert verdicts == old


async def test_jobs_whose_hook_raises_do_not_hold_the_others(dsn, client):
    """A hook that raises backs its job off (1, 2, 4 ... 60 s): 100 such jobs at the front of
    the list no longer take every tick's batch of 100 (breaker helper)."""
    verdicts: list[int] = []
    failing = finished_rows(dsn, "ship", [5.0] * 100)
    ship_verifier(client, verdicts, raising=set(failing))
    fine = finished_rows(dsn, "ship", [1.0])
    await client.start(IDLE, **QUIET)
    await client.runtime.reconcile()
    assert sorted(verdicts) == sorted(failing)
    await client.runtime.reconcile()
    assert verdicts[len(failing) :] == fine
    with psycopg.connect(dsn, autocommit=True) as conn:
        tries = conn.execute(
            "SELECT min(tries), max(tries), bool_and(next_try_at > now()) FROM awa_fast.verify_due"
        ).fetchone()
    assert tries == (1, 1, True)


async def test_a_hook_that_never_returns_is_bounded_and_a_def_hook_runs_in_a_thread(dsn, client):
    """A ``verify_success`` call gets ``consequence_timeout_ms``, like an effect: a hook that
    never returns (an HTTP call without a timeout) counts as raising and its job is backed off,
    instead of freezing the leader's reconcile loop for good. A ``def`` hook runs in a thread:
    a blocked one leaves the event loop free (tester's report)."""
    hung, blocked = finished_rows(dsn, "hang", [1.0]), finished_rows(dsn, "block", [1.0])
    release = threading.Event()
    threads = []

    async def never(job):
        await asyncio.Event().wait()

    def blocking(job):
        threads.append(threading.current_thread())
        release.wait()  # e.g. requests.get without a timeout
        return True

    for kind, hook in (("hang", never), ("block", blocking)):
        client.task(
            dict, kind=kind, failure_consequence=awa.NO_FAILURE_CONSEQUENCE, verify_success=hook
        )(lambda job: None)
    await client.start(IDLE, **QUIET, consequence_timeout_ms=200)
    ticks = 0

    async def ticking():  # the event loop keeps running while the def hook blocks
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(ticking())
    try:
        async with asyncio.timeout(10):
            await client.runtime.reconcile()
    finally:
        ticker.cancel()
        release.set()
    assert threads and threads[0] is not threading.main_thread()
    assert ticks >= 10  # two 0.2 s timeouts passed with the loop free
    with psycopg.connect(dsn, autocommit=True) as conn:
        backed_off = conn.execute(
            "SELECT job_id, tries, next_try_at > now() FROM awa_fast.verify_due ORDER BY 1"
        ).fetchall()
    assert backed_off == [(hung[0], 1, True), (blocked[0], 1, True)]


async def test_a_retried_job_is_verified_again_after_its_new_completion(dsn, client):
    """A job verified, corrected to failed by an admin, retried and completed again by a worker
    is a new completion: retry clears verified_at, so the hook runs on it again (breaker
    helper)."""
    verdicts: list[int] = []
    ship_verifier(client, verdicts)
    (job_id,) = finished_rows(dsn, "ship", [1.0])
    await client.start(IDLE, **QUIET)
    await client.runtime.reconcile()
    await client.correct_to_failed(job_id, error="found broken")
    await wait_state(client, job_id, "failed")
    assert (await client.retry(job_id)) is not None  # the runtime (idle_q) runs it again
    await wait_state(client, job_id, "completed")
    await client.runtime.reconcile()
    assert verdicts == [job_id, job_id]


# ---------------------------------------------------------------------------------------------
# every maintenance loop survives every exception, and health_check reports a dead loop


async def test_class3_a_loop_survives_any_exception_and_reports_it(dsn, client):
    calls = []
    recovered = asyncio.Event()

    async def flaky(fenced):
        calls.append(1)
        if len(calls) <= 2:  # what ended the reconciler loop before: a non-database error
            raise AwaError("job 7 is failed, not completed: nothing to correct")
        async with fenced() as conn:
            await conn.execute("SELECT 1")
        recovered.set()

    m = Maintenance(
        dsn,
        client.pool,
        MaintenanceConfig(leader_election_interval_ms=60_000),
        extra_tasks=[(0.01, flaky)],
    )
    try:
        await m._elect()
        assert m.is_leader
        await asyncio.wait_for(recovered.wait(), 15)
        health = m.loop_health()["flaky"]
        assert health.alive and health.passes >= 1 and health.failures == 0
        assert health.last_error == "AwaError: job 7 is failed, not completed: nothing to correct"
    finally:
        await m._step_down()


async def test_health_check_reports_an_election_that_keeps_failing(dsn, client):
    """A trigger refusing the epoch bump makes every election attempt fail in every process:
    nothing promotes, rescues or prunes. health_check says so (not healthy, the error), and is
    healthy again once this process leads (tester's report: it said healthy, no leader)."""

    @client.task(dict, kind="noop", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def noop(job):
        return None

    async with failing_rows(dsn, "true", event="UPDATE", table="awa_fast.leader", name="no_bump"):
        await client.start(IDLE, **{**QUIET, "maintenance": True}, leader_election_interval_ms=50)
        m = client.runtime.maintenance
        await until(lambda: m.election_failing, m.elections, what="failing elections")
        health = await client.health_check()
        assert not health.healthy and not health.leader
        assert "trigger added outside awa-fast" in (health.election_error or "")
    await until(lambda: m.is_leader, m.leadership, what="leadership")
    health = await client.health_check()
    assert health.healthy and health.leader and health.election_error is None


async def test_class3_health_check_reports_a_dead_loop_until_it_recovers(dsn, client):
    @client.task(dict, kind="noop", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def noop(job):
        return None

    await client.start(
        IDLE,
        poll_interval_ms=50,
        heartbeat_interval_ms=100,
        leader_election_interval_ms=50,
        cron_interval_ms=20,
    )
    m = client.runtime.maintenance
    cron = passes(client, "evaluate_cron")
    await until(
        lambda: m.is_leader and "evaluate_cron" in m.loop_health(), m.passed, what="leadership"
    )
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("ALTER TABLE awa_fast.cron_jobs RENAME TO cron_jobs_away")
        try:

            async def dead():
                health = await client.health_check()
                loop = health.maintenance_loops["evaluate_cron"]
                return (health, loop) if not loop.alive else None

            health, loop = await until(dead, cron, what="the cron loop reported dead")
            assert not health.healthy and loop.failures >= 3
            assert loop.last_error.startswith("UndefinedTable")
        finally:
            await conn.execute("ALTER TABLE awa_fast.cron_jobs_away RENAME TO cron_jobs")

    async def alive_again():
        health = await client.health_check()
        return health.healthy and health.maintenance_loops["evaluate_cron"].alive

    await until(alive_again, cron, timeout=40, what="the cron loop back (it backs off)")
    assert client.runtime.maintenance.is_leader  # it kept the lock and its loops throughout


# ---------------------------------------------------------------------------------------------
# fencing: a deposed leader writes nothing


async def due_job(dsn, client):
    """A scheduled job whose time has come (promote's work)."""
    job = await client.insert(
        {"n": 2}, kind="ship", queue="elsewhere", run_at="2100-01-01T00:00:00+00:00"
    )
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET run_at = now() - interval '1 second' WHERE id = %s", (job.id,)
        )
    return job


async def _lock_pid(m: Maintenance) -> int:
    return m.leader.lock_conn.info.backend_pid


async def _terminate(dsn, pid: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def test_class3_a_deposed_leader_writes_nothing(dsn, client):
    done, _verdicts = await completed_but_not_done(dsn, client)
    due = await due_job(dsn, client)
    assert (await job_row(dsn, due.id))["state"] == "scheduled"
    old = Maintenance(dsn, client.pool, MaintenanceConfig())
    new = Maintenance(dsn, client.pool, MaintenanceConfig())
    try:
        assert await old.acquire()
        await _terminate(dsn, await _lock_pid(old))  # its lock connection dies
        assert await new.acquire()
        assert new.epoch == old.epoch + 1
        # The old leader has not noticed yet: every pass it runs is fenced off.
        with pytest.raises(Deposed):
            await old.promote()
        with pytest.raises(Deposed):
            await old.rescue()
        with pytest.raises(Deposed):
            await client.runtime.reconcile(old.fenced)
        assert (await job_row(dsn, due.id))["state"] == "scheduled"
        assert (await job_row(dsn, done.id))["state"] == "completed"
        # The new leader's passes work, once.
        assert await new.promote() == 1
        assert (await client.runtime.reconcile(new.fenced))["corrected"] == [done.id]
        assert (await client.runtime.reconcile(new.fenced))["corrected"] == []
        row = await job_row(dsn, done.id)
        assert row["state"] == "failed" and len(row["errors"]) == 1
        assert (await job_row(dsn, due.id))["state"] == "available"
        # At its next election tick the old leader steps down.
        with pytest.raises(psycopg.OperationalError):
            await old._elect()
        await old._step_down()
        assert not old.is_leader
    finally:
        await old._step_down()
        await new._step_down()


async def test_class3_taking_leadership_waits_for_the_old_leaders_open_pass(dsn, client):
    old = Maintenance(dsn, client.pool, MaintenanceConfig())
    new = Maintenance(dsn, client.pool, MaintenanceConfig())
    job = await due_job(dsn, client)
    try:
        assert await old.acquire()
        async with old.fenced() as conn:  # a pass of the old epoch is in flight ...
            await _terminate(dsn, await _lock_pid(old))
            electing = asyncio.create_task(new.acquire())

            # ... so the new leader's epoch bump waits for it
            await wait_lock_waiter(
                dsn, query_like="%leader SET epoch%", what="the epoch bump waiting on the open pass"
            )
            assert not electing.done()
            await conn.execute("UPDATE awa_fast.jobs SET priority = 1 WHERE id = %s", (job.id,))
        await electing  # the old pass committed first
        assert new.is_leader and new.epoch == old.epoch + 1
        assert (await job_row(dsn, job.id))["priority"] == 1
        with pytest.raises(Deposed):
            async with old.fenced() as conn:
                await conn.execute("UPDATE awa_fast.jobs SET priority = 4 WHERE id = %s", (job.id,))
        assert (await job_row(dsn, job.id))["priority"] == 1
    finally:
        await old._step_down()
        await new._step_down()


async def test_promotion_wakes_the_promoted_queues_after_its_commit(dsn, client):
    # The leader wakes the promoted queues once the promotion committed (a NOTIFY inside it
    # would hold the notify lock through its WAL flush, ADR 018); fails if the wake-up is lost.
    due = await due_job(dsn, client)
    m = Maintenance(dsn, client.pool, MaintenanceConfig())
    try:
        assert await m.acquire()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
            await listener.execute("LISTEN awa_fast")
            assert await m.promote() == 1
            assert await wakeups_until_marker(listener, dsn, "marker") == ["elsewhere"]
        assert (await job_row(dsn, due.id))["state"] == "available"
    finally:
        await m._step_down()


# ---------------------------------------------------------------------------------------------
# heartbeat staleness is per process: a process started with a short one never judges another
# process's live attempt, or its live leader, by it (migration 025; found by a breaker helper)


async def test_a_short_staleness_elsewhere_never_rescues_a_live_attempt_or_displaces_a_leader(
    dsn, client
):
    started = asyncio.Event()

    @client.task(dict, kind="long", queue="long_q", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def long(job):
        started.set()
        await asyncio.Event().wait()

    job = await client.insert({"n": 1}, kind="long", queue="long_q")
    # this process: awa's default heartbeat (every 30 s), and the maintenance leader
    await client.start([("long_q", 1)], poll_interval_ms=50)
    own = client.runtime.maintenance
    await until(lambda: own.is_leader, own.leadership, what="leadership")
    await asyncio.wait_for(started.wait(), 15)
    assert client.runtime.min_stale_ms == 60_000  # two heartbeat intervals
    # its last beat 5 s ago: live for a process that beats every 30 s
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET heartbeat_at = now() - interval '5 seconds' WHERE id = %s",
            (job.id,),
        )
    other = Maintenance(
        dsn,
        client.pool,
        MaintenanceConfig(heartbeat_staleness_ms=300, leader_election_interval_ms=100),
    )
    try:
        assert await other.rescue() == []
        row = await job_row(dsn, job.id)
        assert (row["state"], row["run_lease"]) == ("running", 1)
        lock_pid = own.leader.lock_conn.info.backend_pid

        async def lock_idle_past_300ms():
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                cur = await conn.execute(
                    "SELECT state_change < now() - interval '400 milliseconds' "
                    "FROM pg_stat_activity WHERE pid = %s",
                    (lock_pid,),
                )
                return (await cur.fetchone())[0]

        # polled: a leader's lock connection idle between its checks is time passing
        await poll_until(lock_idle_past_300ms, what="the leader's lock connection idle")
        assert not await other.acquire()
        assert own.is_leader and not own.leader.lock_conn.closed
    finally:
        await other._step_down()


async def test_a_def_thread_outliving_shutdown_keeps_its_process_staleness(dsn):
    # After shutdown the presence row (and its min_stale_ms) was deleted while the thread
    # still ran: a process with a 4 s staleness rescued the attempt and ran it twice at once
    gate, entered = threading.Event(), threading.Event()

    def slow(job):
        entered.set()
        gate.wait(30)

    client = awa.AsyncClient(dsn)
    try:
        client.task(dict, kind="slow", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)(slow)
        job = await client.insert({"n": 1}, kind="slow")
        await client.start([("default", 1)], poll_interval_ms=50, maintenance=False)
        runtime = client.runtime
        await asyncio.to_thread(entered.wait, 10)
        await client.shutdown(timeout_ms=100)
        assert await _presence(dsn, runtime.instance) == [60_000]  # kept: its thread runs
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                "UPDATE awa_fast.jobs SET heartbeat_at = now() - interval '5 seconds' "
                "WHERE id = %s",
                (job.id,),
            )
        other = Maintenance(dsn, client.pool, MaintenanceConfig(heartbeat_staleness_ms=300))
        assert await other.rescue() == []
        gate.set()  # the thread ends: its attempt is given back, the row goes
        assert await asyncio.to_thread(runtime.lingering.wait_ended, 1, 15)
        # the lingering thread deleted the row after ending the attempt (same thread, after)
        await poll_until(
            lambda: _presence_gone(dsn, runtime.instance),
            timeout=10,
            what="the presence row removed",
        )
        row = await job_row(dsn, job.id)
        assert (row["state"], row["run_lease"]) == ("available", 1)
    finally:
        gate.set()
        await client.close()


async def _presence_gone(dsn, instance: str) -> bool:
    return await _presence(dsn, instance) == []


async def _presence(dsn, instance: str) -> list:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT min_stale_ms FROM awa_fast.workers WHERE instance = %s", (instance,)
        )
        return [r[0] for r in await cur.fetchall()]
