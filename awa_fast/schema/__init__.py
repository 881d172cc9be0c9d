"""Versioned SQL migrations for the ``awa_fast`` schema.

Migrations are the numbered ``NNN_name.sql`` files beside this module. :func:`migrate` applies the
missing ones in order, each in its own transaction, under a transaction-level advisory lock, so it is
idempotent and safe to run from many processes at once.
"""

from __future__ import annotations

import asyncio
import re
from importlib import resources

import psycopg

from awa_fast import db_errors
from awa_fast import sql as statements

SCHEMA = "awa_fast"
# Arbitrary constant: the advisory-lock key that serialises concurrent migrate() calls.
MIGRATE_LOCK_KEY = 0x6177615F6D6967  # "awa_mig"

_NAME = re.compile(r"^(\d{3})_(\w+)\.sql$")


def migrations() -> list[tuple[int, str, str]]:
    """All migrations as ``(version, description, sql)``, in version order.

    Raises:
        RuntimeError: two files share a version number (one would be skipped silently as
            already applied).
    """
    found = []
    for entry in resources.files(__package__).iterdir():
        m = _NAME.match(entry.name)
        if m:
            found.append((int(m.group(1)), m.group(2).replace("_", " "), entry.read_text()))
    versions = [v for v, _, _ in found]
    if len(set(versions)) != len(versions):
        dup = sorted({v for v in versions if versions.count(v) > 1})
        raise RuntimeError(f"two migrations share version(s) {dup}: renumber one")
    return sorted(found)


def migrations_range(from_version: int, to_version: int) -> list[tuple[int, str, str]]:
    """awa-pg's ``migrations_range``: the migrations with ``from_version < version <=
    to_version``, in order."""
    return [m for m in migrations() if from_version < m[0] <= to_version]


def migration_scripts(from_version: int, to_version: int) -> list[tuple[int, str, str]]:
    """The migrations with ``from_version < version <= to_version`` as ``(version, description,
    script)``, in order, each script a transaction that applies the migration by hand (psql, or
    any client that runs several statements) as :func:`migrate` does: under its lock, creating
    the ``schema_version`` table if missing and recording the version. A script whose migration
    is already recorded, or whose predecessor is not, fails and is rolled back before the
    migration runs (``psql -v ON_ERROR_STOP=1`` stops there). ``awa-fast migrate --sql`` prints
    these; :func:`migrations` is the bare SQL."""
    from psycopg.sql import Literal

    everything = migrations()
    previous = {v: (everything[i - 1][0] if i else 0) for i, (v, _, _) in enumerate(everything)}
    scripts = []
    for version, description, text in everything:
        if not from_version < version <= to_version:
            continue
        opening = statements.MIGRATION_SCRIPT_OPEN % {
            "lock_key": MIGRATE_LOCK_KEY,
            "bootstrap": "\n    ".join(statements.MIGRATION_BOOTSTRAP.strip().splitlines()),
            "version": version,
            "previous": previous[version],
        }
        record = statements.MIGRATION_RECORD % (version, Literal(description).as_string())
        closing = statements.MIGRATION_SCRIPT_CLOSE % {"record": record}
        scripts.append((version, description, f"{opening}\n{text.strip()}\n\n{closing}"))
    return scripts


def current_migration_version() -> int:
    """The newest migration version this package ships."""
    return migrations()[-1][0]


async def check_current(conn: psycopg.AsyncConnection) -> None:
    """Fail fast on a database this package cannot work with (the worker's ``start()`` and
    every CLI command that reads jobs).

    Raises:
        SchemaNotMigrated: the ``awa_fast`` schema is missing or older than this package.
    """
    from awa_fast.errors import SchemaNotMigrated

    version = None
    if (await (await conn.execute(statements.SCHEMA_PRESENT)).fetchone() or (None,))[0]:
        version = (await (await conn.execute(statements.SCHEMA_VERSION)).fetchone() or (None,))[0]
    need = current_migration_version()
    if version is None:
        raise SchemaNotMigrated(
            "the awa_fast schema is missing from this database: run `awa-fast migrate`"
        )
    if version < need:
        raise SchemaNotMigrated(
            f"the awa_fast schema is at version {version}, this package "
            f"needs {need}: run `awa-fast migrate`"
        )


@db_errors.maps("migrate")
async def migrate(database_url: str) -> list[int]:
    """Apply every missing migration to ``database_url``; returns the versions applied now.

    Runs :func:`migrate_sync` in a thread (migrations are rare and short).

    Raises:
        ReadOnlyDatabase, DatabaseUnavailable, DatabaseError: the database could not be
            reached or rejected a migration (that migration is rolled back); chained to the
            driver's error (``awa_fast.db_errors``).
    """
    return await asyncio.to_thread(migrate_sync, database_url)


@db_errors.maps("migrate")
def migrate_sync(database_url: str) -> list[int]:
    """Apply every missing migration to ``database_url``; returns the versions applied now.

    Raises:
        DatabaseError: as :func:`migrate`.
    """
    applied_now = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        # The lock, then a fresh look at what is applied: READ COMMITTED whatever the
        # database's default (at REPEATABLE READ two migrators both saw a version missing).
        conn.execute(statements.SESSION_READ_COMMITTED)
        for version, description, sql in migrations():
            with conn.transaction():
                conn.execute(statements.MIGRATE_LOCK, (MIGRATE_LOCK_KEY,))
                conn.execute(statements.MIGRATION_BOOTSTRAP)
                if conn.execute(statements.MIGRATION_APPLIED, (version,)).fetchone():
                    continue
                conn.execute(sql)
                conn.execute(statements.MIGRATION_RECORD, (version, description))
                applied_now.append(version)
    return applied_now
