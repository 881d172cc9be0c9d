"""Faults against the finished-job storage (ADR 016) on a real PostgreSQL: a finished row the hot
table keeps (a handler's "still running" mark) taking a key a finished job holds, retention
longer than the ring, a prune pass that one bad row must not wedge, and the counters and holds
matching the rows after every move."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.rows import dict_row

from awa_fast.errors import ConfigError, UniqueConflict
from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig
from tests.support import FAST, truncate

CANCELLED_ONLY = 1 << 6  # awa_fast.state_bit('cancelled')


@pytest.fixture(autouse=True)
async def clean(dsn):
    await truncate(dsn)


def rows(dsn: str, query: str, params=None) -> list[dict]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(query, params).fetchall()


def execute(dsn: str, query: str, params=None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(query, params)


def maintenance(client, **config) -> Maintenance:
    return Maintenance(client.database_url, client.pool, MaintenanceConfig(**config))


def holders(dsn: str, key: bytes) -> list[int]:
    """Every job holding ``key``: live rows in a state of their mask, and finished holds."""
    return sorted(
        r["id"]
        for r in rows(
            dsn,
            "SELECT id FROM awa_fast.jobs WHERE unique_key = %(k)s "
            "AND (unique_states & (1 << awa_fast.state_bit(state))) <> 0 "
            "UNION ALL SELECT job_id FROM awa_fast.unique_holds WHERE unique_key = %(k)s",
            {"k": key},
        )
    )


def assert_bookkeeping(dsn: str) -> None:
    """done_counts and unique_holds say what the finished rows are."""
    counted = rows(
        dsn,
        "SELECT slot, queue, state::text, sum(n)::bigint AS n FROM awa_fast.done_counts "
        "GROUP BY 1, 2, 3 HAVING sum(n) <> 0 ORDER BY 1, 2, 3",
    )
    real = rows(
        dsn,
        "SELECT awa_fast.done_slot(state, finalized_at) AS slot, queue, state::text, "
        "count(*)::bigint AS n FROM awa_fast.jobs_done GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
    assert counted == real
    held = rows(dsn, "SELECT unique_key, job_id, slot FROM awa_fast.unique_holds ORDER BY 1")
    holding = rows(
        dsn,
        "SELECT unique_key, id AS job_id, awa_fast.done_slot(state, finalized_at) AS slot "
        "FROM awa_fast.jobs_done WHERE unique_key IS NOT NULL "
        "AND (unique_states & (1 << awa_fast.state_bit(state))) <> 0 ORDER BY 1",
    )
    assert held == holding


def run(dsn: str, job_id: int) -> None:
    """A claimed attempt, its handler running (the worker's heartbeat mark)."""
    execute(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'running', run_lease = 1, attempt = 1, "
        "attempted_at = now(), heartbeat_at = now() WHERE id = %s",
        (job_id,),
    )


# -- a finished row kept in the hot table takes its key -----------------------------------------


async def test_cancel_of_a_running_job_cannot_take_a_key_a_finished_job_holds(client, dsn):
    """Mask ``cancelled`` only: a cancelled job holds the key in unique_holds. A second job with
    the key runs (outside the mask); an admin cancel keeps its row in the hot table (its handler
    still runs) in a state of its mask: it must fail as the unique index would have made it,
    not make a second holder that wedges the move of the row later."""
    first = await client.insert({"c": 1}, kind="cmask", unique_opts={"states": CANCELLED_ONLY})
    assert await client.cancel(first.id) is not None
    key = rows(dsn, "SELECT unique_key FROM awa_fast.jobs_all WHERE id = %s", (first.id,))[0][
        "unique_key"
    ]
    assert holders(dsn, key) == [first.id]
    second = await client.insert({"c": 1}, kind="cmask", unique_opts={"states": CANCELLED_ONLY})
    run(dsn, second.id)
    with pytest.raises(UniqueConflict):
        await client.cancel(second.id)
    assert holders(dsn, key) == [first.id]
    assert_bookkeeping(dsn)


async def test_a_stale_mark_whose_move_fails_does_not_wedge_the_prune(client, dsn):
    """The prune pass settles stale "still running" marks and expires slices: one row whose
    move fails (a trigger refuses it) is kept and logged; the other marks settle and the expired
    slices go."""
    ids = [(await client.insert({"s": i}, kind="stale")).id for i in range(3)]
    old = (await client.insert({"s": 9}, kind="old")).id
    execute(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'completed', finalized_at = now() - interval '3 hours' "
        "WHERE id = %s",
        (old,),
    )
    execute(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'cancelled', finalized_at = now(), "
        "heartbeat_at = now() - interval '1 hour' WHERE id = ANY(%s)",
        (ids,),
    )
    assert len(rows(dsn, "SELECT id FROM awa_fast.jobs")) == 3  # kept by their marks
    execute(
        dsn,
        f"""
        CREATE FUNCTION public.refuse_move() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'move refused'; END $$;
        CREATE TRIGGER refuse_move BEFORE INSERT ON awa_fast.jobs_done
            FOR EACH ROW WHEN (NEW.id = {ids[1]}) EXECUTE FUNCTION public.refuse_move();""",
    )
    try:
        m = maintenance(client, completed_retention_hours=1)
        await m.prune()
        assert [r["id"] for r in rows(dsn, "SELECT id FROM awa_fast.jobs")] == [ids[1]]
        assert rows(dsn, "SELECT id FROM awa_fast.jobs_done WHERE id = %s", (old,)) == []
    finally:
        execute(
            dsn,
            "DROP TRIGGER refuse_move ON awa_fast.jobs_done; DROP FUNCTION public.refuse_move()",
        )
    await m.prune()
    assert rows(dsn, "SELECT id FROM awa_fast.jobs") == []
    assert_bookkeeping(dsn)


# -- retention and the ring ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, field",
    [
        ({"completed_retention_hours": 31.5}, "completed_retention_hours"),
        ({"failed_retention_hours": 24 * 7}, "failed_retention_hours"),
    ],
)
async def test_retention_the_ring_cannot_keep_is_rejected(client, options, field):
    """A slice is reused 32 periods after it was written: a retention that does not expire it
    before then would keep its rows for as long as new ones keep arriving (never pruned)."""
    client.task(dict, kind="noop")(lambda job: None)
    with pytest.raises(ConfigError) as err:
        await client.start([("default", 1)], **{**FAST, **options})
    assert err.value.field == field
    assert client.runtime is None
    with pytest.raises(ConfigError):
        maintenance(client, **options)


