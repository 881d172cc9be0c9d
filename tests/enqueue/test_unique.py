"""Unique jobs against a real PostgreSQL: key composition (kind, by_queue, by_args, by_period),
the ``states`` mask deciding when the key is held, cancel_by_unique_key, concurrent duplicate
inserts and batches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.rows import dict_row

import awa_fast
from awa_fast import EnqueueRequest, JobState, UniqueConflict, UniqueOpts
from tests.support import wait_lock_waiter

UTC = UTC
UNIQUE_INDEX = "idx_awa_fast_jobs_unique"

# Bit positions of the states mask.
SCHEDULED, AVAILABLE, RUNNING, COMPLETED, RETRYABLE, FAILED, CANCELLED, WAITING = range(8)


def bits(*positions: int) -> int:
    return sum(1 << p for p in positions)


@dataclasses.dataclass
class SyncInvoice:
    invoice: int
    region: str = "eu"


# -- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture(autouse=True)
def clean(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '5s'")
        conn.execute("TRUNCATE awa_fast.jobs, awa_fast.queue_meta")


@pytest.fixture(scope="module")
async def client(dsn):
    async with awa_fast.AsyncClient(dsn, max_connections=4) as c:
        yield c


def q(dsn: str, query: str, params=None) -> list[dict]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(query, params).fetchall()


def count(dsn: str, where: str = "true", params=None) -> int:
    return q(dsn, f"SELECT count(*) AS n FROM awa_fast.jobs_all WHERE {where}", params)[0]["n"]


def set_state(dsn: str, job_id: int, state: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE awa_fast.jobs SET state = %s::awa_fast.job_state WHERE id = %s", (state, job_id)
        )


async def conflicts(client, args, **opts) -> bool:
    try:
        await client.insert(args, **opts)
    except UniqueConflict:
        return True
    return False


# -- key composition --------------------------------------------------------------------------


async def test_duplicate_raises_unique_conflict(client, dsn):
    first = await client.insert({"a": 1}, kind="u", unique_opts={})
    assert first.unique_states == 31 and len(first.unique_key) == 16
    with pytest.raises(UniqueConflict) as ei:
        await client.insert({"a": 1}, kind="u", unique_opts={})
    assert isinstance(ei.value, awa_fast.AwaError)
    assert ei.value.constraint == UNIQUE_INDEX
    assert UNIQUE_INDEX in str(ei.value)
    assert count(dsn) == 1
    # Without unique_opts the same job is no duplicate.
    await client.insert({"a": 1}, kind="u")
    await client.insert({"a": 1}, kind="u")
    assert count(dsn) == 3


async def test_default_options_equal_explicit_defaults(client):
    a = await client.insert({"a": 1}, kind="u", unique_opts={})
    for opts in (
        {"by_args": True, "by_queue": False, "states": 31},
        UniqueOpts(),
        {"by_period": None},
    ):
        with pytest.raises(UniqueConflict):
            await client.insert({"a": 1}, kind="u", unique_opts=opts)
    assert a.unique_states == 31


async def test_args_are_canonical(client, dsn):
    await client.insert({"a": 1, "b": {"y": 2, "x": [1, "é"]}}, kind="canon", unique_opts={})
    assert await conflicts(
        client, {"b": {"x": [1, "é"], "y": 2}, "a": 1}, kind="canon", unique_opts={}
    )
    # Typed args and the equal dict share a key under the same kind.
    await client.insert(SyncInvoice(invoice=7), unique_opts={})
    assert await conflicts(
        client, {"region": "eu", "invoice": 7}, kind="sync_invoice", unique_opts={}
    )
    assert count(dsn) == 2


@pytest.mark.parametrize(
    "first, second, conflict",
    [
        # by_args (default True): different args -> different key
        (dict(args={"a": 1}), dict(args={"a": 2}), False),
        (dict(args={"a": 1}), dict(args={"a": 1.5}), False),
        # by_args False: args ignored
        (
            dict(args={"a": 1}, u={"by_args": False}),
            dict(args={"a": 2}, u={"by_args": False}),
            True,
        ),
        # by_queue False (default): queue ignored
        (dict(queue="q1"), dict(queue="q2"), True),
        # by_queue True: different queue allowed, same queue conflicts
        (dict(queue="q1", u={"by_queue": True}), dict(queue="q2", u={"by_queue": True}), False),
        (dict(queue="q1", u={"by_queue": True}), dict(queue="q1", u={"by_queue": True}), True),
        # by_period: the bucket number is part of the key
        (dict(u={"by_period": 100}), dict(u={"by_period": 101}), False),
        (dict(u={"by_period": 100}), dict(u={"by_period": 100}), True),
        (dict(u={"by_period": -1}), dict(u={}), False),
        # kind is always part of the key
        (dict(kind="k1"), dict(kind="k2"), False),
        # the key does not depend on the states mask, priority, tags or metadata
        (
            dict(u={"states": 31}),
            dict(u={"states": 2}, priority=4, tags=["t"], metadata={"m": 1}),
            True,
        ),
        # by_queue changes the key even for the same queue
        (dict(u={"by_queue": True}), dict(u={}), False),
    ],
    ids=[
        "args_differ",
        "int_vs_float",
        "by_args_false",
        "queue_ignored",
        "by_queue_differ",
        "by_queue_same",
        "period_differ",
        "period_same",
        "period_vs_none",
        "kind_differ",
        "mask_not_in_key",
        "by_queue_changes_key",
    ],
)
async def test_key_components(client, dsn, first, second, conflict):
    def call(spec):
        return dict(
            kind=spec.get("kind", "comp"),
            queue=spec.get("queue", "default"),
            unique_opts=spec.get("u", {}),
            priority=spec.get("priority", 2),
            tags=spec.get("tags"),
            metadata=spec.get("metadata"),
        )

    await client.insert(first.get("args", {"a": 1}), **call(first))
    assert await conflicts(client, second.get("args", {"a": 1}), **call(second)) is conflict
    assert count(dsn) == (1 if conflict else 2)


# -- the states mask --------------------------------------------------------------------------


async def test_cancel_releases_key_under_default_mask(client, dsn):
    first = await client.insert({"o": 1}, kind="rel", unique_opts={})
    assert await conflicts(client, {"o": 1}, kind="rel", unique_opts={})
    await client.cancel(first.id)
    second = await client.insert({"o": 1}, kind="rel", unique_opts={})
    assert second.id != first.id
    assert await conflicts(client, {"o": 1}, kind="rel", unique_opts={})
    assert count(dsn) == 2


async def test_cancelled_in_mask_keeps_key(client, dsn):
    opts = {"states": 31 | bits(CANCELLED)}
    first = await client.insert({"o": 1}, kind="rel", unique_opts=opts)
    await client.cancel(first.id)
    assert await conflicts(client, {"o": 1}, kind="rel", unique_opts=opts)
    assert count(dsn) == 1


async def test_completed_holds_key_under_default_mask(client, dsn):
    first = await client.insert({"o": 1}, kind="rel", unique_opts={})
    set_state(dsn, first.id, "completed")
    assert await conflicts(client, {"o": 1}, kind="rel", unique_opts={})
    # A mask without completed frees the key on completion.
    other = await client.insert({"o": 2}, kind="rel", unique_opts={"states": bits(AVAILABLE)})
    set_state(dsn, other.id, "completed")
    await client.insert({"o": 2}, kind="rel", unique_opts={"states": bits(AVAILABLE)})
    assert count(dsn) == 3


async def test_failed_state_releases_unless_in_mask(client, dsn):
    a = await client.insert({"o": 1}, kind="fail", unique_opts={})
    set_state(dsn, a.id, "failed")
    await client.insert({"o": 1}, kind="fail", unique_opts={})  # failed is not in 31
    b = await client.insert({"o": 2}, kind="fail", unique_opts={"states": 31 | bits(FAILED)})
    set_state(dsn, b.id, "failed")
    assert await conflicts(client, {"o": 2}, kind="fail", unique_opts={"states": 31})
    assert count(dsn) == 3


async def test_state_outside_mask_does_not_hold(client, dsn):
    only_available = {"states": bits(AVAILABLE)}
    later = datetime.now(UTC) + timedelta(hours=1)
    s1 = await client.insert({"m": 1}, kind="mask", unique_opts=only_available, run_at=later)
    s2 = await client.insert({"m": 1}, kind="mask", unique_opts=only_available, run_at=later)
    assert s1.state == s2.state == JobState.Scheduled
    a = await client.insert({"m": 1}, kind="mask", unique_opts=only_available)
    assert a.state == JobState.Available
    assert await conflicts(client, {"m": 1}, kind="mask", unique_opts=only_available)
    # Promoting a scheduled duplicate into the held state is refused by the index.
    with pytest.raises(psycopg.errors.UniqueViolation):
        set_state(dsn, s1.id, "available")
    # Once the holder leaves the mask, the scheduled one may become available.
    set_state(dsn, a.id, "running")
    set_state(dsn, s1.id, "available")
    assert count(dsn) == 3


async def test_states_zero_never_holds(client, dsn):
    for _ in range(3):
        await client.insert({"z": 1}, kind="zero", unique_opts={"states": 0})
    assert count(dsn) == 3


async def test_retry_refused_when_key_taken(client, dsn):
    first = await client.insert({"r": 1}, kind="retry_u", unique_opts={})
    await client.cancel(first.id)
    holder = await client.insert({"r": 1}, kind="retry_u", unique_opts={})
    with pytest.raises(UniqueConflict):
        await client.retry(first.id)
    assert (await client.get_job(first.id)).state == JobState.Cancelled
    await client.cancel(holder.id)
    assert (await client.retry(first.id)).state == JobState.Available


# -- cancel_by_unique_key ---------------------------------------------------------------------


async def test_cancel_by_unique_key_default(client, dsn):
    target = await client.insert({"user": 1}, kind="cbk", unique_opts={})
    other = await client.insert({"user": 2}, kind="cbk", unique_opts={})
    assert await client.cancel_by_unique_key("cbk", args={"user": 3}) is None
    assert await client.cancel_by_unique_key("other_kind", args={"user": 1}) is None
    job = await client.cancel_by_unique_key("cbk", args={"user": 1})
    assert job.id == target.id and job.state == JobState.Cancelled
    assert (await client.get_job(other.id)).state == JobState.Available
    # The key is free again; cancelling again finds the new holder, not the cancelled one.
    new = await client.insert({"user": 1}, kind="cbk", unique_opts={})
    assert (await client.cancel_by_unique_key("cbk", args={"user": 1})).id == new.id
    assert await client.cancel_by_unique_key("cbk", args={"user": 1}) is None


async def test_cancel_by_unique_key_with_queue_period_and_typed_args(client, dsn):
    job = await client.insert(
        SyncInvoice(invoice=5), queue="billing", unique_opts={"by_queue": True, "by_period": 42}
    )
    assert await client.cancel_by_unique_key("sync_invoice", args=SyncInvoice(invoice=5)) is None
    assert (
        await client.cancel_by_unique_key(
            "sync_invoice", queue="billing", args=SyncInvoice(invoice=5)
        )
        is None
    )
    assert (
        await client.cancel_by_unique_key(
            "sync_invoice", queue="billing", args={"invoice": 5, "region": "eu"}, period_bucket=41
        )
        is None
    )
    got = await client.cancel_by_unique_key(
        "sync_invoice", queue="billing", args={"region": "eu", "invoice": 5}, period_bucket=42
    )
    assert got.id == job.id and got.state == JobState.Cancelled


async def test_cancel_by_unique_key_without_args(client, dsn):
    job = await client.insert({"ignored": True}, kind="noargs", unique_opts={"by_args": False})
    assert await client.cancel_by_unique_key("noargs", args={"ignored": True}) is None
    assert (await client.cancel_by_unique_key("noargs")).id == job.id


# -- concurrency ------------------------------------------------------------------------------


async def test_concurrent_duplicate_inserts_async(dsn):
    clients = [awa_fast.AsyncClient(dsn, max_connections=1) for _ in range(8)]
    try:
        await asyncio.gather(*(c.pool() for c in clients))
        results = await asyncio.gather(
            *(c.insert({"race": 1}, kind="race", unique_opts={}) for c in clients),
            return_exceptions=True,
        )
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    ok = [r for r in results if isinstance(r, awa_fast.Job)]
    conflicts_ = [r for r in results if isinstance(r, UniqueConflict)]
    assert len(ok) == 1 and len(conflicts_) == 7, results
    assert [r["id"] for r in q(dsn, "SELECT id FROM awa_fast.jobs_all")] == [ok[0].id]


def test_concurrent_duplicate_inserts_threads(dsn):
    n = 6
    clients = [awa_fast.Client(dsn, max_connections=1) for _ in range(n)]
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = clients[i].insert({"race": 2}, kind="race", unique_opts={})
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for c in clients:
            c.close()
    assert sum(isinstance(r, awa_fast.Job) for r in results) == 1, results
    assert sum(isinstance(r, UniqueConflict) for r in results) == n - 1, results
    assert count(dsn) == 1


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_duplicate_waits_for_uncommitted_holder(client, dsn, outcome):
    tx = await client.transaction()
    try:
        held = await tx.insert({"w": 1}, kind="wait", unique_opts={})
        async with awa_fast.AsyncClient(dsn, max_connections=1) as other:
            pending = asyncio.create_task(other.insert({"w": 1}, kind="wait", unique_opts={}))
            await wait_lock_waiter(dsn, what="the duplicate insert to block")
            assert not pending.done()
            await (tx.commit() if outcome == "commit" else tx.rollback())
            if outcome == "commit":
                with pytest.raises(UniqueConflict):
                    await pending
                expected = [held.id]
            else:
                expected = [(await pending).id]
    finally:
        await tx.rollback()  # no-op once finished
    assert [r["id"] for r in q(dsn, "SELECT id FROM awa_fast.jobs_all")] == expected


# -- batches ----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["insert_many", "insert_many_copy"])
async def test_batch_duplicate_within_batch_writes_nothing(client, dsn, method):
    batch = [{"b": 1}, {"b": 2}, {"b": 3}, {"b": 1}]
    with pytest.raises(UniqueConflict):
        await getattr(client, method)(batch, kind="batch_u", unique_opts={})
    assert count(dsn) == 0
    jobs = await getattr(client, method)(batch[:3], kind="batch_u", unique_opts={})
    assert len(jobs) == 3 and all(j.unique_states == 31 for j in jobs)
    assert count(dsn) == 3


@pytest.mark.parametrize("method", ["insert_many", "insert_many_copy"])
async def test_batch_duplicate_of_existing_writes_nothing(client, dsn, method):
    existing = await client.insert({"b": 2}, kind="batch_u", unique_opts={})
    batch = [EnqueueRequest({"b": i}, kind="batch_u", unique_opts={}) for i in range(1, 6)]
    with pytest.raises(UniqueConflict):
        await getattr(client, method)(batch)
    assert [r["id"] for r in q(dsn, "SELECT id FROM awa_fast.jobs_all")] == [existing.id]


async def test_batch_mixed_unique_and_plain(client, dsn):
    jobs = await client.insert_many(
        [
            EnqueueRequest({"x": 1}, kind="mix").unique({"by_args": False}),
            EnqueueRequest({"x": 2}, kind="mix"),
            EnqueueRequest({"x": 2}, kind="mix"),
        ]
    )
    assert [j.unique_key is None for j in jobs] == [False, True, True]
    assert await conflicts(client, {"x": 99}, kind="mix", unique_opts={"by_args": False})
    assert count(dsn) == 3


async def test_transaction_unique_conflict_rolls_back(client, dsn):
    await client.insert({"t": 1}, kind="tx_u", unique_opts={})
    with pytest.raises(UniqueConflict):
        async with await client.transaction() as tx:
            await tx.insert({"t": 0}, kind="tx_u", unique_opts={})
            await tx.insert({"t": 1}, kind="tx_u", unique_opts={})
    assert count(dsn) == 1


def test_sync_client_unique_conflict(dsn):
    with awa_fast.Client(dsn, max_connections=1) as c:
        c.insert({"s": 1}, kind="sync_u", unique_opts={"by_period": 3})
        with pytest.raises(UniqueConflict):
            c.insert({"s": 1}, kind="sync_u", unique_opts={"by_period": 3})
        job = c.cancel_by_unique_key("sync_u", args={"s": 1}, period_bucket=3)
        assert job.state == JobState.Cancelled
        c.insert({"s": 1}, kind="sync_u", unique_opts={"by_period": 3})
    assert count(dsn) == 2


# -- distinct keys never wait for each other (migration 026) ------------------------------------


def _keys_sharing_a_first_byte(kind: str, count: int) -> list[int]:
    """``count`` values of ``{"n": n}`` whose unique keys (kind ``kind``, default options)
    differ but share their first byte: the lock bucket of migration 010."""
    from awa_fast.requests import prepare

    by_byte: dict[int, list[int]] = {}
    for n in range(20_000):
        first = prepare({"n": n}, kind=kind, unique_opts={}).unique_key[0]
        by_byte.setdefault(first, []).append(n)
        if len(by_byte[first]) == count:
            return by_byte[first]
    raise AssertionError("no shared first byte")


async def test_distinct_keys_of_one_bucket_do_not_wait_for_an_open_transaction(client, dsn):
    # One bucket lock per first byte, held to commit, made an unrelated key wait for the whole
    # transaction (breaker helper); awa-pg's unique index never does.
    a, b = _keys_sharing_a_first_byte("bucketed", 2)
    async with await client.transaction() as tx:
        await tx.insert({"n": a}, kind="bucketed", unique_opts={})
        # fails (TimeoutError) only if it waits for the transaction above
        await asyncio.wait_for(client.insert({"n": b}, kind="bucketed", unique_opts={}), 10)


async def test_two_transactions_with_distinct_keys_never_deadlock(client, dsn):
    # T1 takes a1 then b2, T2 takes b1 then a2: four distinct keys, two shared first bytes.
    # With bucket locks one of them deadlocked (DeadlockError after its retries).
    a1, a2 = _keys_sharing_a_first_byte("crossed_a", 2)
    b1, b2 = _keys_sharing_a_first_byte("crossed_b", 2)
    async with await client.transaction() as t1, await client.transaction() as t2:
        await t1.insert({"n": a1}, kind="crossed_a", unique_opts={})
        await t2.insert({"n": b1}, kind="crossed_b", unique_opts={})
        await asyncio.wait_for(
            asyncio.gather(
                t1.insert({"n": b2}, kind="crossed_b", unique_opts={}),
                t2.insert({"n": a2}, kind="crossed_a", unique_opts={}),
            ),
            10,
        )
    with psycopg.connect(dsn) as conn:
        n = conn.execute(
            "SELECT count(*) FROM awa_fast.jobs WHERE kind IN ('crossed_a', 'crossed_b')"
        ).fetchone()[0]
    assert n == 4


async def test_a_bulk_insert_still_waits_for_a_key_held_one_by_one(client, dsn):
    # The two ways of locking exclude each other for one key: a bulk statement (over 64 keys:
    # bucket locks) including a key an open transaction inserted alone waits for it, then finds
    # the key held.
    async with await client.transaction() as tx:
        held = await tx.insert({"n": 0}, kind="bulked", unique_opts={})
        bulk = asyncio.ensure_future(
            client.insert_many([{"n": n} for n in range(100)], kind="bulked", unique_opts={})
        )
        await wait_lock_waiter(dsn, what="the bulk insert waiting for the held key")
        assert not bulk.done()
    with pytest.raises(UniqueConflict):
        await bulk
    with psycopg.connect(dsn) as conn:
        ids = conn.execute("SELECT id FROM awa_fast.jobs WHERE kind = 'bulked'").fetchall()
    assert ids == [(held.id,)]  # the bulk insert is one statement: all of it or nothing
