"""Upgrades from released history, and the routines step of the runner (ADR 043).

A schema dumped at a released version with rows in every state (tests/schema/history.py) is
upgraded by this package's runner: its catalog then equals a fresh install's, and its data
equals what the released migrations made of the same dump (stored when the fixture was made).
A start with nothing to do applies no routine and so locks no table; a changed routine is
applied, and an older package never puts its routines back over a newer schema's."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from awa_fast.errors import DatabaseError
from awa_fast.schema import ROUTINES_REVISION, migrate_sync, migrations, routines_digest
from awa_fast.schema_binding import bind
from tests.schema import history
from tests.schema_catalog import catalog, differences

VERSIONS = history.VERSIONS

# The digest of routines/*.sql at each ROUTINES_REVISION (one line added per change).
ROUTINES_DIGESTS = {
    1: "a4e3b84fb462ca76877159232657f33638e60e23c1cc441052deb3965112fec3",
}


@pytest.fixture(scope="module")
def fresh_catalog(dsn):
    """The catalog of a fresh install (the module's database, migrated by the fixture)."""
    with psycopg.connect(dsn) as conn:
        return catalog(conn, "awa_fast")


def _without_rows(found: dict) -> dict:
    return {section: entries for section, entries in found.items() if section != "rows"}


@pytest.mark.parametrize("version", VERSIONS)
def test_an_upgrade_from_a_released_version_gives_a_fresh_install_and_the_released_data(
    fresh_db, fresh_catalog, version
):
    history.restore(fresh_db, version)
    assert migrate_sync(fresh_db) == [v for v, _, _ in migrations() if v > version]
    with psycopg.connect(fresh_db) as conn:
        diff = differences(_without_rows(catalog(conn, "awa_fast")), _without_rows(fresh_catalog))
        assert diff == [], "\n".join(diff[:40])
        got = history.data(conn)
    want = history.expected(version)
    assert sorted(got) == sorted(want)
    for table in want:
        assert got[table] == want[table], table
    assert migrate_sync(fresh_db) == []


def _with_lock_timeout(dsn: str) -> str:
    # A migrate() that waited for the table lock would fail after 5 s instead of hanging.
    return make_conninfo(**{**conninfo_to_dict(dsn), "options": "-c lock_timeout=5000"})


def test_a_start_with_nothing_to_do_takes_no_table_lock(fresh_db):
    migrate_sync(fresh_db)
    bounded = _with_lock_timeout(fresh_db)
    with psycopg.connect(fresh_db) as holder:
        # a transaction that every DDL on jobs, and every trigger change, would wait for
        holder.execute("LOCK TABLE awa_fast.jobs IN ACCESS EXCLUSIVE MODE")
        assert migrate_sync(bounded) == []

        # the same call with the routines due does touch jobs: it waits, and fails at the
        # lock timeout (so the call above proves it took no lock there)
        with psycopg.connect(fresh_db, autocommit=True) as other:
            other.execute("UPDATE awa_fast.schema_routines SET sha256 = 'stale'")
        with pytest.raises(DatabaseError) as failed:
            migrate_sync(bounded)
        assert isinstance(failed.value.__cause__, psycopg.errors.LockNotAvailable)
        holder.rollback()
    assert migrate_sync(bounded) == []
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT sha256 FROM awa_fast.schema_routines").fetchone() == (
            routines_digest(),
        )


def test_changed_routines_are_applied_without_a_migration(fresh_db):
    migrate_sync(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        # a routine edited by hand (or by an older package): the digest no longer matches
        conn.execute(
            "CREATE OR REPLACE FUNCTION awa_fast.raise_key_held(holder bigint) RETURNS void "
            "LANGUAGE sql AS 'SELECT'"
        )
        conn.execute("DROP TRIGGER trg_awa_fast_jobs_key_edited ON awa_fast.jobs")
        conn.execute("UPDATE awa_fast.schema_routines SET sha256 = 'older'")
    assert migrate_sync(fresh_db) == []
    with psycopg.connect(fresh_db) as conn:
        assert (
            "unique_violation"
            in conn.execute(
                "SELECT prosrc FROM pg_proc WHERE proname = 'raise_key_held'"
            ).fetchone()[0]
        )
        assert conn.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgname = 'trg_awa_fast_jobs_key_edited'"
        ).fetchone() == (1,)
        assert conn.execute("SELECT sha256 FROM awa_fast.schema_routines").fetchone() == (
            routines_digest(),
        )


