"""Issue 9's fault-injection soak: the staged follow-up, failure-consequence and correction
guarantees under every fault at once. Two worker processes (both leader-capable) run a
stage-A/B pipeline and a kind with a failure consequence and a ``verify_success`` correction,
while the test SIGKILLs workers, terminates job backends and the leader's lock connection, and
restarts PostgreSQL (fast, and immediate with crash recovery).

Afterwards: no job lost or stuck, no follow-up missing, duplicated or phantom, every consequence
applied exactly once in effect (a reservation is released iff its job failed), every correction
applied. ``AWA_FAST_SOAK_ROUNDS`` lengthens the run (default 10 fault rounds, the CI variant)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys

import psycopg
import pytest

import awa_fast as awa
from tests.soak_app import SoakA, SoakPay
from tests.support import poll_until, scalar

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APP_NAME = "awa_fast_soak_app"
ROUNDS = int(os.environ.get("AWA_FAST_SOAK_ROUNDS", "10"))
MODES = ("fail", "ok", "flaky", "slow")
WAVE_A, WAVE_PAY = 40, 20
A_JOBS, PAYS = WAVE_A * ROUNDS, WAVE_PAY * ROUNDS
FAULTS = ("sigkill", "backends", "leader_lock", "restart_fast", "backends", "restart_immediate")


async def _spawn(dsn):
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.soak_app",
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "AWA_FAST_APP_DSN": f"{dsn} application_name={APP_NAME}"},
    )
    assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"ready"
    return proc


async def _terminate(dsn, query: str, params=()) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        cur = await admin.execute(query, params)
        return len(await cur.fetchall())


async def _terminate_job_backends(dsn) -> int:
    for states in (("active", "idle in transaction"), ("idle",)):
        hit = await _terminate(
            dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s "
            "AND state = ANY(%s) AND query ILIKE %s AND query NOT ILIKE 'LISTEN%%'",
            (APP_NAME, list(states), "%awa_fast.jobs%"),
        )
        if hit:
            return hit
    return 0


async def _terminate_leader_lock(dsn) -> int:
    # The maintenance leader holds one session advisory lock on its lock connection.
    return await _terminate(
        dsn,
        "SELECT pg_terminate_backend(l.pid) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
        "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = %s",
        (APP_NAME,),
    )


async def _insert_wave(dsn, round_: int) -> None:
    client = awa.AsyncClient(dsn)  # a new pool: the last round may have restarted the server
    try:
        await client.insert_many(
            [SoakA(n) for n in range(round_ * WAVE_A, (round_ + 1) * WAVE_A)], max_attempts=25
        )
        pays = [SoakPay(n, MODES[n % 4]) for n in range(round_ * WAVE_PAY, (round_ + 1) * WAVE_PAY)]
        await client.insert_many([p for p in pays if p.mode != "slow"], max_attempts=25)
        await client.insert_many([p for p in pays if p.mode == "slow"], max_attempts=1)
    finally:
        await client.close()


@pytest.fixture
async def business(own_server):
    dsn = own_server.awa_dsn
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("""
            CREATE TABLE public.effect_log (n int, reason text);
            CREATE TABLE public.reservations (n int PRIMARY KEY, qty int NOT NULL,
                                              released boolean NOT NULL DEFAULT false);
            CREATE TABLE public.stock (available int NOT NULL);
            INSERT INTO public.stock VALUES (0);""")
    return dsn


@pytest.mark.slow
async def test_guarantees_hold_under_every_fault_at_once(own_server, business):
    dsn = business
    rng = random.Random(9)
    procs = []
    hits = dict.fromkeys(FAULTS, 0)
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                "INSERT INTO public.reservations (n, qty) "
                "SELECT n, n + 1 FROM generate_series(0, %s) n" % (PAYS - 1)
            )
        procs = [await _spawn(dsn) for _ in range(2)]
        for round_ in range(ROUNDS):
            await _insert_wave(dsn, round_)  # fresh work in flight when each fault hits
            await asyncio.sleep(0.3)
            fault = FAULTS[round_ % len(FAULTS)]
            if fault == "sigkill":
                victim = procs.pop(rng.randrange(len(procs)))
                victim.send_signal(signal.SIGKILL)
                await victim.wait()
                procs.append(await _spawn(dsn))
                hits[fault] += 1
            elif fault == "backends":
                hits[fault] += await _terminate_job_backends(dsn)
            elif fault == "leader_lock":
                hits[fault] += await _terminate_leader_lock(dsn)
            else:  # the postmaster is our child: restart it from this (main) thread
                own_server.restart(fault.removeprefix("restart_"))
                hits[fault] += 1

        async def settled():
            return (
                await scalar(
                    dsn,
                    "SELECT count(*) FROM awa_fast.jobs_all WHERE state NOT IN "
                    "('completed', 'failed', 'cancelled') OR consequence_state = 'owed' "
                    "OR (kind = 'soak_pay' AND state = 'completed' AND verified_at IS NULL)",
                )
                == 0
            )

        # polled: the worker subprocesses settle the jobs (no signal in this process)
        await poll_until(settled, timeout=180, what="every job settled, owed and verified")
        for p in procs:  # every worker survived the restarts
            assert p.returncode is None
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()

    print("faults that hit:", hits)
    assert (
        hits["sigkill"] and hits["backends"] and hits["restart_fast"] and hits["restart_immediate"]
    ), hits
    async with await psycopg.AsyncConnection.connect(dsn) as conn:

        async def rows(query, *params):
            return await (await conn.execute(query, params)).fetchall()

        # Nothing lost: every job is in the table in a final state.
        assert await rows(
            "SELECT count(*) FROM awa_fast.jobs_all WHERE kind IN ('soak_a', 'soak_pay')"
        ) == [(A_JOBS + PAYS,)]
        assert await rows("SELECT count(*) FROM awa_fast.dlq") == [(0,)]
        assert dict(
            await rows(
                "SELECT state::text, count(*) FROM awa_fast.jobs_all WHERE kind = 'soak_a' GROUP BY 1"
            )
        ) == {"completed": A_JOBS}
        # ADR-046: every B traces to a completed A, no key twice, every value has its B.
        assert (
            await rows(
                "SELECT b.id FROM awa_fast.jobs_all b LEFT JOIN awa_fast.jobs_all a "
                "ON a.id = (b.metadata->>'awa:triggered_by')::bigint "
                "WHERE b.kind = 'soak_b' AND (a.id IS NULL OR a.state <> 'completed')"
            )
            == []
        )
        assert (
            await rows(
                "SELECT (args->>'value')::int FROM awa_fast.jobs_all WHERE kind = 'soak_b' "
                "GROUP BY 1 HAVING count(*) > 1"
            )
            == []
        )
        assert await rows(
            "SELECT count(*), count(*) FILTER (WHERE state = 'completed') "
            "FROM awa_fast.jobs_all WHERE kind = 'soak_b'"
        ) == [(29, 29)]
        # Consequences: a reservation is released iff its job failed, the stock moved exactly
        # once per failed job, and each failed job records its consequence applied.
        pay = {
            n: (state, cstate, reason)
            for n, state, cstate, reason in await rows(
                "SELECT (args->>'n')::int, state::text, consequence_state, consequence_reason "
                "FROM awa_fast.jobs_all WHERE kind = 'soak_pay'"
            )
        }
        released = dict(await rows("SELECT n, released FROM public.reservations"))
        wrong = {n: (pay[n], released[n]) for n in pay if (pay[n][0] == "failed") != released[n]}
        assert wrong == {}
        assert all(c == "applied" for s, c, _ in pay.values() if s == "failed")
        expected_stock = sum(n + 1 for n in pay if pay[n][0] == "failed")
        assert await rows("SELECT available FROM public.stock") == [(expected_stock,)]
        # Every correction applied: verify_success said "not done" for n % 5 == 0.
        for n, (state, _, reason) in pay.items():
            mode = MODES[n % 4]
            if mode == "fail":
                assert (state, reason) == ("failed", "terminal_error"), (n, state, reason)
            elif n % 5 == 0 and reason != "rescue_exhausted":
                assert (state, reason) == ("failed", "corrected"), (n, state, reason)
            elif mode != "slow":
                assert state == "completed", (n, state, reason)
        # The finished storage (ADR 016) after the restarts: the hot table keeps no finished row
        # that should have moved, the counters say what the slices hold, every held key has one
        # holder, and the holds are exactly the finished rows holding their keys.
        assert (
            await rows(
                "SELECT id FROM awa_fast.jobs WHERE state IN ('completed', 'failed', 'cancelled') "
                "AND heartbeat_at IS NULL AND consequence_state IS DISTINCT FROM 'owed'"
            )
            == []
        )
        assert await rows(
            "SELECT slot, queue, state::text, sum(n) FROM awa_fast.done_counts "
            "GROUP BY 1, 2, 3 HAVING sum(n) <> 0 ORDER BY 1, 2, 3"
        ) == await rows(
            "SELECT awa_fast.done_slot(state, finalized_at), queue, state::text, count(*) "
            "FROM awa_fast.jobs_done GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
        )
        assert (
            await rows(
                "SELECT unique_key FROM (SELECT unique_key FROM awa_fast.jobs "
                "WHERE unique_key IS NOT NULL AND (unique_states & (1 << awa_fast.state_bit(state))) <> 0 "
                "UNION ALL SELECT unique_key FROM awa_fast.unique_holds) k "
                "GROUP BY 1 HAVING count(*) > 1"
            )
            == []
        )
        assert await rows(
            "SELECT unique_key, job_id FROM awa_fast.unique_holds ORDER BY 1"
        ) == await rows(
            "SELECT unique_key, id FROM awa_fast.jobs_done WHERE unique_key IS NOT NULL "
            "AND (unique_states & (1 << awa_fast.state_bit(state))) <> 0 ORDER BY 1"
        )
