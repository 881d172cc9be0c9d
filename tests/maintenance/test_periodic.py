"""Periodic (cron) jobs on a real PostgreSQL: validation at registration, storage, exactly-once
firing under contending evaluators, missed fires across a restart under each policy, list/delete.

Fire times are made due by moving ``last_fire_at`` back (simulated downtime) on an every-minute
schedule instead of waiting for the clock. Tests that compare against "the latest minute" first
wait (bounded) until the database clock is not near a minute boundary, and count only fire times
up to that minute, so a real minute tick during the test cannot change the outcome.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import awa_fast as awa
from awa_fast import periodic
from tests.support import (
    FAST,
    exploding_inserts,
    poll_until,
    scalar,
    truncate,
    until,
    wait_lock_waiter,
)

IDLE = [("cron_idle", 1)]  # a queue nobody inserts into: cron jobs stay where they are
MINUTE = timedelta(minutes=1)


@dataclasses.dataclass
class Tick:
    n: int = 0


@pytest.fixture(autouse=True)
async def clean(dsn):
    await truncate(dsn)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("TRUNCATE awa_fast.cron_jobs")


async def db_now(dsn) -> datetime:
    return await scalar(dsn, "SELECT now()")


async def away_from_minute_boundary(dsn, margin_s: int = 10) -> datetime:
    """Wait (at most ``margin_s`` + 2 s) until at least ``margin_s`` seconds remain in the current
    minute of the database clock; returns the latest every-minute fire time (that minute)."""

    async def ok():
        now = await db_now(dsn)
        return now if now.second < 60 - margin_s else None

    # polled: this waits for the wall clock alone
    now = await poll_until(ok, timeout=margin_s + 2, what="a point away from a minute boundary")
    return periodic.latest_fire("* * * * *", "UTC", now)


async def set_last_fire(dsn, name: str, at: datetime) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "UPDATE awa_fast.cron_jobs SET last_fire_at = %s WHERE name = %s", (at, name)
        )
        assert cur.rowcount == 1


async def last_fire(dsn, name: str) -> datetime | None:
    return await scalar(dsn, "SELECT last_fire_at FROM awa_fast.cron_jobs WHERE name = %s", (name,))


async def cron_jobs(dsn, name: str) -> list[dict]:
    """Jobs enqueued by schedule ``name``, oldest fire first, with parsed fire times."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute(
            "SELECT * FROM awa_fast.jobs_all WHERE metadata->>'awa:cron_name' = %s ORDER BY id",
            (name,),
        )
        rows = await cur.fetchall()
    for r in rows:
        r["fire_at"] = datetime.fromisoformat(r["metadata"]["awa:cron_fire_at"])
    return sorted(rows, key=lambda r: (r["fire_at"], r["id"]))


async def start_client(
    dsn, name: str, policy: str = "coalesce", *, maintenance: bool = True
) -> awa.AsyncClient:
    """A runtime that registers schedule ``name``. Tests that evaluate by hand or only need the
    registration pass ``maintenance=False`` (no leader, no background evaluation)."""
    client = awa.AsyncClient(dsn)
    client.periodic(
        name,
        "* * * * *",
        Tick,
        Tick(7),
        queue="cron_q",
        priority=3,
        max_attempts=5,
        tags=["cron"],
        metadata={"team": "ops"},
        missed_fire_policy=policy,
    )
    await client.start(IDLE, maintenance=maintenance, **FAST)
    return client


async def first_fire_cleared(dsn, name: str, *clients: awa.AsyncClient) -> None:
    """Wait, on ``clients``' signals, for a new schedule's first fire (awa fires the
    registration minute at once), then delete its jobs so a test counts only the fires it
    provokes."""

    async def fired():
        return await last_fire(dsn, name) is not None

    await until(fired, list(clients), what=f"{name}'s first fire")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "DELETE FROM awa_fast.jobs WHERE metadata->>'awa:cron_name' = %s", (name,)
        )


async def wait_leader(*clients: awa.AsyncClient) -> awa.AsyncClient:
    async def one():
        leaders = [c for c in clients if c.runtime.maintenance.is_leader]
        return leaders[0] if len(leaders) == 1 else None

    return await until(
        one, [c.runtime.maintenance.leadership for c in clients], what="a maintenance leader"
    )


