"""Issue 28, class 4: due twins that share a unique key are an expected case of promotion, not
a failure: the first is promoted and the others are cancelled as duplicates by the bulk
statement itself, with no WARNING and no row-by-row redo."""

from __future__ import annotations

import logging

import psycopg
import pytest

from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig

pytestmark = pytest.mark.usefixtures("clean")


async def test_due_twins_sharing_a_unique_key_promote_one_and_cancel_the_others(
    dsn, client, caplog
):
    # the key is held in 'available' only, so the twins may both wait scheduled
    later = "2999-01-01T00:00:00+00:00"
    twins = [
        await client.insert({"order": 7}, kind="twin", unique_opts={"states": 1 << 1}, run_at=later)
        for _ in range(3)
    ]
    other = await client.insert({"order": 8}, kind="twin", run_at=later)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET run_at = now() - interval '1 second' WHERE id = ANY(%s)",
            ([j.id for j in twins] + [other.id],),
        )
    m = Maintenance(client.database_url, client.pool, MaintenanceConfig())
    caplog.set_level(logging.INFO)
    assert await m.promote() == 2  # the first twin and the other job
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT id, state::text, errors FROM awa_fast.jobs_all WHERE id = ANY(%s) ORDER BY id",
            ([j.id for j in twins] + [other.id],),
        )
        rows = {r[0]: (r[1], r[2]) for r in await cur.fetchall()}
    assert rows[twins[0].id][0] == "available" and rows[other.id][0] == "available"
    for twin in twins[1:]:
        state, errors = rows[twin.id]
        assert state == "cancelled" and "duplicate" in errors[-1]["error"]
    assert m.stuck_rows("promote") == 0
    assert await m.promote() == 0  # nothing left due, nothing warned about
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
