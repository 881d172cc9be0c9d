"""Finished jobs leave the hot table (migration 010, ADR 016), on a real PostgreSQL: the hot
table holds live jobs only; unique keys are held across the hot table and the finished storage
(also against a concurrent completion); retention truncates whole slices (no dead tuples left,
keys released); the DLQ and owed consequences across the two; the migration of a database at
008; and bounded plans with a large finished history."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import psycopg
import pytest
from psycopg.rows import dict_row

import awa_fast as awa
from awa_fast import sql
from awa_fast.errors import UniqueConflict
from awa_fast.schema import MIGRATE_LOCK_KEY, migrate_sync, migrations
from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig, PassIncomplete
from tests.support import poll_until, truncate, wait_lock_waiter, wait_state

FINISHED = ("completed", "failed", "cancelled")


@dataclasses.dataclass
class Item:
    n: int


@pytest.fixture(autouse=True)
async def clean(dsn):
    await truncate(dsn)


def rows(dsn: str, query: str, params=None) -> list[dict]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(query, params).fetchall()


def one(dsn: str, query: str, params=None):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchone()[0]


def hot_states(dsn: str) -> set[str]:
    return {r["state"] for r in rows(dsn, "SELECT DISTINCT state::text FROM awa_fast.jobs")}


def dead_tuples(dsn: str, table: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        return conn.execute(
            "SELECT dead_tuple_count FROM pgstattuple(%s::regclass)", (table,)
        ).fetchone()[0]


def maintenance(client, **config) -> Maintenance:
    return Maintenance(client.database_url, client.pool, MaintenanceConfig(**config))


def finish(dsn: str, job_ids: list[int], state: str = "completed", age: str = "0") -> None:
    """Finish jobs the way an admin statement does (the move trigger takes them out)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE awa_fast.jobs SET state = %s::awa_fast.job_state, "
            "finalized_at = now() - %s::interval WHERE id = ANY(%s)",
            (state, age, job_ids),
        )


# -- the hot table holds live jobs only ---------------------------------------------------------


async def test_completed_failed_and_cancelled_jobs_leave_the_hot_table(client, dsn):
    @client.task(Item)
    async def work(job):
        if job.args.n == 1:
            raise awa.TerminalError("no")
        return None

    done = await client.insert(Item(0))
    failed = await client.insert(Item(1))
    cancelled = await client.insert(Item(2), run_at=None, queue="elsewhere")
    await client.cancel(cancelled.id)
    await client.start([("default", 2)], poll_interval_ms=50)
    try:
        await wait_state(client, done.id, "completed")
        await wait_state(client, failed.id, "failed")
    finally:
        await client.shutdown()
    assert hot_states(dsn) == set()
    assert {
        r["id"]: r["state"] for r in rows(dsn, "SELECT id, state::text FROM awa_fast.jobs_done")
    } == {done.id: "completed", failed.id: "failed", cancelled.id: "cancelled"}
    # reads and listings see both storages
    assert (await client.get_job(done.id)).state == awa.JobState.Completed
    listed = {j.id for j in await client.list_jobs(limit=10)}
    assert {done.id, failed.id, cancelled.id} <= listed
    stats = {s.queue: s for s in await client.queue_stats()}
    assert stats["default"].failed == 1 and stats["default"].completed_last_hour == 1


# -- unique keys across the hot table and the finished storage ----------------------------------


async def test_a_finished_job_holds_its_key_until_its_slice_is_pruned(client, dsn):
    first = await client.insert({"k": 1}, kind="uniq", unique_opts={})
    finish(dsn, [first.id], age="3 hours")
    assert hot_states(dsn) == set()
    assert rows(dsn, "SELECT job_id FROM awa_fast.unique_holds") == [{"job_id": first.id}]
    with pytest.raises(UniqueConflict):
        await client.insert({"k": 1}, kind="uniq", unique_opts={})
    # a mask without completed holds nothing once completed
    free = await client.insert({"k": 2}, kind="uniq", unique_opts={"states": 0b10})
    finish(dsn, [free.id])
    await client.insert({"k": 2}, kind="uniq", unique_opts={"states": 0b10})
    # retention passes: the slice goes, and the key with it
    assert await maintenance(client, completed_retention_hours=1).expire_slices() == 1
    assert rows(dsn, "SELECT job_id FROM awa_fast.unique_holds") == []
    again = await client.insert({"k": 1}, kind="uniq", unique_opts={})
    assert again.id != first.id


async def _waiting_on_lock(dsn: str) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return (await cur.fetchone())[0] > 0


async def test_duplicate_insert_racing_a_completion_sees_the_committed_hold(client, dsn):
    """The completion deletes the holder from the hot table and writes the hold, uncommitted;
    the duplicate waits (on the hot table's unique index and the key's lock) and, once the
    completion commits, finds the hold: UniqueConflict, never two holders."""
    job = await client.insert({"r": 1}, kind="race", unique_opts={})
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET state = 'running', run_lease = 1 WHERE id = %s", (job.id,)
        )
    completer = await psycopg.AsyncConnection.connect(dsn)
    try:
        cur = await completer.execute(sql.COMPLETE_MANY, ([job.id], [1]))
        assert await cur.fetchall() == [(job.id, 1)]
        pending = asyncio.create_task(client.insert({"r": 1}, kind="race", unique_opts={}))
        # server state (a backend waiting on a lock): no signal of this process reports it
        await poll_until(lambda: _waiting_on_lock(dsn), what="the duplicate waits")
        assert not pending.done()
        await completer.commit()
        with pytest.raises(UniqueConflict):
            await pending
    finally:
        await completer.close()
    assert one(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'race'") == 1


async def test_completion_racing_a_duplicate_insert_sees_the_committed_duplicate(client, dsn):
    """The other order: the duplicate is inserted (uncommitted) while the holder runs outside
    its mask; the completion waits on the key's lock and, once the duplicate commits, fails
    with unique_violation (the finalizer cancels it as a duplicate)."""
    states = 0b1010  # available, completed
    job = await client.insert({"r": 2}, kind="race", unique_opts={"states": states})
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET state = 'running', run_lease = 1 WHERE id = %s", (job.id,)
        )
    tx = await client.transaction()
    try:
        dup = await tx.insert({"r": 2}, kind="race", unique_opts={"states": states})
        completer = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            pending = asyncio.create_task(completer.execute(sql.COMPLETE_MANY, ([job.id], [1])))
            # server state (a backend waiting on a lock)
            await poll_until(lambda: _waiting_on_lock(dsn), what="the completion waits")
            await tx.commit()
            with pytest.raises(psycopg.errors.UniqueViolation):
                await pending
        finally:
            await completer.close()
    finally:
        await tx.rollback()
    assert rows(
        dsn, "SELECT id, state::text FROM awa_fast.jobs_all WHERE kind = 'race' ORDER BY id"
    ) == [
        {"id": job.id, "state": "running"},
        {"id": dup.id, "state": "available"},
    ]
    assert rows(dsn, "SELECT * FROM awa_fast.unique_holds") == []


