"""Database errors reach no caller raw (issue 28, class 2): every public call raises the typed
awa-fast tree (``awa_fast/db_errors.py``), naming the call, chained to the driver's error; and a
job too large to send is refused before any SQL is sent (``awa_fast.requests.MAX_*_BYTES``).

The faults are real: a database set ``default_transaction_read_only = on``, a backend
terminated under a transaction, a database without the schema. A write refused before it is sent
is told apart from one the database refused by the read-only database itself: anything sent
there to write would come back as ``ReadOnlyDatabase``, not ``ValidationError``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from starlette.testclient import TestClient

import awa_fast as awa
from awa_fast import bridge, requests
from awa_fast.schema import migrate_sync
from awa_fast.testing import AwaTestClient
from awa_fast.transaction import Transaction
from awa_fast.web import create_app
from awa_fast.worker.context import JobContext
from tests.support import scalar

MiB = 1 << 20
KiB = 1 << 10


@dataclasses.dataclass
class Blob:
    data: str


def big(n_bytes: int) -> dict:
    """Args whose JSON is a little over ``n_bytes`` bytes."""
    return {"data": "x" * n_bytes}


@pytest.fixture(scope="module")
def read_only(pg_base_dsn):
    """A migrated database holding a cancelled job (id in ``.job_id``) and a failed one, then
    set ``default_transaction_read_only = on``: every new session refuses writes."""
    name = f"read_only_{__import__('secrets').token_hex(4)}"
    with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    params = conninfo_to_dict(pg_base_dsn)
    params["dbname"] = name
    dsn = make_conninfo(**params)
    migrate_sync(dsn)
    with awa.Client(dsn) as c:
        job = c.insert({"n": 1}, kind="ro_kind", queue="ro_q")
        c.cancel(job.id)
        failed = c.insert({"n": 2}, kind="ro_kind", queue="ro_q")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE awa_fast.jobs SET state = 'failed' WHERE id = %s", (failed.id,))
        conn.execute(
            pgsql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(
                pgsql.Identifier(name)
            )
        )

    class ReadOnly(str):
        job_id = job.id

    try:
        yield ReadOnly(dsn)
    finally:
        with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
            conn.execute(
                pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
            )


def jobs_in(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM awa_fast.jobs_all").fetchone()[0]


def assert_read_only_error(exc: BaseException, operation: str) -> None:
    assert isinstance(exc, awa.ReadOnlyDatabase), repr(exc)
    assert isinstance(exc, awa.DatabaseError)  # awa-pg's name still catches it
    assert isinstance(exc.__cause__, psycopg.errors.ReadOnlySqlTransaction)
    assert exc.operation == operation and exc.sqlstate == "25006"
    assert str(exc).startswith(f"{operation}: the database is read-only")
    assert "\n" not in str(exc)


# -- writes on a read-only database ------------------------------------------------------------


async def test_every_write_of_the_client_on_a_read_only_database_raises_read_only_database(
    read_only,
):
    client = awa.AsyncClient(read_only)
    try:
        before = jobs_in(read_only)
        calls = {
            "insert": lambda: client.insert({"n": 1}, kind="k"),
            "insert_many": lambda: client.insert_many([{"n": 1}, {"n": 2}], kind="k"),
            "insert_many_copy": lambda: client.insert_many_copy([{"n": 1}], kind="k"),
            "enqueue_many_copy": lambda: client.enqueue_many_copy([Blob("a")]),
            "pause_queue": lambda: client.pause_queue("ro_q"),
            "retry": lambda: client.retry(read_only.job_id),
            "cancel": lambda: client.cancel(read_only.job_id + 1),
            "drain_queue": lambda: client.drain_queue("ro_q"),
            "retry_failed": lambda: client.retry_failed(queue="ro_q"),
            "delete_cron_job": lambda: client.delete_cron_job("nightly"),
        }
        for operation, call in calls.items():
            with pytest.raises(awa.AwaError) as info:
                await call()
            assert_read_only_error(info.value, operation)
        assert jobs_in(read_only) == before
    finally:
        await client.close()


async def test_a_transaction_on_a_read_only_database_raises_read_only_database(read_only):
    client = awa.AsyncClient(read_only)
    try:
        with pytest.raises(awa.AwaError) as info:
            async with await client.transaction() as tx:
                await tx.insert({"n": 1}, kind="k")
        assert_read_only_error(info.value, "transaction.insert")
        with pytest.raises(awa.AwaError) as info:
            async with await client.transaction() as tx:
                await tx.execute("CREATE TABLE t (id int)")
        assert_read_only_error(info.value, "transaction.execute")
    finally:
        await client.close()


def test_the_sync_client_and_the_bridge_on_a_read_only_database_raise_read_only_database(
    read_only,
):
    with awa.Client(read_only) as client:
        with pytest.raises(awa.AwaError) as info:
            client.insert({"n": 1}, kind="k")
        assert_read_only_error(info.value, "insert")
        with pytest.raises(awa.AwaError) as info:
            with client.transaction() as tx:
                tx.insert({"n": 1}, kind="k")
        assert_read_only_error(info.value, "transaction.insert")
    with psycopg.connect(read_only) as conn:
        with pytest.raises(awa.AwaError) as info:
            bridge.insert_job_sync(conn, {"n": 1}, kind="k")
        assert_read_only_error(info.value, "insert_job_sync")


async def test_the_async_bridge_on_a_read_only_database_raises_read_only_database(read_only):
    async with await psycopg.AsyncConnection.connect(read_only) as conn:
        with pytest.raises(awa.AwaError) as info:
            await bridge.insert_job(conn, {"n": 1}, kind="k")
        assert_read_only_error(info.value, "insert_job")


async def test_start_and_migrate_on_a_read_only_database_raise_read_only_database(read_only):
    client = awa.AsyncClient(read_only)
    client.task(dict, kind="ro_kind", queue="ro_q")(lambda job: None)
    try:
        with pytest.raises(awa.AwaError) as info:
            await client.start([("ro_q", 1)])
        assert_read_only_error(info.value, "start")
        assert client.runtime is None  # nothing left running
        with pytest.raises(awa.AwaError) as info:
            await awa.migrate(read_only)
        assert_read_only_error(info.value, "migrate")
    finally:
        await client.close()


def test_the_cli_reports_a_read_only_database_on_one_line_and_exits_non_zero(read_only):
    import subprocess

    for command in (["queue", "pause", "ro_q"], ["job", "retry", str(read_only.job_id)]):
        r = subprocess.run(
            [sys.executable, "-m", "awa_fast", "--database-url", read_only, *command],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1, (command, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert re.match(
            r"awa-fast: error: (pause_queue|retry): the database is read-only", lines[0]
        )


def test_a_worker_on_a_read_only_database_says_so_on_one_line_and_gives_up(read_only):
    import os
    import subprocess
    from pathlib import Path

    env = {
        k: v for k, v in os.environ.items() if k not in ("AWA_FAST_DATABASE_URL", "DATABASE_URL")
    }
    env["AWA_FAST_LAUNCHER_DSN"] = read_only
    r = subprocess.run(
        [sys.executable, "-m", "awa_fast", "worker", "tests.launcher_app:client"]
        + ["--processes", "1"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    refused = [line for line in out.splitlines() if "cannot start: the database refused it" in line]
    assert refused and "read-only transaction" in refused[0], out
    assert "Traceback" not in out and "restart" not in out, out


def test_a_dashboard_action_on_a_read_only_database_gets_a_503_page(read_only):
    with TestClient(create_app(read_only), base_url="http://127.0.0.1") as web:
        page = web.get("/queues")
        assert page.status_code == 200
        token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        r = web.post("/queues/pause", data={"csrf": token, "queue": "ro_q"})
        assert r.status_code == 503, r.text
        assert "read-only" in r.text and "nothing changed" in r.text
        assert "Traceback" not in r.text


# -- other faults -------------------------------------------------------------------------------


async def test_a_connection_lost_mid_transaction_raises_database_unavailable(dsn):
    client = awa.AsyncClient(dsn)
    try:
        with pytest.raises(awa.AwaError) as info:
            async with await client.transaction() as tx:
                await tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        exc = info.value
        assert isinstance(exc, awa.DatabaseUnavailable), repr(exc)
        assert isinstance(exc.__cause__, psycopg.OperationalError)
        assert exc.operation == "transaction.execute"
        assert "connection was lost" in str(exc)
        assert (await client.insert({"n": 1}, kind="after_loss")).id  # the pool recovered
    finally:
        await client.close()


async def test_an_error_in_the_callers_own_sql_is_a_database_error_not_a_missing_schema(dsn):
    client = awa.AsyncClient(dsn)
    try:
        async with await client.transaction() as tx:
            with pytest.raises(awa.AwaError) as info:
                await tx.fetch_all("SELECT * FROM no_such_table_of_the_app")
            await tx.rollback()
        exc = info.value
        assert type(exc) is awa.DatabaseError, repr(exc)
        assert exc.sqlstate == "42P01" and exc.operation == "transaction.fetch_all"
        assert isinstance(exc.__cause__, psycopg.errors.UndefinedTable)
    finally:
        await client.close()


async def test_a_database_without_the_schema_raises_schema_not_migrated_naming_the_call(
    fresh_db,
):
    client = awa.AsyncClient(fresh_db)
    try:
        with pytest.raises(awa.SchemaNotMigrated, match="run `awa-fast migrate`") as info:
            await client.queue_stats()
        assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)
        assert str(info.value).startswith("queue_stats: ")
    finally:
        await client.close()


# -- sizes checked before anything is sent ------------------------------------------------------


def _size_refusal(info: pytest.ExceptionInfo, field: str, limit: int) -> None:
    exc = info.value
    assert type(exc) is awa.ValidationError, repr(exc)
    assert exc.field == field and exc.limit == f"<= {limit} bytes"
    assert exc.size is not None and exc.size > limit
    assert f"{exc.size:,} bytes" in str(exc) and f"{limit:,} bytes" in str(exc)


async def test_an_insert_past_a_size_bound_is_refused_before_any_sql_naming_field_size_and_limit(
    read_only,
):
    # On the read-only database anything sent would come back ReadOnlyDatabase.
    client = awa.AsyncClient(read_only)
    over_args = big(requests.MAX_ARGS_BYTES)
    cases = {
        "args": dict(args=over_args),
        "metadata": dict(args={"n": 1}, metadata=big(requests.MAX_METADATA_BYTES)),
        "tags": dict(args={"n": 1}, tags=["t" * (requests.MAX_TAGS_BYTES // 2)] * 3),
        "ordering_key": dict(
            args={"n": 1}, ordering_key=b"k" * (requests.MAX_ORDERING_KEY_BYTES + 1)
        ),
    }
    limits = {
        "args": requests.MAX_ARGS_BYTES,
        "metadata": requests.MAX_METADATA_BYTES,
        "tags": requests.MAX_TAGS_BYTES,
        "ordering_key": requests.MAX_ORDERING_KEY_BYTES,
    }
    try:
        for field, opts in cases.items():
            opts = dict(opts)
            args = opts.pop("args")
            with pytest.raises(awa.ValidationError) as info:
                await client.insert(args, kind="k", **opts)
            _size_refusal(info, field, limits[field])
        for call in (
            lambda: client.insert_many([{"n": 1}, over_args], kind="k"),
            lambda: client.insert_many_copy([{"n": 1}, over_args], kind="k"),
            lambda: client.enqueue_many_copy([Blob("a"), Blob(over_args["data"])]),
            lambda: client.insert_many_copy([{"n": 1}], kind="k", metadata=big(70 * KiB)),
        ):
            with pytest.raises(awa.ValidationError) as info:
                await call()
            assert info.value.field in ("args", "metadata") and info.value.size is not None
        async with await client.transaction() as tx:
            with pytest.raises(awa.ValidationError) as info:
                await tx.insert(over_args, kind="k")
            _size_refusal(info, "args", requests.MAX_ARGS_BYTES)
            with pytest.raises(awa.ValidationError) as info:
                await tx.insert_many([over_args], kind="k")
            _size_refusal(info, "args", requests.MAX_ARGS_BYTES)
        async with await psycopg.AsyncConnection.connect(read_only) as conn:
            with pytest.raises(awa.ValidationError) as info:
                await bridge.insert_job(conn, over_args, kind="k")
            _size_refusal(info, "args", requests.MAX_ARGS_BYTES)
    finally:
        await client.close()


async def test_a_callback_payload_past_the_bound_is_refused_before_any_sql(read_only):
    client = awa.AsyncClient(read_only)
    try:
        with pytest.raises(awa.ValidationError) as info:
            await client.resume_external(
                "00000000-0000-4000-8000-000000000000", big(requests.MAX_PAYLOAD_BYTES)
            )
        _size_refusal(info, "payload", requests.MAX_PAYLOAD_BYTES)
    finally:
        await client.close()


def test_args_just_within_the_bound_are_stored_and_read_back_whole(dsn):
    args = {"data": "y" * (requests.MAX_ARGS_BYTES - len('{"data":""}'))}
    assert len(requests.to_json(args, "args")) == requests.MAX_ARGS_BYTES
    with awa.Client(dsn) as client:
        job = client.insert(args, kind="at_the_bound")
        assert client.get_job(job.id).args == args


async def test_an_insert_many_past_the_statement_bound_is_refused_before_sending(
    read_only, monkeypatch
):
    # The bound itself (256 MiB) takes that much memory to reach: a smaller one, same check.
    monkeypatch.setattr(requests, "MAX_STATEMENT_BYTES", 1 * MiB)
    client = awa.AsyncClient(read_only)
    try:
        rows = [big(400 * KiB) for _ in range(3)]
        for call in (
            lambda: client.insert_many(rows, kind="k"),
            lambda: _in_transaction(client, rows),
        ):
            with pytest.raises(awa.ValidationError, match="smaller batches") as info:
                await call()
            assert info.value.field == "jobs" and info.value.size > 1 * MiB
            assert info.value.limit == f"<= {1 * MiB} bytes"
        # COPY streams its rows: no statement bound (the read-only database refuses it)
        with pytest.raises(awa.ReadOnlyDatabase):
            await client.insert_many_copy(rows, kind="k")
    finally:
        await client.close()


async def _in_transaction(client, rows):
    async with await client.transaction() as tx:
        await tx.insert_many(rows, kind="k")


async def test_a_staged_follow_up_past_a_field_bound_is_too_large_like_one_past_the_budget(
    dsn, client
):
    raised = []

    async def handler(job):
        for args in (big(requests.MAX_ARGS_BYTES), big(40 * KiB)):
            try:
                job.enqueue_on_completion(args, kind="child")
            except awa.StagingError as exc:
                raised.append(exc)
        return None

    await client.insert({"n": 1}, kind="stager")
    result = await AwaTestClient(client).work_one(dict, handler, kind="stager")
    field_bound = raised[0]
    assert field_bound.reason == "too_large" and field_bound.limit == 65536
    assert field_bound.field == "args"
    assert isinstance(field_bound.__cause__, awa.ValidationError)
    assert field_bound.__cause__.size > requests.MAX_ARGS_BYTES
    assert len(raised) == 1  # the second fits the budget, but the attempt is poisoned
    assert result.job.state == awa.JobState.Failed
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'child'") == 0


# -- the boundary covers every public call ------------------------------------------------------


@pytest.mark.parametrize(
    "cls",
    [awa.AsyncClient, Transaction, AwaTestClient],
    ids=lambda c: c.__name__,
)
def test_every_public_coroutine_method_maps_driver_errors(cls):
    # db_errors.boundary wraps each one (functools.wraps keeps the original as __wrapped__)
    missing = [
        name
        for name, value in vars(cls).items()
        if not name.startswith("_")
        and inspect.iscoroutinefunction(value)
        and getattr(value, "__wrapped__", None) is None
    ]
    assert not missing, f"{cls.__name__}: not mapped: {missing}"


def test_a_handlers_database_calls_on_its_job_map_driver_errors():
    for name in ("flush_progress", "flush_progress_sync", "register_callback", "wait_for_callback"):
        assert getattr(getattr(JobContext, name), "__wrapped__", None) is not None, name