# -- registration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        "not a cron",
        "61 * * * *",
        "* * * *",
        "*/5 * * * * *",
        "* * 32 * *",
        "",
        "@reboot",
        "@sometimes",
    ],
)
async def test_invalid_cron_expression_fails_at_registration(dsn, expr):
    client = awa.AsyncClient(dsn)  # registration itself needs no database
    with pytest.raises(awa.ValidationError) as info:
        client.periodic("bad", expr, Tick, Tick())
    assert repr(expr) in str(info.value)
    assert client.periodic_jobs == {}


@pytest.mark.parametrize("expr", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4 *"])
async def test_cron_expression_without_fire_time_fails_at_registration(dsn, expr):
    # accepted, then start() raised a raw CroniterBadDateError
    client = awa.AsyncClient(dsn)
    with pytest.raises(awa.ValidationError) as info:
        client.periodic("never", expr, Tick, Tick())
    assert info.value.field == "cron_expr" and info.value.limit, str(info.value)
    assert repr(expr) in str(info.value) and "no fire time" in str(info.value)
    assert client.periodic_jobs == {}
    for rare in ("0 0 29 2 *", "0 0 31 2 1"):  # leap day; Feb 31 *or* a Monday
        client.periodic(f"rare{len(client.periodic_jobs)}", rare, Tick, Tick())


@pytest.mark.parametrize("tz", ["Mars/Olympus_Mons", "", "../etc/passwd", "UTC+99"])
async def test_invalid_timezone_fails_at_registration(dsn, tz):
    client = awa.AsyncClient(dsn)
    with pytest.raises(awa.ValidationError, match="timezone"):
        client.periodic("bad", "* * * * *", Tick, Tick(), timezone=tz)
    assert client.periodic_jobs == {}


async def test_invalid_policy_and_options_fail_at_registration(dsn):
    client = awa.AsyncClient(dsn)
    with pytest.raises(ValueError, match="missed_fire_policy"):
        client.periodic("bad", "* * * * *", Tick, Tick(), missed_fire_policy="skip")
    with pytest.raises(ValueError):  # ValidationError is a ValueError
        client.periodic("bad", "* * * * *", Tick, Tick(), priority=9)
    with pytest.raises(ValueError):
        client.periodic("bad", "* * * * *", Tick, {"n": object()})
    with pytest.raises(ValueError):
        client.periodic("bad", "* * * * *", Tick, 42)
    with pytest.raises(ValueError):
        client.periodic("", "* * * * *", Tick, Tick())
    assert client.periodic_jobs == {}
    client.periodic("ok", "@hourly", Tick, Tick(), timezone="Europe/Paris")
    client.periodic("ok", "*/5 * * * *", Tick, {"n": 2})  # same name: replaces
    assert list(client.periodic_jobs) == ["ok"]
    assert client.periodic_jobs["ok"].cron_expr == "*/5 * * * *"
    assert client.periodic_jobs["ok"].kind == "tick"


def test_due_fires_policies_cap_and_timezone():
    last = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    now = last + timedelta(minutes=5, seconds=30)
    assert periodic.due_fires("* * * * *", "UTC", "coalesce", last, now) == [last + 5 * MINUTE]
    assert periodic.due_fires("* * * * *", "UTC", "catch_up", last, now) == [
        last + i * MINUTE for i in range(1, 6)
    ]
    assert periodic.due_fires("* * * * *", "UTC", "catch_up", last, now, limit=2) == [
        last + MINUTE,
        last + 2 * MINUTE,
    ]
    assert periodic.due_fires("* * * * *", "UTC", "catch_up", now, now) == []
    # 09:00 in Paris is 08:00 UTC in winter, 07:00 UTC in summer.
    winter = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
    assert periodic.latest_fire("0 9 * * *", "Europe/Paris", winter) == winter.replace(hour=8)
    summer = datetime(2026, 7, 10, 12, 0, tzinfo=UTC)
    assert periodic.latest_fire("0 9 * * *", "Europe/Paris", summer) == summer.replace(hour=7)
    # A fire time exactly at ``now`` is due.
    assert periodic.latest_fire("* * * * *", "UTC", last) == last


# -- firing -------------------------------------------------------------------------------------


async def test_registration_fires_the_current_minute_once(dsn):
    latest = await away_from_minute_boundary(dsn)
    client = await start_client(dsn, "reg", maintenance=False)
    try:
        # A new schedule is stored never fired; its first evaluation enqueues the fire time of
        # the minute it was registered in (awa's first-registration rule), then nothing more.
        assert await last_fire(dsn, "reg") is None
        with pytest.raises(RuntimeError):
            client.periodic("late", "* * * * *", Tick, Tick())
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            assert await periodic.evaluate(conn) == 1
            assert await periodic.evaluate(conn) == 0
        assert [j["fire_at"] for j in await cron_jobs(dsn, "reg")] == [latest]
    finally:
        await client.close()


async def test_due_fire_enqueues_exactly_one_job(dsn):
    client = await start_client(dsn, "due")
    try:
        await wait_leader(client)
        latest = await away_from_minute_boundary(dsn)
        await first_fire_cleared(dsn, "due", client)
        await set_last_fire(dsn, "due", latest - MINUTE)

        async def fired():
            return await last_fire(dsn, "due") == latest

        await until(fired, client, what="the leader to fire the due minute")
        # More evaluation passes (the leader's and ours) find nothing left to do.
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            assert await periodic.evaluate(conn) == 0
        jobs = await cron_jobs(dsn, "due")
        assert len(jobs) == 1, jobs
        job = jobs[0]
        assert job["fire_at"] == latest
        assert (job["kind"], job["queue"], job["priority"], job["max_attempts"]) == (
            "tick",
            "cron_q",
            3,
            5,
        )
        assert job["args"] == {"n": 7} and job["tags"] == ["cron"]
        assert job["metadata"]["team"] == "ops"
        assert job["state"] == "available"
    finally:
        await client.close()


async def test_contending_evaluators_fire_once(dsn):
    """Two evaluators (separate connections, as two leaders would during a failover) race on the
    same due schedules, many times: each fire time is enqueued exactly once."""
    client = awa.AsyncClient(dsn)
    client.periodic("race_coalesce", "* * * * *", Tick, Tick(), missed_fire_policy="coalesce")
    client.periodic("race_catch_up", "* * * * *", Tick, Tick(), missed_fire_policy="catch_up")
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as a,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as b,
    ):
        await periodic.sync_schedules(a, list(client.periodic_jobs.values()))
        latest = await away_from_minute_boundary(dsn)
        rounds, expected_catch_up = 30, 0
        for i in range(rounds):
            missed = 1 + i % 3
            expected_catch_up += missed
            await set_last_fire(dsn, "race_coalesce", latest - missed * MINUTE)
            await set_last_fire(dsn, "race_catch_up", latest - missed * MINUTE)
            counts = await asyncio.gather(periodic.evaluate(a), periodic.evaluate(b))
            assert sum(counts) == 1 + missed, (i, counts)
    coalesced = await cron_jobs(dsn, "race_coalesce")
    assert len(coalesced) == rounds and {j["fire_at"] for j in coalesced} == {latest}
    caught_up = await cron_jobs(dsn, "race_catch_up")
    assert len(caught_up) == expected_catch_up