async def test_follow_up_racing_the_holders_completion_is_skipped_not_fatal(client, dsn):
    """A follow-up whose key a job is completing right now: the follow-up insert waits for the
    completion and skips the key (the completion holds it); the triggering completion commits."""
    holder = await client.insert({"b": 1}, kind="stage_b", unique_opts={})
    trigger = await client.insert({"a": 1}, kind="stage_a")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET state = 'running', run_lease = 1 WHERE id = ANY(%s)",
            ([holder.id, trigger.id],),
        )
    completer = await psycopg.AsyncConnection.connect(dsn)
    try:
        await completer.execute(sql.COMPLETE_MANY, ([holder.id], [1]))
        from awa_fast import enqueue, requests

        follow = requests.prepare({"b": 1}, kind="stage_b", unique_opts={})
        payload = enqueue.follow_ups_json([follow], trigger.id)
        other = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            pending = asyncio.create_task(
                other.execute(sql.COMPLETE_WITH_FOLLOW_UPS, (trigger.id, 1, payload))
            )
            # server state (a backend waiting on a lock)
            await poll_until(lambda: _waiting_on_lock(dsn), what="the follow-up insert waits")
            await completer.commit()
            cur = await pending
            done, inserted, _keys, _queues = await cur.fetchone()
            assert (done, inserted) == (1, 0)
        finally:
            await other.close()
    finally:
        await completer.close()
    assert one(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'stage_b'") == 1
    assert one(dsn, "SELECT state::text FROM awa_fast.jobs_all WHERE id = %s", (trigger.id,)) == (
        "completed"
    )


# -- retention: whole slices ---------------------------------------------------------------------


async def test_prune_truncates_expired_slices_only(client, dsn):
    old = [(await client.insert(Item(i))).id for i in range(5)]
    young = [(await client.insert(Item(i))).id for i in range(5, 8)]
    failed_old = (await client.insert(Item(9))).id
    finish(dsn, old, age="3 hours")
    finish(dsn, young)
    finish(dsn, [failed_old], state="failed", age="4 days")
    m = maintenance(client, completed_retention_hours=1, failed_retention_hours=72)
    assert await m.prune() == 6
    left = {r["id"] for r in rows(dsn, "SELECT id FROM awa_fast.jobs_all")}
    assert left == set(young)
    # no per-row delete: the remaining storage has no dead tuples, the hot table none from it
    for part in rows(
        dsn,
        "SELECT inhrelid::regclass::text AS t FROM pg_inherits "
        "WHERE inhparent = 'awa_fast.jobs_done'::regclass",
    ):
        assert dead_tuples(dsn, part["t"]) == 0, part["t"]
    # the counters went with the slices
    assert one(dsn, "SELECT sum(n) FROM awa_fast.done_counts") == 3
    assert await m.prune() == 0


async def test_a_slice_that_cannot_be_truncated_is_kept_and_the_rest_pruned(client, dsn):
    ids = [(await client.insert(Item(i))).id for i in range(4)]
    finish(dsn, ids[:3], age="3 hours")
    finish(dsn, ids[3:], age="6 hours")
    bad = one(
        dsn, "SELECT tableoid::regclass::text FROM awa_fast.jobs_done WHERE id = %s", (ids[3],)
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"""
            CREATE FUNCTION public.refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'truncate refused'; END $$;
            CREATE TRIGGER refuse_truncate BEFORE TRUNCATE ON {bad}
                FOR EACH STATEMENT EXECUTE FUNCTION public.refuse_truncate();""")
    try:
        assert await maintenance(client, completed_retention_hours=1).prune() == 3
        assert [r["id"] for r in rows(dsn, "SELECT id FROM awa_fast.jobs_all")] == [ids[3]]
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                f"DROP TRIGGER refuse_truncate ON {bad}; DROP FUNCTION public.refuse_truncate()"
            )
    assert await maintenance(client, completed_retention_hours=1).prune() == 1


# -- the DLQ and owed consequences across the two storages --------------------------------------


async def test_dlq_moves_and_retries_across_the_storages(client, dsn):
    job = await client.insert({"x": 1}, kind="to_dlq", unique_opts={"states": 31 | (1 << 5)})
    finish(dsn, [job.id], state="failed")
    assert rows(dsn, "SELECT job_id FROM awa_fast.unique_holds") == [{"job_id": job.id}]
    moved = await client.move_failed_to_dlq(job.id, reason="operator")
    assert moved
    assert one(dsn, "SELECT count(*) FROM awa_fast.jobs_all") == 0
    assert rows(dsn, "SELECT job_id FROM awa_fast.unique_holds") == []
    assert one(dsn, "SELECT COALESCE(sum(n), 0) FROM awa_fast.done_counts") == 0
    back = await client.retry_from_dlq(job.id)
    assert back.state == awa.JobState.Available and hot_states(dsn) == {"available"}


async def test_failed_job_retried_back_to_the_hot_table(client, dsn):
    job = await client.insert({"x": 2}, kind="again", unique_opts={"states": 31 | (1 << 5)})
    finish(dsn, [job.id], state="failed")
    retried = await client.retry(job.id)
    assert retried.state == awa.JobState.Available
    assert rows(dsn, "SELECT id FROM awa_fast.jobs") == [{"id": job.id}]
    assert one(dsn, "SELECT count(*) FROM awa_fast.jobs_done") == 0
    assert rows(dsn, "SELECT * FROM awa_fast.unique_holds") == []
    result = await client.retry_failed(kind="again")
    assert result.matched == 0


async def test_owed_consequence_stays_live_and_is_never_pruned(client, dsn):
    job = await client.insert({"x": 3}, kind="owes")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE awa_fast.jobs SET state = 'failed', finalized_at = now() - interval '9 days', "
            "consequence_state = 'owed', consequence_retry_at = now() WHERE id = %s",
            (job.id,),
        )
    assert hot_states(dsn) == {"failed"}  # owed: still live
    assert (
        await maintenance(client, failed_retention_hours=0, completed_retention_hours=0).prune()
        == 0
    )
    assert hot_states(dsn) == {"failed"}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE awa_fast.jobs SET consequence_state = 'applied' WHERE id = %s", (job.id,)
        )
    assert hot_states(dsn) == set()  # settled: it moved
    assert await maintenance(client, failed_retention_hours=1).prune() == 1


# -- the migration ------------------------------------------------------------------------------


def test_migration_moves_an_existing_database(fresh_db):
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
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK_KEY,))
                conn.execute(text)
                conn.execute(
                    "INSERT INTO awa_fast.schema_version VALUES (%s, %s)", (version, description)
                )
        conn.execute("""
            INSERT INTO awa_fast.jobs (kind, state, finalized_at, unique_key, unique_states,
                                       consequence_state, heartbeat_at)
            VALUES ('live', 'available', NULL, NULL, NULL, NULL, NULL),
                   ('live', 'running', NULL, '\\x01', 31, NULL, now()),
                   ('done', 'completed', now() - interval '2 hours', '\\x02', 31, NULL, NULL),
                   ('done', 'completed', now(), NULL, NULL, NULL, NULL),
                   ('done', 'failed', NULL, '\\x03', 31, NULL, NULL),
                   ('owed', 'failed', now(), NULL, NULL, 'owed', NULL),
                   ('marked', 'cancelled', now(), NULL, NULL, NULL, now())""")
    assert migrate_sync(fresh_db) == [v for v, _d, _t in migrations() if v > 8]
    assert {r["kind"] for r in rows(fresh_db, "SELECT kind FROM awa_fast.jobs")} == {
        "live",
        "owed",
        "marked",
    }
    assert one(fresh_db, "SELECT count(*) FROM awa_fast.jobs_done") == 3
    assert one(fresh_db, "SELECT count(*) FROM awa_fast.jobs_all") == 7
    # the completed job with a key holds it; the failed one's mask does not hold failed
    assert [
        r["unique_key"] for r in rows(fresh_db, "SELECT unique_key FROM awa_fast.unique_holds")
    ] == [b"\x02"]
    assert one(fresh_db, "SELECT sum(n) FROM awa_fast.done_counts") == 3
    with (
        psycopg.connect(fresh_db, autocommit=True) as conn,
        pytest.raises(psycopg.errors.UniqueViolation),
    ):
        conn.execute(
            "INSERT INTO awa_fast.jobs (kind, unique_key, unique_states) VALUES ('x', '\\x02', 31)"
        )
    assert migrate_sync(fresh_db) == []


# -- bounded plans with a large finished history ---------------------------------------------------

HISTORY = 200_000


