"""awa 0.7's storage options with a counterpart in awa-fast's storage, honoured with awa's
meaning, on a real PostgreSQL (docs/compat.md): per-queue ``retention`` (a queue's finished jobs
pruned at its own age, the others at the global one), ``claimers`` (claim loops sharing the
queue's slots), ``terminal_count_rollup_interval_ms`` (the counter fold as its own loop) and
``install_queue_storage(reset=True)`` (the storage emptied; refused while the runtime runs)."""

from __future__ import annotations

import asyncio
import dataclasses

import psycopg
import pytest

import awa_fast as awa
from awa_fast.worker.dispatcher import Dispatcher
from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig
from tests import support

pytestmark = pytest.mark.usefixtures("clean")

FAST = {**support.FAST, "maintenance": False}


@dataclasses.dataclass
class Tick:
    n: int


def sql_rows(dsn: str, query: str, params=None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


async def finished_jobs(client, dsn: str, per_queue: dict[str, list[tuple[str, str]]]) -> dict:
    """Insert jobs and finish them as an admin statement does, ``finalized_at`` moved back by
    the given age; returns queue -> ids."""
    out: dict[str, list[int]] = {}
    for queue, specs in per_queue.items():
        for state, age in specs:
            job = await client.insert(Tick(0), queue=queue)
            sql_rows(
                dsn,
                "UPDATE awa_fast.jobs SET state = %s::awa_fast.job_state, "
                "finalized_at = now() - %s::interval WHERE id = %s",
                (state, age, job.id),
            )
            out.setdefault(queue, []).append(job.id)
    return out


def present(dsn: str, ids: list[int]) -> list[int]:
    return [
        r[0] for r in sql_rows(dsn, "SELECT id FROM awa_fast.jobs_done WHERE id = ANY(%s)", (ids,))
    ]


def maintenance(client, **config) -> Maintenance:
    return Maintenance(client.database_url, client.pool, MaintenanceConfig(**config))


# -- per-queue retention ------------------------------------------------------------------------


async def test_a_shorter_queue_retention_prunes_that_queue_only(client, dsn):
    ids = await finished_jobs(
        client,
        dsn,
        {
            "short": [("completed", "2 hours"), ("completed", "10 minutes"), ("failed", "5 hours")],
            "other": [("completed", "2 hours"), ("failed", "5 hours")],
        },
    )
    m = maintenance(client, queue_retention={"short": (1.0, 4.0)})
    pruned = await m.prune()
    assert pruned == 2
    # short: past its own 1 h / 4 h; the young one stays; other: inside the global 24 h / 72 h
    assert present(dsn, ids["short"]) == [ids["short"][1]]
    assert sorted(present(dsn, ids["other"])) == sorted(ids["other"])
    stats = {s.queue: s for s in await client.queue_stats()}
    assert stats["short"].failed == 0  # the counters follow the deletes
    assert stats["other"].failed == 1


async def test_a_longer_queue_retention_keeps_that_queue_and_prunes_the_others(client, dsn):
    ids = await finished_jobs(
        client,
        dsn,
        {"long": [("completed", "26 hours")], "other": [("completed", "26 hours")]},
    )
    m = maintenance(client, completed_retention_hours=24.0, queue_retention={"long": (30.0, 72.0)})
    await m.prune()
    assert present(dsn, ids["long"]) == ids["long"]  # its slice is kept for it
    assert present(dsn, ids["other"]) == []  # the global 24 h, row by row
    # without the override the slice (newest row 26 h old) goes whole
    await maintenance(client, completed_retention_hours=24.0).prune()
    assert present(dsn, ids["long"]) == []


async def test_start_takes_awa_retention_dicts_with_awa_defaults_for_missing_keys(client):
    client.task(Tick, queue="a")(lambda job: None)
    client.task(Tick, kind="tick_b", queue="b")(lambda job: None)
    await client.start(
        [
            {"name": "a", "max_workers": 1, "retention": {"completed_hours": 1}},
            {"name": "b", "max_workers": 1, "retention": {"failed_hours": 0}},
        ],
        completed_retention_hours=12,
        **FAST,
    )
    try:
        # a key left out takes awa's RetentionPolicy default (24 h / 72 h), not the global one
        assert client.runtime.maintenance_config.queue_retention == {
            "a": (1.0, 72.0),
            "b": (24.0, 0.0),
        }
    finally:
        await client.shutdown()


async def test_start_takes_awas_week_of_failed_retention_and_long_queue_retention(client):
    """awa's own suite starts with failed_retention_hours=168 and per-queue dicts of the same
    (test_start_config.py): longer than the finished slices' ring, kept row by row (ADR 029)."""
    for queue in "abc":
        client.task(Tick, kind=f"tick_{queue}", queue=queue)(lambda job: None)
    await client.start(
        [
            {"name": "a", "max_workers": 1},
            {"name": "b", "max_workers": 1, "retention": {"completed_hours": 720}},
            {"name": "c", "max_workers": 1, "retention": {"failed_hours": 24 * 365 * 10}},
        ],
        completed_retention_hours=72,
        failed_retention_hours=168,
        **FAST,
    )
    try:
        config = client.runtime.maintenance_config
        assert (config.completed_retention_hours, config.failed_retention_hours) == (72, 168)
        assert config.queue_retention == {"b": (720.0, 72.0), "c": (24.0, 87600.0)}
    finally:
        await client.shutdown()


async def test_a_queue_kept_for_ages_keeps_its_rows_and_the_others_are_pruned(client, dsn):
    """A retention past PostgreSQL's timestamps (here 10**12 hours) keeps that queue's rows
    forever, without an overflow in any pass; the other queues keep their own retention."""
    ids = await finished_jobs(
        client,
        dsn,
        {
            "keep": [("completed", "26 hours"), ("failed", "100 hours")],
            "other": [("completed", "26 hours"), ("failed", "100 hours")],
        },
    )
    m = maintenance(client, queue_retention={"keep": (1e12, 1e12)})
    assert await m.prune() == 2  # a failed step would raise PassIncomplete
    assert sorted(present(dsn, ids["keep"])) == sorted(ids["keep"])
    assert present(dsn, ids["other"]) == []


async def test_start_takes_a_zero_retention_as_awa_does(client):
    """awa takes any retention >= 0 ("a non-negative finite number"); 0 prunes at once."""
    client.task(Tick, queue="a")(lambda job: None)
    await client.start([("a", 1)], completed_retention_hours=0, failed_retention_hours=0.0, **FAST)
    try:
        config = client.runtime.maintenance_config
        assert (config.completed_retention_hours, config.failed_retention_hours) == (0, 0)
    finally:
        await client.shutdown()


async def test_a_long_queue_retention_keeps_that_queue_past_the_ring(client, dsn):
    ids = await finished_jobs(
        client,
        dsn,
        {
            "long": [
                ("completed", "50 hours"),
                ("completed", "80 hours"),
                ("failed", "100 hours"),
                ("failed", "170 hours"),
            ],
            "other": [("completed", "26 hours"), ("failed", "80 hours"), ("failed", "1 hour")],
        },
    )
    m = maintenance(client, queue_retention={"long": (72.0, 168.0)})
    assert await m.prune() == 4
    # long: its own 72 h / 168 h, beyond the ring (30 h / 90 h); other: the global 24 h / 72 h
    assert sorted(present(dsn, ids["long"])) == sorted(ids["long"][0:3:2])
    assert present(dsn, ids["other"]) == [ids["other"][2]]
    stats = {s.queue: s for s in await client.queue_stats()}
    assert (stats["long"].failed, stats["other"].failed) == (1, 1)


@pytest.mark.parametrize(
    "retention, message",
    [
        ("1h", "retention must be a dict"),
        ({"completed_hours": -1}, "retention completed_hours must be a non-negative finite number"),
        ({"failed_hours": float("nan")}, "retention failed_hours must be a non-negative finite"),
        ({"completed": 1}, "retention takes 'completed_hours' and 'failed_hours'"),
        (
            {"completed_hours": 1e16},
            "queue 'q': retention completed_hours=1e\\+16 is longer than awa",
        ),
    ],
)
async def test_a_bad_queue_retention_is_refused_naming_the_queue(client, retention, message):
    client.task(Tick, queue="q")(lambda job: None)
    with pytest.raises(awa.ConfigError, match=message):
        await client.start([{"name": "q", "max_workers": 1, "retention": retention}])
    assert client.runtime is None


# -- claimers -----------------------------------------------------------------------------------


async def test_claimers_run_concurrent_claims_sharing_the_queue_slots(client, monkeypatch):
    in_flight = 0
    most = 0
    both = asyncio.Event()
    real_claim = Dispatcher._claim

    async def claim(self, limit):
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        if in_flight == 2:
            both.set()
        try:
            if self.queue == "hot" and not both.is_set():
                await both.wait()  # the first claim waits for the second claimer's
            return await real_claim(self, limit)
        finally:
            in_flight -= 1

    monkeypatch.setattr(Dispatcher, "_claim", claim)
    running = 0
    most_running = 0
    done: list[int] = []

    @client.task(Tick, queue="hot")
    async def work(job):
        nonlocal running, most_running
        running += 1
        most_running = max(most_running, running)
        await asyncio.sleep(0)
        running -= 1
        done.append(job.args.n)

    for n in range(12):
        await client.insert(Tick(n), queue="hot")
    await client.start(
        [{"name": "hot", "max_workers": 4, "claimers": 2, "claim_batch_size": 2}], **FAST
    )
    try:
        await asyncio.wait_for(both.wait(), 15)  # two claim statements at once
        await support.until(lambda: len(done) == 12, client)
    finally:
        await client.shutdown()
    assert most == 2  # never more than the claimers
    assert most_running <= 4  # the claimers share max_workers
    assert sorted(done) == list(range(12))


async def test_claimers_below_one_are_refused(client):
    client.task(Tick, queue="q")(lambda job: None)
    with pytest.raises(ValueError, match="claimers must be a positive int"):
        await client.start([{"name": "q", "max_workers": 1, "claimers": 0}])


# -- terminal_count_rollup_interval_ms ----------------------------------------------------------


def _unfolded_counter(dsn: str) -> None:
    # a counter row a writer left 10 minutes ago (folded once its bucket is 6 minutes old)
    sql_rows(
        dsn,
        "INSERT INTO awa_fast.done_counts (slot, bucket, queue, state, backend, n, newest) "
        "VALUES (0, date_trunc('minute', now() - interval '10 minutes'), 'q', 'completed', 4242,"
        " 3, now() - interval '10 minutes')",
    )


def _writers(dsn: str) -> list[int]:
    return [r[0] for r in sql_rows(dsn, "SELECT backend FROM awa_fast.done_counts ORDER BY 1")]


async def test_with_a_rollup_interval_the_fold_is_its_own_loop(client, dsn):
    _unfolded_counter(dsn)
    m = maintenance(client, terminal_count_rollup_interval_ms=60_000)
    await m.prune()
    assert _writers(dsn) == [4242]  # the prune pass no longer folds
    await m.fold_counts()
    assert _writers(dsn) == [0]
    plain = maintenance(client)
    _unfolded_counter(dsn)
    await plain.prune()  # without the option the prune pass folds, as before
    assert _writers(dsn) == [0]


async def test_start_runs_the_counter_fold_loop_at_the_rollup_interval(client, dsn):
    _unfolded_counter(dsn)
    client.task(Tick, queue="q")(lambda job: None)
    await client.start(
        [("q", 1)],
        **{**support.FAST, "cleanup_interval_ms": 3_600_000},
        terminal_count_rollup_interval_ms=50,
    )
    try:
        folded = support.passes(client, "counter_fold")
        await support.until(lambda: _writers(dsn) == [0], folded)
        assert "counter_fold" in client.runtime.maintenance.loops
    finally:
        await client.shutdown()


async def test_a_rollup_interval_of_zero_is_refused_as_awa_refuses_it(client):
    client.task(Tick, queue="q")(lambda job: None)
    with pytest.raises(ValueError, match="terminal_count_rollup_interval_ms must be > 0"):
        await client.start([("q", 1)], terminal_count_rollup_interval_ms=0)


# -- install_queue_storage(reset=True) ----------------------------------------------------------


async def test_reset_empties_the_storage_and_never_reuses_ids(client, dsn):
    ids = await finished_jobs(client, dsn, {"q": [("completed", "1 minute"), ("failed", "0")]})
    live = await client.insert(Tick(1), queue="q", unique_opts={})
    await client.install_queue_storage(reset=True)
    assert await client.list_jobs() == []
    assert all(s.available == 0 and s.failed == 0 for s in await client.queue_stats())
    assert sql_rows(dsn, "SELECT count(*) FROM awa_fast.unique_holds")[0][0] == 0
    again = await client.insert(Tick(1), queue="q", unique_opts={})  # the key was released
    assert again.id > max(ids["q"] + [live.id])
    assert sql_rows(dsn, "SELECT count(*) FROM awa_fast.leader")[0][0] == 1  # fencing kept


@pytest.mark.parametrize("lease_row", ["kept", "lost"])
async def test_a_runtime_started_after_a_reset_becomes_the_leader(client, dsn, lease_row):
    # The reset had emptied the leader lease (ADR 028), so no process ever led again: no
    # promotion, rescue or cron after awa's test fixture's install_queue_storage(reset=True).
    # A database an earlier reset left without the row gets it back at the next election.
    await client.install_queue_storage(reset=True)
    if lease_row == "lost":
        sql_rows(dsn, "DELETE FROM awa_fast.leader_lease RETURNING 1")
    client.task(Tick, queue="q")(lambda job: None)
    await client.start([("q", 1)], **{**FAST, "maintenance": True})
    try:
        maintenance = client.runtime.maintenance
        await maintenance.elections.wait_until(lambda: maintenance.is_leader, timeout=15)
    finally:
        await client.shutdown()


async def test_install_queue_storage_is_refused_while_the_runtime_runs(client):
    client.task(Tick, queue="q")(lambda job: None)
    await client.start([("q", 1)], **FAST)
    try:
        with pytest.raises(
            awa.AwaError, match="cannot install queue storage while the worker runtime is running"
        ):
            await client.install_queue_storage(reset=True)
    finally:
        await client.shutdown()
    await client.install_queue_storage()  # after shutdown it is allowed again