async def test_second_evaluator_waits_and_rechecks(dsn):
    """Deterministic interleaving: evaluator A has fired and still holds the row lock (its
    transaction is open); evaluator B blocks on the lock and, once A commits, finds nothing due."""
    client = awa.AsyncClient(dsn)
    client.periodic("locked", "* * * * *", Tick, Tick())
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as a,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as b,
    ):
        await periodic.sync_schedules(a, list(client.periodic_jobs.values()))
        latest = await away_from_minute_boundary(dsn)
        await set_last_fire(dsn, "locked", latest - 3 * MINUTE)
        async with a.transaction():
            assert len(await periodic.fire_one(a, "locked")) == 1  # savepoint; lock still held
            second = asyncio.create_task(periodic.fire_one(b, "locked"))

            await wait_lock_waiter(
                dsn, pid=b.info.backend_pid, what="the second evaluator to wait on the row lock"
            )
            assert not second.done()
        assert await second == []
    jobs = await cron_jobs(dsn, "locked")
    assert [j["fire_at"] for j in jobs] == [latest]
    assert await last_fire(dsn, "locked") == latest


async def test_two_runtimes_one_fire(dsn):
    """Two processes' runtimes register the same schedule; the leader's background evaluator
    and both runtimes' evaluators forced to run concurrently still enqueue one job per fire."""
    c1 = await start_client(dsn, "shared")
    c2 = await start_client(dsn, "shared")
    try:
        await wait_leader(c1, c2)
        latest = await away_from_minute_boundary(dsn)
        await first_fire_cleared(dsn, "shared", c1, c2)
        for i in range(10):
            await set_last_fire(dsn, "shared", latest - MINUTE)
            await asyncio.gather(c1.runtime._evaluate_cron(), c2.runtime._evaluate_cron())
            assert len(await cron_jobs(dsn, "shared")) == i + 1
        jobs = await cron_jobs(dsn, "shared")
        assert {j["fire_at"] for j in jobs} == {latest}
    finally:
        await c1.close()
        await c2.close()


