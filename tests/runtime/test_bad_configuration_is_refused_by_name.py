"""Issue 9, class 5: a worker never destroys work it does not understand, and says what is wrong.

Real PostgreSQL throughout: a second application sharing the queue, configurations start()
must reject, an unmigrated database, an unreachable port for the launcher.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import awa_fast as awa
from awa_fast.errors import ConfigError, SchemaNotMigrated
from tests import support
from tests.support import job_row, scalar, truncate, until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "maintenance": False}
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nothing"


@pytest.fixture(autouse=True)
async def _clean(dsn):
    await truncate(dsn)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("TRUNCATE awa_fast.workers")


@dataclasses.dataclass
class Mine:
    n: int


@dataclasses.dataclass
class Theirs:
    n: int


async def _states(dsn, kind: str) -> dict:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT state::text, count(*), max(attempt), "
            "max(jsonb_array_length(errors)) FROM awa_fast.jobs_all "
            "WHERE kind = %s GROUP BY 1",
            (kind,),
        )
        return {s: (n, a, e) for s, n, a, e in await cur.fetchall()}


# ---------------------------------------------------------------------------------------------
# a kind this process has no handler for is left for a worker that has one


async def test_class5_unknown_kind_is_left_for_a_worker_that_has_it(dsn, client, caplog):
    done = []

    @client.task(Mine, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def mine(job):
        done.append(job.id)

    theirs = await client.insert_many([Theirs(i) for i in range(200)], queue="shared")
    mine_jobs = await client.insert_many([Mine(i) for i in range(20)], queue="shared")
    caplog.set_level(logging.WARNING, logger="awa_fast.runtime")
    await client.start([("shared", 8)], **FAST)
    await until(lambda: len(done) == len(mine_jobs), client, what="this app's jobs")
    assert (await client.runtime.check_unhandled()) == [("shared", "theirs", 200)]
    assert (await client.runtime.check_unhandled()) == [("shared", "theirs", 200)]
    loud = [r for r in caplog.records if "no live worker has a handler" in r.getMessage()]
    assert len(loud) == 1 and "'theirs'" in loud[0].getMessage()  # once per kind
    # The other application's jobs are untouched: never claimed, never failed.
    assert await _states(dsn, "theirs") == {"available": (200, 0, 0)}
    stats = {s.queue: s for s in await client.queue_stats()}
    assert stats["shared"].unhandled == 200
    assert await client.unhandled_kinds() == [
        {"queue": "shared", "kind": "theirs", "available": 200}
    ]

    other = awa.AsyncClient(dsn)  # the application that has the handler starts
    ran = []

    @other.task(Theirs, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def their_handler(job):
        ran.append(job.id)

    try:
        await other.start([("shared", 8)], **FAST)
        await until(lambda: len(ran) == len(theirs), other, what="the other app's jobs")
        assert await _states(dsn, "theirs") == {"completed": (200, 1, 0)}
        assert sorted(ran) == sorted(j.id for j in theirs)
        assert {s.queue: s for s in await client.queue_stats()}["shared"].unhandled == 0
    finally:
        await other.close()


# ---------------------------------------------------------------------------------------------
# configuration that cannot work is rejected at start(), naming the field


@pytest.mark.parametrize(
    "setup, queues, options, field",
    [
        ("mine", None, {"heartbeat_interval_ms": 60_000}, "heartbeat_interval_ms"),
        (
            "mine",
            None,
            {"heartbeat_interval_ms": 1_000, "heartbeat_staleness_ms": 1_500},
            "heartbeat_interval_ms",
        ),
        ("mine", [("", 1)], {}, "queues"),
        ("mine", [("q\x00", 1)], {}, "queues"),
        ("mine", [("x" * 201, 1)], {}, "queues"),
        ("mine", [("q", 1), ("q", 2)], {}, "queues"),
        ("mine", [("default", 5, 7)], {}, "queues"),
        ("mine", [("default",)], {}, "queues"),
        # (a kind insert would refuse is refused at task() itself: tests/enqueue/test_names.py)
        ("nothing", [("default", 1)], {}, "handlers"),
        ("emails", [("default", 1)], {}, "queues"),
        # values each pass would send to PostgreSQL and fail on, every pass (breaker helper):
        # lock_timeout and LIMITs are int4, intervals overflow past 100 years, and a loop run
        # every microsecond is not an interval
        (
            "mine",
            None,
            {"leader_election_interval_ms": 3_000_000_000},
            "leader_election_interval_ms",
        ),
        ("mine", None, {"cleanup_batch_size": 2**63}, "cleanup_batch_size"),
        # (a retention past PostgreSQL's range is kept forever, ADR 029; refused past awa's
        # own limit, 2**64 s)
        ("mine", None, {"descriptor_retention_days": 1e15}, "descriptor_retention_days"),
        ("mine", None, {"descriptor_retention_days": -1}, "descriptor_retention_days"),
        ("mine", None, {"promote_interval_ms": 0.001}, "promote_interval_ms"),
        ("mine", None, {"cleanup_interval_ms": 0.5}, "cleanup_interval_ms"),
        ("mine", None, {"poll_interval_ms": 2**31}, "poll_interval_ms"),
        ("mine", None, {"cron_interval_ms": 0}, "cron_interval_ms"),
        ("mine", None, {"finalizer_batch_size": 2**40}, "finalizer_batch_size"),
        ("mine", [{"name": "mine", "max_workers": 2**40}], {}, "max_workers"),
        (
            "mine",
            [{"name": "mine", "max_workers": 1, "claim_batch_size": 2**63}],
            {},
            "claim_batch_size",
        ),
    ],
)
async def test_class5_start_rejects_config_that_cannot_work(
    dsn, client, setup, queues, options, field
):
    if setup == "mine":
        client.task(Mine)(lambda job: None)
    elif setup == "emails":
        client.task(Mine, queue="emails")(lambda job: None)
    with pytest.raises(ConfigError) as err:
        await client.start(queues, **{**FAST, **options})
    assert err.value.field == field, str(err.value)
    assert isinstance(err.value, awa.ValidationError)  # as awa-pg raises for a bad setting
    assert client.runtime is None  # nothing started
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.workers") == 0


async def test_class5_callback_rescue_interval_is_honoured(dsn, client):
    @client.task(Mine, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def park(job):
        token = await job.register_callback(timeout_seconds=0.1)
        return awa.WaitForCallback(token)

    job = await client.insert(Mine(1), max_attempts=3)
    await client.start(
        None,
        poll_interval_ms=50,
        heartbeat_interval_ms=100,
        leader_election_interval_ms=50,
        promote_interval_ms=3_600_000,
        heartbeat_rescue_interval_ms=3_600_000,
        deadline_rescue_interval_ms=3_600_000,
        callback_rescue_interval_ms=50,
    )

    async def rescued():
        row = await job_row(dsn, job.id)
        return row if row["state"] == "retryable" else None

    row = await until(rescued, client, what="the expired callback rescued on its own interval")
    assert row["errors"][-1]["error"] == "callback timed out"
    loops = client.runtime.maintenance.loop_health()
    assert loops["callback_rescue"].passes >= 1 and loops["rescue"].passes <= 1


# ---------------------------------------------------------------------------------------------
# an unmigrated database fails fast; the launcher gives up on an unreachable database


async def test_class5_unmigrated_database_fails_fast(fresh_db):
    client = awa.AsyncClient(fresh_db)
    client.task(Mine)(lambda job: None)
    try:
        with pytest.raises(SchemaNotMigrated, match="run `awa-fast migrate`"):
            await client.start([("default", 1)], **FAST)
        assert client.runtime is None
    finally:
        await client.close()


def _launch(*args: str, app_dsn: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "AWA_FAST_LAUNCHER_DSN": app_dsn}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "awa_fast",
            "worker",
            "tests.launcher_app:client",
            "--processes",
            "1",
            *args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_class5_launcher_on_an_unmigrated_database_gives_up_at_once(dsn, fresh_db):
    t0 = time.monotonic()
    r = _launch("--database-url", fresh_db, app_dsn=dsn)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "ready" not in r.stdout and "restarting" not in r.stdout
    # one line on stderr, from the launcher's preflight: no child started (issue 28, class 3)
    assert "tests.launcher_app:client: cannot start" in r.stderr
    assert "run `awa-fast migrate`" in r.stderr
    assert "does not exist" not in r.stderr  # no flood of "relation does not exist"
    assert time.monotonic() - t0 < 30


def test_class5_launcher_gives_up_when_the_database_is_unreachable(dsn):
    t0 = time.monotonic()
    r = _launch("--database-url", UNREACHABLE, app_dsn=dsn)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "ready" not in r.stdout
    # one line on stderr, from the launcher's preflight: no child started (issue 28, class 3)
    assert "cannot reach the database at 127.0.0.1:1" in r.stderr
    assert "no worker process started" in r.stderr
    assert time.monotonic() - t0 < 30  # bounded: not "5 deaths of 30 s each"


# ---------------------------------------------------------------------------------------------
# a failed or retried attempt logs one line, never the args


async def test_class5_failed_attempt_logs_one_line(dsn, client, caplog):
    @client.task(Mine, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def boom(job):
        raise ValueError(f"boom on attempt {job.attempt}")

    job = await client.insert(Mine(424242), max_attempts=2)
    caplog.set_level(logging.WARNING, logger="awa_fast.runtime")
    await client.start(
        [("default", 1)],
        **{
            **FAST,
            "maintenance": True,
            "promote_interval_ms": 50,
            "leader_election_interval_ms": 50,
        },
    )
    await until(lambda: _failed(dsn, job.id), client, what="both attempts")
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "awa_fast.runtime" and f"job {job.id} " in r.getMessage()
    ]
    assert lines[0].startswith(
        f"job {job.id} (mine) attempt 1/2 failed: ValueError: boom on attempt 1; retry in"
    ), lines
    assert lines[1] == (
        f"job {job.id} (mine) attempt 2/2 failed: ValueError: boom on attempt 2; not retried (exhausted)"
    ), lines
    assert len(lines) == 2 and not any("424242" in line for line in lines)


async def _failed(dsn, job_id):
    return (await job_row(dsn, job_id))["state"] == "failed"


def test_class5_check_command_reports_what_start_would_reject(dsn, tmp_path):
    app = tmp_path / "cfg_app.py"
    app.write_text(
        "import awa_fast as awa\n"
        f"client = awa.AsyncClient({dsn!r})\n"
        "START_OPTIONS = {'heartbeat_interval_ms': 60_000}\n"
        "@client.task(dict, kind='alpha', failure_consequence=awa.NO_FAILURE_CONSEQUENCE)\n"
        "async def a(job): pass\n"
    )
    run = lambda: subprocess.run(
        [sys.executable, "-m", "awa_fast", "check", "cfg_app:client"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    res = run()
    assert res.returncode == 1, res.stdout + res.stderr
    assert "start() would reject this configuration: heartbeat_interval_ms:" in res.stdout
    app.write_text(app.read_text().replace("60_000", "10_000"))
    res = run()
    assert res.returncode == 0 and "would reject" not in res.stdout, res.stdout + res.stderr


async def test_start_warns_when_handlers_without_queue_lose_their_default_queue(dsn, client):
    # start([("defualt", 10)]) ran silently while the jobs waited in 'default' (fresh eyes)
    client.task(Mine)(lambda job: None)
    with pytest.warns(awa.QueueMismatchWarning, match=r"not 'default'.*'mine'.*misspelt"):
        await client.start([("defualt", 1)], **FAST)
    await client.shutdown()


async def test_start_warns_when_a_started_queue_has_no_handler(dsn, client):
    # `awa-fast worker app:client --queues default:2` for an app whose only handler names
    # 'billing' started silently and could run nothing (fresh eyes).
    client.task(Mine, queue="billing")(lambda job: None)
    with pytest.warns(
        awa.QueueMismatchWarning, match=r"serves 'default', for which no handler.*'billing'"
    ):
        await client.start([("default", 1), ("billing", 1)], **FAST)
    await client.shutdown()


async def test_start_does_not_warn_when_default_is_served(dsn, client, recwarn):
    client.task(Mine)(lambda job: None)
    await client.start([("default", 1), ("other", 1)], **FAST)
    assert not [w for w in recwarn if issubclass(w.category, awa.QueueMismatchWarning)]


async def test_an_unknown_start_keyword_names_the_close_one(dsn, client):
    client.task(Mine)(lambda job: None)
    with pytest.raises(TypeError, match=r"staged_completion \(did you mean 'staged_completions'"):
        await client.start(None, staged_completion="batched", **FAST)
    assert client.runtime is None


@pytest.mark.parametrize("how", ["role", "session"])
async def test_an_admin_bulk_call_that_cannot_write_raises_instead_of_reporting_zero(dsn, how):
    # A role without write privileges, or a read-only session (a standby), made drain_queue,
    # retry_failed and purge_dlq redo every row alone, fail each, and report 0 (breaker helper).
    url = dsn
    if how == "role":
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("DROP ROLE IF EXISTS awa_reader")
            await conn.execute("CREATE ROLE awa_reader LOGIN")
            await conn.execute("GRANT USAGE ON SCHEMA awa_fast TO awa_reader")
            await conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA awa_fast TO awa_reader")
        url = make_conninfo(dsn, user="awa_reader")
    else:
        url = make_conninfo(dsn, options="-c default_transaction_read_only=on")
    writer = awa.AsyncClient(dsn)
    reader = awa.AsyncClient(url)
    try:
        job = await writer.insert({"i": 1}, kind="ro_kind", queue="ro_q")
        # typed (awa_fast.db_errors), the driver's error chained
        expected, cause = awa.DatabaseError, psycopg.errors.InsufficientPrivilege
        if how == "session":
            expected, cause = awa.ReadOnlyDatabase, psycopg.errors.ReadOnlySqlTransaction
        for call in (
            lambda: reader.drain_queue("ro_q"),
            lambda: reader.retry_failed(queue="ro_q"),
            lambda: reader.purge_dlq(queue="ro_q"),
        ):
            with pytest.raises(expected) as info:
                await call()
            assert isinstance(info.value.__cause__, cause)
        assert (await job_row(dsn, job.id))["state"] == "available"  # nothing changed
    finally:
        await reader.close()
        await writer.close()
        if how == "role":
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute("DROP OWNED BY awa_reader")
                await conn.execute("DROP ROLE awa_reader")


@pytest.mark.parametrize("queue", ["", "q" * 201, "a\x00b", 7])
async def test_queue_admin_calls_reject_a_name_no_job_could_have(dsn, queue):
    # pause/resume/drain accepted "" and 5,000-character names and wrote queue_meta rows
    client = awa.AsyncClient(dsn)
    try:
        for call in (client.pause_queue, client.resume_queue, client.drain_queue):
            with pytest.raises(awa.ValidationError) as info:
                await call(queue)
            # the one name rule (requests.check_name): its limit names the rule broken
            assert info.value.field == "queue"
            assert info.value.limit in ("1..200 characters", "no NUL bytes")
        assert await scalar(dsn, "SELECT count(*) FROM awa_fast.queue_meta") == 0
    finally:
        await client.close()


@pytest.mark.parametrize("value", [0, -1, 2**63, True, 1.5])
async def test_paging_arguments_out_of_range_name_the_argument(dsn, value):
    # the database refused them: "bigint out of range", "LIMIT must not be negative"
    from datetime import UTC, datetime

    client = awa.AsyncClient(dsn)
    try:
        calls = {
            "limit": [
                lambda: client.list_jobs(limit=value),
                lambda: client.list_dlq(limit=value),
                lambda: client.list_batch_operations(limit=value),
                lambda: client.purge_batch_operations(datetime.now(UTC), limit=value),
            ],
            "before_id": [
                lambda: client.list_dlq(before_id=value),
                lambda: client.purge_dlq(before_id=value),
            ],
        }
        for field, fns in calls.items():
            for fn in fns:
                with pytest.raises(awa.ValidationError) as info:
                    await fn()
                assert info.value.field == field and "1-9223372036854775807" in str(info.value)
    finally:
        await client.close()


async def test_a_trigger_refusing_one_row_with_a_privilege_code_fails_that_row_alone(dsn):
    # ... while a role that may not write fails the whole call (above): one row still never
    # wedges the others (ADR 009), whatever SQLSTATE its trigger raises
    client = awa.AsyncClient(dsn)
    jobs = [await client.insert({"i": i}, kind="ro_kind", queue="ro_q2") for i in range(3)]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "CREATE FUNCTION awa_test_refuse_one() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN IF OLD.id = {jobs[1].id} THEN RAISE insufficient_privilege; END IF; "
            "RETURN NEW; END $$"
        )
        await conn.execute(
            "CREATE TRIGGER refuse_one BEFORE UPDATE ON awa_fast.jobs "
            "FOR EACH ROW EXECUTE FUNCTION awa_test_refuse_one()"
        )
    try:
        assert await client.drain_queue("ro_q2") == 2
        states = [(await job_row(dsn, j.id))["state"] for j in jobs]
        assert states == ["cancelled", "available", "cancelled"]
    finally:
        await client.close()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("DROP TRIGGER refuse_one ON awa_fast.jobs")
            await conn.execute("DROP FUNCTION awa_test_refuse_one()")
