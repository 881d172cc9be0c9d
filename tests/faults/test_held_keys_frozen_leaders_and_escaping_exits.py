"""Issue 9, more cases of its classes (an adversarial pass after the named defects were fixed).

Real PostgreSQL throughout; each test names the class it belongs to.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import psycopg
import pytest

import awa_fast as awa
from awa_fast.errors import ConfigError
from tests import support
from tests.support import job_row, poll_until, scalar, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "maintenance": False}
CANCELLED_BIT = 1 << 6

pytestmark = pytest.mark.usefixtures("clean")


@pytest.fixture(autouse=True)
async def _no_presence_rows(dsn):
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("TRUNCATE awa_fast.workers")


@dataclasses.dataclass
class Job:
    mode: str = ""


# ---------------------------------------------------------------------------------------------
# class 1/2: an outcome whose state would take a key that a *cancelled* job holds. The attempt
# is cancelled as a duplicate -- which, with `cancelled` in the mask, collided with the same
# holder: a Cancel or a terminal failure became a retry ("finalize failed: UniqueViolation"),
# a retry or a completion left the row running until rescue.


@pytest.mark.parametrize(
    "mode, mask",
    [
        ("cancel", CANCELLED_BIT),
        ("fail", (1 << 5) | CANCELLED_BIT),
        ("retry", (1 << 4) | CANCELLED_BIT),
        ("snooze", (1 << 0) | CANCELLED_BIT),
        ("complete", (1 << 3) | CANCELLED_BIT),
    ],
)
async def test_class2_outcome_into_a_key_a_cancelled_job_holds_settles(dsn, client, mode, mask):
    async def handler(job):
        if mode == "cancel":
            return awa.Cancel("bye")
        if mode == "fail":
            raise awa.TerminalError("boom")
        if mode == "retry":
            raise RuntimeError("again")
        if mode == "snooze":
            return awa.Snooze(100)

    client.task(Job)(handler)
    job = await client.insert(
        Job(mode), max_attempts=3, unique_opts={"by_args": False, "states": mask}
    )
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        holder = (
            await (
                await conn.execute(
                    "INSERT INTO awa_fast.jobs (kind, args, state, unique_key, unique_states, "
                    "finalized_at) SELECT 'job', '{}', 'cancelled', unique_key, unique_states, now() "
                    "FROM awa_fast.jobs_all WHERE id = %s RETURNING id",
                    (job.id,),
                )
            ).fetchone()
        )[0]
    await client.start([("default", 2)], **FAST)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    row = await wait_state(
        client, job.id, "cancelled", "retryable", "failed", "completed", "scheduled", timeout=5
    )
    assert row["state"] == "cancelled" and row["attempt"] == 1, row
    assert row["errors"][-1]["error"].startswith("cancelled as duplicate"), row["errors"]
    assert not row["unique_states"] & CANCELLED_BIT  # the duplicate does not hold the key
    assert (await job_row(dsn, holder))["state"] == "cancelled"


# ---------------------------------------------------------------------------------------------
# class 5: maintenance and consequence settings start() accepted but no pass could use: NaN /
# inf retention or staleness (every prune / rescue pass failed with "interval out of range",
# or start() itself raised a raw psycopg error), wrong types (a raw TypeError), "no" taken as
# true for a bool keyword, and a raw ValueError without the field.


@pytest.mark.parametrize(
    "options, field",
    [
        ({"completed_retention_hours": float("nan")}, "completed_retention_hours"),
        ({"failed_retention_hours": float("inf")}, "failed_retention_hours"),
        ({"dlq_retention_days": -1}, "dlq_retention_days"),
        ({"heartbeat_staleness_ms": float("nan")}, "heartbeat_staleness_ms"),
        (
            {"heartbeat_interval_ms": 1_000, "heartbeat_staleness_ms": 10**16},
            "heartbeat_staleness_ms",
        ),
        ({"promote_interval_ms": "100"}, "promote_interval_ms"),
        ({"cleanup_batch_size": 0.5}, "cleanup_batch_size"),
        ({"consequence_timeout_ms": float("nan")}, "consequence_timeout_ms"),
        ({"consequence_backoff_ms": "5"}, "consequence_backoff_ms"),
        ({"dlq_enabled_by_default": "no"}, "dlq_enabled_by_default"),
        ({"maintenance": "no"}, "maintenance"),
        ({"queue_subset": 1}, "queue_subset"),
        ({"staged_completions": None}, "staged_completions"),
    ],
)
async def test_class5_start_rejects_settings_no_pass_could_use(dsn, client, options, field):
    client.task(Job)(lambda job: None)
    with pytest.raises(ConfigError) as err:
        await client.start([("default", 1)], **{**FAST, **options})
    assert err.value.field == field, str(err.value)
    assert client.runtime is None
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.workers") == 0


@pytest.mark.parametrize("dlq", ["no", 0, None])
async def test_class5_start_rejects_a_per_queue_dlq_that_is_not_a_bool(dsn, client, dlq):
    # {"dlq": "no"} was stored as bool("no"): the queue's DLQ turned on
    client.task(Job)(lambda job: None)
    with pytest.raises(ConfigError) as err:
        await client.start([{"name": "default", "max_workers": 1, "dlq": dlq}], **FAST)
    assert err.value.field == "dlq" and err.value.limit == "bool", str(err.value)
    assert "'default'" in str(err.value)
    assert client.runtime is None
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.queue_meta WHERE dlq") == 0


# ---------------------------------------------------------------------------------------------
# class 2/3: user code the runtime calls besides the handler -- a failure consequence effect,
# a verify_success hook, a follow-up spec -- raising SystemExit (a library calling sys.exit):
# it escaped `except Exception` and ended the worker's event loop (the whole process). It is
# that code's failure: the consequence stays owed and is retried, the job stays unverified, the
# attempt is recorded as a failed finalize; the process lives on.


async def _settle(client, dsn, job_id, *, ticks=5) -> dict:
    for _ in range(ticks):
        await client.runtime.reconcile()
        row = await job_row(dsn, job_id)
        if row["consequence_state"] == "applied":
            return row
        await asyncio.sleep(0.2)  # the consequence's backoff (consequence_backoff_ms)
    return row


async def test_class2_failure_consequence_raising_system_exit_stays_owed(dsn, client):
    calls = []

    async def effect(failure):
        calls.append(failure.job.id)
        if len(calls) == 1:
            raise SystemExit("effect called sys.exit")

    @client.task(Job, failure_consequence=effect)
    async def handler(job):
        raise awa.TerminalError("gone")

    job = await client.insert(Job(), max_attempts=1)
    await client.start([("default", 1)], **FAST, consequence_backoff_ms=100)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    row = await _settle(client, dsn, job.id)
    assert (row["state"], row["consequence_state"]) == ("failed", "applied"), row
    assert calls == [job.id, job.id]
    assert (await client.health_check()).poll_loop_alive


async def test_class3_verify_success_raising_system_exit_is_verified_again(dsn, client):
    calls = []

    def verify(job):
        calls.append(job.id)
        if len(calls) == 1:
            raise SystemExit("verifier called sys.exit")
        return False  # not done: corrected to failed

    @client.task(Job, failure_consequence=lambda failure: None, verify_success=verify)
    async def handler(job):
        return None

    job = await client.insert(Job())
    await client.start([("default", 1)], **FAST)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    await wait_state(client, job.id, "completed", timeout=5)
    row = await _settle(client, dsn, job.id, ticks=20)  # the raise backs it off 1 s (ADR 019)
    assert row["state"] == "failed" and row["errors"][-1]["corrected"] is True, row
    assert calls == [job.id, job.id]


@pytest.mark.parametrize("outcome", ["completed", "cancelled"])
async def test_class2_follow_up_spec_raising_system_exit_fails_the_finalize(dsn, client, outcome):
    def spec(*_):
        raise SystemExit("spec called sys.exit")

    @client.task(Job, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def handler(job):
        return awa.Cancel("no") if outcome == "cancelled" else None

    getattr(client, f"on_{outcome}_enqueue")(Job, spec)
    job = await client.insert(Job(), max_attempts=2)
    await client.start([("default", 1)], **FAST)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    row = await wait_state(client, job.id, "retryable", "failed", timeout=5)
    assert row["state"] == "retryable" and row["attempt"] == 1, row
    assert "raised SystemExit: spec called sys.exit" in row["errors"][-1]["error"]
    assert (await client.health_check()).poll_loop_alive


# ---------------------------------------------------------------------------------------------
# class 3: a SIGSTOPped leader (a frozen VM, a debugger, a blocked event loop) kept its
# advisory lock -- its connection stays open -- so no other process could take leadership:
# nothing was promoted or rescued cluster-wide, not even the stopped process's own attempts,
# until it was continued. Its zombie attempt, once continued, must not finalize or stage.

ROOT = __import__("os").path.dirname(
    __import__("os").path.dirname(
        __import__("os").path.dirname(__import__("os").path.abspath(__file__))
    )
)


async def _line(proc) -> list[str]:
    return (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()


async def test_class3_a_sigstopped_leader_is_displaced_and_its_zombie_attempt_is_fenced(
    dsn, client
):
    import os
    import signal
    import subprocess
    import sys

    from tests.stop_app import STALE_MS

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.stop_app",
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "AWA_FAST_APP_DSN": dsn},
    )
    try:
        assert await _line(proc) == ["ready", "True"]  # it is the leader
        job = await client.insert({"hold": 1.5}, kind="zombie", queue="stop_q", max_attempts=3)
        assert await _line(proc) == ["started", str(job.id), "1"]
        proc.send_signal(signal.SIGSTOP)
        runs = []

        @client.task(
            dict, kind="zombie", queue="stop_q", failure_consequence=awa.NO_FAILURE_CONSEQUENCE
        )
        async def zombie(j):
            runs.append(j.run_lease)
            j.enqueue_on_completion({"from_lease": j.run_lease}, kind="child", queue="child_q")

        await client.start(
            [("stop_q", 2)],
            poll_interval_ms=50,
            heartbeat_interval_ms=100,
            heartbeat_staleness_ms=STALE_MS,
            leader_election_interval_ms=100,
            heartbeat_rescue_interval_ms=100,
            promote_interval_ms=50,
        )
        row = await wait_state(client, job.id, "completed", timeout=20)
        assert client.runtime.maintenance.is_leader
        assert runs == [row["run_lease"]] and row["run_lease"] >= 2
        proc.send_signal(signal.SIGCONT)
        assert await _line(proc) == ["ended"]  # the zombie's handler returned and gave up
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            await proc.wait()
    row = await job_row(dsn, job.id)
    assert row["state"] == "completed" and row["run_lease"] == runs[0]
    children = await scalar(
        dsn, "SELECT json_agg(args) FROM awa_fast.jobs_all WHERE kind = 'child'"
    )
    assert children == [{"from_lease": runs[0]}]  # none from the zombie attempt


# ---------------------------------------------------------------------------------------------
# class 4/5: handlers that hold every pool connection (max_connections below the slots, each
# handler in a transaction of its own) starved the heartbeat of a connection: the leader
# rescued the live attempts as "heartbeat stale" and ran them again, over and over (the jobs
# never completed). Beats now go over a connection of their own.


async def test_class4_handlers_holding_every_pool_connection_do_not_go_stale(dsn):
    worker = awa.AsyncClient(dsn, max_connections=2)
    leader = awa.AsyncClient(dsn)
    runs = []

    @worker.task(Job, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def hold(job):
        runs.append((job.id, job.run_lease))
        async with await worker.transaction() as tx:
            await tx.execute("SELECT pg_sleep(1.6)")  # longer than the staleness

    leader.failure_consequence(Job, awa.NO_FAILURE_CONSEQUENCE)  # a maintenance-only process
    try:
        jobs = await worker.insert_many([Job(str(i)) for i in range(3)])
        await worker.start(
            [("default", 3)],
            poll_interval_ms=50,
            heartbeat_interval_ms=100,
            heartbeat_staleness_ms=1000,
            maintenance=False,
        )
        await leader.start(
            [("idle_q", 1)],
            poll_interval_ms=50,
            heartbeat_interval_ms=100,
            heartbeat_staleness_ms=1000,
            heartbeat_rescue_interval_ms=100,
            leader_election_interval_ms=100,
            promote_interval_ms=50,
        )
        for job in jobs:
            row = await wait_state([worker, leader], job.id, "completed", timeout=20)
            assert row["errors"] == [] and row["run_lease"] == 1, row
        assert sorted(runs) == [(j.id, 1) for j in jobs]  # each ran once
    finally:
        await worker.close()
        await leader.close()


# ---------------------------------------------------------------------------------------------
# class 3: the LISTEN loop retried a lost connection every poll interval without backing off
# (about 20 WARNING lines a second at poll_interval_ms=50 while the database refused
# connections), unlike every other loop (interval * 2^(failures-1), at most 30 s).


async def test_class3_listen_reconnects_back_off(dsn, client, caplog):
    import logging
    import re

    client.task(Job)(lambda job: None)
    await client.start([("default", 1)], **FAST)
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    pid = client.runtime.listener.conn.info.backend_pid
    caplog.set_level(logging.WARNING, logger="awa_fast.runtime")

    def delays():
        return [
            float(m.group(1))
            for r in caplog.records
            if (
                m := re.search(
                    r"LISTEN connection lost .*reconnecting in ([0-9.]+) s", r.getMessage(), re.S
                )
            )
        ]

    admin = psycopg.conninfo.make_conninfo(dsn, dbname="postgres")
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS false')
        try:
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            # polled: the listen loop's failed reconnects show only in its log records
            await poll_until(
                lambda: _true(len(delays()) >= 4), timeout=10, what="four failed LISTEN reconnects"
            )
        finally:
            await conn.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS true')
    assert delays()[:4] == [0.05, 0.1, 0.2, 0.4]  # poll_interval_ms=50, doubling


async def _true(value):
    return value


# ---------------------------------------------------------------------------------------------
# class 2/5: a callback timeout too large for PostgreSQL's interval (1e300 s) reached the
# database and came back to the handler as a raw psycopg DatetimeFieldOverflow; it is a
# ValidationError naming timeout_seconds and its limit, at register_callback and at
# heartbeat_callback, and changes nothing.


async def test_class2_callback_timeout_past_the_interval_range_is_a_validation_error(dsn, client):
    errors = []

    @client.task(Job, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def handler(job):
        try:
            await job.register_callback(timeout_seconds=1e300)
        except awa.ValidationError as exc:
            errors.append((exc.field, exc.limit))
        token = await job.register_callback(timeout_seconds=60)
        try:
            await client.heartbeat_callback(token.id, timeout_seconds=1e12)
        except awa.ValidationError as exc:
            errors.append((exc.field, exc.limit))
        return awa.WaitForCallback(token)

    job = await client.insert(Job())
    await client.start([("default", 1)], **FAST)
    row = await wait_state(client, job.id, "waiting_external", "retryable", "failed", timeout=10)
    assert row["state"] == "waiting_external", row["errors"]
    assert [f for f, _limit in errors] == ["timeout_seconds", "timeout_seconds"]
    assert all("315360000" in limit for _f, limit in errors)


# ---------------------------------------------------------------------------------------------
# class 1/5: a queue's deadline_duration_ms too large for PostgreSQL's interval made every
# claim of that queue fail ("interval out of range"): its jobs stayed available forever. A
# negative, fractional or string one was accepted too. start() rejects them naming the field.


@pytest.mark.parametrize(
    "key, value",
    [
        ("deadline_duration_ms", 10**16),
        ("deadline_duration_ms", -1),
        ("deadline_duration_ms", 1.5),
        ("deadline_duration_ms", "300"),
        ("deadline_duration_ms", float("nan")),
        ("priority_aging_interval_ms", 10**16),  # every aging pass overflowed
    ],
)
async def test_class1_a_deadline_no_claim_could_compute_is_rejected_at_start(
    dsn, client, key, value
):
    client.task(Job)(lambda job: None)
    with pytest.raises(awa.ValidationError) as err:
        await client.start([{"name": "default", "max_workers": 2, key: value}], **FAST)
    assert err.value.field == key and "'default'" in str(err.value)
    assert client.runtime is None
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.workers") == 0


STALE_MS = 300


@contextlib.asynccontextmanager
async def _frozen_leader(dsn, client, *, pass_after_stale: bool):
    """A leader frozen as PostgreSQL sees it: its lock connection idle holding the advisory lock
    at a bumped epoch, and a pass idle in transaction on the leader row FOR SHARE (taken at once,
    or once the lock connection is idle past the staleness). Yields
    ``(lock, frozen_pass, epoch, maintenance)`` with a fresh ``Maintenance`` to take over."""
    from awa_fast import sql
    from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig

    lock = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    frozen_pass = await psycopg.AsyncConnection.connect(dsn)
    try:
        assert (await (await lock.execute(sql.TRY_LEADER, (sql.LEADER_LOCK_KEY,))).fetchone())[0]
        epoch = (await (await lock.execute(sql.LEADER_BUMP, ("frozen",))).fetchone())[0]
        if pass_after_stale:
            lock_pid = lock.info.backend_pid

            async def holder_stale():
                return await scalar(
                    dsn,
                    "SELECT state_change < now() - %s * interval '1 millisecond' "
                    "FROM pg_stat_activity WHERE pid = %s",
                    (STALE_MS, lock_pid),
                )

            # polled: idle "past the staleness" is server state and time passing
            await poll_until(holder_stale, what="the lock connection idle past the staleness")
        await frozen_pass.execute(
            "SELECT epoch FROM awa_fast.leader WHERE epoch = %s FOR SHARE", (epoch,)
        )
        m = Maintenance(
            dsn,
            client.pool,
            MaintenanceConfig(heartbeat_staleness_ms=STALE_MS, leader_election_interval_ms=100),
        )
        try:
            yield lock, frozen_pass, epoch, m
        finally:
            await m._step_down()
    finally:
        for conn in (lock, frozen_pass):
            if not conn.closed:
                await conn.close()


async def test_class3_a_leader_frozen_mid_pass_is_displaced_with_its_open_pass(dsn, client):
    """What a leader frozen inside a fenced pass looks like to PostgreSQL: its lock connection
    idle holding the advisory lock, and a transaction idle on the leader row FOR SHARE (which
    the new leader's epoch bump would wait for). Both are displaced past the staleness."""
    async with _frozen_leader(dsn, client, pass_after_stale=False) as (lock, frozen_pass, epoch, m):
        assert not await m.acquire()  # not frozen yet: the lock is respected

        async def displaced():
            return await m.acquire()

        # polled: the takeover is retried until the frozen holder is idle past the staleness
        await poll_until(displaced, timeout=10, what="the frozen leader displaced")
        assert m.epoch == epoch + 1
        assert lock.closed or lock.broken or await _dead(lock)
        assert await _dead(frozen_pass)


async def test_class3_a_pass_frozen_after_its_leaders_lock_connection_is_displaced_too(dsn, client):
    """The frozen leader's lock connection goes stale first and is terminated, but its pass froze
    a moment later and is not stale yet: the new leader's epoch bump waits on it, and once that
    wait times out the pass is stale and terminated, so leadership is taken on the same try
    (before, the bump's LockNotAvailable escaped, and later tries found no stale lock holder to
    go with the pass, so nobody ever terminated it)."""
    async with _frozen_leader(dsn, client, pass_after_stale=True) as (lock, frozen_pass, epoch, m):
        assert await m.acquire()
        assert m.epoch == epoch + 1
        assert await _dead(lock) and await _dead(frozen_pass)


async def _dead(conn) -> bool:
    try:
        await conn.execute("SELECT 1")
        return False
    except psycopg.OperationalError:
        return True


# ---------------------------------------------------------------------------------------------
# class 1/2: an inline wait_for_callback whose waiting_external state would take a key another
# parked job holds raised a raw psycopg UniqueViolation into the handler, and the attempt was
# retried (to collide again) -- while a WaitForCallback result into the same key is cancelled
# as a duplicate. Both now resolve the same way; the handler gets an AwaError saying so.


async def test_class1_inline_park_into_a_held_key_cancels_as_a_duplicate(dsn, client):
    raised = []

    @client.task(Job, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def park(job):
        token = await job.register_callback(timeout_seconds=60)
        try:
            await job.wait_for_callback(token)
        except awa.AwaError as exc:
            raised.append((job.id, str(exc)))
            raise

    mask = {"unique_opts": {"by_args": False, "states": 1 << 7}}  # waiting_external only
    jobs = [await client.insert(Job(str(i)), **mask) for i in range(2)]
    await client.start([("default", 2)], **FAST)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    rows = {j.id: await job_row(dsn, j.id) for j in jobs}
    assert sorted(r["state"] for r in rows.values()) == ["cancelled", "waiting_external"]
    loser = next(i for i, r in rows.items() if r["state"] == "cancelled")
    assert rows[loser]["attempt"] == 1
    assert rows[loser]["errors"][-1]["error"].startswith("cancelled as duplicate")
    assert raised == [
        (
            loser,
            f"job {loser} could not park: another job holds its unique key "
            "in waiting_external; cancelled as a duplicate",
        )
    ]


# ---------------------------------------------------------------------------------------------
# class 2/3: a settlement that would make a second holder of a unique key. A failure whose
# mask holds 'failed' (not 'running') takes its key only when it settles: the consequence
# settlement collided with a live holder, rolled back, and the reconciler ran the effect again
# every tick for as long as the holder lived; a verify_success correction into such a key was
# retried every tick with no back-off (the hook ran about once a second) and then dropped.

FAILED_BIT = 1 << 5


async def _hold_key_of(dsn, job_id) -> int:
    """A second job holding ``job_id``'s unique key while available, on a queue nobody serves."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "INSERT INTO awa_fast.jobs (kind, queue, args, state, unique_key, unique_states) "
            "SELECT 'job', 'nobody', '{}', 'available', unique_key, %s FROM awa_fast.jobs_all "
            "WHERE id = %s RETURNING id",
            ((1 << 1) | FAILED_BIT, job_id),
        )
        return (await cur.fetchone())[0]


async def test_class2_a_consequence_settlement_into_a_held_key_settles_once(dsn, client):
    calls = []

    @client.task(Job, failure_consequence=lambda failure: calls.append(failure.job.id))
    async def handler(job):
        raise awa.TerminalError("boom")

    job = await client.insert(
        Job(), max_attempts=1, unique_opts={"by_args": False, "states": FAILED_BIT}
    )
    holder = await _hold_key_of(dsn, job.id)
    await client.start([("default", 1)], **FAST, consequence_backoff_ms=100)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    for _ in range(3):  # the reconciler finds nothing left to settle
        await client.runtime.reconcile()
    row = await job_row(dsn, job.id)
    assert (row["state"], row["consequence_state"]) == ("cancelled", "applied"), row
    assert row["errors"][-1]["error"].startswith("cancelled as duplicate"), row["errors"]
    assert calls == [job.id]  # the effect ran once
    assert (await job_row(dsn, holder))["state"] == "available"


async def test_class3_a_correction_into_a_held_key_fails_without_the_key(dsn, client):
    verdicts, calls = [], []

    def verify(job):
        verdicts.append(job.id)
        return False  # not done

    @client.task(
        Job, failure_consequence=lambda failure: calls.append(failure.job.id), verify_success=verify
    )
    async def handler(job):
        return None

    job = await client.insert(Job(), unique_opts={"by_args": False, "states": FAILED_BIT})
    holder = await _hold_key_of(dsn, job.id)
    await client.start([("default", 1)], **FAST)
    await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
    await wait_state(client, job.id, "completed", timeout=5)
    for _ in range(3):
        await client.runtime.reconcile()
    row = await job_row(dsn, job.id)
    assert (row["state"], row["consequence_state"]) == ("failed", "applied"), row
    assert "failed without its unique key" in row["errors"][-1]["error"], row["errors"]
    assert row["errors"][-1]["corrected"] is True
    assert not row["unique_states"] & FAILED_BIT  # it does not hold the key
    assert (verdicts, calls) == ([job.id], [job.id])
    assert (await job_row(dsn, holder))["state"] == "available"


async def test_class3_a_verdict_that_cannot_be_recorded_is_backed_off(dsn, client):
    verdicts = []

    @client.task(Job, failure_consequence=lambda failure: None, verify_success=verdicts.append)
    async def handler(job):
        return None

    job = await client.insert(Job())
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # a real fault: recording any verdict fails
        await conn.execute(
            "CREATE FUNCTION awa_test_refuse_verdict() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
        )
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                "CREATE TRIGGER refuse BEFORE DELETE ON awa_fast.verify_due "
                "FOR EACH ROW EXECUTE FUNCTION awa_test_refuse_verdict()"
            )
        await client.start([("default", 1)], **FAST)
        await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
        await wait_state(client, job.id, "completed", timeout=5)
        for _ in range(3):  # the first back-off is 1 s
            await client.runtime.reconcile()
        assert len(verdicts) == 1
        assert await scalar(
            dsn, "SELECT tries FROM awa_fast.verify_due WHERE job_id = %s", (job.id,)
        )
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("DROP TRIGGER IF EXISTS refuse ON awa_fast.verify_due")
            await conn.execute("DROP FUNCTION IF EXISTS awa_test_refuse_verdict()")
