"""Faults against the finished-job storage (ADR 016) on a real PostgreSQL: a finished row the hot
table keeps (a handler's "still running" mark) taking a key a finished job holds, retention
longer than the ring, a prune pass that one bad row must not wedge, and the counters and holds
matching the rows after every move."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg.rows import dict_row

from awa_fast import sql
from awa_fast.errors import ConfigError, UniqueConflict
from awa_fast.schema import migrate_sync, migrations
from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig
from tests.support import FAST, truncate, wait_lock_waiter, wait_state

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


async def finished(client, dsn: str, specs: list[tuple[str, str]], unique: bool = False):
    """Jobs finished as an admin statement finishes them, ``finalized_at`` moved back by each
    spec's age (the move trigger puts each row in the slice of that time); returns the ids."""
    ids = []
    for i, (state, age) in enumerate(specs):
        opts = {"unique_opts": {"states": 0b1111111}} if unique else {}
        job = await client.insert({"r": i, "age": age}, kind="ring", **opts)
        execute(
            dsn,
            "UPDATE awa_fast.jobs SET state = %s::awa_fast.job_state, "
            "finalized_at = now() - %s::interval WHERE id = %s",
            (state, age, job.id),
        )
        ids.append(job.id)
    return ids


def kept(dsn: str, ids: list[int]) -> list[int]:
    found = rows(dsn, "SELECT id FROM awa_fast.jobs_done WHERE id = ANY(%s)", (ids,))
    return sorted(r["id"] for r in found)


async def test_a_retention_longer_than_the_ring_keeps_rows_until_it_passes(client, dsn):
    """awa's own suite runs a week of failed retention (issue 29). A slice is written again
    32 periods later (32 h completed, 96 h failed), so a retention beyond the ring shares a
    slice between rows past it and rows inside it: the expired ones go row by row, the young
    ones stay, and the counters and holds follow."""
    specs = [
        ("completed", "80 hours"),  # past 72 h
        ("completed", "48 hours"),  # the same slice (32 h later), inside 72 h
        ("completed", "70 hours"),
        ("failed", "170 hours"),  # past 168 h
        ("failed", "74 hours"),  # the same slice (96 h later), inside 168 h
        ("failed", "160 hours"),
        ("cancelled", "169 hours"),  # past 168 h
    ]
    ids = await finished(client, dsn, specs, unique=True)
    slot = {
        r["id"]: r["slot"]
        for r in rows(
            dsn,
            "SELECT id, awa_fast.done_slot(state, finalized_at) AS slot FROM awa_fast.jobs_done",
        )
    }
    assert slot[ids[0]] == slot[ids[1]] and slot[ids[3]] == slot[ids[4]]
    m = maintenance(client, completed_retention_hours=72, failed_retention_hours=168)
    assert await m.prune() == 3
    assert kept(dsn, ids) == sorted([ids[1], ids[2], ids[4], ids[5]])
    assert_bookkeeping(dsn)  # counts and holds of the deleted rows released, the others kept
    assert len(rows(dsn, "SELECT 1 FROM awa_fast.unique_holds")) == 4
    stats = {s.queue: s for s in await client.queue_stats()}
    assert stats["default"].failed == 2
    assert await m.prune() == 0  # the young ones stay until their own retention passes
    assert kept(dsn, ids) == sorted([ids[1], ids[2], ids[4], ids[5]])


@pytest.mark.parametrize(
    "hours, gone",
    [
        (10 * 8766, True),  # ten years: the 11-year-old rows go, row by row
        (1e9, False),  # 114,000 years: now() minus it precedes PostgreSQL's timestamps
        (5e15, False),  # just under awa's limit (2**64 s): beyond PostgreSQL's intervals
    ],
)
async def test_retention_up_to_awas_limit_is_kept_without_overflow(client, dsn, hours, gone):
    """Every retention awa accepts is accepted and kept; no pass overflows PostgreSQL's
    interval or timestamp arithmetic (a step that failed would raise PassIncomplete)."""
    ages = ["11 years", "11 years", "9 years", "9 years"]
    ids = await finished(client, dsn, list(zip(["completed", "failed"] * 2, ages)))
    m = maintenance(
        client,
        completed_retention_hours=hours,
        failed_retention_hours=hours,
        descriptor_retention_days=hours / 24,
        queue_retention={"other": (hours, hours)},
    )
    assert await m.prune() == (2 if gone else 0)
    assert kept(dsn, ids) == sorted(ids[2:] if gone else ids)
    assert_bookkeeping(dsn)


