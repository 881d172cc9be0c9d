"""awa_fast.bridge on real drivers: psycopg 3, asyncpg, SQLAlchemy (Connection, Session,
AsyncConnection, AsyncSession) and Django. The job commits or rolls back with the caller's
transaction; unique conflicts map to UniqueConflict; wrong-flavour connections are refused."""

from __future__ import annotations

import dataclasses
import threading

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import awa_fast as awa
from awa_fast.bridge import insert_job, insert_job_sync

asyncpg = pytest.importorskip("asyncpg")  # the `test` extra installs all three drivers
sqlalchemy = pytest.importorskip("sqlalchemy")
django = pytest.importorskip("django")

from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402


@dataclasses.dataclass
class Bridged:
    n: int


class Rollback(Exception):
    pass


def _count(dsn: str, kind: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = %s", (kind,)
        ).fetchone()[0]


def _url(dsn: str, driver: str) -> str:
    p = conninfo_to_dict(dsn)
    auth = p.get("user", "postgres") + (f":{p['password']}" if p.get("password") else "")
    return f"postgresql+{driver}://{auth}@{p.get('host', '127.0.0.1')}:{p.get('port', 5432)}/{p['dbname']}"


async def test_asyncpg_commit_rollback_and_unique(dsn):
    p = conninfo_to_dict(dsn)
    conn = await asyncpg.connect(
        host=p.get("host"),
        port=int(p.get("port", 5432)),
        user=p.get("user"),
        password=p.get("password"),
        database=p["dbname"],
    )
    try:
        async with conn.transaction():
            job = await insert_job(
                conn,
                Bridged(1),
                kind="br_apg",
                queue="bq",
                priority=1,
                tags=["t"],
                metadata={"m": 1},
                ordering_key="k",
            )
        assert job["kind"] == "br_apg" and job["queue"] == "bq" and job["state"] == "available"
        assert job["args"] == {"n": 1} and job["tags"] == ["t"] and job["metadata"] == {"m": 1}
        with pytest.raises(Rollback):
            async with conn.transaction():
                await insert_job(conn, {"kind": "br_apg", "n": 2})
                raise Rollback
        assert _count(dsn, "br_apg") == 1
        await insert_job(conn, {"u": 1}, kind="br_apg_u", unique_opts={})
        with pytest.raises(awa.UniqueConflict):
            await insert_job(conn, {"u": 1}, kind="br_apg_u", unique_opts={})
        with pytest.raises(TypeError, match="insert_job_sync needs a sync connection"):
            insert_job_sync(conn, Bridged(3))
    finally:
        await conn.close()


def test_sqlalchemy_sync_connection_and_session(dsn):
    engine = create_engine(_url(dsn, "psycopg"))
    try:
        with engine.connect() as conn:
            with conn.begin():
                job = insert_job_sync(conn, Bridged(1), kind="br_sa")
            assert job["state"] == "available"
            with pytest.raises(Rollback):
                with conn.begin():
                    insert_job_sync(conn, Bridged(2), kind="br_sa")
                    raise Rollback
        with Session(engine) as session:
            with session.begin():
                insert_job_sync(session, Bridged(3), kind="br_sa", run_at="2000-01-01T00:00:00Z")
            with pytest.raises(Rollback):
                with session.begin():
                    insert_job_sync(session, Bridged(4), kind="br_sa")
                    raise Rollback
            with session.begin():
                insert_job_sync(session, {"u": 1}, kind="br_sa_u", unique_opts={})
            with pytest.raises(awa.UniqueConflict):
                with session.begin():
                    insert_job_sync(session, {"u": 1}, kind="br_sa_u", unique_opts={})
    finally:
        engine.dispose()
    assert _count(dsn, "br_sa") == 2


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_sqlalchemy_async_connection_and_session(dsn, driver):
    kind = f"br_saa_{driver}"
    engine = create_async_engine(_url(dsn, driver))
    try:
        async with engine.connect() as conn:
            async with conn.begin():
                job = await insert_job(conn, Bridged(1), kind=kind)
            assert job["kind"] == kind
            with pytest.raises(Rollback):
                async with conn.begin():
                    await insert_job(conn, Bridged(2), kind=kind)
                    raise Rollback
        async with AsyncSession(engine) as session:
            async with session.begin():
                await insert_job(session, Bridged(3), kind=kind)
            with pytest.raises(Rollback):
                async with session.begin():
                    await insert_job(session, Bridged(4), kind=kind)
                    raise Rollback
            with pytest.raises(TypeError, match="insert_job_sync needs a sync connection"):
                insert_job_sync(session, Bridged(5), kind=kind)
    finally:
        await engine.dispose()
    assert _count(dsn, kind) == 2


def _django_connection(dsn: str):
    from django.conf import settings

    p = conninfo_to_dict(dsn)
    if not settings.configured:
        settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": p["dbname"],
                    "USER": p.get("user", "postgres"),
                    "PASSWORD": p.get("password", ""),
                    "HOST": p.get("host", "127.0.0.1"),
                    "PORT": p.get("port", "5432"),
                }
            },
            USE_TZ=True,
        )
        django.setup()
    from django.db import connection

    return connection


def test_django_commits_and_rolls_back_with_atomic(dsn):
    # Django connections are per thread: run in a fresh one, closed at the end.
    failures: list = []

    def run():
        try:
            from django.db import transaction

            connection = _django_connection(dsn)
            try:
                with transaction.atomic():
                    job = insert_job_sync(connection, Bridged(1), kind="br_dj")
                assert job["state"] == "available" and job["args"] == {"n": 1}
                try:
                    with transaction.atomic():
                        insert_job_sync(connection, Bridged(2), kind="br_dj")
                        raise Rollback
                except Rollback:
                    pass
                with transaction.atomic():
                    insert_job_sync(connection, {"u": 1}, kind="br_dj_u", unique_opts={})
                try:
                    with transaction.atomic():
                        insert_job_sync(connection, {"u": 1}, kind="br_dj_u", unique_opts={})
                    failures.append("no UniqueConflict")
                except awa.UniqueConflict:
                    pass
            finally:
                connection.close()
        except BaseException as exc:  # reported in the test's thread
            failures.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert failures == []
    assert _count(dsn, "br_dj") == 1


async def test_unsupported_connection_is_a_type_error():
    # awa's wording, case included: "Unsupported connection type"
    with pytest.raises(TypeError, match="^Unsupported connection type object "):
        await insert_job(object(), Bridged(1))
