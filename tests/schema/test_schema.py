"""Migrations: idempotent, and safe when many processes run them at once; the claim path uses
its partial index."""

from __future__ import annotations

import ast
import secrets
import subprocess
import sys
import threading

import psycopg
import pytest
from psycopg import sql as psql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from awa_fast.schema import current_migration_version, migrate_sync


@pytest.fixture
def empty_db(pg_base_dsn):
    name = f"schema_{secrets.token_hex(4)}"
    with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
        conn.execute(psql.SQL("CREATE DATABASE {}").format(psql.Identifier(name)))
    yield make_conninfo(**{**conninfo_to_dict(pg_base_dsn), "dbname": name})
    with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
        conn.execute(psql.SQL("DROP DATABASE {} WITH (FORCE)").format(psql.Identifier(name)))


@pytest.mark.parametrize("default", ["repeatable read", "serializable"])
def test_concurrent_migrations_under_a_snapshot_isolation_default(empty_db, default):
    # Under a database default of REPEATABLE READ or SERIALIZABLE each migration's look at what
    # is applied read a snapshot from before the lock it waited on, so a migrator that waited
    # ran a version again and failed (three of four in a breaker helper's repro): the migration
    # connection runs READ COMMITTED. Four threads start together at a barrier.
    with psycopg.connect(empty_db, autocommit=True) as conn:
        db = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute(
            psql.SQL("ALTER DATABASE {} SET default_transaction_isolation = {}").format(
                psql.Identifier(db), psql.Literal(default)
            )
        )
    barrier = threading.Barrier(4)
    results: list = []

    def run() -> None:
        barrier.wait()
        try:
            results.append(migrate_sync(empty_db))
        except Exception as exc:  # reported below
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [r for r in results if isinstance(r, Exception)] == []
    everything = list(range(1, current_migration_version() + 1))
    assert sorted(v for r in results for v in r) == everything  # each applied exactly once


def test_concurrent_migrations_from_many_processes(empty_db):
    code = "import sys; from awa_fast.schema import migrate_sync; print(migrate_sync(sys.argv[1]))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, empty_db],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, [o[1] for o in outputs]
    applied = [
        ast.literal_eval(o[0]) for o in outputs
    ]  # each prints the list of versions it applied
    everything = list(range(1, current_migration_version() + 1))
    assert sorted(v for a in applied for v in a) == everything  # each applied exactly once
    assert migrate_sync(empty_db) == []  # idempotent
    with psycopg.connect(empty_db) as conn:
        versions = [
            r[0]
            for r in conn.execute(
                "SELECT version FROM awa_fast.schema_version ORDER BY 1"
            ).fetchall()
        ]
    assert versions == everything


def test_claim_uses_the_partial_claim_index(dsn):
    from awa_fast import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE awa_fast.jobs")
        conn.execute(
            "INSERT INTO awa_fast.jobs (kind, queue, state) SELECT 'k', "
            "CASE WHEN g % 10 = 0 THEN 'q1' ELSE 'q2' END, "
            "CASE WHEN g % 3 = 0 THEN 'available' ELSE 'completed' END::awa_fast.job_state "
            "FROM generate_series(1, 20000) g"
        )
        conn.execute("ANALYZE awa_fast.jobs")
        with conn.transaction():
            plan = "\n".join(
                r[0]
                for r in conn.execute(
                    "EXPLAIN " + sql.CLAIM,
                    {"queue": "q1", "limit": 10, "deadline_ms": 1000, "kinds": ["k"]},
                )
            )
            raise psycopg.Rollback()
    assert "idx_awa_fast_jobs_claim" in plan, plan