def plan_of(dsn: str, statement: str, params=None) -> str:
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        # Only where no index can serve a relation does a Seq Scan remain: the hot table is
        # small (its active set) and most slices are empty, so costs alone would pick one.
        conn.execute("SET enable_seqscan = off")
        return "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement, params))


def test_stats_health_listing_and_admin_reads_are_bounded_by_the_live_set(dsn):
    """With 200k finished jobs (a stand-in for 10 million: the plans are what matters), the
    statements behind queue_stats and health_check never read the finished storage, and job
    reads by id or newest-first listing only probe indexes of the slices."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"""
            INSERT INTO awa_fast.jobs_done (id, kind, queue, state, attempt, run_at, created_at,
                                            finalized_at)
            SELECT nextval('awa_fast.jobs_id_seq'), 'kind_' || (g % 20), 'q' || (g % 3),
                   (CASE WHEN g % 100 = 7 THEN 'failed' ELSE 'completed' END)::awa_fast.job_state,
                   1, now() - interval '1 day', now() - interval '1 day',
                   now() - (g % 20) * interval '1 hour'
            FROM generate_series(1, {HISTORY}) g""")
        conn.execute("""
            INSERT INTO awa_fast.jobs (kind, queue, state)
            SELECT 'kind_1', 'q1', 'available' FROM generate_series(1, 300)""")
        conn.execute("ANALYZE awa_fast.jobs")
        conn.execute("ANALYZE awa_fast.done_counts")
        newest = conn.execute("SELECT max(id) FROM awa_fast.jobs_done").fetchone()[0]
    assert one(dsn, "SELECT sum(n) FROM awa_fast.done_counts") == HISTORY
    # a slice autovacuum has not analyzed yet, then as it leaves them (300 rows, migration 017)
    assert_bounded_plans(dsn, newest)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE awa_fast.jobs_done")
    assert_bounded_plans(dsn, newest)


def assert_bounded_plans(dsn: str, newest: int) -> None:
    untouched = {
        "queue_stats": (sql.QUEUE_STATS, None),
        "health_check": (sql.HEALTH_AVAILABLE, (["q1"],)),
        "expired slices": (sql.EXPIRED_SLICES, {"completed_s": 3600, "failed_s": 3600}),
        "verify pass": (sql.VERIFY_DUE, {"kinds": ["kind_1"], "window_s": 3600, "limit": 100}),
    }
    for name, (statement, params) in untouched.items():
        plan = plan_of(dsn, statement, params)
        assert "jobs_done" not in plan, f"{name}:\n{plan}"

    probed = {
        "get_job": (sql.GET_JOB, (newest - 5,)),
        "list_jobs": (sql.LIST_JOBS, {"state": None, "kind": None, "queue": None, "limit": 50}),
        "list_jobs, queue": (
            sql.LIST_JOBS,
            {"state": None, "kind": None, "queue": "q2", "limit": 50},
        ),
        "dump_job": (sql.DUMP_JOB, (newest,)),
        "unique holder": (sql.UNIQUE_HOLDER, (b"\x01" * 16,)),
        "retry": (sql.RETRY_JOB, {"id": newest, "stale_ms": 90_000}),
        "dlq move": (sql.DLQ_MOVE_ONE, {"id": newest, "reason": "r", "kind": None, "queue": None}),
        "verify pass, listed jobs": (sql.DUE_JOBS, {"ids": [newest - 1, newest]}),
    }
    for name, (statement, params) in probed.items():
        plan = plan_of(dsn, statement, params)
        assert "Seq Scan on jobs" not in plan, f"{name}:\n{plan}"
    # the newest-first listing stops after its page: a merge of backward index scans
    plan = plan_of(dsn, sql.LIST_JOBS, probed["list_jobs"][1])
    assert "Limit" in plan and "Index Scan Backward" in plan, plan
    # bulk admin calls on failed jobs read only the failed slices
    plan = plan_of(dsn, sql.FAILED_MATCHING, {"kind": "kind_7", "queue": None})
    assert "jobs_done_c" not in plan and "jobs_done_f" in plan, plan


# -- the slice function (migration 012) ------------------------------------------------------------

# 010's body, which PostgreSQL could not inline (extract(epoch FROM timestamptz) is STABLE).
SLOT_010 = """(CASE WHEN s = 'completed'
    THEN mod(mod(floor(extract(epoch FROM at) / 3600)::bigint, 32) + 32, 32)
    ELSE 32 + mod(mod(floor(extract(epoch FROM at) / 10800)::bigint, 32) + 32, 32) END)::smallint"""


def test_done_slot_is_inlined_and_unchanged(dsn):
    """Migration 012: every timestamp keeps the slice 010 gave it (hour and three-hour edges to
    the microsecond, before 1970, under another TimeZone), the partition routing and the
    counting trigger see the function's body (no per-row function call), and a row lands in
    the slice the function names."""
    edges = """
        SELECT s, at FROM unnest(ARRAY['completed', 'failed', 'cancelled']::awa_fast.job_state[]) s,
        LATERAL (
            SELECT timestamptz '2026-12-01 00:00:00+00' + h * interval '1 hour' + d AS at
            FROM generate_series(-200, 200) h,
                 unnest(ARRAY[interval '0', interval '-1 microsecond', interval '1 microsecond',
                              interval '59 minutes 59.999999 seconds']) d
            UNION ALL SELECT timestamptz '1969-12-31 23:59:59.999999+00'
            UNION ALL SELECT timestamptz '1900-01-01 00:00:00.000001+00'
            UNION ALL SELECT timestamptz '2200-06-15 12:34:56.789012+00'
            UNION ALL SELECT now() + g * interval '7 minutes 13.000017 seconds'
            FROM generate_series(-5000, 5000) g
        ) t"""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for zone in ("UTC", "Asia/Kathmandu", "America/St_Johns"):
            conn.execute(f"SET TimeZone = '{zone}'")
            differ = conn.execute(
                f"SELECT count(*) FILTER (WHERE awa_fast.done_slot(s, at) <> {SLOT_010}), "
                f"count(*) FROM ({edges}) e"
            ).fetchone()
            assert differ[0] == 0 and differ[1] > 30_000, (zone, differ)
        conn.execute("RESET TimeZone")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN VERBOSE SELECT awa_fast.done_slot(state, finalized_at) "
                "FROM awa_fast.jobs_done"
            )
        )
        assert "done_slot" not in plan and "CASE" in plan, plan

        at = "2026-12-01 05:30:00+00"
        conn.execute(
            "INSERT INTO awa_fast.jobs_done (id, kind, state, finalized_at) VALUES "
            "(nextval('awa_fast.jobs_id_seq'), 'k', 'completed', %s), "
            "(nextval('awa_fast.jobs_id_seq'), 'k', 'failed', %s)",
            (at, at),
        )
        placed = conn.execute(
            "SELECT state::text, tableoid::regclass::text, awa_fast.done_slot(state, finalized_at) "
            "FROM awa_fast.jobs_done ORDER BY state"
        ).fetchall()
    # 2026-12-01 05:30 UTC: epoch hour 498,917 (mod 32 = 5), three-hour period 166,305 (mod 32 = 1)
    assert placed == [
        ("completed", "awa_fast.jobs_done_c05", 5),
        ("failed", "awa_fast.jobs_done_f01", 33),
    ], placed


def test_rows_inserted_finished_move_and_hold_their_keys(dsn):
    """Migration 013: a finished row INSERTed into the hot table (an admin statement) moves to
    its slice in the statement, its finalized_at filled in, its key held; a live duplicate of
    that key is then refused, and a live row inserted in the same statement stays."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO awa_fast.jobs (kind, state, unique_key, unique_states) VALUES "
            "('k', 'completed', '\\x0101', 255), ('k', 'failed', NULL, NULL), "
            "('k', 'available', '\\x0202', 255)"
        )
        hot = conn.execute("SELECT state::text FROM awa_fast.jobs ORDER BY id").fetchall()
        done = conn.execute(
            "SELECT state::text, finalized_at IS NOT NULL FROM awa_fast.jobs_done ORDER BY id"
        ).fetchall()
        holds = conn.execute("SELECT unique_key FROM awa_fast.unique_holds").fetchall()
        counted = conn.execute("SELECT sum(n) FROM awa_fast.done_counts").fetchone()[0]
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(
                "INSERT INTO awa_fast.jobs (kind, unique_key, unique_states) "
                "VALUES ('k', '\\x0101', 255)"
            )
    assert hot == [("available",)]
    assert done == [("completed", True), ("failed", True)]
    assert holds == [(b"\x01\x01",)]
    assert counted == 2