@pytest.mark.parametrize(
    "options, field",
    [
        ({"completed_retention_hours": 2**64 / 3600}, "completed_retention_hours"),
        ({"failed_retention_hours": 1e16}, "failed_retention_hours"),
        ({"descriptor_retention_days": 1e15}, "descriptor_retention_days"),
    ],
)
async def test_a_retention_beyond_awas_limit_is_rejected(client, options, field):
    """awa turns a retention into a Rust Duration (at most 2**64 s) and panics past it: that,
    and only that, is refused, with the field and the limit."""
    client.task(dict, kind="noop")(lambda job: None)
    with pytest.raises(ConfigError) as err:
        await client.start([("default", 1)], **{**FAST, **options})
    assert err.value.field == field
    assert "longer than awa accepts" in str(err.value)
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
    assert stats["default"].completed_last_hour == len(
        rows(dsn, "SELECT id FROM awa_fast.jobs_done WHERE state = 'completed'")
    )
    # every slice expires (retention 0): the counters go with the rows; the live rows stay
    live = rows(dsn, "SELECT id FROM awa_fast.jobs ORDER BY id")
    m = maintenance(client, completed_retention_hours=0, failed_retention_hours=0)
    assert await m.expire_slices() > 0
    assert rows(dsn, "SELECT id FROM awa_fast.jobs_done") == []
    assert_bookkeeping(dsn)
    assert rows(dsn, "SELECT id FROM awa_fast.jobs ORDER BY id") == live
    stats = {s.queue: s for s in await client.queue_stats()}
    # what is left failed is the corrected job, live while its consequence is owed
    assert stats["default"].failed == len(
        rows(dsn, "SELECT id FROM awa_fast.jobs WHERE state = 'failed'")
    )
    assert stats["default"].completed_last_hour == 0
    assert (await client.health_check()).postgres_connected


# -- masks that hold only a final state, through a running worker ------------------------------


@pytest.mark.parametrize(
    "final, mask",
    [("completed", 1 << 3), ("failed", 1 << 5), ("cancelled", 1 << 6)],
)
async def test_duplicates_whose_mask_holds_one_final_state_settle_through_a_worker(
    client, dsn, final, mask
):
    """Two live jobs share a key that only the final state ``final`` holds (neither holds it
    while live). The worker finishes both: the first holds the key in unique_holds, the
    second, finishing into the same state, must not make a second holder, nor stick: it ends
    cancelled as a duplicate (as the single table's index made it). Nothing is left live."""
    import awa_fast as awa

    @client.task(dict, kind=f"only_{final}")
    async def work(job):
        if final == "failed":
            raise awa.TerminalError("no")
        if final == "cancelled":
            return awa.Cancel("stop")
        return None

    a = await client.insert({"k": 1}, kind=f"only_{final}", unique_opts={"states": mask})
    b = await client.insert({"k": 1}, kind=f"only_{final}", unique_opts={"states": mask})
    await client.start([("default", 1)], **FAST)
    for job in (a, b):
        await wait_state(client, job.id, "completed", "failed", "cancelled", timeout=60)
    await client.close()
    states = rows(dsn, "SELECT id, state::text, errors::text FROM awa_fast.jobs_all ORDER BY id")
    # The slot frees when a handler returns, before its outcome commits: b's outcome may commit
    # first. Whichever commits first holds the key; the other is cancelled as a duplicate.
    duplicate = [r for r in states if r["state"] == "cancelled" and "as duplicate" in r["errors"]]
    holder = [r for r in states if r["state"] == final and r not in duplicate]
    assert len(states) == 2 and len(holder) == 1 and len(duplicate) == 1, states
    assert rows(dsn, "SELECT id FROM awa_fast.jobs") == []
    held = [r["job_id"] for r in rows(dsn, "SELECT job_id FROM awa_fast.unique_holds")]
    assert held == [holder[0]["id"]], (held, states)
    assert_bookkeeping(dsn)


# -- retention under faults ---------------------------------------------------------------------


def slice_of(dsn: str, job_id: int) -> str:
    return rows(
        dsn, "SELECT tableoid::regclass::text AS t FROM awa_fast.jobs_done WHERE id = %s", (job_id,)
    )[0]["t"]