async def test_the_longest_accepted_retention_expires_a_slice_before_its_reuse(client, dsn):
    """At the longest retention accepted, a slice written until the end of its period expires
    a whole period before the ring writes it again."""
    job = await client.insert({"r": 1}, kind="ring")
    # the end of the period 31 periods ago: the ring writes this slice again next hour
    execute(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'completed', "
        "finalized_at = date_trunc('hour', now()) - interval '30 hours' - interval '1 second' "
        "WHERE id = %s",
        (job.id,),
    )
    assert await maintenance(client, completed_retention_hours=30).expire_slices() == 1


# -- the counters and the holds follow every move -----------------------------------------------


async def test_counts_and_holds_follow_retries_corrections_dlq_and_rollbacks(client, dsn):
    await client.set_queue_dlq("default", True) if hasattr(client, "set_queue_dlq") else None
    mask = 0b1111111  # every state but waiting_external
    jobs = [
        (await client.insert({"m": i}, kind="moves", unique_opts={"states": mask})).id
        for i in range(6)
    ]
    execute(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'completed', finalized_at = now() WHERE id = ANY(%s)",
        (jobs[:3],),
    )
    execute(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'failed', finalized_at = now() WHERE id = ANY(%s)",
        (jobs[3:],),
    )
    assert_bookkeeping(dsn)
    await client.retry(jobs[3])
    assert_bookkeeping(dsn)
    await client.correct_to_failed(jobs[0], error="wrong")
    assert_bookkeeping(dsn)
    await client.move_failed_to_dlq(jobs[4], reason="op")
    assert_bookkeeping(dsn)
    # a statement that fails after moving rows leaves no count or hold behind
    with pytest.raises(psycopg.errors.DivisionByZero):
        with psycopg.connect(dsn) as conn:
            conn.execute(
                "UPDATE awa_fast.jobs SET state = 'completed', finalized_at = now() WHERE id = %s",
                (jobs[3],),
            )
            conn.execute("SELECT 1 / 0")
    assert_bookkeeping(dsn)
    stats = {s.queue: s for s in await client.queue_stats()}
    assert stats["default"].failed == len(
        rows(dsn, "SELECT id FROM awa_fast.jobs_all WHERE state = 'failed'")
    )