def test_a_key_given_to_a_live_row_by_an_update_is_checked_against_finished_holders(dsn):
    """Migration 021: a finished job holds key K; an admin UPDATE giving a live row K (or a mask
    that makes it hold K) is refused with unique_violation, as giving it a state would be; the
    finished holder's key stays held once (found by a breaker helper)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO awa_fast.jobs (kind, state, unique_key, unique_states) "
            "VALUES ('k', 'completed', '\\x01aa', 127)"
        )
        live = conn.execute(
            "INSERT INTO awa_fast.jobs (kind, unique_key, unique_states) "
            "VALUES ('k', '\\x01aa', 0), ('k', NULL, NULL) RETURNING id"
        ).fetchall()
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(
                "UPDATE awa_fast.jobs SET unique_states = 127 WHERE id = %s", (live[0][0],)
            )
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(
                "UPDATE awa_fast.jobs SET unique_key = '\\x01aa', unique_states = 127 "
                "WHERE id = %s",
                (live[1][0],),
            )
        conn.execute(  # another key is free
            "UPDATE awa_fast.jobs SET unique_key = '\\x01bb', unique_states = 127 WHERE id = %s",
            (live[1][0],),
        )
        holds = conn.execute("SELECT unique_key FROM awa_fast.unique_holds").fetchall()
    assert holds == [(b"\x01\xaa",)]


@pytest.mark.parametrize(
    "column, value",
    [
        ("state", "'failed'"),
        ("queue", "'elsewhere'"),
        ("finalized_at", "finalized_at - interval '5 hours'"),  # another slice
        ("unique_key", "'\\x01bb'"),
        ("unique_states", "0"),
        ("id", "id + 1000"),
    ],
)
def test_an_edit_of_a_finished_rows_counted_fields_is_refused(dsn, column, value):
    """Migration 022: done_counts and unique_holds are written as rows enter and leave
    jobs_done; an UPDATE of the fields they are kept from (one moving the row to another slice
    included) is refused, naming the column, and changes nothing. Other fields stay editable,
    and a delete keeps both right."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        (job,) = conn.execute(
            "INSERT INTO awa_fast.jobs (kind, state, finalized_at, unique_key, unique_states) "
            "VALUES ('k', 'completed', now(), '\\x01aa', 31) RETURNING id"
        ).fetchone()
        before = conn.execute(
            "SELECT (SELECT array_agg(c ORDER BY c::text) FROM awa_fast.done_counts c), "
            "(SELECT array_agg(h ORDER BY h::text) FROM awa_fast.unique_holds h), "
            "(SELECT row_to_json(d)::text FROM awa_fast.jobs_done d)"
        ).fetchone()
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as info:
            conn.execute(f"UPDATE awa_fast.jobs_done SET {column} = {value} WHERE id = %s", (job,))
        assert info.value.diag.column_name == column
        assert f"column {column} of finished job {job}" in str(info.value)
        after = conn.execute(
            "SELECT (SELECT array_agg(c ORDER BY c::text) FROM awa_fast.done_counts c), "
            "(SELECT array_agg(h ORDER BY h::text) FROM awa_fast.unique_holds h), "
            "(SELECT row_to_json(d)::text FROM awa_fast.jobs_done d)"
        ).fetchone()
        assert after == before
        # the same value, and the fields nothing is kept from, are editable
        conn.execute(
            f"UPDATE awa_fast.jobs_done SET {column} = {column}, errors = '[]', "
            "verified_at = now() WHERE id = %s",
            (job,),
        )
        conn.execute("DELETE FROM awa_fast.jobs_done WHERE id = %s", (job,))
        counted, held = conn.execute(
            "SELECT (SELECT coalesce(sum(n), 0) FROM awa_fast.done_counts), "
            "(SELECT count(*) FROM awa_fast.unique_holds)"
        ).fetchone()
    assert (counted, held) == (0, 0)


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
async def test_a_keyed_insert_in_a_snapshot_transaction_is_refused(client, level):
    """Migration 024: the key check across live and finished jobs looks after a lock with a
    snapshot taken after it; a REPEATABLE READ or SERIALIZABLE transaction reads one snapshot
    throughout, so a finished holder that committed while it waited went unseen and the key was
    held twice (a breaker helper's repro: the insert next to a cancel of the holder). Such a
    transaction is refused when it inserts a job that holds a key; one without a key goes in."""
    async with await client.transaction() as tx:
        await tx.connection.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        await tx.insert(Item(1))
        with pytest.raises(awa.DatabaseError, match=f"not {level}") as info:
            await tx.insert(Item(2), unique_opts={})
        assert isinstance(info.value.__cause__, psycopg.errors.FeatureNotSupported)
    async with await client.transaction() as tx:  # the pool's sessions are READ COMMITTED
        await tx.insert(Item(3), unique_opts={})
    kept = await client.list_jobs()  # the refused insert left its transaction usable
    assert sorted(j.args["n"] for j in kept) == [1, 3]


def test_snapshot_checks_refine_read_uncommitted_and_slice_truncates(dsn):
    """Migration 024: READ UNCOMMITTED runs as READ COMMITTED and may insert a keyed job; a
    slice's TRUNCATE at REPEATABLE READ is refused (its release of the slot's counters and keys
    would read a snapshot from before its lock), and TRUNCATE awa_fast.jobs, which empties them
    in the same statement, is not."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
            conn.execute(
                "INSERT INTO awa_fast.jobs (kind, state, unique_key, unique_states) "
                "VALUES ('k', 'completed', '\\x01aa', 31)"
            )
        (slice_name,) = conn.execute(
            "SELECT tableoid::regclass::text FROM awa_fast.jobs_done"
        ).fetchone()
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="slice of jobs_done"):
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                conn.execute(f"TRUNCATE {slice_name}")
        assert one(dsn, "SELECT count(*) FROM awa_fast.unique_holds") == 1
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.execute("TRUNCATE awa_fast.jobs")
    assert one(dsn, "SELECT count(*) FROM awa_fast.jobs_all") == 0
    assert one(dsn, "SELECT count(*) FROM awa_fast.unique_holds") == 0
    assert one(dsn, "SELECT count(*) FROM awa_fast.done_counts") == 0


async def test_awa_fast_runs_read_committed_whatever_the_databases_default(dsn):
    """Migration 024 and sql.SESSION_READ_COMMITTED: under a database default of REPEATABLE
    READ awa-fast's own connections still check keys with fresh snapshots (the session setting),
    so an insert, a cancel and a duplicate insert behave as at READ COMMITTED; a connection of
    the application's own is refused for a keyed insert."""
    db = one(dsn, "SELECT current_database()")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"ALTER DATABASE \"{db}\" SET default_transaction_isolation = 'repeatable read'"
        )
    c = awa.AsyncClient(dsn)
    try:
        only_cancelled = {"states": 1 << 6}
        held = await c.insert(Item(5), unique_opts=only_cancelled)
        await c.cancel(held.id)  # finished, and holding its key
        with pytest.raises(UniqueConflict):  # available and cancelled hold it: refused
            await c.insert(Item(5), unique_opts={"states": (1 << 6) | (1 << 1)})
        with psycopg.connect(dsn, autocommit=True) as raw:
            assert raw.execute("SHOW transaction_isolation").fetchone() == ("repeatable read",)
            with pytest.raises(psycopg.errors.FeatureNotSupported):
                raw.execute(
                    "INSERT INTO awa_fast.jobs (kind, unique_key, unique_states) "
                    "VALUES ('k', '\\x01ee', 31)"
                )
            raw.execute("INSERT INTO awa_fast.jobs (kind) VALUES ('k')")  # no key: fine
    finally:
        await c.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{db}" RESET default_transaction_isolation')


