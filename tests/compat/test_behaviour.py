"""awa-pg behaviours awa-fast now matches: ValidationError for bad cron / time zone / callback
timeout, explicit run_at => scheduled, eager connect at construction, worker() deprecation,
CREATE SCHEMA in migrations(), drain_queue cancelling parked jobs, typed args round trip,
flush_progress_sync from an async handler, the CLI's awa-pg forms, and the ordering key kept alike
on every insert path."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import uuid
import warnings
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest

import awa_fast as awa
from awa_fast.testing import AwaTestClient
from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig
from tests.support import job_row, scalar, until

pytestmark = pytest.mark.usefixtures("clean")

CLOSED = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=5"


@dataclasses.dataclass
class Tick:
    n: int = 0


async def test_bad_cron_timezone_and_callback_timeout_are_validation_errors(client):
    with pytest.raises(awa.ValidationError, match="cron") as e:
        client.periodic("bad", "61 * * * *", Tick, Tick())
    assert e.value.field == "cron_expr"
    with pytest.raises(awa.ValidationError, match="timezone") as e:
        client.periodic("bad", "* * * * *", Tick, Tick(), timezone="Mars/Base")
    assert e.value.field == "timezone"
    with pytest.raises(awa.ValidationError, match="timeout_seconds") as e:
        await client.heartbeat_callback(str(uuid.uuid4()), -5)
    assert e.value.field == "timeout_seconds"


async def test_any_explicit_run_at_is_scheduled_then_promoted(dsn, client):
    past = datetime.now(UTC) - timedelta(days=1)
    for run_at in (past, past.isoformat(), datetime.now(UTC) + timedelta(hours=1)):
        assert (await client.insert(Tick(), run_at=run_at)).state == awa.JobState.Scheduled
    assert (await client.insert(Tick())).state == awa.JobState.Available
    copied = await client.insert_many_copy([Tick(1), Tick(2)], run_at=past)
    assert {j.state for j in copied} == {awa.JobState.Scheduled}
    promoted = await Maintenance(dsn, client.pool, MaintenanceConfig()).promote()
    assert promoted == 4  # the four past ones; the future one waits
    assert (
        await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE state = 'scheduled'") == 1
    )


def test_unreachable_database_raises_at_construction():
    with pytest.raises(awa.DatabaseError, match="could not connect"):
        awa.AsyncClient(CLOSED)
    with pytest.raises(awa.DatabaseError, match="could not connect"):
        awa.Client(CLOSED)


async def test_worker_decorator_is_deprecated(client):
    with pytest.warns(DeprecationWarning, match="use client.task"):

        @client.worker(Tick)
        async def handle(job):
            return None

    assert client.registry.get("tick") is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @client.task(Tick)
        async def handle2(job):
            return None


def test_migrations_sql_creates_its_schema_and_runs_by_hand(fresh_db):
    first = awa.migrations()[0][2]
    assert "CREATE SCHEMA IF NOT EXISTS awa_fast" in first
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for _version, _desc, text in awa.migrations():
            conn.execute(text)
        assert conn.execute("SELECT count(*) FROM awa_fast.jobs_all").fetchone()[0] == 0


async def test_drain_queue_cancels_parked_jobs(dsn, client):
    parked = await client.insert(Tick(), queue="drain_me")
    waiting = await client.insert(Tick(), queue="drain_me")
    await scalar(
        dsn,
        "UPDATE awa_fast.jobs SET state = 'waiting_external', attempt = 1, "
        "run_lease = 1, callback_id = gen_random_uuid(), "
        "callback_timeout_at = now() + interval '1 hour' WHERE id = %s "
        "RETURNING 1",
        (parked.id,),
    )
    assert await client.drain_queue("drain_me") == 2
    for job_id in (parked.id, waiting.id):
        row = await job_row(dsn, job_id)
        assert row["state"] == "cancelled" and row["callback_id"] is None


@dataclasses.dataclass
class Typed:
    when: datetime
    day: date
    amount: Decimal
    blob: bytes
    ref: uuid.UUID
    labels: set[str]
    ratio: float = 1


@dataclasses.dataclass
class Loose:
    extra: Any = None
    n: float = 0.0


async def test_typed_args_arrive_with_their_declared_types(client):
    sent = Typed(
        datetime(2024, 5, 1, 12, 30, tzinfo=UTC),
        date(2024, 5, 2),
        Decimal("10.25"),
        b"\x00\xffbin",
        uuid.uuid4(),
        {"b", "a"},
        ratio=2,
    )
    stored = await client.insert(sent)
    assert stored.args["labels"] == ["a", "b"]  # sets are stored sorted
    got: list = []

    async def handler(job):
        got.append(job.args)

    client.failure_consequence(Typed, awa.NO_FAILURE_CONSEQUENCE)
    assert (await AwaTestClient(client).work_one(Typed, handler)).is_completed()
    assert got == [sent]
    assert type(got[0].amount) is Decimal and type(got[0].labels) is set


@pytest.mark.parametrize(
    "args, field",
    [
        (Loose(extra=datetime(2024, 1, 1)), "args.extra"),  # would arrive as str
        (Loose(extra={1, 2}), "args.extra"),  # would arrive as list
        (Loose(n=float("nan")), "args.n"),  # NaN is stored as null
    ],
)
async def test_args_that_cannot_round_trip_are_rejected_at_insert(dsn, client, args, field):
    with pytest.raises(awa.ValidationError) as e:
        await client.insert(args)
    assert e.value.field == field and field in str(e.value)
    with pytest.raises(awa.ValidationError):
        await client.insert_many_copy([args])
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all") == 0


async def test_flush_progress_sync_from_an_async_handler_returns(dsn, client):
    flushed, release = asyncio.Event(), asyncio.Event()

    @client.task(Tick, queue="progress_sync")
    async def handler(job):
        job.set_progress(40, "almost")
        job.flush_progress_sync()  # must neither deadlock the loop nor wait for the finish
        flushed.set()
        await release.wait()

    job = await client.insert(Tick(), queue="progress_sync")
    await client.start([("progress_sync", 1)], poll_interval_ms=50, maintenance=False)
    try:
        await asyncio.wait_for(flushed.wait(), 15)
        row = await job_row(dsn, job.id)
        assert row["state"] == "running" and row["progress"]["percent"] == 40
        release.set()

        async def done():
            return (await job_row(dsn, job.id))["state"] == "completed"

        await until(done, client, what="completion")
    finally:
        release.set()
        await client.shutdown()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "awa_fast", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_awa_forms(dsn):
    # SQL-printing migrate forms need no database (an unreachable URL is never contacted)
    r = _cli("--database-url", CLOSED, "migrate", "--version", "1")
    assert r.returncode == 0 and r.stdout.startswith("-- Migration V1: ")
    assert "CREATE SCHEMA IF NOT EXISTS awa_fast" in r.stdout
    r = _cli("--database-url", CLOSED, "migrate", "--version", "999")
    assert r.returncode == 1
    assert "Version 999 is out of range. Valid versions: 1.." in r.stderr
    r = _cli("--database-url", CLOSED, "migrate", "--from", "1", "--to", "2")
    assert r.returncode == 0 and "-- Migration V2: " in r.stdout and "V1:" not in r.stdout
    r = _cli("--database-url", dsn, "migrate", "--pending")
    assert r.returncode == 0 and r.stdout == "" and "No migrations in range" in r.stderr
    # retry-failed filter errors: awa-pg's message and exit status 1, before connecting
    for extra in ([], ["--kind", "k", "--queue", "q"]):
        r = _cli("--database-url", CLOSED, "job", "retry-failed", *extra)
        assert r.returncode == 1 and r.stderr.strip() == "Specify exactly one of --kind or --queue"
    # the hidden queue-stats alias
    r = _cli("--database-url", dsn, "queue-stats")
    assert r.returncode == 0, r.stderr
    assert "queue-stats" not in _cli("--help").stdout


async def test_an_ordering_key_is_kept_alike_on_every_async_insert_path(client, dsn):
    # awa: the ordering key pins a job's routing whichever path inserts it, given as bytes or
    # as str (its UTF-8 bytes); awa-fast keeps it on the job, the same bytes from every path
    await client.insert(Tick(1), queue="ok", ordering_key=b"account-42")
    tx = await client.transaction()
    await tx.insert(Tick(2), queue="ok", ordering_key="account-42")
    await tx.commit()
    await client.insert_many_copy([Tick(3), Tick(4)], queue="ok", ordering_key=b"account-42")
    written = await client.enqueue_many_copy([Tick(5)], queue="ok", ordering_key="account-42")
    assert written == 1
    keys = await scalar(
        dsn,
        "SELECT array_agg(DISTINCT ordering_key) FROM awa_fast.jobs_all WHERE queue = 'ok'",
    )
    count = await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE queue = 'ok'")
    assert [bytes(k) for k in keys] == [b"account-42"] and count == 5
