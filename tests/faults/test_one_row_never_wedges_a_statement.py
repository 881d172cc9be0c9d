"""Issue 9, class 1: one row must never wedge a queue, a sweep or a batch.

Each test puts one bad row (a unique collision, or a trigger added outside awa-fast that fails
that row's statement) among good ones on a real PostgreSQL, runs the real statement path, and
asserts the final rows: the bad row gets its documented outcome (docs/architecture.md, "Failure
path of every statement") and the others proceed. The deadlock tests use two real connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging

import psycopg
import pytest

import awa_fast as awa
from awa_fast import bulk, enqueue, sql
from awa_fast.requests import prepare
from awa_fast.worker import heartbeat as heartbeat_module
from awa_fast.worker.context import JobContext
from awa_fast.worker.dispatcher import Dispatcher
from awa_fast.worker.executor import COMPLETED, Outcome
from awa_fast.worker.finalize_request import Finalized, FinalizeRequest
from awa_fast.worker.finalizer import Finalizer
from awa_fast.worker.heartbeat import Heartbeat
from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig
from tests.support import (
    FAST,
    exploding_inserts,
    failing_rows,
    job_row,
    passes,
    scalar,
    until,
    wait_lock_waiter,
)

pytestmark = pytest.mark.usefixtures("clean")

RUNNING_ONLY = {"states": 1 << 2}  # the key is held only while running


@dataclasses.dataclass
class Held:
    n: int = 0


@dataclasses.dataclass
class Plain:
    n: int = 0


async def _rows(dsn: str, where: str = "true", params=None) -> dict[int, dict]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute(f"SELECT * FROM awa_fast.jobs_all WHERE {where} ORDER BY id", params)
        return {r["id"]: r for r in await cur.fetchall()}


async def _exec(dsn: str, query: str, params=None) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(query, params)


async def _make_running(
    dsn: str, ids: list[int], *, stale: bool = False, final: bool = False
) -> None:
    """Put jobs in ``running`` under run lease 1 as a claim would (stale: heartbeat long ago;
    final: on their last attempt)."""
    await _exec(
        dsn,
        """
        UPDATE awa_fast.jobs SET state = 'running', run_lease = 1, attempt = 1,
            max_attempts = CASE WHEN %(final)s THEN 1 ELSE max_attempts END,
            attempted_at = now(),
            heartbeat_at = now() - CASE WHEN %(stale)s THEN interval '1 hour' ELSE '0' END
        WHERE id = ANY(%(ids)s)""",
        {"ids": ids, "stale": stale, "final": final},
    )


def _maintenance(client, **config) -> Maintenance:
    # Kinds known to have no failure consequence: a final-attempt rescue fails them.
    return Maintenance(
        client.database_url,
        client.pool,
        MaintenanceConfig(heartbeat_staleness_ms=1000, **config),
        known_kinds=lambda: ["plain", "explode"],
    )


async def _all_in(dsn: str, ids: list[int], state: str) -> bool:
    return await scalar(
        dsn,
        "SELECT count(*) FROM awa_fast.jobs_all WHERE id = ANY(%s) AND state = %s",
        (ids, state),
    ) == len(ids)


# -- claim ------------------------------------------------------------------------------------


async def test_class1_claim_does_not_wedge_on_running_only_unique_mask(dsn, client):
    # Two available jobs share a key their mask holds only in 'running': before the fix the
    # claim took both in one UPDATE, hit idx_awa_fast_jobs_unique and retried forever.
    release = asyncio.Event()
    running_together = []

    @client.task(Held)
    async def held(job):
        running_together.append(
            await scalar(
                dsn,
                "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'held' AND state = 'running'",
            )
        )
        await release.wait()

    @client.task(Plain)
    async def plain(job):
        return None

    dups = [await client.insert(Held(1), unique_opts=RUNNING_ONLY) for _ in range(2)]
    plains = [(await client.insert(Plain(i))).id for i in range(6)]
    await client.start([("default", 8)], **FAST)
    # The queue drains around the duplicates: the plain jobs complete ...
    await until(lambda: _all_in(dsn, plains, "completed"), client, what="the plain jobs")
    # ... one duplicate runs, the other waits available for the key.
    states = sorted(r["state"] for r in (await _rows(dsn, "kind = 'held'")).values())
    assert states == ["available", "running"]
    release.set()
    await until(
        lambda: _all_in(dsn, [d.id for d in dups], "completed"),
        client,
        what="both duplicates, one after the other",
    )
    assert running_together == [1, 1]  # never two running attempts holding the key


async def test_class1_claim_takes_one_row_per_key_and_skips_held_keys(dsn, client):
    a = await client.insert(Held(1), unique_opts=RUNNING_ONLY)
    b = await client.insert(Held(1), unique_opts=RUNNING_ONLY)
    c = await client.insert(Held(2), unique_opts=RUNNING_ONLY)
    p = await client.insert(Plain(1))
    params = {"queue": "default", "limit": 10, "deadline_ms": 0, "kinds": ["held", "plain"]}
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        first = [r[0] for r in await (await conn.execute(sql.CLAIM, params)).fetchall()]
        again = [r[0] for r in await (await conn.execute(sql.CLAIM, params)).fetchall()]
    assert sorted(first) == [a.id, c.id, p.id] and again == []  # b waits: a holds the key
    assert (await job_row(dsn, b.id))["state"] == "available"


async def test_class1_claim_isolates_a_row_its_update_fails(dsn, client):
    @client.task(Plain)
    async def plain(job):
        return None

    async with failing_rows(dsn, "NEW.kind = 'explode' AND NEW.state = 'running'", event="UPDATE"):
        bad = await client.insert({"x": 1}, kind="explode", priority=1)  # claimed first
        plains = [(await client.insert(Plain(i))).id for i in range(5)]
        await client.start([("default", 4)], **FAST)
        await until(lambda: _all_in(dsn, plains, "completed"), client, what="the plain jobs")
        await client.shutdown()
    row = await job_row(dsn, bad.id)
    assert row["state"] == "available" and row["attempt"] == 0  # left as it was, not lost


def _dispatcher(client) -> Dispatcher:
    """A dispatcher of queue 'default' with 4 slots whose claims a test makes itself."""
    return Dispatcher(
        "default",
        pool_getter=client.pool,
        spawn=lambda row, sent: None,
        max_workers=4,
        deadline_ms=0,
        claim_batch_size=4,
        poll_interval_s=1.0,
        kinds=["explode", "plain"],
    )


async def test_class1_a_row_every_claim_leaves_available_is_warned_about_once(dsn, client, caplog):
    # The refused row stays at the head of its queue, so every claim meets it again: one
    # warning for the bulk statement and one for the row, not two per claim.
    bad = await client.insert({"x": 1}, kind="explode", priority=1)
    dispatcher = _dispatcher(client)
    async with failing_rows(dsn, "NEW.kind = 'explode' AND NEW.state = 'running'", event="UPDATE"):
        with caplog.at_level(logging.WARNING, logger="awa_fast.bulk"):
            for i in range(3):
                good = await client.insert(Plain(i))
                claimed = await dispatcher._claim(10)
                assert [r[0] for r in claimed] == [good.id]
    warned = _warnings(caplog)
    assert len(warned) == 2, warned
    assert "claim from queue 'default': the bulk statement failed" in warned[0]
    assert f"row {bad.id} left unchanged" in warned[1]
    assert (await job_row(dsn, bad.id))["state"] == "available"


async def test_class1_a_claims_worth_of_refused_rows_does_not_hide_the_queue_behind_them(
    dsn, client
):
    # The row-by-row redo took the same head candidates every claim: with as many refused rows
    # at the head as the claim takes, the jobs behind them were never claimed.
    bad = [(await client.insert({"x": i}, kind="explode", priority=1)).id for i in range(4)]
    good = [(await client.insert(Plain(i))).id for i in range(6)]
    dispatcher = _dispatcher(client)
    claimed: list[list[int]] = []
    async with failing_rows(dsn, "NEW.kind = 'explode' AND NEW.state = 'running'", event="UPDATE"):
        for _ in range(3):
            claimed.append([r[0] for r in await dispatcher._claim(4)])
        # one of the refused rows is fixed: a later claim takes it, though the rest still fail
        await _exec(dsn, "UPDATE awa_fast.jobs SET kind = 'plain' WHERE id = %s", (bad[0],))
        claimed.append([r[0] for r in await dispatcher._claim(4)])
    assert all(len(c) <= 4 for c in claimed), claimed  # never more than its free slots
    assert sorted(i for c in claimed[:3] for i in c) == good, claimed
    assert claimed[3] == [bad[0]], claimed
    for job_id in bad[1:]:
        assert (await job_row(dsn, job_id))["state"] == "available"


# -- promote ----------------------------------------------------------------------------------


async def test_class1_promote_isolates_a_colliding_and_a_failing_row(dsn, client):
    async with failing_rows(
        dsn, "NEW.kind = 'explode' AND NEW.state = 'available'", event="UPDATE"
    ):
        holder = await client.insert(Held(7), unique_opts={"states": 1 << 1})
        later = {"run_at": "2000-01-01T00:00:00+00:00"}  # due at once
        scheduled = [await client.insert(Plain(i), **later) for i in range(3)]
        await _exec(
            dsn,
            "UPDATE awa_fast.jobs SET state = 'scheduled' WHERE id = ANY(%s)",
            ([j.id for j in scheduled],),
        )
        # A scheduled duplicate (scheduled is outside its mask) and a row a trigger rejects.
        dup = await client.insert(
            Held(7), unique_opts={"states": 1 << 1}, run_at="2999-01-01T00:00:00+00:00"
        )
        bad = await client.insert({"x": 1}, kind="explode", run_at="2999-01-01T00:00:00+00:00")
        await _exec(
            dsn,
            "UPDATE awa_fast.jobs SET run_at = now() - interval '1 second' WHERE id = ANY(%s)",
            ([dup.id, bad.id],),
        )
        m = _maintenance(client)
        promoted = await m.promote()
    rows = await _rows(dsn)
    assert promoted == 3
    assert m.stuck_rows("promote") == 1  # the refused row; the duplicate had its outcome
    assert all(rows[j.id]["state"] == "available" for j in scheduled)
    assert rows[dup.id]["state"] == "cancelled"
    assert "duplicate" in rows[dup.id]["errors"][-1]["error"]
    assert rows[bad.id]["state"] == "scheduled"  # left due, retried next pass
    assert rows[holder.id]["state"] == "available"


async def test_class1_a_row_promote_leaves_due_every_pass_is_warned_about_once(dsn, client, caplog):
    # The row stays due, so every pass (4 a second) meets it again: one warning for the bulk
    # statement and one for the row, then DEBUG; a second bad row is a new problem.
    async def make_due(job) -> None:
        await _exec(
            dsn,
            "UPDATE awa_fast.jobs SET run_at = now() - interval '1 second' WHERE id = %s",
            (job.id,),
        )

    later = "2999-01-01T00:00:00+00:00"
    bad = await client.insert({"x": 1}, kind="explode", run_at=later)
    await make_due(bad)
    m = _maintenance(client)
    async with failing_rows(
        dsn, "NEW.kind = 'explode' AND NEW.state = 'available'", event="UPDATE"
    ):
        with caplog.at_level(logging.WARNING, logger="awa_fast.bulk"):
            for _ in range(3):
                assert await m.promote() == 0
            first = _warnings(caplog)
            caplog.clear()
            bad2 = await client.insert({"x": 2}, kind="explode", run_at=later)
            await make_due(bad2)
            assert await m.promote() == 0
            second = _warnings(caplog)
    assert len(first) == 2, first
    assert "promote: the bulk statement failed" in first[0]
    assert f"promote: row {bad.id} left unchanged" in first[1]
    assert len(second) == 1 and f"promote: row {bad2.id} left unchanged" in second[0], second
    assert (await job_row(dsn, bad.id))["state"] == "scheduled"  # still due, tried every pass


async def test_class1_a_batch_of_refused_rows_at_the_head_does_not_hide_the_due_rows_behind(
    dsn, client, caplog
):
    # A batch's worth (5) of rows a trigger refuses are due first: the bulk statement fails
    # and the row-by-row redo took the same 5 head rows every pass, so the 3 good rows behind
    # them stayed scheduled for ever (and, warned once, silently). The redo leaves the rows
    # it already left unchanged out of its fresh candidates: the good rows go by the second pass.
    later = "2999-01-01T00:00:00+00:00"
    bad = [await client.insert({"x": i}, kind="explode", run_at=later) for i in range(5)]
    good = [await client.insert(Plain(i), run_at=later) for i in range(3)]
    await _exec(
        dsn,
        "UPDATE awa_fast.jobs SET run_at = now() - CASE WHEN kind = 'explode'"
        " THEN interval '1 hour' ELSE interval '1 minute' END WHERE id = ANY(%s)",
        ([j.id for j in bad + good],),
    )
    m = _maintenance(client, promote_batch_size=5)
    async with failing_rows(
        dsn, "NEW.kind = 'explode' AND NEW.state = 'available'", event="UPDATE"
    ):
        with caplog.at_level(logging.WARNING, logger="awa_fast.bulk"):
            promoted = [await m.promote() for _ in range(3)]
    assert sum(promoted) == 3 and promoted[2] == 0, promoted
    assert await _all_in(dsn, [j.id for j in good], "available")
    assert await _all_in(dsn, [j.id for j in bad], "scheduled")  # refused: left due
    # one warning per refused row (and one for the bulk statement), not one per pass
    assert len(_warnings(caplog)) == 6, _warnings(caplog)
    assert m.stuck_rows("promote") == 5  # what health_check reports for the promote loop


async def test_class1_a_remembered_refused_row_that_is_fixed_goes_through(dsn, client):
    # The rows a pass left unchanged are left out of its fresh candidates but retried apart
    # every pass: one the operator fixes is promoted although the bulk statement still fails.
    later = "2999-01-01T00:00:00+00:00"
    bad = [await client.insert({"x": i}, kind="explode", run_at=later) for i in range(5)]
    await _exec(
        dsn,
        "UPDATE awa_fast.jobs SET run_at = now() - interval '1 hour' WHERE id = ANY(%s)",
        ([j.id for j in bad],),
    )
    m = _maintenance(client, promote_batch_size=5)
    async with failing_rows(
        dsn, "NEW.kind = 'explode' AND NEW.state = 'available'", event="UPDATE"
    ):
        assert await m.promote() == 0
        assert m.stuck_rows("promote") == 5
        await _exec(dsn, "UPDATE awa_fast.jobs SET kind = 'plain' WHERE id = %s", (bad[2].id,))
        assert await m.promote() == 1
    assert (await job_row(dsn, bad[2].id))["state"] == "available"
    assert m.stuck_rows("promote") == 4


async def test_class1_stuck_rows_are_a_prometheus_gauge_of_the_leader(dsn, client):
    # What health_check reports per loop is also awa_fast_maintenance_stuck_rows{loop}: set
    # after every pass of the leader's loop, back to 0 when the process stops leading.
    from prometheus_client import REGISTRY

    def gauge() -> float | None:
        return REGISTRY.get_sample_value("awa_fast_maintenance_stuck_rows", {"loop": "promote"})

    later = "2999-01-01T00:00:00+00:00"
    bad = [await client.insert({"x": i}, kind="explode", run_at=later) for i in range(3)]
    await _exec(
        dsn,
        "UPDATE awa_fast.jobs SET run_at = now() - interval '1 hour' WHERE id = ANY(%s)",
        ([j.id for j in bad],),
    )
    async with failing_rows(
        dsn, "NEW.kind = 'explode' AND NEW.state = 'available'", event="UPDATE"
    ):

        @client.task(Plain)
        async def plain(job):
            return None

        await client.start([("default", 1)], **FAST)
        promote = passes(client, "promote")
        await until(lambda: gauge() == 3, promote, what="the gauge at 3 stuck rows")
        health = await client.health_check()
        assert health.leader and health.maintenance_loops["promote"].stuck_rows == 3
        await client.shutdown()
    assert gauge() == 0


async def test_one_rescue_pass_takes_every_stale_attempt_batch_after_batch(dsn, client):
    # A pass rescued one batch of 500 every heartbeat_rescue_interval_ms (30 s): what a crashed
    # launcher left running took minutes to come back (same class as the DLQ prune's batches).
    jobs = await client.insert_many([Plain(i) for i in range(1200)])
    await _make_running(dsn, [j.id for j in jobs], stale=True)
    rows = await _maintenance(client).rescue_running()
    assert len(rows) == 1200
    assert await _all_in(dsn, [j.id for j in jobs], "retryable")


async def test_class1_a_batch_of_refused_rows_does_not_hide_the_stale_attempts_behind(dsn, client):
    # Rescue takes its candidates by id, 500 a pass: 500 refused rows first, 3 good behind.
    bad = await client.insert_many([{"x": i} for i in range(500)], kind="explode")
    good = [await client.insert(Plain(i)) for i in range(3)]
    await _make_running(dsn, [j.id for j in bad + good], stale=True)
    m = _maintenance(client)
    async with failing_rows(
        dsn, "NEW.kind = 'explode' AND NEW.state = 'retryable'", event="UPDATE"
    ):
        rescued = [await m.rescue() for _ in range(2)]
    assert sorted(r[0] for rows in rescued for r in rows) == [j.id for j in good]
    assert await _all_in(dsn, [j.id for j in good], "retryable")
    assert await _all_in(dsn, [j.id for j in bad], "running")  # left stale, retried apart
    assert m.stuck_rows("rescue") == 500


async def test_class1_a_batch_of_refused_dlq_rows_does_not_hide_the_expired_rows_behind(
    dsn, client
):
    # DLQ prune takes its candidates unordered (the heap's order), 5 a pass here: the 5
    # entries a trigger refuses to delete come first, 3 expired entries behind them.
    await _exec(
        dsn,
        """INSERT INTO awa_fast.dlq (id, kind, queue, state, dlq_reason, original_run_lease,
                                     dlq_at)
           SELECT 20000000 + g, CASE WHEN g <= 5 THEN 'explode' ELSE 'plain' END, 'default',
                  'failed', 'exhausted', 1, now() - interval '40 days'
           FROM generate_series(1, 8) g ORDER BY g""",
    )
    m = Maintenance(
        client.database_url,
        client.pool,
        MaintenanceConfig(heartbeat_staleness_ms=1000, cleanup_batch_size=5),
    )
    async with failing_rows(dsn, "OLD.kind = 'explode'", event="DELETE", table="awa_fast.dlq"):
        pruned = [await m.prune() for _ in range(2)]
    assert sum(pruned) == 3, pruned
    kinds = await scalar(dsn, "SELECT array_agg(DISTINCT kind) FROM awa_fast.dlq")
    assert kinds == ["explode"]
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.dlq") == 5
    assert m.stuck_rows("prune") == 5


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- rescue and its dead-letter moves -----------------------------------------------------------


async def test_class1_rescue_dead_letters_every_row_despite_one_failing_move(dsn, client):
    # Before the fix the rescue committed 'failed' first and moved rows one by one afterwards:
    # the first failing move stranded every later row as failed in jobs (then pruned).
    await _exec(dsn, "INSERT INTO awa_fast.queue_meta (queue, dlq) VALUES ('dl', true)")
    jobs = [await client.insert(Plain(i), queue="dl") for i in range(2)]
    bad = await client.insert({"x": 1}, kind="explode", queue="dl")
    jobs += [await client.insert(Plain(i), queue="dl") for i in range(2, 5)]
    await _make_running(dsn, [j.id for j in jobs] + [bad.id], stale=True, final=True)
    async with failing_rows(dsn, "NEW.kind = 'explode'", table="awa_fast.dlq"):
        rescued = await _maintenance(client).rescue()
    assert len(rescued) == 6
    dlq = {r[0] for r in await _conn_fetch(dsn, "SELECT id FROM awa_fast.dlq")}
    assert dlq == {j.id for j in jobs}  # every good row, including those after the bad one
    row = await job_row(dsn, bad.id)
    assert row["state"] == "failed"
    assert row["errors"][-1]["error"].startswith("dead-letter move failed")


async def _conn_fetch(dsn, query):
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        return await (await conn.execute(query)).fetchall()


async def test_class1_rescue_isolates_a_row_its_update_fails(dsn, client):
    jobs = [await client.insert(Plain(i)) for i in range(3)]
    bad = await client.insert({"x": 1}, kind="explode")
    await _make_running(dsn, [j.id for j in jobs] + [bad.id], stale=True)
    async with failing_rows(
        dsn, "NEW.kind = 'explode' AND NEW.state = 'retryable'", event="UPDATE"
    ):
        rescued = await _maintenance(client).rescue()
    assert sorted(r[0] for r in rescued) == [j.id for j in jobs]
    rows = await _rows(dsn)
    assert all(rows[j.id]["state"] == "retryable" for j in jobs)
    assert rows[bad.id]["state"] == "running"  # left stale: the next pass tries it again


async def test_class1_a_row_rescue_leaves_stale_every_pass_is_warned_about_once(
    dsn, client, caplog
):
    bad = await client.insert({"x": 1}, kind="explode")
    await _make_running(dsn, [bad.id], stale=True)
    m = _maintenance(client)
    async with failing_rows(
        dsn, "NEW.kind = 'explode' AND NEW.state = 'retryable'", event="UPDATE"
    ):
        with caplog.at_level(logging.WARNING, logger="awa_fast.bulk"):
            for _ in range(3):
                assert await m.rescue() == []
    warned = _warnings(caplog)
    assert len(warned) == 2, warned
    assert f"rescue: row {bad.id} left unchanged" in warned[1]
    assert (await job_row(dsn, bad.id))["state"] == "running"


# -- prune and cron sweeps -----------------------------------------------------------------------


async def test_class1_prune_isolates_a_slice_its_truncate_fails(dsn, client):
    # Finished jobs are pruned a whole slice at a time (ADR 016): a slice whose TRUNCATE fails
    # is kept, the other expired slices are pruned.
    old = [await client.insert(Plain(i)) for i in range(3)]
    bad = await client.insert({"x": 1}, kind="explode")
    await _exec(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'completed', "
        "finalized_at = now() - interval '2 days' WHERE id = ANY(%s)",
        ([j.id for j in old],),
    )
    slice_ = await _finish_in_an_old_slice(dsn, bad.id)
    async with failing_truncate(dsn, slice_):
        assert await _maintenance(client).prune() == 3
    assert list(await _rows(dsn)) == [bad.id]  # kept; the others are gone


async def _finish_in_an_old_slice(dsn: str, job_id: int) -> str:
    """Complete the job 3 days ago (it moves to an expired slice); returns that slice."""
    await _exec(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'completed', "
        "finalized_at = now() - interval '3 days' WHERE id = %s",
        (job_id,),
    )
    ((slice_,),) = await _conn_fetch(
        dsn, f"SELECT tableoid::regclass::text FROM awa_fast.jobs_done WHERE id = {job_id}"
    )
    return slice_


async def test_class1_a_slice_whose_truncate_is_refused_every_pass_is_warned_about_once(
    dsn, client, caplog
):
    bad = await client.insert({"x": 1}, kind="explode")
    slice_ = await _finish_in_an_old_slice(dsn, bad.id)
    m = _maintenance(client)
    async with failing_truncate(dsn, slice_):
        with caplog.at_level(logging.WARNING, logger="awa_fast.maintenance"):
            for _ in range(3):
                assert await m.expire_slices() == 0
    warned = _warnings(caplog)
    assert len(warned) == 1, warned
    assert "finished slice" in warned[0] and "truncate refused" in warned[0]
    assert list(await _rows(dsn)) == [bad.id]  # kept every pass


async def test_a_slice_whose_truncate_is_refused_shows_in_health_check(dsn, client):
    """The rows of a slice whose truncate a trigger refuses every pass stay past retention:
    health_check reports them as the prune loop's ``stuck_rows`` until a pass truncates it
    (tester's report: the loop looked clean)."""
    bad = await client.insert({"x": 1}, kind="explode")
    slice_ = await _finish_in_an_old_slice(dsn, bad.id)

    async def prune_stuck() -> int:
        loop = (await client.health_check()).maintenance_loops.get("prune")
        return loop.stuck_rows if loop is not None else -1

    client.task(dict, kind="explode", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)(
        lambda job: None
    )
    async with failing_truncate(dsn, slice_):
        await client.start([("default", 1)], **FAST, cleanup_interval_ms=50)
        m = client.runtime.maintenance
        await until(
            lambda: "prune" in m.loops and m.loops["prune"].passes >= 2,
            passes(client, "prune"),
            what="two prune passes",
        )
        assert await prune_stuck() == 1
        assert list(await _rows(dsn)) == [bad.id]

    async def truncated() -> bool:
        return await prune_stuck() == 0

    await until(truncated, passes(client, "prune"), what="the slice truncated")
    assert list(await _rows(dsn)) == []


@contextlib.asynccontextmanager
async def failing_truncate(dsn: str, table: str):
    """A trigger added outside awa-fast that fails every TRUNCATE of ``table``."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"""
            CREATE OR REPLACE FUNCTION public.refuse_truncate() RETURNS trigger
            LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'truncate refused'; END $$;
            CREATE TRIGGER refuse_truncate BEFORE TRUNCATE ON {table}
                FOR EACH STATEMENT EXECUTE FUNCTION public.refuse_truncate();""")
    try:
        yield
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                f"DROP TRIGGER refuse_truncate ON {table}; DROP FUNCTION public.refuse_truncate()"
            )


async def test_class1_cron_pass_fires_the_schedules_after_a_failing_one(dsn):
    from awa_fast import periodic

    await _exec(
        dsn,
        "INSERT INTO awa_fast.cron_jobs (name, cron_expr, kind, last_fire_at) "
        "VALUES ('a_bad', '* * * * *', 'explode', now() - interval '2 minutes'), "
        "('b_good', '* * * * *', 'plain', now() - interval '2 minutes')",
    )
    async with exploding_inserts(dsn):
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            assert await periodic.evaluate(conn) >= 1
    assert {r["kind"] for r in (await _rows(dsn)).values()} == {"plain"}
    assert await scalar(
        dsn,
        "SELECT last_fire_at < now() - interval '90 seconds' "
        "FROM awa_fast.cron_jobs WHERE name = 'a_bad'",
    )  # not advanced
    await _exec(dsn, "DELETE FROM awa_fast.cron_jobs")


async def test_class1_owed_rows_that_always_fail_never_stall_the_reconciler(dsn, client):
    # More owed rows than one reconciler batch fail the same way on every try (a trigger fails
    # their settlement; a few have an effect that always raises): each is backed off, so the
    # good owed rows behind them settle.
    from awa_fast.worker.consequences import ConsequenceConfig
    from awa_fast.worker.reconcile import OWED_BATCH, reconcile_tick

    applied = []

    async def effect(failure):
        if failure.args["mode"] == "raise":
            raise RuntimeError("provider down")
        applied.append(failure.id)

    client.failure_consequence("owing", effect)
    # a backed-off row is not due again in this test
    client.consequences.config = ConsequenceConfig(backoff_base_s=60.0)
    m = Maintenance(
        dsn,
        client.pool,
        MaintenanceConfig(heartbeat_staleness_ms=1000),
        consequence_kinds=lambda: ["owing"],
        known_kinds=lambda: ["owing"],
    )

    async def owed(modes: list[str]) -> list[int]:
        # Final attempts of a dead worker: rescue records them owed, due now.
        ids = [j.id for j in await client.insert_many([{"mode": x} for x in modes], kind="owing")]
        await _make_running(dsn, ids, stale=True, final=True)
        assert sorted(r[0] for r in await m.rescue()) == ids
        return ids

    stuck = await owed(["stuck"] * (OWED_BATCH + 1))
    raising = await owed(["raise"] * 3)
    good = await owed(["good"] * 5)  # due last: behind a full batch of failing rows
    async with failing_rows(
        dsn, "NEW.state = 'failed' AND NEW.args->>'mode' = 'stuck'", event="UPDATE"
    ):
        for _ in range(3):
            await reconcile_tick(client._services(), MaintenanceConfig())
        rows = await _rows(dsn)
    assert all(
        (rows[i]["state"], rows[i]["consequence_state"]) == ("failed", "applied") for i in good
    )
    assert sorted(set(applied) & set(good)) == good
    for i in stuck + raising:  # still owed, pushed out, the error recorded
        r = rows[i]
        assert (r["state"], r["consequence_state"], r["consequence_attempts"]) == (
            "consequence_pending",
            "owed",
            1,
        )
        assert r["consequence_retry_at"] > r["attempted_at"] + datetime.timedelta(seconds=30)
    assert "trigger added outside awa-fast" in rows[stuck[0]]["consequence_error"]
    assert "provider down" in rows[raising[0]]["consequence_error"]


# -- heartbeat and completion batches -----------------------------------------------------------


class _Attempt:
    """The part of a JobContext the heartbeat reads."""

    def __init__(self, job_id: int):
        self.id, self.run_lease, self.kind, self.acked = job_id, 1, "k", None

    def progress_snapshot(self):
        return 1, '{"percent": 5}'

    def progress_acked(self, version):
        self.acked = version


async def test_class1_heartbeat_isolates_a_row_its_update_fails(dsn, client):
    jobs = [await client.insert(Plain(i)) for i in range(3)]
    bad = await client.insert({"x": 1}, kind="explode")
    await _make_running(dsn, [j.id for j in jobs] + [bad.id], stale=True)
    attempts = [_Attempt(j.id) for j in jobs] + [_Attempt(bad.id)]
    async with failing_rows(
        dsn, "NEW.kind = 'explode' AND NEW.heartbeat_at > OLD.heartbeat_at", event="UPDATE"
    ):
        await Heartbeat(client.pool, lambda: attempts, 1.0).beat()
    rows = await _rows(dsn)
    fresh = await _rows(dsn, "heartbeat_at > now() - interval '1 minute'")
    assert set(fresh) == {j.id for j in jobs}
    assert all(rows[j.id]["progress"] == {"percent": 5} for j in jobs)
    assert [a.acked for a in attempts] == [1, 1, 1, None]  # the skipped row keeps its progress
    assert rows[bad.id]["progress"] is None


async def test_class1_an_attempt_every_beat_fails_for_is_warned_about_once(dsn, client, caplog):
    jobs = [await client.insert(Plain(i)) for i in range(2)]
    bad = await client.insert({"x": 1}, kind="explode")
    await _make_running(dsn, [j.id for j in jobs] + [bad.id])
    attempts = [_Attempt(j.id) for j in jobs] + [_Attempt(bad.id)]
    heartbeat = Heartbeat(client.pool, lambda: attempts, 1.0)
    async with failing_rows(
        dsn, "NEW.kind = 'explode' AND NEW.heartbeat_at > OLD.heartbeat_at", event="UPDATE"
    ):
        with caplog.at_level(logging.WARNING):
            await heartbeat.beat()
            first = _warnings(caplog)
            caplog.clear()
            for _ in range(3):
                await heartbeat.beat()
            again = _warnings(caplog)
    # the bulk statement, the attempt, and its retry without progress: each once
    assert len(first) == 3, first
    assert "heartbeat: the bulk statement failed" in first[0]
    assert f"heartbeat of job {bad.id} " in first[1] and "failed" in first[1]
    assert f"heartbeat: row ({bad.id}, 1) left unchanged" in first[2]
    assert again == [], again


async def test_class1_a_beat_of_several_chunks_warns_about_a_refused_attempt_once(
    dsn, client, caplog, monkeypatch
):
    # Each chunk of a beat ended the pass: the next chunk forgot the refused attempt of the
    # first, and every beat warned about it again.
    monkeypatch.setattr(heartbeat_module, "CHUNK", 2)
    bad = await client.insert({"x": 1}, kind="explode")
    jobs = [await client.insert(Plain(i)) for i in range(3)]
    await _make_running(dsn, [bad.id] + [j.id for j in jobs])
    attempts = [_Attempt(bad.id)] + [_Attempt(j.id) for j in jobs]
    heartbeat = Heartbeat(client.pool, lambda: attempts, 1.0)
    async with failing_rows(
        dsn, "NEW.kind = 'explode' AND NEW.heartbeat_at > OLD.heartbeat_at", event="UPDATE"
    ):
        with caplog.at_level(logging.WARNING):
            await heartbeat.beat()
            assert _warnings(caplog), "the first beat warns"
            caplog.clear()
            for _ in range(3):
                await heartbeat.beat()
    assert _warnings(caplog) == []


def _attempt(job_id: int, kind: str) -> JobContext:
    """The attempt ``_make_running`` made (run lease 1), as a claim would hand it over."""
    return JobContext(
        (job_id, kind, "default", {}, 2, 1, 25, None, None, None, "[]", "{}", [], 1, None)
    )


async def test_class1_completion_batch_isolates_a_row_its_update_fails(dsn, client):
    jobs = [await client.insert(Plain(i)) for i in range(4)]
    bad = await client.insert({"x": 1}, kind="explode")
    ids = [j.id for j in jobs] + [bad.id]
    await _make_running(dsn, ids)
    finalizer = Finalizer.batching(client.pool, flushers=1)
    requests = [
        FinalizeRequest.of(_attempt(i, "explode" if i == bad.id else "plain"), Outcome(COMPLETED))
        for i in ids
    ]
    try:
        # a completion moves the row: the write that fails is its insert into the slices
        async with failing_rows(
            dsn, "NEW.kind = 'explode' AND NEW.state = 'completed'", table="awa_fast.jobs_done"
        ):
            results = await asyncio.gather(
                *(finalizer.submit(r) for r in requests), return_exceptions=True
            )
    finally:
        await finalizer.close()
    assert results[:4] == [Finalized.APPLIED] * 4
    # The four completed in the compact batch, not redone alone; the bad row's completion
    # failed alone too, and its attempt is not lost: a prompt failure records the error.
    assert finalizer.stats["compact"] == 4 and finalizer.stats["batches"] >= 1
    assert results[4] is Finalized.PROMPT_FAILURE and finalizer.stats["prompt_failures"] == 1
    assert await _all_in(dsn, [j.id for j in jobs], "completed")
    row = await job_row(dsn, bad.id)
    assert row["state"] == "retryable"
    assert "trigger added outside awa-fast" in row["errors"][-1]["error"]


# -- admin bulk operations ------------------------------------------------------------------------


async def test_class1_retry_failed_row_by_row_keeps_the_owed_consequence_guard(dsn, client):
    # A key collision forces the row-by-row fallback; before the fix its twin statement lacked
    # the owed-consequence guard of the bulk statement and retried a job whose consequence was
    # still owed (losing it).
    failed = [await client.insert(Plain(i), unique_opts={}) for i in range(3)]
    owed = await client.insert(Plain(10))
    colliding = await client.insert(Plain(20), unique_opts={})
    await _exec(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'failed', finalized_at = now() WHERE id = ANY(%s)",
        ([j.id for j in failed] + [owed.id, colliding.id],),
    )
    await _exec(
        dsn,
        "UPDATE awa_fast.jobs_done SET consequence_state = 'owed', "
        "consequence_retry_at = now() + interval '1 hour' WHERE id = %s",
        (owed.id,),
    )
    holder = await client.insert(Plain(20), unique_opts={})  # now holds colliding's key
    retried = await client.retry_failed(kind="plain")
    assert sorted(j.id for j in retried) == [j.id for j in failed]
    rows = await _rows(dsn)
    assert rows[owed.id]["state"] == "failed" and rows[owed.id]["consequence_state"] == "owed"
    assert rows[colliding.id]["state"] == "failed"
    assert rows[holder.id]["state"] == "available"


async def test_class1_drain_queue_isolates_a_row_its_cancel_fails(dsn, client):
    jobs = [await client.insert(Plain(i), queue="dr") for i in range(3)]
    bad = await client.insert({"x": 1}, kind="explode", queue="dr")
    async with failing_rows(
        dsn, "NEW.kind = 'explode' AND NEW.state = 'cancelled'", event="UPDATE"
    ):
        drained = await client.drain_queue("dr")
    assert drained == 3
    assert await _all_in(dsn, [j.id for j in jobs], "cancelled")
    assert (await job_row(dsn, bad.id))["state"] == "available"


async def _fail(dsn: str, ids: list[int]) -> None:
    await _exec(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'failed', finalized_at = now() WHERE id = ANY(%s)",
        (ids,),
    )


async def _failed_with_a_bad_one(dsn: str, client) -> tuple[list, awa.Job]:
    """Three failed plain jobs and one failed ``explode`` job (the one a trigger refuses)."""
    jobs = [await client.insert(Plain(i)) for i in range(3)]
    bad = await client.insert({"x": 1}, kind="explode")
    await _fail(dsn, [j.id for j in jobs] + [bad.id])
    return jobs, bad


async def test_class1_dlq_bulk_retry_isolates_a_row_its_reinsert_fails(dsn, client):
    jobs, bad = await _failed_with_a_bad_one(dsn, client)
    assert await client.bulk_move_failed_to_dlq(allow_all=True) == 4
    async with exploding_inserts(dsn):
        assert await client.bulk_retry_from_dlq(allow_all=True) == 3
    assert await _all_in(dsn, [j.id for j in jobs], "available")
    assert (await client.get_dlq_job(bad.id)) is not None  # stays dead-lettered


async def test_class1_dlq_move_purge_and_discard_isolate_a_row_that_fails(dsn, client):
    jobs, bad = await _failed_with_a_bad_one(dsn, client)
    # the failed jobs are finished: they live in awa_fast.jobs_done (ADR 016)
    async with failing_rows(
        dsn, "OLD.kind = 'explode'", event="DELETE", table="awa_fast.jobs_done"
    ):
        assert await client.bulk_move_failed_to_dlq(allow_all=True) == 3
        assert (await job_row(dsn, bad.id))["state"] == "failed"  # stays, the rest moved
        assert await client.discard_failed("explode") == 0
    assert await client.dlq_depth() == 3
    async with failing_rows(dsn, "OLD.id = %d" % jobs[0].id, event="DELETE", table="awa_fast.dlq"):
        assert await client.purge_dlq(allow_all=True) == 2
    assert [e.job.id for e in await client.list_dlq()] == [jobs[0].id]
    more = [await client.insert(Plain(i)) for i in range(2)]
    await _fail(dsn, [j.id for j in more])
    async with failing_rows(
        dsn, "OLD.id = %d" % more[0].id, event="DELETE", table="awa_fast.jobs_done"
    ):
        assert await client.discard_failed("plain") == 1
    assert (await job_row(dsn, more[0].id))["state"] == "failed"


# -- every bulk / row-by-row pair carries the same guard ------------------------------------------


@pytest.mark.parametrize("family", sorted(sql.ISOLATED))
def test_class1_each_bulk_and_row_by_row_pair_carries_the_same_guard(family):
    guard, statements = sql.ISOLATED[family]
    assert guard.strip()
    for statement in statements:
        assert guard in statement, f"{family}: a statement lost its guard"


# -- unique keys and row locks in one global order ------------------------------------------------


def _keys(kind: str, *values: int) -> list:
    """Prepared unique requests of ``kind`` ordered by their unique key (the global order)."""
    reqs = [prepare({"v": v}, kind=kind, unique_opts={}) for v in values]
    return sorted(reqs, key=lambda p: p.unique_key)


async def _hold_then_take(dsn, client, kind, second_writer):
    """Writer 1 holds the low key (uncommitted); ``second_writer(lo, hi)`` takes both keys with
    the high one first in its input; then writer 1 takes the high key and commits. Taken in
    input order this deadlocks; in key order the second writer waits on the low key first."""
    lo, hi = _keys(kind, 1, 2)
    tx = await client.transaction()
    try:
        await enqueue.insert_one(tx.connection, lo)
        second = asyncio.create_task(second_writer(lo, hi))
        await wait_lock_waiter(dsn)
        await enqueue.insert_one(tx.connection, hi)  # not held by the waiting writer
        await tx.commit()
    finally:
        await tx.rollback()  # no-op once committed
    return await asyncio.gather(second, return_exceptions=True)


@pytest.mark.parametrize("method", ["insert_many", "insert_many_copy"])
async def test_class1_concurrent_batches_over_the_same_keys_do_not_deadlock(dsn, client, method):
    async def second(lo, hi):
        async with awa.AsyncClient(dsn, max_connections=1) as other:
            return await getattr(other, method)(
                [{"v": 2}, {"v": 1}], kind="dl_keys", unique_opts={}
            )

    [result] = await _hold_then_take(dsn, client, "dl_keys", second)
    assert isinstance(result, awa.UniqueConflict), result  # not DeadlockDetected
    assert len(await _rows(dsn, "kind = 'dl_keys'")) == 2


async def test_class1_completions_with_shared_follow_up_keys_do_not_deadlock(dsn, client):
    # ADR-046's deadlock-free multi-insert completion: follow-ups are taken in key order.
    trigger = await client.insert(Plain(1))
    await _make_running(dsn, [trigger.id])

    async def second(lo, hi):
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute(
                sql.COMPLETE_WITH_FOLLOW_UPS, (trigger.id, 1, enqueue.follow_ups_json([hi, lo]))
            )
            return await cur.fetchone()

    [(applied, inserted, _keys_, woken)] = await _hold_then_take(dsn, client, "dl_follow", second)
    assert applied == 1 and inserted == 0  # both keys were held: skipped, no deadlock
    assert woken == []  # nothing inserted, no queue to wake
    assert len(await _rows(dsn, "kind = 'dl_follow'")) == 2
    assert (await job_row(dsn, trigger.id))["state"] == "completed"


async def test_class1_follow_ups_inserted_in_a_transaction_do_not_deadlock(dsn, client):
    # The per-job path (failure settlement, external completion, other outcomes' specs).
    async def second(lo, hi):
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            result = await enqueue.insert_follow_ups(conn, [hi, lo], "plain", 1)
            await conn.commit()
            return result

    [result] = await _hold_then_take(dsn, client, "dl_tx_follow", second)
    assert result == (0, 2)  # both keys held by the committed writer: skipped, no deadlock
    assert len(await _rows(dsn, "kind = 'dl_tx_follow'")) == 2


async def test_class1_a_deadlock_with_another_writer_is_retried(dsn, client, caplog):
    # A writer outside awa-fast's order (holds the high key, then wants the low one) deadlocks
    # with insert_many; insert_many is the victim and its retry succeeds.
    lo, hi = _keys("dl_other", 1, 2)
    async with await psycopg.AsyncConnection.connect(dsn) as other:
        await other.execute("SET deadlock_timeout = '10s'")  # insert_many detects it first
        await enqueue.insert_one(other, hi)
        with caplog.at_level(logging.INFO, logger="awa_fast.bulk"):
            batch = asyncio.create_task(
                client.insert_many([{"v": 1}, {"v": 2}], kind="dl_other", unique_opts={})
            )
            await wait_lock_waiter(dsn)
            await enqueue.insert_one(other, lo)  # waits on insert_many's lo: a deadlock
            await other.rollback()
            jobs = await batch
    assert [j.args for j in jobs] == [{"v": 1}, {"v": 2}]
    assert any("deadlocked" in r.message for r in caplog.records)
    assert len(await _rows(dsn, "kind = 'dl_other'")) == 2


async def test_class1_a_persisting_deadlock_raises_a_typed_error(dsn):
    async def deadlocks():
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40P01'; END $$")

    with pytest.raises(awa.DeadlockError) as info:
        await bulk.retry_deadlocks(deadlocks, what="test", retries=1)
    assert isinstance(info.value, awa.DatabaseError)
    assert isinstance(info.value.__cause__, psycopg.errors.DeadlockDetected)


# -- a UniqueConflict from a retry path names the holder ----------------------------------------


async def test_class1_unique_conflict_of_a_retry_names_the_holder(dsn, client):
    first = await client.insert(Plain(1), unique_opts={})
    # failed, so finished (its row moves to awa_fast.jobs_done, ADR 016) and, under the default
    # mask, holding no key
    await _exec(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'failed', finalized_at = now() WHERE id = %s",
        (first.id,),
    )
    holder = await client.insert(Plain(1), unique_opts={})
    with pytest.raises(awa.UniqueConflict) as info:
        await client.retry(first.id)
    assert info.value.holder_id == holder.id and info.value.holder_state == "available"
    assert f"job {holder.id}" in str(info.value)
    # ... and from the DLQ.
    await client.cancel(holder.id)
    assert await client.move_failed_to_dlq(first.id)
    again = await client.insert(Plain(1), unique_opts={})
    with pytest.raises(awa.UniqueConflict) as info:
        await client.retry_from_dlq(first.id)
    assert info.value.holder_id == again.id and f"job {again.id}" in str(info.value)


async def test_class1_cancel_into_a_held_key_names_the_holder(dsn, client):
    only_cancelled = {"states": 1 << 6}
    a = await client.insert(Plain(5), unique_opts=only_cancelled)
    b = await client.insert(Plain(5), unique_opts=only_cancelled)
    await client.cancel(a.id)  # a now holds the key
    with pytest.raises(awa.UniqueConflict) as info:
        await client.cancel(b.id)
    assert info.value.holder_id == a.id and info.value.holder_state == "cancelled"
    assert (await job_row(dsn, b.id))["state"] == "available"  # nothing changed


async def test_class1_retry_external_into_a_held_key_names_the_holder(dsn, client):
    parked = await client.insert(Plain(6), unique_opts={})
    await _exec(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'waiting_external', attempt = 1, "
        "callback_id = gen_random_uuid() WHERE id = %s",
        (parked.id,),
    )
    holder = await client.insert(Plain(6), unique_opts={})  # waiting_external does not hold
    callback = (await job_row(dsn, parked.id))["callback_id"]
    with pytest.raises(awa.UniqueConflict) as info:
        await client.retry_external(str(callback))
    assert info.value.holder_id == holder.id and f"job {holder.id}" in str(info.value)
    assert (await job_row(dsn, parked.id))["state"] == "waiting_external"


async def test_class1_two_workers_drain_duplicates_one_running_attempt_per_key(dsn):
    # Many duplicates of a few keys whose mask holds only 'running', claimed by two processes'
    # runtimes at once: every job completes, and no key ever has two running attempts.
    seen = []

    async def work(job):
        seen.append(
            await scalar(
                dsn,
                "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'held' AND state = 'running' "
                "AND unique_key = (SELECT unique_key FROM awa_fast.jobs_all WHERE id = %s)",
                (job.id,),
            )
        )
        await asyncio.sleep(0.01)

    clients = [awa.AsyncClient(dsn, max_connections=4) for _ in range(2)]
    try:
        for c in clients:
            c.task(Held)(work)
        ids = [
            j.id
            for j in await clients[0].insert_many(
                [Held(n % 4) for n in range(40)], unique_opts=RUNNING_ONLY
            )
        ]
        for c in clients:
            await c.start([("default", 6)], **FAST)
        await until(lambda: _all_in(dsn, ids, "completed"), clients, 30, "every duplicate")
    finally:
        for c in clients:
            await c.close()
    assert len(seen) == 40 and set(seen) == {1}


async def test_class1_snooze_into_a_held_key_cancels_that_job_as_a_duplicate(dsn, client):
    # A worker outcome whose new state would take a key another job holds (here: the mask holds
    # only 'scheduled', a scheduled duplicate exists) cancels the attempt's job as a duplicate;
    # the queue goes on.
    only_scheduled = {"states": 1 << 0}

    @client.task(Held)
    async def held(job):
        return awa.Snooze(3600)

    @client.task(Plain)
    async def plain(job):
        return None

    holder = await client.insert(
        Held(9), unique_opts=only_scheduled, run_at="2999-01-01T00:00:00+00:00"
    )
    job = await client.insert(Held(9), unique_opts=only_scheduled)
    plains = [(await client.insert(Plain(i))).id for i in range(3)]
    await client.start([("default", 4)], **FAST)
    await until(lambda: _all_in(dsn, plains, "completed"), client, what="the plain jobs")
    row = await until(lambda: _cancelled(dsn, job.id), client, what="the duplicate cancelled")
    assert "duplicate" in row["errors"][-1]["error"]
    assert (await job_row(dsn, holder.id))["state"] == "scheduled"


async def _cancelled(dsn, job_id):
    row = await job_row(dsn, job_id)
    return row if row["state"] == "cancelled" else None
