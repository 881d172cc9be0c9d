"""The schema baseline (ADR 032): a fresh install runs ``baseline_NNN.sql`` in one step, and the
schema it creates is the one the numbered migrations build, catalog entry for catalog entry.

The catalog (tests/schema_catalog.py) is read from PostgreSQL's system catalogs: tables,
columns in order, indexes, constraints, functions' whole definitions, triggers, sequences,
types, storage settings, statistics targets, comments, privileges and the rows migrations
seed. The drift cases show that a baseline one detail away from the migrations fails."""

from __future__ import annotations

import secrets

import psycopg
import pytest
from psycopg import sql as psql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from awa_fast import schema, sql
from awa_fast.schema import (
    ROUTINES_REVISION,
    baseline,
    current_migration_version,
    migrate_sync,
    migration_scripts,
    migrations,
    routines_digest,
    routines_script,
)
from awa_fast.schema_binding import bind
from tests.schema_catalog import catalog, differences


@pytest.fixture(scope="module")
def new_db(pg_base_dsn):
    """A factory of empty databases, dropped at the end of the module."""
    made: list[str] = []

    def make() -> str:
        name = f"baseline_{secrets.token_hex(4)}"
        with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
            conn.execute(psql.SQL("CREATE DATABASE {}").format(psql.Identifier(name)))
        made.append(name)
        return make_conninfo(**{**conninfo_to_dict(pg_base_dsn), "dbname": name})

    yield make
    with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
        for name in made:
            conn.execute(psql.SQL("DROP DATABASE {} WITH (FORCE)").format(psql.Identifier(name)))


@pytest.fixture(scope="module")
def upgraded(new_db):
    """The catalog of a schema upgraded through every migration in order, per schema name."""
    found: dict[str, dict] = {}

    def of(name: str) -> dict:
        if name not in found:
            dsn = new_db()
            every = [v for v, _, _ in migrations()]
            assert migrate_sync(dsn, bind(name), use_baseline=False) == every
            with psycopg.connect(dsn) as conn:
                found[name] = catalog(conn, name)
        return found[name]

    return of


def _report(diff: list[str]) -> str:
    return (
        f"{len(diff)} catalog entries differ (- baseline only, + migrations only); fold the "
        "newest migration into the baseline as docs/architecture.md ('Schema and migrations') "
        "says:\n" + "\n".join(line[:300] for line in diff[:40])
    )


def test_the_baseline_is_at_the_newest_migration():
    version, _ = baseline()
    assert version == current_migration_version(), (
        f"baseline_{version:03d}.sql is behind migration {current_migration_version():03d}: "
        "fold the newer migrations into it and rename it (docs/architecture.md, 'Schema and "
        "migrations')"
    )


@pytest.mark.parametrize("name", ["awa_fast", "tenant_b"])
def test_a_fresh_install_from_the_baseline_equals_the_migrations_in_order(new_db, upgraded, name):
    dsn = new_db()
    every = [v for v, _, _ in migrations()]
    assert migrate_sync(dsn, bind(name)) == every  # each version recorded as applied
    assert migrate_sync(dsn, bind(name)) == []
    with psycopg.connect(dsn) as conn:
        installed = catalog(conn, name)
        if name != "awa_fast":
            assert conn.execute("SELECT to_regnamespace('awa_fast')").fetchone() == (None,)
    assert len(installed["relations"]) > 100 and len(installed["functions"]) > 10
    diff = differences(installed, upgraded(name))
    assert diff == [], _report(diff)


def test_the_printed_scripts_build_the_same_schema_with_its_routines(new_db, upgraded):
    # awa-fast migrate --sql: the newest migration's script ends with the routines and their
    # record (ADR 043), so a schema built by hand equals the runner's and has nothing due.
    dsn = new_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _, _, script in migration_scripts(0, current_migration_version()):
            conn.execute(script)
        diff = differences(catalog(conn, "awa_fast"), upgraded("awa_fast"))
    assert diff == [], _report(diff)
    assert migrate_sync(dsn) == []


def test_a_baseline_behind_the_migrations_is_completed_by_them(new_db, upgraded, monkeypatch):
    # A baseline older than the newest migration (one not folded in yet) still gives the newest
    # schema: the runner applies the later migrations after it. Here the baseline is migration
    # 001 itself.
    first_version, _, first_text = migrations()[0]
    monkeypatch.setattr(schema, "baseline", lambda: (first_version, first_text))
    dsn = new_db()
    assert migrate_sync(dsn) == [v for v, _, _ in migrations()]
    with psycopg.connect(dsn) as conn:
        diff = differences(catalog(conn, "awa_fast"), upgraded("awa_fast"))
    assert diff == [], _report(diff)


# Each drift changes one detail of a fresh install's script (the baseline, then the routines);
# the catalogs must then differ in the section named.
DRIFTS = {
    "function body": (
        "current_setting('max_locks_per_transaction')::int / 2",
        "current_setting('max_locks_per_transaction')::int / 4",
        "functions",
    ),
    "column order": (
        "    unique_key      bytea,\n    unique_states   smallint,\n",
        "    unique_states   smallint,\n    unique_key      bytea,\n",
        "columns",
    ),
    "storage setting": (
        "ALTER TABLE awa_fast.unique_holds SET (vacuum_truncate = false);",
        "",
        "relations",
    ),
    "statistics target": (
        "'ALTER TABLE %s ALTER COLUMN %I SET STATISTICS 1'",
        "'ALTER TABLE %s ALTER COLUMN %I SET STATISTICS 2'",
        "columns",
    ),
    "trigger": (
        "AFTER UPDATE OF consequence_state ON awa_fast.jobs_done",
        "AFTER UPDATE ON awa_fast.jobs_done",
        "triggers",
    ),
    "index predicate": (
        "    WHERE state IN ('scheduled', 'retryable');",
        "    WHERE state = 'scheduled';",
        "indexes",
    ),
    "seeded row": ("INSERT INTO awa_fast.leader_lease DEFAULT VALUES;", "", "rows"),
    "comment": ("", "COMMENT ON COLUMN awa_fast.jobs.run_lease IS 'fencing token';", "comments"),
    "privilege": ("", "GRANT SELECT ON awa_fast.jobs_all TO PUBLIC;", "relations"),
}


@pytest.mark.parametrize("drift", list(DRIFTS))
def test_a_baseline_that_drifted_from_the_migrations_is_found(new_db, upgraded, drift):
    old, new, section = DRIFTS[drift]
    text = f"{baseline()[1]}\n{routines_script()}"
    if old:
        assert text.count(old) == 1, f"the drift {drift!r} no longer matches the install script"
        text = text.replace(old, new)
    else:
        text = f"{text}\n{new}\n"
    dsn = new_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(text)
        conn.execute(sql.MIGRATION_BOOTSTRAP)  # the version table and its rows, as the runner's
        conn.cursor().executemany(sql.MIGRATION_RECORD, [(v, d) for v, d, _ in migrations()])
        conn.execute(
            sql.ROUTINES_RECORD,
            (routines_digest(), ROUTINES_REVISION, current_migration_version()),
        )
        diff = differences(catalog(conn, "awa_fast"), upgraded("awa_fast"))
    assert any(line[2:].startswith(f"{section}:") for line in diff), (drift, diff[:10])
