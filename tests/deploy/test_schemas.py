"""Two awa-fast schemas side by side in one database (issue 29, ADR 027): each its own queue
system. No job, lock, leader or notification crosses them; migrations create the second one
completely; the CLI's ``--schema`` reads the one it names."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import subprocess
import sys

import psycopg
import pytest

import awa_fast as awa
from awa_fast import bridge, pg_connection, schema_binding
from awa_fast.schema import migrate_sync
from awa_fast.schema_binding import DEFAULT, bind
from tests import support

FAST = {**support.FAST, "maintenance": False}
TIMEOUT_S = 60


@dataclasses.dataclass
class Mail:
    n: int
    origin: str


async def _migrated(dsn: str, name: str) -> None:
    await asyncio.to_thread(migrate_sync, dsn, bind(name))


async def _empty(dsn: str, *names: str) -> None:
    for name in names:
        await _migrated(dsn, name)
        async with await pg_connection.connection_class(bind(name)).connect(
            dsn, autocommit=True
        ) as conn:
            # the same statement as support.truncate, on a connection bound to the schema
            await conn.execute(
                "TRUNCATE awa_fast.jobs, awa_fast.queue_meta, awa_fast.dlq, awa_fast.workers "
                "CASCADE"
            )


@pytest.fixture
async def pair(dsn):
    """Two clients of the module's database: ``awa_fast`` (the default) and ``tenant_b``,
    both schemas migrated and empty."""
    await _empty(dsn, "awa_fast", "tenant_b")
    a = awa.AsyncClient(dsn)
    b = awa.AsyncClient(dsn, schema="tenant_b")
    try:
        yield a, b
    finally:
        await asyncio.gather(a.close(), b.close())


# -- names --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, rule",
    [
        ("Tenant", "lowercase"),
        ("1tenant", "not starting with a digit"),
        ("ten-ant", "lowercase"),
        ('a"; DROP', "lowercase"),
        ("t" * 57, "at most 56"),
        ("pg_tenant", "reserved"),
        ("information_schema", "reserved"),
        ("plpgsql", "reserved"),
    ],
)
def test_a_schema_name_breaking_the_rule_is_refused_naming_the_field(name, rule):
    with pytest.raises(awa.ValidationError, match=rule) as e:
        awa.AsyncClient("postgresql://unused", schema=name)
    assert e.value.field == "schema"
    assert schema_binding.check_name("t" * 56) == "t" * 56


def test_the_default_schema_costs_nothing_and_another_rewrites_each_text_once():
    # the default's connections are the plain class: no rewrite on the hot path
    assert pg_connection.connection_class(DEFAULT) is pg_connection.Connection
    assert DEFAULT.rewrite("SELECT 1 FROM awa_fast.jobs") == "SELECT 1 FROM awa_fast.jobs"
    t = bind("tenant_b")
    text = "SELECT pg_notify('awa_fast', %s) FROM awa_fast.jobs"
    first = t.rewrite(text)
    assert first == "SELECT pg_notify('tenant_b', %s) FROM \"tenant_b\".jobs"
    assert t.rewrite(text) is first  # cached: one dict lookup
    assert t.rewrite(first) == first  # a rewritten text is left as it is


# -- migrations -----------------------------------------------------------------------------------

CATALOG = {
    "tables": """SELECT c.relname, c.relkind::text, c.relispartition FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s""",
    "columns": """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
                         a.attnotnull, coalesce(pg_get_expr(d.adbin, d.adrelid), '')
                  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                  JOIN pg_namespace n ON n.oid = c.relnamespace
                  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                  WHERE n.nspname = %s AND a.attnum > 0 AND NOT a.attisdropped""",
    "indexes": """SELECT indexname, indexdef || %s FROM pg_indexes
                  WHERE schemaname = %s""",
    "functions": """SELECT p.proname, pg_get_function_identity_arguments(p.oid)
                    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                    WHERE n.nspname = %s""",
    "triggers": """SELECT c.relname, t.tgname, pn.nspname = n.nspname
                   FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_namespace pn ON pn.oid = p.pronamespace
                   WHERE n.nspname = %s AND NOT t.tgisinternal""",
    "types": """SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
                WHERE n.nspname = %s AND t.typtype = 'e'""",
    "versions": "SELECT version FROM {}.schema_version",
}


def _catalog(conn: psycopg.Connection, name: str) -> dict[str, set]:
    out = {}
    for what, query in CATALOG.items():
        if what == "versions":
            rows = conn.execute(query.format(name)).fetchall()
        elif what == "indexes":
            rows = conn.execute(query, ("", name)).fetchall()
        else:
            rows = conn.execute(query, (name,)).fetchall()
        # the schema's own name (not inside another name: idx_awa_fast_jobs_claim) as S
        own = re.compile(rf"(?<![\w]){name}(?![\w])")
        out[what] = {tuple(own.sub("S", str(v)) for v in r) for r in rows}
    return out


def test_migrations_create_the_second_schema_completely(fresh_db):
    migrate_sync(fresh_db)
    migrate_sync(fresh_db, bind("tenant_b"))
    assert migrate_sync(fresh_db, bind("tenant_b")) == []  # its own version table
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        default, other = _catalog(conn, "awa_fast"), _catalog(conn, "tenant_b")
        for what in default:
            only = (
                sorted(default[what] - other[what])[:5],
                sorted(other[what] - default[what])[:5],
            )
            assert other[what] == default[what], (what, only)
        assert len(default["tables"]) > 30 and len(default["functions"]) > 10
        assert default["triggers"] and all(same for _, _, same in default["triggers"])
        # no function body or column default of tenant_b names the default schema
        bodies = conn.execute(
            """SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
               WHERE n.nspname = 'tenant_b' AND p.prosrc ~ '(^|[^a-z_])awa_fast[.''"]'"""
        ).fetchall()
        assert bodies == []


def test_the_printed_migration_scripts_create_the_named_schema(fresh_db):
    from awa_fast.schema import current_migration_version, migration_scripts

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for _, _, script in migration_scripts(0, current_migration_version(), bind("tenant_s")):
            conn.execute(script)
        assert conn.execute("SELECT to_regclass('awa_fast.jobs')").fetchone() == (None,)
        assert conn.execute("SELECT max(version) FROM tenant_s.schema_version").fetchone() == (
            current_migration_version(),
        )


# -- jobs, leaders, notifications, locks ------------------------------------------------------------


async def test_jobs_inserted_in_one_schema_are_run_only_by_its_workers(pair):
    a, b = pair
    seen: dict[str, list[Mail]] = {"awa_fast": [], "tenant_b": []}
    for client in (a, b):

        def handler(job, schema=client.schema):
            seen[schema].append(job.args)

        client.task(Mail, kind="mail", queue="q")(handler)
    # same kind, same queue, same args in both
    await a.insert_many([Mail(n, "awa_fast") for n in range(20)], queue="q")
    await b.insert_many_copy([Mail(n, "tenant_b") for n in range(20)], queue="q")  # COPY too
    await asyncio.gather(a.start([("q", 4)], **FAST), b.start([("q", 4)], **FAST))
    for client in (a, b):
        await support.until(
            lambda c=client: len(seen[c.schema]) == 20, client, TIMEOUT_S, "all run"
        )
    for name, args in seen.items():
        assert {m.origin for m in args} == {name}
        assert sorted(m.n for m in args) == list(range(20))
    assert len(await a.list_jobs(kind="mail", state="completed")) == 20
    assert len(await b.list_jobs(kind="mail", state="completed")) == 20


async def test_each_schema_has_its_own_maintenance_leader_at_once(pair):
    a, b = pair
    for client in (a, b):
        client.task(Mail, kind="mail", queue="q")(lambda job: None)
    fast = {**support.FAST, "maintenance": True}
    await asyncio.gather(a.start([("q", 1)], **fast), b.start([("q", 1)], **fast))
    for client in (a, b):
        m = client.runtime.maintenance
        await m.leadership.wait_until(lambda m=m: m.is_leader, TIMEOUT_S)
    assert a.runtime.maintenance.is_leader and b.runtime.maintenance.is_leader
    assert a.runtime.maintenance.binding.leader_lock_key != bind("tenant_b").leader_lock_key


async def test_a_wake_up_in_one_schema_is_not_heard_by_the_other(pair, dsn):
    a, b = pair
    for client in (a, b):
        client.task(Mail, kind="mail", queue="q")(lambda job: None)
    await asyncio.gather(a.start([("q", 1)], **FAST), b.start([("q", 1)], **FAST))
    heard: dict[str, list] = {"awa_fast": [], "tenant_b": []}
    for client in (a, b):
        client.runtime.notifications.subscribe(heard[client.schema].append)
    await b.insert(Mail(1, "tenant_b"), queue="q")
    # b's own runtime hears its wake-up: the NOTIFY was sent
    await b.runtime.notifications.wait_until(
        lambda: any(payload == "q" for _, payload in heard["tenant_b"]), TIMEOUT_S
    )
    # then a marker on a's channel: notifications arrive in commit order, so whatever of b's
    # a could hear, it would have heard before the marker
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SELECT pg_notify('awa_fast', 'marker')")
    await a.runtime.notifications.wait_until(
        lambda: ("awa_fast", "marker") in heard["awa_fast"], TIMEOUT_S
    )
    assert heard["awa_fast"] == [("awa_fast", "marker")]
    assert all(channel == "tenant_b" for channel, _ in heard["tenant_b"])


async def test_equal_unique_keys_neither_conflict_nor_lock_across_schemas(pair, dsn):
    a, b = pair
    unique = {"by_args": True}
    await a.insert(Mail(7, "same"), queue="q", unique_opts=unique)
    await b.insert(Mail(7, "same"), queue="q", unique_opts=unique)  # no conflict across
    with pytest.raises(awa.UniqueConflict):
        await b.insert(Mail(7, "same"), queue="q", unique_opts=unique)
    # a transaction of a's holding a fresh key's locks does not hold b's
    tenant = bind("tenant_b")
    async with await psycopg.AsyncConnection.connect(dsn) as holder:
        async with holder.transaction():
            await bridge.insert_job(holder, Mail(8, "same"), queue="q", unique_opts=unique)
            held = await (
                await holder.execute(
                    "SELECT DISTINCT classid::bigint FROM pg_locks WHERE locktype = 'advisory'"
                    " AND objsubid = 2 AND pid = pg_backend_pid()"
                )
            ).fetchall()
            classes = {r[0] for r in held}
            assert classes and classes <= {c & 0xFFFFFFFF for c in DEFAULT.lock_classes}
            assert not classes & {c & 0xFFFFFFFF for c in tenant.lock_classes}
            # and b inserts the same key meanwhile, waiting for no lock of a's
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
                await other.execute("SET lock_timeout = '10s'")
                job = await bridge.insert_job(
                    other, Mail(8, "same"), queue="q", unique_opts=unique, schema="tenant_b"
                )
    assert (await b.get_job(job["id"])).args == {"n": 8, "origin": "same"}


# -- awa's names for it: install_queue_storage(schema=), start(queue_storage_schema=) -------------


async def test_install_queue_storage_with_a_schema_creates_it_and_moves_the_client(dsn):
    async with awa.AsyncClient(dsn) as c:
        await c.install_queue_storage(schema="tenant_i", reset=True)
        assert c.schema == "tenant_i"
        job = await c.insert(Mail(1, "i"), queue="q")
        rows = await support.scalar(
            dsn, "SELECT count(*) FROM tenant_i.jobs WHERE id = %s", (job.id,)
        )
        assert rows == 1
        # awa's default "awa" is the client's own schema: stays there
        await c.prepare_queue_storage_schema(schema="awa")
        assert c.schema == "tenant_i"


async def test_start_with_queue_storage_schema_runs_the_client_there(dsn):
    await _empty(dsn, "tenant_q")
    async with awa.AsyncClient(dsn) as c:
        ran = []
        c.task(Mail, kind="mail", queue="q")(lambda job: ran.append(job.id))
        await c.start([("q", 1)], queue_storage_schema="tenant_q", **FAST)
        assert c.schema == "tenant_q" and c.runtime.services.schema.name == "tenant_q"
        job = await c.insert(Mail(1, "q"), queue="q")
        await support.until(lambda: job.id in ran, c, TIMEOUT_S, "run")
        n = await support.scalar(
            dsn, "SELECT count(*) FROM tenant_q.jobs_all WHERE id = %s", (job.id,)
        )
        assert n == 1


async def test_a_queue_storage_schema_breaking_the_rule_is_refused_before_starting(client):
    client.task(Mail, kind="mail", queue="q")(lambda job: None)
    with pytest.raises(awa.ValidationError, match="lowercase") as e:
        await client.start([("q", 1)], queue_storage_schema="Tenant")
    assert e.value.field == "queue_storage_schema"
    assert client.runtime is None and client.schema == "awa_fast"


async def test_a_schema_not_migrated_is_named_when_starting(dsn):
    async with awa.AsyncClient(dsn, schema="never_migrated") as c:
        c.task(Mail, kind="mail", queue="q")(lambda job: None)
        with pytest.raises(awa.SchemaNotMigrated, match="awa-fast migrate --schema never_migrated"):
            await c.start([("q", 1)], **FAST)


async def test_a_start_into_a_schema_not_migrated_creates_it_first(dsn):
    # awa's runtime prepares its queue-storage schema when it starts (ADR 033); awa-fast's own
    # schema= above still names the missing schema instead
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("DROP SCHEMA IF EXISTS created_at_start CASCADE")
    async with awa.AsyncClient(dsn) as c:
        ran = []
        c.task(Mail, kind="mail", queue="q")(lambda job: ran.append(job.id))
        await c.start([("q", 1)], queue_storage_schema="created_at_start", **FAST)
        assert c.schema == "created_at_start"
        job = await c.insert(Mail(1, "new"), queue="q")
        await support.until(lambda: job.id in ran, c, TIMEOUT_S, "run")
        n = await support.scalar(
            dsn, "SELECT count(*) FROM created_at_start.jobs_all WHERE id = %s", (job.id,)
        )
        assert n == 1


async def test_a_start_that_fails_leaves_the_client_where_it_was(dsn, client):
    # the schema exists, but the runtime's first write there fails (a trigger): the client's
    # own schema is still the one it uses
    await _migrated(dsn, "failed_start")
    client.task(Mail, kind="mail", queue="q")(lambda job: None)
    async with support.failing_rows(dsn, "true", table="failed_start.workers"):
        with pytest.raises(awa.DatabaseError, match="trigger added outside awa-fast"):
            await client.start([("q", 1)], queue_storage_schema="failed_start", **FAST)
    assert client.runtime is None and client.schema == "awa_fast"
    job = await client.insert(Mail(1, "stay"), queue="q")
    assert (await client.get_job(job.id)).state == "available"


# -- the CLI ------------------------------------------------------------------------------------


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWA_FAST_", "DATABASE_URL"))}
    return subprocess.run(
        [sys.executable, "-m", "awa_fast", "--database-url", dsn, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


async def test_cli_schema_reads_and_migrates_the_schema_it_names(pair, dsn):
    a, b = pair
    await b.insert(Mail(1, "tenant_b"), kind="only_in_b", queue="q")
    r = _cli(dsn, "--schema", "tenant_b", "job", "list", "--json")
    assert r.returncode == 0, r.stderr
    assert [j["kind"] for j in json.loads(r.stdout)] == ["only_in_b"]
    r = _cli(dsn, "job", "list", "--json")  # the default schema has none
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []
    # after the command too, and migrate creates the schema it names
    r = _cli(dsn, "migrate", "--schema", "tenant_cli", "--json")
    assert r.returncode == 0, r.stderr
    assert await support.scalar(dsn, "SELECT to_regclass('tenant_cli.jobs') IS NOT NULL")
    r = _cli(dsn, "--schema", "Bad-Name", "job", "list")
    assert r.returncode == 1
    assert "--schema 'Bad-Name'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


async def test_a_cancel_in_one_schema_never_flags_the_same_job_id_of_the_other(pair, dsn):
    a, b = pair
    # ids are per schema: make both next ids equal, so both running attempts are (id, lease 1)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for name in ("awa_fast", "tenant_b"):
            await conn.execute(
                "SELECT setval(pg_get_serial_sequence(%s, 'id'), 1000000)", (f"{name}.jobs",)
            )
    running: dict[str, object] = {}
    started = support.Recorder()  # a claim's progress step comes before its handler runs
    release = asyncio.Event()
    for client in (a, b):

        async def handler(job, schema=client.schema):
            running[schema] = job
            started.append(schema)
            await release.wait()

        client.task(Mail, kind="mail", queue="q")(handler)
    ja = await a.insert(Mail(1, "awa_fast"), queue="q")
    jb = await b.insert(Mail(1, "tenant_b"), queue="q")
    assert ja.id == jb.id
    await asyncio.gather(a.start([("q", 1)], **FAST), b.start([("q", 1)], **FAST))
    try:
        await started.until(lambda: len(running) == 2, TIMEOUT_S, "both running")
        heard: list = []
        a.runtime.notifications.subscribe(heard.append)
        await b.cancel(jb.id)
        await support.until(lambda: running["tenant_b"].is_cancelled(), b, TIMEOUT_S, "flag")
        # a marker on a's cancel channel, after b's cancel NOTIFY committed
        marker = json.dumps({"job_id": -1, "run_lease": 0})
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("SELECT pg_notify('awa_fast_cancel', %s)", (marker,))
        await a.runtime.notifications.wait_until(lambda: heard, TIMEOUT_S)
        assert heard == [("awa_fast_cancel", marker)]
        assert not running["awa_fast"].is_cancelled()
        assert (await a.get_job(ja.id)).state == "running"
    finally:
        release.set()


# -- the dashboard --------------------------------------------------------------------------------


def test_the_dashboard_of_a_schema_lists_its_jobs_only(dsn):
    from starlette.testclient import TestClient

    from awa_fast.web import create_app

    asyncio.run(_empty(dsn, "awa_fast", "tenant_b"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        a = bridge.insert_job_sync(conn, {"n": 1}, kind="only_in_a")
        b = bridge.insert_job_sync(conn, {"n": 1}, kind="only_in_b", schema="tenant_b")
    base = "http://127.0.0.1"
    with TestClient(create_app(dsn, schema="tenant_b"), base_url=base) as web:
        page = web.get("/jobs").text
        assert "only_in_b" in page and "only_in_a" not in page
        assert web.get(f"/jobs/{b['id']}").status_code == 200
    with TestClient(create_app(dsn), base_url=base) as web:
        page = web.get("/jobs").text
        assert "only_in_a" in page and "only_in_b" not in page
        assert a["id"] != b["id"] or web.get(f"/jobs/{a['id']}").status_code == 200


async def test_the_dashboard_of_each_schema_shows_its_own_leader(pair, dsn):
    from awa_fast.web.reads import Reads

    a, b = pair
    for client in (a, b):
        client.task(Mail, kind="mail", queue="q")(lambda job: None)
    fast = {**support.FAST, "maintenance": True}
    await asyncio.gather(a.start([("q", 1)], **fast), b.start([("q", 1)], **fast))
    for client in (a, b):
        m = client.runtime.maintenance
        await m.leadership.wait_until(lambda m=m: m.is_leader, TIMEOUT_S)
    leaders = []
    for binding in (DEFAULT, bind("tenant_b")):
        reads = Reads(dsn, binding=binding)
        await reads.open()
        try:
            leaders.append((await reads.workers())["leader"])
        finally:
            await reads.close()
    assert all(leader is not None for leader in leaders)
    assert leaders[0]["pid"] != leaders[1]["pid"]


# -- the launcher -------------------------------------------------------------------------------


@pytest.mark.parametrize("app", ["tests.launcher_app:client", "tests.schema_app:client"])
def test_the_worker_launchers_schema_reaches_its_children(dsn, app):
    # launcher_app's client names no schema; schema_app's names tenant_app: --schema wins, as
    # --database-url does
    import signal

    from tests.launcher_app import Nap
    from tests.runtime.test_launcher import QUEUE, Launcher, poll

    asyncio.run(_empty(dsn, "awa_fast", "tenant_w", "tenant_app"))
    with awa.Client(dsn, schema="tenant_w") as c:
        c.insert_many([Nap(0) for _ in range(3)], queue=QUEUE)
    with awa.Client(dsn) as c:  # the default schema's: the launcher must leave it alone
        kept = c.insert(Nap(0), queue=QUEUE)
    with awa.Client(dsn, schema="tenant_app") as c:
        kept_app = c.insert(Nap(0), queue=QUEUE)
    launcher = Launcher(dsn, "--processes", "1", app=app, global_args=("--schema", "tenant_w"))
    try:
        launcher.ready_pids(1)
        with awa.Client(dsn, schema="tenant_w") as c:
            # across processes no signal reaches this test: polled, as tests/runtime/test_launcher.py
            poll(lambda: len(c.list_jobs(state="completed")) == 3, 60, "tenant_w's jobs run")
        launcher.proc.send_signal(signal.SIGTERM)
        assert launcher.wait(60) == 0, launcher.transcript()
    finally:
        launcher.stop()
    with awa.Client(dsn) as c:
        assert c.get_job(kept.id).state == "available"
    with awa.Client(dsn, schema="tenant_app") as c:
        assert c.get_job(kept_app.id).state == "available"


async def test_a_clients_schema_set_before_use_moves_it_and_is_refused_after(dsn):
    await _empty(dsn, "tenant_set")
    async with awa.AsyncClient(dsn) as c:  # opened: in use
        with pytest.raises(awa.AwaError, match="in use"):
            c.schema = "tenant_set"
        assert c.schema == "awa_fast"
    c = awa.AsyncClient(dsn)
    c.schema = "tenant_set"
    try:
        job = await c.insert(Mail(1, "set"), queue="q")
        n = await support.scalar(
            dsn, "SELECT count(*) FROM tenant_set.jobs WHERE id = %s", (job.id,)
        )
        assert n == 1
    finally:
        await c.close()
    with pytest.raises(awa.ValidationError):
        c.schema = "Nope"