def test_an_older_package_leaves_a_newer_schemas_routines(fresh_db):
    migrate_sync(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        # a newer package migrated this schema past our newest version, with its routines
        newest = migrations()[-1][0]
        conn.execute(
            "INSERT INTO awa_fast.schema_version (version, description) VALUES (%s, 'newer')",
            (newest + 1,),
        )
        conn.execute(
            "UPDATE awa_fast.schema_routines SET sha256 = 'newer', version = %s", (newest + 1,)
        )
    assert migrate_sync(fresh_db) == []
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT sha256 FROM awa_fast.schema_routines").fetchone() == ("newer",)


def test_an_older_package_at_the_same_version_leaves_newer_routines(fresh_db):
    # A newer package changed a routine without a migration (ADR 043's point) and applied it;
    # this package, older, shares the newest migration. Its start must not put its own routines
    # back (a downgrade, and then the two fight: each start re-applies and locks jobs).
    migrate_sync(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(
            "UPDATE awa_fast.schema_routines SET sha256 = 'newer', revision = %s",
            (ROUTINES_REVISION + 1,),
        )
    bounded = _with_lock_timeout(fresh_db)
    with psycopg.connect(fresh_db) as holder:
        holder.execute("LOCK TABLE awa_fast.jobs IN ACCESS EXCLUSIVE MODE")
        assert migrate_sync(bounded) == []  # no lock taken: nothing applied
        holder.rollback()
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT sha256, revision FROM awa_fast.schema_routines").fetchone() == (
            "newer",
            ROUTINES_REVISION + 1,
        )


def test_routines_revision_names_their_digest():
    # ROUTINES_REVISION orders packages' routines (an older one never re-applies its own over a
    # newer one's): a change to routines/*.sql bumps it and adds its digest here.
    assert ROUTINES_DIGESTS[ROUTINES_REVISION] == routines_digest(), (
        "routines/*.sql changed: bump awa_fast.schema.ROUTINES_REVISION and add "
        f"{{{ROUTINES_REVISION + 1}: {routines_digest()!r}}} to ROUTINES_DIGESTS"
    )
    assert max(ROUTINES_DIGESTS) == ROUTINES_REVISION


@pytest.mark.parametrize("name", ["awa_fast", "tenant_b"])
def test_routines_changed_by_hand_are_applied_again(fresh_db, name):
    # A DBA dropped the wake-up trigger, disabled the finished rows' move and redefined a
    # function: the recorded digest still matches, but the queue relies on its routines as
    # written, so the next migrate() puts them back (ADR 043); the one after takes no lock.
    binding = bind(name)
    migrate_sync(fresh_db, binding)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(binding.rewrite("DROP TRIGGER trg_awa_fast_notify ON awa_fast.jobs"))
        conn.execute(
            binding.rewrite("ALTER TABLE awa_fast.jobs DISABLE TRIGGER trg_awa_fast_jobs_finished")
        )
        conn.execute(
            binding.rewrite(
                "CREATE OR REPLACE FUNCTION awa_fast.raise_key_held(holder bigint) RETURNS void "
                "LANGUAGE sql AS 'SELECT'"
            )
        )
    assert migrate_sync(fresh_db, binding) == []
    with psycopg.connect(fresh_db) as conn:
        triggers = dict(
            conn.execute(
                "SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = %s::regclass",
                (binding.rewrite("awa_fast.jobs"),),
            ).fetchall()
        )
        assert triggers["trg_awa_fast_notify"] == "O"
        assert triggers["trg_awa_fast_jobs_finished"] == "O"
        assert (
            "unique_violation"
            in conn.execute(
                "SELECT prosrc FROM pg_proc WHERE proname = 'raise_key_held'"
            ).fetchone()[0]
        )
    bounded = _with_lock_timeout(fresh_db)
    with psycopg.connect(fresh_db) as holder:
        holder.execute(binding.rewrite("LOCK TABLE awa_fast.jobs IN ACCESS EXCLUSIVE MODE"))
        assert migrate_sync(bounded, binding) == []
        holder.rollback()


def test_a_migrator_killed_in_the_newest_migration_leaves_the_next_to_finish(
    fresh_db, fresh_catalog
):
    # An upgrade from 19 whose process is SIGKILLed while the newest migration's transaction
    # waits (its routines) for a lock another session holds: nothing of that transaction is
    # kept, and the next migrate() finishes the upgrade to a fresh install's catalog.
    history.restore(fresh_db, 19)
    code = "import sys; from awa_fast.schema import migrate_sync; migrate_sync(sys.argv[1])"
    newest = migrations()[-1][0]
    with psycopg.connect(fresh_db) as holder:
        holder.execute("SELECT count(*) FROM awa_fast.jobs_done")  # ACCESS SHARE, kept
        migrator = subprocess.Popen([sys.executable, "-c", code, fresh_db])
        try:
            with psycopg.connect(fresh_db, autocommit=True) as watch:
                for _ in range(1200):  # until the migrator waits for our lock
                    if watch.execute(
                        "SELECT 1 FROM pg_locks WHERE NOT granted AND locktype = 'relation' "
                        "AND database = (SELECT oid FROM pg_database "
                        "WHERE datname = current_database())"
                    ).fetchone():
                        break
                    time.sleep(0.05)
                else:
                    raise AssertionError("the migrator never waited for our lock")
                (at,) = watch.execute("SELECT max(version) FROM awa_fast.schema_version").fetchone()
        finally:
            migrator.send_signal(signal.SIGKILL)
            migrator.wait()
        holder.rollback()
    assert at == newest - 1  # killed within the newest migration's transaction
    assert migrate_sync(fresh_db) == [newest]
    with psycopg.connect(fresh_db) as conn:
        diff = differences(_without_rows(catalog(conn, "awa_fast")), _without_rows(fresh_catalog))
        assert diff == [], "\n".join(diff[:40])
        assert conn.execute("SELECT sha256 FROM awa_fast.schema_routines").fetchone() == (
            routines_digest(),
        )