@pytest.mark.parametrize("policy, missed, expected", [("coalesce", 5, 1), ("catch_up", 5, 5)])
async def test_restart_across_missed_fires(dsn, policy, missed, expected):
    name = f"restart_{policy}"
    client = await start_client(dsn, name, policy, maintenance=False)  # registers and runs
    await client.close()  # ... then the process stops ...

    latest = await away_from_minute_boundary(dsn)
    await truncate(dsn)
    # ... and stays down across ``missed`` fire times (the last enqueued one was ``missed``
    # minutes before the latest).
    await set_last_fire(dsn, name, latest - missed * MINUTE)
    assert await cron_jobs(dsn, name) == []

    client = await start_client(dsn, name, policy)  # restart: same schedule re-registered
    try:

        async def caught_up():
            last = await last_fire(dsn, name)
            return last is not None and last >= latest

        await until(caught_up, client, what="the missed fires to be evaluated")
        jobs = [j for j in await cron_jobs(dsn, name) if j["fire_at"] <= latest]
        fires = [j["fire_at"] for j in jobs]
        if policy == "coalesce":
            assert fires == [latest]
        else:
            assert fires == [latest - i * MINUTE for i in reversed(range(expected))]
        assert len(jobs) == expected
        # Re-registration kept the stored position; the schedule row still reads as registered.
        [row] = await client.list_cron_jobs()
        assert row["missed_fire_policy"] == policy
    finally:
        await client.close()


async def test_changed_expression_restarts_from_now(dsn):
    client = await start_client(dsn, "changed", maintenance=False)
    await client.close()
    latest = await away_from_minute_boundary(dsn)
    await set_last_fire(dsn, "changed", latest - 30 * MINUTE)
    client = awa.AsyncClient(dsn)
    client.periodic("changed", "*/2 * * * *", Tick, Tick(), missed_fire_policy="catch_up")
    await client.start(IDLE, maintenance=False, **FAST)
    try:
        stored = await last_fire(dsn, "changed")
        # Not 30 minutes back: a new expression does not catch up the old one's history.
        assert stored == periodic.latest_fire("*/2 * * * *", "UTC", latest)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            assert await periodic.evaluate(conn) == 0
        assert await cron_jobs(dsn, "changed") == []
    finally:
        await client.close()


# -- stored schedules the leader cannot evaluate or fire ----------------------------------------


async def exec_sql(dsn, query: str, params=None) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(query, params)


def cron_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "awa_fast.periodic" and r.levelno >= logging.WARNING
    ]