async def test_a_prune_terminated_while_it_waits_for_a_slice_keeps_that_slice_only(client, dsn):
    """The prune's backend is terminated (pg_terminate_backend) while it waits for one slice's
    lock behind a reader: that slice is kept, the next slice is still truncated (on a new
    connection), and the kept one goes on the next pass. Holds and counters follow."""
    keyed = [(await client.insert({"t": i}, kind="term", unique_opts={})).id for i in range(2)]
    execute(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'completed', "
        "finalized_at = now() - interval '3 hours' WHERE id = %s",
        (keyed[0],),
    )
    execute(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'completed', "
        "finalized_at = now() - interval '6 hours' WHERE id = %s",
        (keyed[1],),
    )
    blocked = slice_of(dsn, keyed[0])
    assert blocked != slice_of(dsn, keyed[1])
    reader = await psycopg.AsyncConnection.connect(dsn)
    try:
        await reader.execute(f"SELECT count(*) FROM {blocked}")  # holds ACCESS SHARE
        m = maintenance(client, completed_retention_hours=1)
        pruning = asyncio.create_task(m.expire_slices())
        await wait_lock_waiter(dsn, query_like="LOCK TABLE%")
        execute(
            dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LOCK TABLE%%' "
            "AND wait_event_type = 'Lock'",
        )
        assert await pruning == 1
    finally:
        await reader.close()
    assert [r["id"] for r in rows(dsn, "SELECT id FROM awa_fast.jobs_done")] == [keyed[0]]
    assert_bookkeeping(dsn)
    assert await m.expire_slices() == 1
    assert rows(dsn, "SELECT id FROM awa_fast.jobs_done") == []
    assert_bookkeeping(dsn)


async def test_a_slice_whose_holds_cannot_be_released_is_kept_whole(client, dsn):
    """A trigger refuses the delete of one slice's unique holds: that slice's TRUNCATE rolls
    back with it (its rows keep their keys), the other slice goes; nothing wedges."""
    keyed = [(await client.insert({"h": i}, kind="holds", unique_opts={})).id for i in range(2)]
    execute(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'completed', "
        "finalized_at = now() - interval '3 hours' WHERE id = %s",
        (keyed[0],),
    )
    execute(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'completed', "
        "finalized_at = now() - interval '6 hours' WHERE id = %s",
        (keyed[1],),
    )
    execute(
        dsn,
        f"""
        CREATE FUNCTION public.refuse_release() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'release refused'; END $$;
        CREATE TRIGGER refuse_release BEFORE DELETE ON awa_fast.unique_holds
            FOR EACH ROW WHEN (OLD.job_id = {keyed[0]})
            EXECUTE FUNCTION public.refuse_release();""",
    )
    try:
        m = maintenance(client, completed_retention_hours=1)
        assert await m.expire_slices() == 1
        assert [r["id"] for r in rows(dsn, "SELECT id FROM awa_fast.jobs_done")] == [keyed[0]]
        assert_bookkeeping(dsn)
        with pytest.raises(UniqueConflict):
            await client.insert({"h": 0}, kind="holds", unique_opts={})
    finally:
        execute(
            dsn,
            "DROP TRIGGER refuse_release ON awa_fast.unique_holds; "
            "DROP FUNCTION public.refuse_release()",
        )
    assert await m.expire_slices() == 1
    await client.insert({"h": 0}, kind="holds", unique_opts={})
    assert_bookkeeping(dsn)


async def test_a_duplicate_insert_racing_the_truncate_of_its_holders_slice(client, dsn):
    """While the prune's transaction (slice truncated, holds released) is open, a duplicate of
    a key held in that slice is refused (the hold is still committed); once it commits, the
    key is free. Never two holders."""
    held = (await client.insert({"d": 1}, kind="trunc", unique_opts={})).id
    execute(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'completed', "
        "finalized_at = now() - interval '3 hours' WHERE id = %s",
        (held,),
    )
    table = slice_of(dsn, held)
    slot = rows(dsn, "SELECT slot FROM awa_fast.unique_holds")[0]["slot"]
    pruner = await psycopg.AsyncConnection.connect(dsn)
    try:
        await pruner.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        await pruner.execute(f"TRUNCATE {table}")
        await pruner.execute(sql.RELEASE_SLICE, {"slot": slot})
        with pytest.raises(UniqueConflict):
            await client.insert({"d": 1}, kind="trunc", unique_opts={})
        await pruner.commit()
    finally:
        await pruner.close()
    again = await client.insert({"d": 1}, kind="trunc", unique_opts={})
    key = rows(dsn, "SELECT unique_key FROM awa_fast.jobs WHERE id = %s", (again.id,))[0]
    assert holders(dsn, key["unique_key"]) == [again.id]


# -- the migration from 008 with keys held in every storage -------------------------------------


