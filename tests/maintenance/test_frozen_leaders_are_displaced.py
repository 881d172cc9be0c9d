"""A frozen leader is displaced past the staleness, and its zombie attempt is fenced."""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
import pytest

import awa_fast as awa
from tests.support import job_row, poll_until, scalar, wait_state

pytestmark = pytest.mark.usefixtures("clean", "no_presence_rows")


# Issue 9, class 3: a SIGSTOPped leader (a frozen VM, a debugger, a blocked event loop) kept its
# advisory lock -- its connection stays open -- so no other process could take leadership: nothing
# was promoted or rescued cluster-wide, not even the stopped process's own attempts, until it was
# continued. Its zombie attempt, once continued, must not finalize or stage.


ROOT = __import__("os").path.dirname(
    __import__("os").path.dirname(
        __import__("os").path.dirname(__import__("os").path.abspath(__file__))
    )
)


async def _line(proc) -> list[str]:
    return (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()


async def test_a_sigstopped_leader_is_displaced_and_its_zombie_attempt_is_fenced(dsn, client):
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


async def test_a_leader_frozen_mid_pass_is_displaced_with_its_open_pass(dsn, client):
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


async def test_a_pass_frozen_after_its_leaders_lock_connection_is_displaced_too(dsn, client):
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
