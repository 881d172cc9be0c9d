"""The maintenance pass scheduler (ADR 036): one pass run directly (``Maintenance.run_pass``)
goes through what its loop runs it with: its health recorded (failures in a row, dead after
``DEAD_AFTER_FAILURES``, reset by a good pass), its failure logged with the next try, the
``passed`` signal fired; a pass that finds its leader deposed is no failure and wakes the
election, which then steps down without renewing. Real faults: a trigger that refuses a prune
step's statement, a leader whose lock connection is terminated."""

from __future__ import annotations

import logging

import psycopg
import pytest

from awa_fast.worker.maintenance import (
    DEAD_AFTER_FAILURES,
    Deposed,
    Maintenance,
    MaintenanceConfig,
    PassIncomplete,
)
from tests.support import truncate


@pytest.fixture(autouse=True)
async def _clean(dsn):
    await truncate(dsn)


def _refuse_presence_prune(dsn: str, on: bool) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if on:
            conn.execute(
                "CREATE FUNCTION public.refuse_delete() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'refused by test'; END $$"
            )
            conn.execute(
                "CREATE TRIGGER refuse BEFORE DELETE ON awa_fast.workers "
                "FOR EACH STATEMENT EXECUTE FUNCTION public.refuse_delete()"
            )
        else:
            conn.execute("DROP TRIGGER refuse ON awa_fast.workers")
            conn.execute("DROP FUNCTION public.refuse_delete()")


async def test_a_pass_run_directly_records_its_health_as_its_loop_does(dsn, client, caplog):
    m = Maintenance(dsn, client.pool, MaintenanceConfig(cleanup_interval_ms=4000))
    caplog.set_level(logging.ERROR, logger="awa_fast.maintenance")
    _refuse_presence_prune(dsn, True)
    try:
        for n in range(1, DEAD_AFTER_FAILURES + 1):
            fired = m.passed.count
            with pytest.raises(PassIncomplete) as raised:
                await m.run_pass("prune")
            health = m.loops["prune"]
            assert (health.failures, health.passes) == (n, 0)
            assert health.alive == (n < DEAD_AFTER_FAILURES)
            assert health.last_error == f"PassIncomplete: {raised.value}"
            assert m.passed.count == fired + 1 and m.passed.last == ("prune", raised.value)
        # the back-off doubles the interval per failure in a row: 4 s, 8 s, 16 s
        logged = [
            r.getMessage() for r in caplog.records if "maintenance prune failed" in r.getMessage()
        ]
        assert logged == [
            "maintenance prune failed (1 in a row; next try in 4.0 s)",
            "maintenance prune failed (2 in a row; next try in 8.0 s)",
            "maintenance prune failed (3 in a row; next try in 16.0 s)",
        ]
    finally:
        _refuse_presence_prune(dsn, False)
    assert await m.run_pass("prune") == 0
    health = m.loops["prune"]
    assert (health.failures, health.passes, health.alive) == (0, 1, True)
    assert m.passed.last == ("prune", 0)


async def test_a_deposed_pass_is_no_failure_and_wakes_the_election_to_step_down(dsn, client):
    old = Maintenance(dsn, client.pool, MaintenanceConfig())
    new = Maintenance(dsn, client.pool, MaintenanceConfig())
    try:
        assert await old.acquire()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            pid = old.leader.lock_conn.info.backend_pid
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert await new.acquire()
        fired = old.passed.count
        with pytest.raises(Deposed):
            await old.run_pass("promote")
        assert old.loops["promote"].failures == 0 and old.loops["promote"].alive
        assert old.passed.count == fired
        # Its election steps down at once, not renewing on the dead connection (which raises).
        stepped_down = old.leadership.count
        await old._elect()
        assert not old.is_leader and old.leadership.count == stepped_down + 1
        assert old.leadership.last is False
    finally:
        await old._step_down()
        await new._step_down()


async def test_an_unknown_pass_is_refused(dsn, client):
    m = Maintenance(dsn, client.pool, MaintenanceConfig())
    with pytest.raises(KeyError):
        await m.run_pass("no such pass")
