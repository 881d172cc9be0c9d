"""Faults against the liveness of attempts (issue 28, class 1; docs/architecture.md, "Which
executions can overlap"): a blocked event loop, beats that stall, a rescuer in another process.

Executions are recorded by the handlers themselves, so a run is seen whatever the database says.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import psycopg
import pytest

import awa_fast as awa
from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig
from tests import stall_app
from tests.support import Recorder, until

VICTIM_QUEUE = "victim"


@pytest.fixture(autouse=True)
def clean(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE awa_fast.jobs, awa_fast.queue_meta, awa_fast.dlq, awa_fast.workers")


@dataclasses.dataclass
class Blocker:
    seconds: float


@dataclasses.dataclass
class Victim:
    seconds: float


def _rescue_from_another_process(dsn: str, staleness_ms: int) -> list[tuple]:
    """One heartbeat rescue pass of a maintenance that is not this process's (its own
    attempts are none of ours), on a loop of its own in a thread of its own."""
    out: list[tuple] = []

    async def go() -> None:
        other = awa.AsyncClient(dsn)
        try:
            m = Maintenance(dsn, other.pool, MaintenanceConfig(heartbeat_staleness_ms=staleness_ms))
            out.extend(await m.rescue())
        finally:
            await other.close()

    t = threading.Thread(target=asyncio.run, args=(go(),))
    t.start()
    t.join()
    return out


async def test_an_attempt_claimed_while_the_loop_is_blocked_and_rescued_meanwhile_never_runs(dsn):
    # The victim's claim commits (a real trigger holds it 2 s in the server) while a handler
    # of another queue blocks the event loop: the claimed rows wait, unbeaten and not yet this
    # process's own, until the loop runs again. Another process's rescue takes them in that
    # time, as a rescuer should (their heartbeat is stale); the blocked process must then not
    # start their handlers: the rescued attempt runs again elsewhere.
    client = awa.AsyncClient(dsn)
    rescued: list[tuple] = []

    runs = stall_app.recording(client, Victim, VICTIM_QUEUE)

    @client.task(Blocker, queue=stall_app.QUEUE)
    async def blocker(job):
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while True:  # the victim's claim is in the server (its trigger sleeping)
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
                )
                if (await cur.fetchone())[0]:
                    break
                await asyncio.sleep(0.02)
        # From here the loop is blocked (on purpose) until the victim's attempt is rescued.
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not conn.execute(
                "SELECT count(*) FROM awa_fast.jobs WHERE kind = 'victim' AND state = 'running'"
                " AND heartbeat_at < now() - interval '1 second'"
            ).fetchone()[0]:
                time.sleep(0.05)
        rescued.extend(_rescue_from_another_process(dsn, 1000))

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$;
               CREATE TRIGGER slow_claim BEFORE UPDATE ON awa_fast.jobs FOR EACH ROW
               WHEN (OLD.state = 'available' AND NEW.state = 'running'
                     AND NEW.kind = 'victim')
               EXECUTE FUNCTION slow_claim()"""
        )
    try:
        await client.insert(Blocker(0), queue=stall_app.QUEUE)
        job = await client.insert(Victim(3.0), queue=VICTIM_QUEUE)
        await client.start(
            [(stall_app.QUEUE, 1), (VICTIM_QUEUE, 2)],
            **{**stall_app.START_OPTIONS, "maintenance": False},
        )
        rt = client.runtime
        try:
            # both attempts' tasks ended: the blocker's, and the victim's (run or given back)
            await until(lambda: rt.attempts_ended >= 2, client, timeout=30, what="both ended")
        finally:
            await client.shutdown(timeout_ms=5000)
            await client.close()
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP TRIGGER slow_claim ON awa_fast.jobs; DROP FUNCTION slow_claim()")
    assert [r[0] for r in rescued] == [job.id]
    assert runs == [], runs  # the rescued attempt's handler never started


async def test_a_heartbeat_statement_that_never_answers_holds_only_its_own_round(dsn):
    # The presence step of a round waits on a lock an open transaction holds on the workers
    # table (a real LOCK TABLE): that round never ends. The attempts' own beats commit before
    # it, in every round, so no attempt may lose its lease -- as long as later rounds do not
    # queue behind the stuck one.
    client = awa.AsyncClient(dsn)
    runs = Recorder()  # a claim's progress step comes before its handler runs

    @client.task(Victim, queue=VICTIM_QUEUE)
    async def victim(job):
        runs.append((job.id, job.attempt, "start"))
        try:
            await asyncio.sleep(job.args.seconds)
        except asyncio.CancelledError:
            runs.append((job.id, job.attempt, "cancelled"))
            raise
        runs.append((job.id, job.attempt, "end"))

    await client.start([(VICTIM_QUEUE, 2)], **{**stall_app.START_OPTIONS, "maintenance": False})
    rt = client.runtime
    locker = await psycopg.AsyncConnection.connect(dsn)
    try:
        first = await client.insert(Victim(4.0), queue=VICTIM_QUEUE)
        await runs.until(lambda: (first.id, 1, "start") in runs, what="first started")
        await until(lambda: rt.heartbeat.beats >= 2, rt.heartbeat.beaten, what="beats")
        await locker.execute("LOCK TABLE awa_fast.workers IN ACCESS EXCLUSIVE MODE")
        later = await client.insert(Victim(3.0), queue=VICTIM_QUEUE)
        await until(
            lambda: {r[0] for r in runs if r[2] != "start"} >= {first.id, later.id},
            client,
            timeout=30,
            what="both jobs ended or were cancelled",
        )
    finally:
        await locker.close()  # its transaction rolls back: the lock goes
        await client.shutdown(timeout_ms=5000)
        await client.close()
    assert sorted(runs) == [
        (first.id, 1, "end"),
        (first.id, 1, "start"),
        (later.id, 1, "end"),
        (later.id, 1, "start"),
    ], runs
    assert rt.heartbeat.rounds_abandoned >= 1


async def test_beats_slower_than_a_rescuer_tolerates_never_end_a_healthy_attempt(dsn, caplog):
    # Every beat takes 0.25 s in the server (a real trigger): commits come 0.75 s apart, well
    # within the 1 s staleness a rescuer judges by, so nobody may take the attempt; its own
    # lease check must not end it either.
    client = awa.AsyncClient(dsn)

    runs = stall_app.recording(client, Victim, VICTIM_QUEUE)

    with stall_app.slow_beats(dsn, 0.25):
        await client.insert(Victim(4.0), queue=VICTIM_QUEUE)
        await client.start([(VICTIM_QUEUE, 1)], **{**stall_app.START_OPTIONS, "maintenance": False})
        try:
            await until(lambda: len(runs) >= 2, client, timeout=30, what="the attempt ended")
        finally:
            await client.shutdown(timeout_ms=5000)
            await client.close()
    assert runs == [(1, "start"), (1, "end")], (runs, caplog.text)