async def test_a_stored_schedule_that_cannot_be_evaluated_is_warned_about_once(dsn, caplog):
    """Rows written by hand (or an older version) that the leader's pass skips: one warning
    each, not one per pass (every second); again when the row is edited."""
    client = await start_client(dsn, "good", maintenance=False)
    try:
        await exec_sql(
            dsn,
            "INSERT INTO awa_fast.cron_jobs (name, cron_expr, timezone, kind) VALUES "
            "('bad_expr', 'not a cron', 'UTC', 'tick'), "
            "('bad_tz', '* * * * *', 'Mars/Olympus_Mons', 'tick')",
        )
        with caplog.at_level(logging.DEBUG, logger="awa_fast.periodic"):
            for _ in range(4):  # the leader's pass, as its maintenance loop runs it
                await client.runtime._evaluate_cron()
        warned = cron_warnings(caplog)
        assert len(warned) == 2, warned
        assert "cron job 'bad_expr' cannot be evaluated" in warned[0]
        assert "cron job 'bad_tz' cannot be evaluated" in warned[1]
        assert all("warned once" in w for w in warned)
        repeats = [
            r for r in caplog.records if r.levelno == logging.DEBUG and "bad_" in r.getMessage()
        ]
        assert len(repeats) == 6  # the later passes, at DEBUG
        assert await last_fire(dsn, "good") is not None  # the valid schedule still fired

        # An edited row is a new definition: warned about again (its unchanged neighbour not).
        caplog.clear()
        await exec_sql(
            dsn, "UPDATE awa_fast.cron_jobs SET cron_expr = '61 * * * *' WHERE name = 'bad_expr'"
        )
        with caplog.at_level(logging.WARNING, logger="awa_fast.periodic"):
            for _ in range(3):
                await client.runtime._evaluate_cron()
        warned = cron_warnings(caplog)
        assert len(warned) == 1 and "cron job 'bad_expr' cannot be evaluated" in warned[0]

        # Repaired, then broken again in the same way: a new problem, warned about.
        caplog.clear()
        await exec_sql(dsn, "UPDATE awa_fast.cron_jobs SET timezone = 'UTC' WHERE name = 'bad_tz'")
        with caplog.at_level(logging.WARNING, logger="awa_fast.periodic"):
            await client.runtime._evaluate_cron()
            await exec_sql(
                dsn,
                "UPDATE awa_fast.cron_jobs SET timezone = 'Mars/Olympus_Mons' "
                "WHERE name = 'bad_tz'",
            )
            await client.runtime._evaluate_cron()
        warned = cron_warnings(caplog)
        assert len(warned) == 1 and "cron job 'bad_tz' cannot be evaluated" in warned[0], warned
    finally:
        await client.close()


async def test_a_schedule_whose_fire_is_refused_every_pass_is_warned_about_once(dsn, caplog):
    """A trigger refuses the schedule's insert on every pass (rolled back, fired next pass):
    one warning while it lasts; once it fired, a new refusal is warned about again."""
    client = await start_client(dsn, "good", maintenance=False)
    try:
        await exec_sql(
            dsn,
            "INSERT INTO awa_fast.cron_jobs (name, cron_expr, kind, last_fire_at) "
            "VALUES ('refused', '* * * * *', 'explode', now() - interval '2 minutes')",
        )
        async with exploding_inserts(dsn):
            with caplog.at_level(logging.WARNING, logger="awa_fast.periodic"):
                for _ in range(3):
                    await client.runtime._evaluate_cron()
        warned = cron_warnings(caplog)
        assert len(warned) == 1, warned
        assert "cron job 'refused' not fired this pass" in warned[0]
        assert "trigger added outside awa-fast" in warned[0]
        assert await scalar(
            dsn,
            "SELECT last_fire_at < now() - interval '90 seconds' "
            "FROM awa_fast.cron_jobs WHERE name = 'refused'",
        )  # not advanced: tried every pass

        # The trigger goes: it fires. Due again and refused again: warned about again.
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="awa_fast.periodic"):
            await client.runtime._evaluate_cron()
            assert [j["kind"] for j in await cron_jobs(dsn, "refused")] == ["explode"]
            await set_last_fire(dsn, "refused", await db_now(dsn) - 2 * MINUTE)
            async with exploding_inserts(dsn):
                await client.runtime._evaluate_cron()
                await client.runtime._evaluate_cron()
        warned = cron_warnings(caplog)
        assert len(warned) == 1 and "not fired this pass" in warned[0], warned
    finally:
        await client.close()