async def test_a_slice_truncate_waits_for_the_fold_of_its_counts(dsn):
    """Migration 024: the leader's fold replaces a slot's old counter rows by their sum in one
    transaction; a TRUNCATE of that slot's slice meeting it took the counters with a snapshot
    from before the sum committed and left the sum behind, counting rows the slice no longer had
    (a breaker helper's repro). The truncate now waits on the slot's counts lock the fold
    holds."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO awa_fast.jobs (kind, queue, state, finalized_at) "
            "SELECT 'k', 'q', 'failed', now() - interval '150 minutes' FROM generate_series(1, 5)"
        )
        (slot,) = conn.execute(
            "SELECT DISTINCT awa_fast.done_slot(state, finalized_at) FROM awa_fast.jobs_done"
        ).fetchone()
    fold = await psycopg.AsyncConnection.connect(dsn)  # the leader's transaction, left open
    try:
        slots = (await (await fold.execute(sql.LOCK_FOLDABLE_SLOTS)).fetchone())[0]
        assert slots == [slot]
        await fold.execute(sql.FOLD_COUNTS, {"slots": slots})
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            truncating = asyncio.ensure_future(other.execute(f"TRUNCATE {sql.slice_table(slot)}"))
            await wait_lock_waiter(dsn, query_like="TRUNCATE%")
            await fold.commit()
            await truncating
    finally:
        await fold.close()
    assert rows(dsn, "SELECT slot, n FROM awa_fast.done_counts") == []
    assert one(dsn, "SELECT count(*) FROM awa_fast.jobs_done") == 0


def test_counter_rows_fold_to_one_per_bucket_then_one_per_slice(dsn):
    """``done_counts`` kept one row per writing backend for two hours, so its size (what every
    ``queue_stats`` reads) grew with the connections and each reconnect: 960k rows at 200
    queues and 40 connections (a breaker's measurement). The fold now merges a bucket's
    backends once it ended five minutes ago, and older than two hours a slice's rows into one
    per queue and state; ``queue_stats``' counts stay what they were."""
    ages = {"recent": "0 minutes", "ten minutes": "10 minutes", "three hours": "3 hours"}
    for _ in range(4):  # four connections: four writing backends
        with psycopg.connect(dsn, autocommit=True) as conn:
            for age in ages.values():
                conn.execute(
                    "INSERT INTO awa_fast.jobs (kind, queue, state, finalized_at) "
                    "SELECT 'k', 'fold_q', s::awa_fast.job_state, now() - %s::interval "
                    "FROM unnest(ARRAY['completed', 'completed', 'completed', 'failed']) s",
                    (age,),
                )
    counts = (
        "SELECT state::text AS state, bucket = 'epoch' AS epoch, backend = 0 AS merged, "
        "count(*) AS rows, sum(n) AS n "
        "FROM awa_fast.done_counts WHERE queue = 'fold_q' "
        "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    )
    by_queue = "SELECT * FROM (" + sql.DONE_COUNTS_BY_QUEUE + ") q WHERE queue = 'fold_q'"
    stats = rows(dsn, by_queue)
    # every failed row is held; completed rows in the last hour only
    assert stats == [{"queue": "fold_q", "failed": 12, "cancelled": 0, "completed_last_hour": 24}]
    before = rows(dsn, counts)
    # a row per backend and bucket: three minute buckets of completed rows, and two or three
    # hour buckets of failed ones (now and ten minutes ago may fall in one hour)
    assert sum(r["rows"] for r in before) >= 4 * 5

    def fold() -> list[int]:
        with psycopg.connect(dsn) as conn:  # one transaction, as the prune pass runs it
            slots = conn.execute(sql.LOCK_FOLDABLE_SLOTS).fetchone()[0]
            if slots:
                conn.execute(sql.FOLD_COUNTS, {"slots": slots})
            return slots

    assert fold()
    after = rows(dsn, counts)
    recent = [r for r in before if not r["epoch"]]
    epoch = [r for r in after if r["epoch"]]  # three hours old: one row per slice and state
    assert epoch == [
        {"state": "completed", "epoch": True, "merged": True, "rows": 1, "n": 12},
        {"state": "failed", "epoch": True, "merged": True, "rows": 1, "n": 4},
    ]
    # ten minutes old: one row per bucket, whatever the backends; the minute being written
    # keeps a row per backend
    assert (
        one(
            dsn,
            "SELECT count(*) FROM awa_fast.done_counts WHERE queue = 'fold_q' AND backend <> 0 "
            "AND state = 'completed' AND bucket < now() - interval '6 minutes'",
        )
        == 0
    )
    # (failed rows count in hour buckets: those of the last hour are still being written)
    assert (
        one(
            dsn,
            "SELECT count(*) FROM awa_fast.done_counts WHERE queue = 'fold_q' AND backend <> 0 "
            "AND state = 'completed'",
        )
        == 4
    )
    assert sum(r["rows"] for r in after) < sum(r["rows"] for r in before)
    assert sum(r["n"] for r in after) == sum(r["n"] for r in before) == 4 * 4 * 3
    assert rows(dsn, by_queue) == stats
    assert recent  # the recent rows were there before, and stay
    assert fold() == []  # nothing left to fold until a bucket ages


def test_every_job_column_moves_with_the_row(dsn):
    """A row moves between jobs, jobs_done and the DLQ by position (move_owing's NEW.*,
    dead_letter_if_enabled's d.*) and by the column lists of the move functions (013's
    check_inserted_keys, 019's move_updated_finished) and of sql.ALL_COLUMNS. A column added
    to jobs and missing from one of them would be dropped or shifted on the move: all of them
    must name every column of jobs, in jobs' order where the order counts."""

    def columns(rel: str) -> list[tuple[str, str]]:
        return [
            (r["attname"], r["type"])
            for r in rows(
                dsn,
                "SELECT attname, format_type(atttypid, atttypmod) AS type FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
                "ORDER BY attnum",
                (rel,),
            )
        ]

    hot = columns("awa_fast.jobs")
    assert columns("awa_fast.jobs_done") == hot
    assert columns("awa_fast.dlq")[: len(hot)] == hot
    assert [c.strip() for c in sql.ALL_COLUMNS.split(",")] == [name for name, _ in hot]
    for fn in ("check_inserted_keys", "move_updated_finished"):
        body = one(dsn, "SELECT prosrc FROM pg_proc WHERE oid = %s::regproc", (f"awa_fast.{fn}",))
        listed = set(re.findall(r"\w+", body.split("INSERT INTO awa_fast.jobs_done", 1)[1]))
        missing = [name for name, _ in hot if name not in listed]
        assert missing == [], (fn, missing)


def test_a_statement_naming_one_slice_keeps_counts_and_holds(dsn):
    """Migration 023: an INSERT, DELETE or TRUNCATE that names a slice (not jobs_done) keeps
    done_counts and unique_holds right: jobs_done's statement triggers fire only for statements
    naming jobs_done itself, so these left both as they were. A key another finished job holds
    is refused as through jobs_done."""

    def state(conn) -> tuple:
        return conn.execute(
            "SELECT (SELECT coalesce(sum(n), 0) FROM awa_fast.done_counts), "
            "(SELECT count(*) FROM awa_fast.jobs_done), "
            "(SELECT array_agg(unique_key ORDER BY unique_key) FROM awa_fast.unique_holds)"
        ).fetchone()

    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = [
            r[0]
            for r in conn.execute(
                "INSERT INTO awa_fast.jobs (kind, state, finalized_at, unique_key, unique_states) "
                "SELECT 'k', 'completed', now(), k, 31 "
                "FROM unnest(ARRAY['\\x01aa', '\\x01bb', '\\x01cc']::bytea[]) k RETURNING id"
            )
        ]
        (slice_name,) = conn.execute(
            "SELECT DISTINCT tableoid::regclass::text FROM awa_fast.jobs_done"
        ).fetchone()
        assert state(conn) == (3, 3, [b"\x01\xaa", b"\x01\xbb", b"\x01\xcc"])
        conn.execute(f"DELETE FROM {slice_name} WHERE id = %s", (ids[0],))
        assert state(conn) == (2, 2, [b"\x01\xbb", b"\x01\xcc"])
        copy_row = (
            f"INSERT INTO {slice_name} (id, kind, queue, args, state, finalized_at, unique_key, "
            "unique_states) SELECT %s, 'k', 'default', '{}', 'completed', finalized_at, %s, 31 "
            f"FROM {slice_name} LIMIT 1"
        )
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(copy_row, (ids[-1] + 1, b"\x01\xbb"))  # job ids[1] holds it
        conn.execute(copy_row, (ids[-1] + 2, b"\x01\xdd"))
        assert state(conn) == (3, 3, [b"\x01\xbb", b"\x01\xcc", b"\x01\xdd"])
        conn.execute(f"TRUNCATE {slice_name}")
        assert state(conn) == (0, 0, None)


def test_one_statement_finishing_many_rows_moves_them_with_one_insert(dsn):
    """Migration 019: an UPDATE that finishes 2,000 rows (an admin statement; ``drain_queue``
    and a batch cancel are such statements too) moves them with one INSERT into the slices, so
    jobs_done's statement trigger runs once and writes done_counts once. Per row, as the row
    trigger did it, every row upserted the same done_counts row again in the same transaction
    and the statement's cost grew faster than its rows. A row whose handler still runs stays in
    the hot table; every moved row holds its key."""
    n = 2000
    with psycopg.connect(dsn) as conn:  # one transaction: its own statistics are readable
        conn.execute("SET LOCAL track_functions = 'pl'")
        conn.execute(
            "INSERT INTO awa_fast.jobs (kind, queue, unique_key, unique_states) "
            "SELECT 'k', 'bulk', int4send(g), 255 FROM generate_series(1, %s) g",
            (n,),
        )
        conn.execute(
            "UPDATE awa_fast.jobs SET state = 'running', heartbeat_at = now() "
            "WHERE id = (SELECT min(id) FROM awa_fast.jobs)"
        )
        conn.execute("UPDATE awa_fast.jobs SET state = 'cancelled', finalized_at = now()")
        calls, counts_written = conn.execute(
            "SELECT pg_stat_get_xact_function_calls('awa_fast.done_inserted'::regproc), "
            "pg_stat_get_xact_tuples_inserted('awa_fast.done_counts'::regclass) "
            "+ pg_stat_get_xact_tuples_updated('awa_fast.done_counts'::regclass)"
        ).fetchone()
        conn.commit()
    assert (calls, counts_written) == (1, 1)
    assert rows(dsn, "SELECT state::text, count(*) FROM awa_fast.jobs GROUP BY 1") == [
        {"state": "cancelled", "count": 1}
    ]
    assert one(dsn, "SELECT count(*) FROM awa_fast.jobs_done WHERE state = 'cancelled'") == n - 1
    assert one(dsn, "SELECT sum(n) FROM awa_fast.done_counts WHERE queue = 'bulk'") == n - 1
    assert one(dsn, "SELECT count(*) FROM awa_fast.unique_holds") == n - 1


def test_statements_that_update_listed_rows_probe_the_hot_table_by_id(dsn):
    """ADR 017: every statement that picks rows in a CTE (or takes a batch of ids) and then
    writes them finds them in the hot table by ``id = ANY(...)``, even when the statistics say
    the table is empty and a nested loop over it looks cheapest (the soak's pathology)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE awa_fast.jobs")  # empty: the planner believes it stays tiny
    batch = ([1, 2], [1, 1])
    rescue = {
        "stale_ms": 1000,
        "limit": 100,
        "only": None,
        "consequence_kinds": [],
        "known_kinds": [],
        "own": [],
    }
    statements = {
        "claim": (
            sql.CLAIM,
            {"queue": "q", "kinds": ["k"], "limit": 512, "deadline_ms": 0},
        ),
        "complete": (sql.COMPLETE_MANY, batch),
        "complete with follow-ups": (
            sql.COMPLETE_MANY_WITH_FOLLOW_UPS,
            None,
        ),
        "heartbeat": (sql.HEARTBEAT, ([1, 2], [1, 1], [None, None])),
        "promote": (sql.PROMOTE, {"stale_ms": 1000, "limit": 4096}),
        "rescue": (sql.RESCUE, rescue),
        "rescue callbacks": (sql.RESCUE_CALLBACKS, rescue),
        "age priorities": (sql.AGE_PRIORITIES, {"queue": "q", "interval_ms": 1000, "limit": 10}),
    }
    for name, (statement, params) in statements.items():
        if params is None:
            assert "j.id = ANY(ARRAY(SELECT b.id FROM b))" in statement, name
            continue
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
            conn.execute("SET enable_hashjoin = off")
            conn.execute("SET enable_mergejoin = off")
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement, params))
        assert "id = ANY ((InitPlan" in plan, f"{name}:\n{plan}"


# -- the hot table's vacuum ---------------------------------------------------------------------


async def test_the_leaders_vacuum_reclaims_the_hot_tables_dead_rows(client, dsn):
    ids = [j.id for j in await client.insert_many([Item(i) for i in range(3000)])]
    finish(dsn, ids)  # every row moved to jobs_done: the hot table holds dead rows only
    assert dead_tuples(dsn, "awa_fast.jobs") >= 3000
    m = maintenance(client, hot_vacuum_dead_rows=0)
    assert await m.vacuum_hot() and m.counts["hot_vacuums"] == 1
    assert dead_tuples(dsn, "awa_fast.jobs") == 0


@pytest.mark.parametrize("reset", ["crash recovery", "pg_stat_reset"])
async def test_the_leader_vacuums_dead_rows_that_reset_statistics_no_longer_count(
    own_server, reset
):
    """Crash recovery (and pg_stat_reset) zero the hot table's statistics, its dead-row count
    included, but not its dead rows: on a quiet database the threshold would never be reached
    again. A pass that finds statistics which have seen no vacuum vacuums once."""
    dsn = own_server.awa_dsn

    async def dead_rows_finished(n: int) -> None:
        c = awa.AsyncClient(dsn)
        try:
            finish(dsn, [j.id for j in await c.insert_many([Item(i) for i in range(n)])])
        finally:
            await c.close()

    def pass_(c) -> Maintenance:  # the default threshold (5,000 dead rows)
        return maintenance(c)

    c = awa.AsyncClient(dsn)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM awa_fast.jobs")  # the statistics have seen a vacuum
        await dead_rows_finished(2000)  # counted twice: the UPDATE's old version and the move
        assert not await pass_(c).vacuum_hot()  # 4,000 counted: below the threshold
    finally:
        await c.close()
    assert dead_tuples(dsn, "awa_fast.jobs") >= 2000
    if reset == "crash recovery":
        await asyncio.to_thread(own_server.restart, "immediate")
    else:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_reset()")
    assert one(
        dsn,
        "SELECT n_dead_tup + vacuum_count + autovacuum_count FROM pg_stat_user_tables "
        "WHERE relid = 'awa_fast.jobs'::regclass",
    ) in (0, None)
    assert dead_tuples(dsn, "awa_fast.jobs") >= 2000  # the rows outlived their count
    c = awa.AsyncClient(dsn)
    try:
        m = pass_(c)
        assert await m.vacuum_hot() and m.counts["hot_vacuums"] == 1
        assert dead_tuples(dsn, "awa_fast.jobs") == 0
        assert not await m.vacuum_hot()  # the statistics have seen it now
    finally:
        await c.close()


def test_the_slices_are_analyzed_from_300_rows(dsn):
    """Migrations 015 and 017: an ANALYZE holds a snapshot while it samples, and that snapshot
    keeps every VACUUM of the hot table from removing anything (ADR 016). Autovacuum analyzes
    the slices and unique_holds as usual (015's "never" is reset), but every column and the
    slices' expression index have a statistics target of 1: 300 sampled rows."""
    slices = [
        r["inhrelid"]
        for r in rows(
            dsn,
            "SELECT inhrelid::regclass::text AS inhrelid FROM pg_inherits "
            "WHERE inhparent = 'awa_fast.jobs_done'::regclass",
        )
    ]
    assert len(slices) == 64
    for rel in [*slices, "awa_fast.unique_holds"]:
        opts = one(dsn, "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", (rel,))
        assert "autovacuum_analyze_threshold" not in str(opts), rel
    targets = rows(
        dsn,
        """SELECT a.attrelid::regclass::text AS rel, a.attname, a.attstattarget FROM pg_attribute a
           WHERE a.attnum > 0 AND NOT a.attisdropped AND (
                 a.attrelid IN (SELECT inhrelid FROM pg_inherits
                                WHERE inhparent = 'awa_fast.jobs_done'::regclass)
              OR a.attrelid = 'awa_fast.unique_holds'::regclass
              OR a.attrelid IN (SELECT indexrelid FROM pg_index WHERE indexprs IS NOT NULL
                                AND indrelid IN (SELECT inhrelid FROM pg_inherits
                                    WHERE inhparent = 'awa_fast.jobs_done'::regclass)))""",
    )
    assert [t for t in targets if t["attstattarget"] != 1] == []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO awa_fast.jobs_done (id, kind, state, finalized_at) "
            "SELECT nextval('awa_fast.jobs_id_seq'), 'k', 'completed', now() "
            "FROM generate_series(1, 50000)"
        )
        slot = conn.execute(
            "SELECT tableoid::regclass::text FROM awa_fast.jobs_done LIMIT 1"
        ).fetchone()[0]
        notes: list[str] = []
        conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
        conn.execute(f"ANALYZE VERBOSE {slot}")
        conn.execute("TRUNCATE awa_fast.jobs_done")
    assert any("300 rows in sample" in n for n in notes), notes


def test_one_failed_job_is_retried_without_reading_every_slice(dsn):
    """With the statistics autovacuum gathers (300 rows, migration 017) and default planner
    settings, retrying or dead-lettering one failed job probes the slices by id: it does not
    read every slice (which it did with no statistics at all, migration 015)."""
    import re

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO awa_fast.jobs_done (id, kind, queue, state, finalized_at)
            SELECT nextval('awa_fast.jobs_id_seq'), 'k', 'q',
                   (CASE WHEN g % 100 = 7 THEN 'failed' ELSE 'completed' END)::awa_fast.job_state,
                   now() - interval '3 hours' + g * interval '50 microseconds'
            FROM generate_series(1, 200000) g""")
        conn.execute("ANALYZE awa_fast.jobs_done")  # what autovacuum does, with 017's targets
        failed = conn.execute(
            "SELECT max(id) FROM awa_fast.jobs_done WHERE state = 'failed'"
        ).fetchone()[0]
    try:
        with psycopg.connect(dsn, prepare_threshold=None) as conn:
            for statement, params in [
                (sql.RETRY_JOB, {"id": failed, "stale_ms": 90_000}),
                (sql.DLQ_MOVE_ONE, {"id": failed, "reason": "r", "kind": None, "queue": None}),
            ]:
                plan = "\n".join(
                    r[0] for r in conn.execute("EXPLAIN (ANALYZE, TIMING OFF) " + statement, params)
                )
                conn.rollback()
                scanned = re.findall(r"Seq Scan on jobs_done_\w+ .*actual rows=([\d.]+)", plan)
                assert sum(int(float(n)) for n in scanned) < 1000, plan
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE awa_fast.jobs_done")


def heap_bytes(dsn: str) -> int:
    return one(dsn, "SELECT pg_relation_size('awa_fast.jobs')")


async def test_the_hot_tables_empty_pages_are_cut_off_only_when_it_is_large(client, dsn):
    """Migration 016, ADR 016: cutting off the hot table's empty tail takes an ACCESS EXCLUSIVE
    lock that stops every claim, insert and completion, and at a steady rate the table grows the
    pages back at once. A plain VACUUM (what autovacuum runs) and the leader's vacuum of a small
    table keep them; the leader cuts them off once the heap is larger than
    ``hot_vacuum_truncate_bytes`` (a backlog drained)."""
    ids = [j.id for j in await client.insert_many([Item(i) for i in range(3000)])]
    finish(dsn, ids)  # the table's tail is empty now
    size = heap_bytes(dsn)
    assert size > 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM awa_fast.jobs")
    assert heap_bytes(dsn) == size
    small = maintenance(client, hot_vacuum_dead_rows=0, hot_vacuum_truncate_bytes=size)
    assert await small.vacuum_hot()
    assert (small.counts["hot_truncations"], heap_bytes(dsn)) == (0, size)
    large = maintenance(client, hot_vacuum_dead_rows=0, hot_vacuum_truncate_bytes=size - 1)
    assert await large.vacuum_hot()
    assert large.counts["hot_truncations"] == 1
    assert heap_bytes(dsn) < size


async def test_a_cut_that_cannot_take_its_lock_is_not_asked_for_again_at_once(client, dsn):
    """A reader in a transaction holds the hot table, so the vacuum cannot take the ACCESS
    EXCLUSIVE lock to cut off the empty tail: PostgreSQL gives up after 5 s and the heap stays
    above the limit. The next vacuums do not ask again within ``hot_vacuum_truncate_retry_ms``
    (each ask may wait 5 s without vacuuming); once it passed, the next one cuts."""
    ids = [j.id for j in await client.insert_many([Item(i) for i in range(3000)])]
    finish(dsn, ids)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM awa_fast.jobs")  # keeps the pages, records their number
    size = heap_bytes(dsn)
    m = maintenance(client, hot_vacuum_dead_rows=0, hot_vacuum_truncate_bytes=size - 1)
    with psycopg.connect(dsn) as reader:
        reader.execute("SELECT count(*) FROM awa_fast.jobs")  # ACCESS SHARE until it ends
        assert await m.vacuum_hot()
        assert (m.counts["hot_truncations"], heap_bytes(dsn)) == (1, size)
    assert await m.vacuum_hot()  # the lock is free now, but the retry time has not passed
    assert (m.counts["hot_vacuums"], m.counts["hot_truncations"], heap_bytes(dsn)) == (2, 1, size)
    # the retry time passed: it asks even with no dead rows left (a drained, quiet queue)
    m.config.hot_vacuum_truncate_retry_ms = 0
    m.config.hot_vacuum_dead_rows = 10**9
    assert await m.vacuum_hot()
    assert m.counts["hot_truncations"] == 2
    assert heap_bytes(dsn) < size
    assert not await m.vacuum_hot()  # below the limit and no dead rows: nothing to do


async def test_a_cut_whose_vacuum_raises_is_not_asked_for_again_at_once(client, dsn):
    """The truncating VACUUM itself fails (a statement_timeout while it waits for the lock):
    the next pass does not ask again within the retry time."""
    ids = [j.id for j in await client.insert_many([Item(i) for i in range(3000)])]
    finish(dsn, ids)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM awa_fast.jobs")
    size = heap_bytes(dsn)
    m = maintenance(client, hot_vacuum_dead_rows=0, hot_vacuum_truncate_bytes=size - 1)
    m.vacuum.conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await m.vacuum.conn.execute("SET statement_timeout = '1s'")
    with psycopg.connect(dsn) as reader:
        reader.execute("SELECT count(*) FROM awa_fast.jobs")
        with pytest.raises(psycopg.errors.QueryCanceled):
            await m.vacuum_hot()
    assert await m.vacuum_hot()
    assert (m.counts["hot_truncations"], heap_bytes(dsn)) == (1, size)
    await m.vacuum.conn.close()


def test_the_tables_every_completion_writes_keep_their_pages(dsn):
    """Migrations 016 and 018: cutting off a table's empty tail takes an ACCESS EXCLUSIVE lock
    that every completion would wait for. The hot table, done_counts (every completing
    statement upserts it) and unique_holds (every completion of a unique job) keep their
    pages under a plain VACUUM, which is what autovacuum runs."""
    for table in ("awa_fast.done_counts", "awa_fast.unique_holds"):
        assert "vacuum_truncate=false" in str(
            one(dsn, "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", (table,))
        ), table
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO awa_fast.unique_holds (unique_key, job_id, slot) "
            "SELECT int8send(g), g, 0 FROM generate_series(1, 20000) g"
        )
        size = conn.execute("SELECT pg_relation_size('awa_fast.unique_holds')").fetchone()[0]
        conn.execute("DELETE FROM awa_fast.unique_holds WHERE slot = 0")
        conn.execute("VACUUM awa_fast.unique_holds")
        after = conn.execute("SELECT pg_relation_size('awa_fast.unique_holds')").fetchone()[0]
    assert size > 0 and after == size


def test_the_fold_skips_counter_rows_a_writer_holds(dsn):
    """A transaction that finishes jobs in a bucket the fold takes (one opened minutes ago, its
    now() old) holds that bucket's counter row of its backend: the fold waited on it, stalling
    the whole prune pass, and with two such rows the two deadlocked (a breaker's repro). The
    fold now skips such a row and folds it in a later pass; the counts stay exact."""
    finish = (
        "INSERT INTO awa_fast.jobs (kind, queue, state, finalized_at) "
        "VALUES ('k', %s, 'completed', date_trunc('minute', now()) - interval '10 minutes')"
    )
    total = "SELECT COALESCE(sum(n), 0) FROM awa_fast.done_counts WHERE queue IN ('sk1', 'sk2')"
    with psycopg.connect(dsn, autocommit=True) as writer:
        writer.execute(finish, ("sk1",))
        writer.execute(finish, ("sk2",))
        writer.execute("BEGIN")
        writer.execute(finish, ("sk2",))  # holds its backend's sk2 row until it commits
        with psycopg.connect(dsn) as leader:
            leader.execute("SET lock_timeout = '2s'")  # waiting on the writer would raise
            slots = leader.execute(sql.LOCK_FOLDABLE_SLOTS).fetchone()[0]
            leader.execute(sql.FOLD_COUNTS, {"slots": slots})
            leader.commit()
        held = one(
            dsn,
            "SELECT count(*) FROM awa_fast.done_counts WHERE queue = 'sk2' AND backend <> 0",
        )
        assert held == 1  # skipped; sk1's row was folded
        assert one(dsn, total) == 2  # the writer's third row is not committed yet
        writer.execute("COMMIT")
    with psycopg.connect(dsn) as leader:
        slots = leader.execute(sql.LOCK_FOLDABLE_SLOTS).fetchone()[0]
        leader.execute(sql.FOLD_COUNTS, {"slots": slots})
    assert one(dsn, total) == 3
    assert one(dsn, "SELECT count(*) FROM awa_fast.done_counts WHERE queue IN ('sk1', 'sk2')") == 2


# -- a prune pass's steps are independent, and never wait long on a lock -----------------------


async def test_a_failing_prune_step_is_reported_and_the_slices_still_expire(client, dsn):
    job = await client.insert(Item(0))
    finish(dsn, [job.id], age="5 hours")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION public.refuse_delete() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by test'; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse BEFORE DELETE ON awa_fast.workers "
            "FOR EACH STATEMENT EXECUTE FUNCTION public.refuse_delete()"
        )
    try:
        m = maintenance(client, completed_retention_hours=1)
        with pytest.raises(PassIncomplete, match=r"worker presence \(RaiseException\)"):
            await m.prune()
        # the failed first step did not keep the slice from expiring
        assert one(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE id = %s", (job.id,)) == 0
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP TRIGGER refuse ON awa_fast.workers")
            conn.execute("DROP FUNCTION public.refuse_delete()")


async def test_a_prune_skips_a_dlq_row_another_session_holds(client, dsn):
    held, refused, free = [await client.insert(Item(n)) for n in (1, 2, 3)]
    finish(dsn, [held.id, refused.id, free.id], state="failed")
    for job in (held, refused, free):
        assert await client.move_failed_to_dlq(job.id)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE awa_fast.dlq SET dlq_at = now() - interval '40 days'")
        # one row a trigger refuses: the bulk delete fails and the step goes row by row
        conn.execute(
            "CREATE FUNCTION public.refuse_one() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN IF OLD.id = {refused.id} THEN RAISE EXCEPTION 'kept by test'; END IF; "
            "RETURN OLD; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse_one BEFORE DELETE ON awa_fast.dlq "
            "FOR EACH ROW EXECUTE FUNCTION public.refuse_one()"
        )
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as locker:
            await locker.execute("SELECT 1 FROM awa_fast.dlq WHERE id = %s FOR UPDATE", (held.id,))
            # before, the step waited on the held row for as long as it was held, and then
            # (row by row, past the pass's lock timeout) kept every row
            assert await asyncio.wait_for(maintenance(client).prune(), 10) == 1
            await locker.rollback()
        assert await client.get_dlq_job(free.id) is None
        assert (await client.get_dlq_job(held.id)).job.id == held.id
        assert (await client.get_dlq_job(refused.id)).job.id == refused.id
        assert await maintenance(client).prune() == 1  # released: the next pass takes it
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP TRIGGER refuse_one ON awa_fast.dlq")
            conn.execute("DROP FUNCTION public.refuse_one()")


def test_a_row_by_row_retention_batch_reads_its_class_and_probes_by_id(dsn):
    """A batch of the row-by-row retention (a queue's shorter retention, or any past the
    ring's span: ADR 029) reads only its class's slices and deletes its rows by id: it had
    joined them against every finished row, a scan of the whole history each batch."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"""
            INSERT INTO awa_fast.jobs_done (id, kind, queue, state, attempt, run_at, created_at,
                                            finalized_at)
            SELECT nextval('awa_fast.jobs_id_seq'), 'k', 'q',
                   (CASE WHEN g % 2 = 0 THEN 'failed' ELSE 'completed' END)::awa_fast.job_state,
                   1, now() - interval '5 days', now() - interval '5 days',
                   now() - (g % 100) * interval '1 hour'
            FROM generate_series(1, {HISTORY}) g""")
        conn.execute("ANALYZE awa_fast.jobs_done")
    config = MaintenanceConfig(completed_retention_hours=72, failed_retention_hours=168)
    for params in config.queue_retention_params():
        other = "jobs_done_f" if params["states"] == ["completed"] else "jobs_done_c"
        plan = plan_of(dsn, sql.PRUNE_QUEUE_RETENTION, {**params, "limit": 1000})
        assert other not in plan, plan
        assert "Hash" not in plan and "Index Cond: (id = ANY" in plan, plan
