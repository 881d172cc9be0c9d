"""awa's cron rules (ADR-007; ``awa-worker`` ``compute_fire_times``) for a schedule's first
evaluation and for missed fires, with a fixed past ``now``, and on a real PostgreSQL: a new
schedule fires the latest fire time in ``[created_at - 1 minute, now]`` at once (coalesced,
whatever its policy); once it has fired, ``coalesce`` enqueues the latest missed fire and
``catch_up`` every missed one, oldest first, bounded per pass."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import awa_fast as awa
from awa_fast import periodic
from tests.support import scalar

UTC = UTC
M = timedelta(minutes=1)


def at(h: int, m: int, s: int = 0) -> datetime:
    return datetime(2025, 6, 15, h, m, s, tzinfo=UTC)


@pytest.mark.parametrize("policy", ["coalesce", "catch_up"])
def test_first_evaluation_fires_the_latest_slot_since_registration(policy):
    due = periodic.due_fires
    # every minute, registered at 12:00:30: the 12:00 slot fires at once
    assert due("* * * * *", "UTC", policy, None, at(12, 0, 31), at(12, 0, 30)) == [at(12, 0)]
    # hourly, registered at 14:35: 14:00 is before the window (no backfill); 15:00 fires
    assert due("0 * * * *", "UTC", policy, None, at(14, 35, 10), at(14, 35)) == []
    assert due("0 * * * *", "UTC", policy, None, at(15, 0, 1), at(14, 35)) == [at(15, 0)]
    # hourly, registered at 15:00:20 (inside the slot's minute): 15:00 fires at once
    assert due("0 * * * *", "UTC", policy, None, at(15, 0, 25), at(15, 0, 20)) == [at(15, 0)]
    # first evaluated hours late (no leader ran): one job, the latest slot, even for catch_up
    assert due("0 * * * *", "UTC", policy, None, at(18, 10), at(14, 35)) == [at(18, 0)]
    # in the schedule's timezone: 09:00 Paris is 07:00 UTC in June
    assert due("0 9 * * *", "Europe/Paris", policy, None, at(7, 0, 5), at(7, 0)) == [at(7, 0)]


def test_missed_fires_after_the_first_follow_the_policy():
    due = periodic.due_fires
    last, now = at(14, 0), at(15, 0, 20)
    assert due("*/20 * * * *", "UTC", "coalesce", last, now, at(9, 0)) == [at(15, 0)]
    assert due("*/20 * * * *", "UTC", "catch_up", last, now, at(9, 0)) == [
        at(14, 20),
        at(14, 40),
        at(15, 0),
    ]
    assert due("*/20 * * * *", "UTC", "catch_up", last, now, at(9, 0), limit=2) == [
        at(14, 20),
        at(14, 40),
    ]
    assert due("*/20 * * * *", "UTC", "catch_up", at(15, 0), now, at(9, 0)) == []


@dataclasses.dataclass
class Beat:
    n: int = 0


async def test_a_new_schedule_fires_at_once_on_postgres(dsn):
    async with awa.AsyncClient(dsn) as client:
        client.periodic("every_minute", "* * * * *", Beat, Beat(1))
        client.periodic("yearly", "0 0 1 1 *", Beat, Beat(2), missed_fire_policy="catch_up")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("TRUNCATE awa_fast.cron_jobs, awa_fast.jobs")
            await periodic.sync_schedules(conn, list(client.periodic_jobs.values()))
            now = await scalar(dsn, "SELECT now()")
            # the every-minute schedule's current slot fires at once; the yearly one's latest
            # slot (1 January) is long before its registration: nothing
            assert await periodic.evaluate(conn) == 1
            assert await periodic.evaluate(conn) == 0
            # the yearly schedule, registered (say) two years ago and never evaluated since:
            # exactly one job, for the latest 1 January, though its policy is catch_up
            await conn.execute(
                "UPDATE awa_fast.cron_jobs SET created_at = now() - "
                "interval '2 years' WHERE name = 'yearly'"
            )
            assert await periodic.evaluate(conn) == 1
            assert await periodic.evaluate(conn) == 0
            cur = await conn.execute(
                "SELECT metadata->>'awa:cron_name', metadata->>'awa:cron_fire_at' "
                "FROM awa_fast.jobs_all ORDER BY id"
            )
            rows = await cur.fetchall()
    minute = periodic.latest_fire("* * * * *", "UTC", now)
    year = periodic.latest_fire("0 0 1 1 *", "UTC", now)
    assert [r[0] for r in rows] == ["every_minute", "yearly"]
    # the minute may have ticked between now() and the first evaluation
    assert datetime.fromisoformat(rows[0][1]) in (minute, minute + M)
    assert datetime.fromisoformat(rows[1][1]) == year