async def test_a_fire_a_check_constraint_refuses_is_warned_about_once(dsn, caplog):
    """A CHECK constraint's error quotes the failing row (a new job id every try) in its
    DETAIL: the same refusal, warned about once, not once a pass."""
    client = await start_client(dsn, "good", maintenance=False)
    try:
        await exec_sql(
            dsn,
            "INSERT INTO awa_fast.cron_jobs (name, cron_expr, kind, last_fire_at) "
            "VALUES ('checked', '* * * * *', 'cronbad', now() - interval '2 minutes')",
        )
        await exec_sql(
            dsn,
            "ALTER TABLE awa_fast.jobs ADD CONSTRAINT no_cronbad CHECK (kind <> 'cronbad') "
            "NOT VALID",
        )
        try:
            with caplog.at_level(logging.WARNING, logger="awa_fast.periodic"):
                for _ in range(3):
                    await client.runtime._evaluate_cron()
        finally:
            await exec_sql(dsn, "ALTER TABLE awa_fast.jobs DROP CONSTRAINT no_cronbad")
            await exec_sql(dsn, "DELETE FROM awa_fast.cron_jobs WHERE name = 'checked'")
        warned = cron_warnings(caplog)
        assert len(warned) == 1 and "cron job 'checked'" in warned[0], warned
        assert 'violates check constraint "no_cronbad"' in warned[0]
    finally:
        await client.close()


async def test_an_evaluation_by_hand_warns_every_time(dsn, caplog):
    """Without the leader's memory (a call by hand) every failure is a warning, as before."""
    await exec_sql(
        dsn,
        "INSERT INTO awa_fast.cron_jobs (name, cron_expr, kind) VALUES ('bad', 'nope', 'tick')",
    )
    with caplog.at_level(logging.WARNING, logger="awa_fast.periodic"):
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for _ in range(2):
                assert await periodic.evaluate(conn) == 0
    warned = cron_warnings(caplog)
    assert len(warned) == 2 and not any("warned once" in w for w in warned)


# -- admin --------------------------------------------------------------------------------------


async def test_list_and_delete_cron_jobs(dsn):
    client = awa.AsyncClient(dsn)
    client.periodic(
        "b_daily",
        "0 9 * * *",
        Tick,
        Tick(1),
        timezone="Europe/Paris",
        queue="reports",
        tags=["t"],
        metadata={"m": 1},
        missed_fire_policy="catch_up",
    )
    client.periodic("a_minutely", "* * * * *", Tick, {"n": 2})
    await client.start(IDLE, maintenance=False, **FAST)
    try:
        rows = await client.list_cron_jobs()
        assert [r["name"] for r in rows] == ["a_minutely", "b_daily"]
        daily = rows[1]
        assert daily["cron_expr"] == "0 9 * * *" and daily["timezone"] == "Europe/Paris"
        assert daily["kind"] == "tick" and daily["queue"] == "reports"
        assert daily["args"] == {"n": 1} and daily["metadata"] == {"m": 1}
        assert daily["tags"] == ["t"] and daily["missed_fire_policy"] == "catch_up"
        assert (daily["priority"], daily["max_attempts"]) == (2, 25)
        assert daily["last_enqueued_at"] is None and daily["last_fire_at"] is None  # never fired
        next_fire = datetime.fromisoformat(daily["next_fire_at"])
        assert next_fire > datetime.fromisoformat(daily["created_at"])
        assert next_fire.astimezone(periodic.check_timezone("Europe/Paris")).hour == 9
        assert await client.delete_cron_job("b_daily") is True
        assert await client.delete_cron_job("b_daily") is False
        assert [r["name"] for r in await client.list_cron_jobs()] == ["a_minutely"]
    finally:
        await client.close()


async def test_sync_client_list_and_delete(dsn):
    async with awa.AsyncClient(dsn) as ac:
        ac.periodic("sync_one", "@hourly", Tick, Tick())
        async with (await ac.pool()).connection() as conn:
            await periodic.sync_schedules(conn, list(ac.periodic_jobs.values()))

    def blocking():
        with awa.Client(dsn) as c:
            names = [r["name"] for r in c.list_cron_jobs()]
            return names, c.delete_cron_job("sync_one"), c.list_cron_jobs()

    names, deleted, after = await asyncio.to_thread(blocking)
    assert names == ["sync_one"] and deleted is True and after == []