def test_migration_from_008_holds_every_key_once_and_counts_every_row(fresh_db):
    """A database at 008 with a row in every state, unique holders in completed, failed and
    cancelled masks, an owed failed holder, a marked (still running) finished holder, and rows
    older than the ring: after the migration every key has exactly the holder it had, the
    counters and holds match the rows, and a duplicate of each held key is refused."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS awa_fast")
        conn.execute(
            "CREATE TABLE awa_fast.schema_version (version integer PRIMARY KEY, "
            "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, description, text in migrations():
            if version > 8:
                break
            with conn.transaction():
                conn.execute(text)
                conn.execute(
                    "INSERT INTO awa_fast.schema_version VALUES (%s, %s)", (version, description)
                )
        every = 0b11111111
        conn.execute(
            """
            INSERT INTO awa_fast.jobs (kind, queue, state, finalized_at, unique_key,
                                       unique_states, consequence_state, heartbeat_at)
            VALUES ('k', 'q1', 'scheduled', NULL, '\\x01', %(e)s, NULL, NULL),
                   ('k', 'q1', 'available', NULL, '\\x02', %(e)s, NULL, NULL),
                   ('k', 'q1', 'running', NULL, '\\x03', %(e)s, NULL, now()),
                   ('k', 'q1', 'retryable', NULL, '\\x04', %(e)s, NULL, NULL),
                   ('k', 'q1', 'waiting_external', NULL, '\\x05', %(e)s, NULL, NULL),
                   ('k', 'q2', 'completed', now() - interval '50 hours', '\\x06', %(e)s,
                    NULL, NULL),
                   ('k', 'q2', 'completed', NULL, '\\x07', 8, NULL, NULL),
                   ('k', 'q2', 'failed', now() - interval '10 days', '\\x08', 32, NULL, NULL),
                   ('k', 'q2', 'cancelled', now(), '\\x09', 64, NULL, NULL),
                   ('k', 'q2', 'failed', now(), '\\x0a', 32, 'owed', NULL),
                   ('k', 'q2', 'completed', now(), '\\x0b', 8, NULL, now()),
                   ('k', 'q2', 'consequence_pending', NULL, '\\x0c', %(e)s, 'owed', NULL),
                   ('k', 'q2', 'completed', now(), '\\x0d', 2, NULL, NULL),
                   ('k', 'q2', 'failed', now(), NULL, NULL, 'applied', NULL)""",
            {"e": every},
        )
        before = dict(
            conn.execute(
                "SELECT unique_key, id FROM awa_fast.jobs WHERE unique_key IS NOT NULL "
                "AND (unique_states & (1 << awa_fast.state_bit(state))) <> 0"
            ).fetchall()
        )
    migrate_sync(fresh_db)
    assert {
        bytes(k): i
        for k, i in (
            (r["unique_key"], r["id"])
            for r in rows(
                fresh_db,
                "SELECT unique_key, id FROM awa_fast.jobs WHERE unique_key IS NOT NULL "
                "AND (unique_states & (1 << awa_fast.state_bit(state))) <> 0 "
                "UNION ALL SELECT unique_key, job_id FROM awa_fast.unique_holds",
            )
        )
    } == {bytes(k): i for k, i in before.items()}
    assert len(rows(fresh_db, "SELECT id FROM awa_fast.jobs_all")) == 14
    assert {r["state"] for r in rows(fresh_db, "SELECT state::text FROM awa_fast.jobs_done")} == {
        "completed",
        "failed",
        "cancelled",
    }
    assert_bookkeeping(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for key in before:
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute(
                    "INSERT INTO awa_fast.jobs (kind, unique_key, unique_states) "
                    "VALUES ('dup', %s, 255)",
                    (key,),
                )


async def test_a_pass_whose_process_stops_mid_transaction_releases_its_slice_lock(dsn, client):
    # The slice expiry locks a slice ACCESS EXCLUSIVE, then truncates it in later statements of
    # the same transaction: a leader stopped in between (SIGSTOP, a hung host) blocked every
    # read of finished jobs until another process displaced it, or for good without one
    # (breaker helper). The server now ends such a pass after PASS_IDLE_TIMEOUT_S idle.
    import time

    job = await client.insert({"x": 1}, kind="stopped_pass")
    await client.cancel(job.id)
    [slice_] = rows(
        dsn, "SELECT tableoid::regclass::text AS t FROM awa_fast.jobs_done WHERE id = %s", (job.id,)
    )
    m = maintenance(client)
    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
        async with m.fenced(bounded=True) as conn:
            await conn.execute(f"LOCK TABLE {slice_['t']} IN ACCESS EXCLUSIVE MODE")
            # this pass now sits idle, as one whose process stopped: a reader waits for the
            # server to end it, no longer
            started = time.monotonic()
            got = await asyncio.wait_for(client.get_job(job.id), 60)
            waited = time.monotonic() - started
    assert got.id == job.id and waited < sql.PASS_IDLE_TIMEOUT_S + 5, waited
