"""Shared pytest fixtures: a PostgreSQL server per test session and a fresh database per module.

``pg_base_dsn`` (session): ``$AWA_FAST_TEST_DSN`` if set, else a throwaway server from
:func:`awa_fast.embedded.start_temp`, stopped at the end of the session. Under pytest-xdist
every worker process starts its own server.

``dsn`` (module): a fresh database on that server, named after the test module plus a random
suffix, migrated with ``awa_fast.schema.migrate_sync`` and dropped (``WITH (FORCE)``) afterwards.

``own_server`` (module): a server of the module's own that its tests may restart.

A server that cannot be started is an error, never a skip.

``AWA_FAST_TEST_LOOP=uvloop`` runs every async test and fixture on uvloop, the loop every worker
process runs (``awa_fast/supervisor.py``); unset (or ``asyncio``), the standard loop.

Every test is marked ``unit`` (it uses none of the database fixtures below, so it needs no
server: ``pytest -m unit``) or ``integration`` (``pytest -m integration``).
"""

from __future__ import annotations

import os
import re
import secrets

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from awa_fast.schema import migrate_sync

# The fixtures that give a test a PostgreSQL server; a test using none of them is a unit test
# unless it is marked ``integration`` itself (it starts a server of its own).
DATABASE_FIXTURES = {
    "pg_base_dsn",
    "dsn",
    "fresh_db",
    "own_server",
    "clean",
    "client",
    "embedded_data_dir",  # tests/cli/test_cli.py: the CLI starts an embedded server there
}


def pytest_collection_modifyitems(config, items):
    # The 10-minute soak runs only when selected (-m long_soak): deselected, not skipped.
    if "long_soak" not in (config.option.markexpr or ""):
        soaks = [i for i in items if i.get_closest_marker("long_soak") is not None]
        if soaks:
            config.hook.pytest_deselected(items=soaks)
            items[:] = [i for i in items if i.get_closest_marker("long_soak") is None]
    for item in items:
        if item.get_closest_marker("integration") is not None:
            continue
        if DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        else:
            item.add_marker(pytest.mark.unit)


_LOOP = os.environ.get("AWA_FAST_TEST_LOOP", "asyncio")
if _LOOP == "uvloop":
    import uvloop

    def pytest_asyncio_loop_factories(config, item):
        """pytest-asyncio's hook: every async test and fixture runs on a uvloop loop."""
        return {"uvloop": uvloop.new_event_loop}

elif _LOOP != "asyncio":
    raise pytest.UsageError(f"AWA_FAST_TEST_LOOP must be 'asyncio' or 'uvloop', got {_LOOP!r}")


@pytest.fixture(scope="session")
def pg_base_dsn():
    """DSN of a superuser connection to the test server's ``postgres`` database."""
    env = os.environ.get("AWA_FAST_TEST_DSN")
    if env:
        yield env
        return
    from awa_fast.embedded import start_temp

    # A missing database is a failure, never a skip (set AWA_FAST_TEST_DSN to use another server).
    server = start_temp()
    try:
        yield server.dsn
    finally:
        server.stop()


def _db_name(module_name: str) -> str:
    base = re.sub(r"[^a-z0-9_]+", "_", module_name.rsplit(".", 1)[-1].lower()).strip("_") or "t"
    suffix = secrets.token_hex(4)
    return f"{base[: 63 - len(suffix) - 1]}_{suffix}"


@pytest.fixture(scope="module")
def dsn(request, pg_base_dsn):
    """DSN of a fresh, migrated database for this test module (dropped afterwards)."""
    name = _db_name(request.module.__name__)
    with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(pg_base_dsn)
    params["dbname"] = name
    db_dsn = make_conninfo(**params)
    try:
        migrate_sync(db_dsn)
        yield db_dsn
    finally:
        with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def fresh_db(pg_base_dsn):
    """An empty (not migrated) database, dropped afterwards."""
    name = f"fresh_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(pg_base_dsn)
    params["dbname"] = name
    try:
        yield make_conninfo(**params)
    finally:
        with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
async def clean(dsn):
    """Empty the module's database before a test (use with ``pytest.mark.usefixtures``)."""
    from tests.support import truncate

    await truncate(dsn)


@pytest.fixture
async def no_presence_rows(dsn):
    """Empty the module's ``awa_fast.workers`` (presence rows) before a test; with ``clean``."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("TRUNCATE awa_fast.workers")


@pytest.fixture
async def client(dsn):
    """An :class:`awa_fast.AsyncClient` on the module's database, closed after the test."""
    import awa_fast

    c = awa_fast.AsyncClient(dsn)
    yield c
    await c.close()


@pytest.fixture(scope="module")
def own_server():
    """A throwaway server of this test module's own, for tests that restart or crash it
    (``own_server.restart("fast" | "immediate")``) without disturbing the shared one. Its
    ``awa`` database is migrated; ``own_server.awa_dsn`` is its DSN."""
    from awa_fast.embedded import start_temp

    server = start_temp()
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE awa")
        params = conninfo_to_dict(server.dsn)
        params["dbname"] = "awa"
        server.awa_dsn = make_conninfo(**params)
        migrate_sync(server.awa_dsn)
        yield server
    finally:
        server.stop()
