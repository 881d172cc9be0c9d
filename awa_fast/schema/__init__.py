"""Versioned SQL migrations for the ``awa_fast`` schema (or another, ADR 027), and its routines.

Migrations are the numbered ``NNN_name.sql`` files beside this module; ``baseline_NNN.sql`` is
the schema's tables, indexes and other stored objects as migrations 1..NNN leave them, in one
script (ADR 032). The functions and triggers are the routines, ``routines/*.sql``: each defined
once, idempotently, as the newest schema has it (ADR 043). :func:`migrate` creates a schema
with no version recorded from the baseline in one transaction and records versions 1..NNN;
then it applies the missing migrations in order, each in its own transaction. The routines run
in the transaction of the baseline or of the newest migration, and in one of their own when
their digest differs from the one recorded (a package whose routines changed without a
migration); a start with nothing to do reads two rows and locks no table. Every transaction
holds the schema's advisory lock, so migrating is idempotent and safe to run from many
processes at once. The files are written for ``awa_fast``; for another schema each is
rendered with the rule every statement follows
(:meth:`awa_fast.schema_binding.SchemaBinding.rewrite`), on a connection bound to that schema.

The baseline is kept equal to the migrations by ``tests/schema/test_schema_baseline.py`` (catalogs
compared) and at the newest version (docs/architecture.md, "Schema and migrations").
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Callable
from functools import partial
from importlib import resources

import psycopg

from awa_fast import db_errors
from awa_fast import sql as statements
from awa_fast.pg_connection import sync_connection_class
from awa_fast.schema_binding import DEFAULT, SchemaBinding

SCHEMA = "awa_fast"
# The advisory-lock key that serialises concurrent migrate() calls of the default schema
# (another schema's: SchemaBinding.migrate_lock_key).
MIGRATE_LOCK_KEY = DEFAULT.migrate_lock_key

# Orders the routines of different packages (ADR 043): bumped with every change to
# routines/*.sql (tests/schema pins each revision's digest), so that an older package, even one
# with the same newest migration, never puts its routines back over a newer one's.
ROUTINES_REVISION = 1

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{3})_(\w+)\.sql$")
_BASELINE = re.compile(r"^baseline_(\d{3})\.sql$")
# psql's include, relative to the file: a stored object's definition written once in
# objects/NNN_*.sql, included by migration NNN and by the baseline (ADR 043).
_INCLUDE = re.compile(r"^\\ir (objects/\w+\.sql)$", re.MULTILINE)


def _read(name: str) -> str:
    """A file of this package with its ``\\ir objects/...`` lines replaced by those files."""
    folder = resources.files(__package__)
    return _INCLUDE.sub(
        lambda m: folder.joinpath(m.group(1)).read_text().strip(), folder.joinpath(name).read_text()
    )


def migrations() -> list[tuple[int, str, str]]:
    """All migrations as ``(version, description, sql)``, in version order; ``sql`` has its
    ``\\ir objects/...`` lines replaced by those files.

    Raises:
        RuntimeError: two files share a version number (one would be skipped silently as
            already applied).
    """
    found = []
    for entry in resources.files(__package__).iterdir():
        m = _NAME.match(entry.name)
        if m:
            found.append((int(m.group(1)), m.group(2).replace("_", " "), _read(entry.name)))
    versions = [v for v, _, _ in found]
    if len(set(versions)) != len(versions):
        dup = sorted({v for v in versions if versions.count(v) > 1})
        raise RuntimeError(f"two migrations share version(s) {dup}: renumber one")
    return sorted(found)


def baseline() -> tuple[int, str]:
    """The baseline as ``(version, sql)``: one script creating the schema as migrations
    ``1..version`` leave it (``baseline_NNN.sql``).

    Raises:
        RuntimeError: no baseline file, more than one, or one past the newest migration.
    """
    found = [
        (int(m.group(1)), _read(entry.name))
        for entry in resources.files(__package__).iterdir()
        if (m := _BASELINE.match(entry.name))
    ]
    if len(found) != 1:
        raise RuntimeError(f"expected one baseline_NNN.sql, found {len(found)}")
    version, text = found[0]
    if version not in {v for v, _, _ in migrations()}:
        raise RuntimeError(f"baseline_{version:03d}.sql names no migration")
    return version, text


def routines() -> list[tuple[str, str]]:
    """The routines files as ``(name, sql)``, in the order they run (by name): every function
    and trigger of the newest schema, each script idempotent (ADR 043)."""
    folder = resources.files(__package__).joinpath("routines")
    return sorted(
        (entry.name, entry.read_text()) for entry in folder.iterdir() if entry.name.endswith(".sql")
    )


def routines_digest() -> str:
    """The SHA-256 of the routines files (names and texts), as recorded in ``schema_routines``
    when they are applied."""
    digest = hashlib.sha256()
    for name, text in routines():
        digest.update(f"{name}\0{text}\0".encode())
    return digest.hexdigest()


def routines_script() -> str:
    """Every routines file in order, as one script (written for ``awa_fast``)."""
    return "\n".join(f"-- routines/{name}\n{text.strip()}\n" for name, text in routines())


def _apply_routines(conn: psycopg.Connection) -> None:
    """Run every routines file and record their digest, in the caller's transaction (which
    holds the migration lock); ``conn`` is bound to the schema, which rewrites them."""
    conn.execute(routines_script())
    conn.execute(
        statements.ROUTINES_RECORD,
        (routines_digest(), ROUTINES_REVISION, current_migration_version()),
    )


def migrations_range(from_version: int, to_version: int) -> list[tuple[int, str, str]]:
    """awa-pg's ``migrations_range``: the migrations with ``from_version < version <=
    to_version``, in order."""
    return [m for m in migrations() if from_version < m[0] <= to_version]


def migration_scripts(
    from_version: int, to_version: int, binding: SchemaBinding = DEFAULT
) -> list[tuple[int, str, str]]:
    """The migrations with ``from_version < version <= to_version`` as ``(version, description,
    script)``, in order, each script a transaction that applies the migration by hand (psql, or
    any client that runs several statements) as :func:`migrate` does: under its lock, creating
    the ``schema_version`` table if missing and recording the version. A script whose migration
    is already recorded, or whose predecessor is not, fails and is rolled back before the
    migration runs (``psql -v ON_ERROR_STOP=1`` stops there). ``awa-fast migrate --sql`` prints
    these; :func:`migrations` is the bare SQL. The newest migration's script ends with the
    routines (ADR 043). ``binding``: the schema the scripts create or
    upgrade (the default ``awa_fast``'s scripts are the files as written)."""
    from psycopg.sql import Literal

    everything = migrations()
    previous = {v: (everything[i - 1][0] if i else 0) for i, (v, _, _) in enumerate(everything)}
    scripts = []
    for version, description, text in everything:
        if not from_version < version <= to_version:
            continue
        opening = statements.MIGRATION_SCRIPT_OPEN % {
            "lock_key": binding.migrate_lock_key,
            "bootstrap": "\n    ".join(statements.MIGRATION_BOOTSTRAP.strip().splitlines()),
            "version": version,
            "previous": previous[version],
        }
        record = statements.MIGRATION_RECORD % (version, Literal(description).as_string())
        if version == everything[-1][0]:
            # The newest migration's script also (re)defines the routines and records them, as
            # the runner does in that migration's transaction.
            text = f"{text.strip()}\n\n{routines_script()}"
            record += ";\n" + statements.ROUTINES_RECORD % (
                Literal(routines_digest()).as_string(),
                ROUTINES_REVISION,
                version,
            )
        closing = statements.MIGRATION_SCRIPT_CLOSE % {"record": record}
        script = binding.rewrite(f"{opening}\n{text.strip()}\n\n{closing}")
        scripts.append((version, description, script))
    return scripts


def current_migration_version() -> int:
    """The newest migration version this package ships."""
    return migrations()[-1][0]


async def check_current(conn: psycopg.AsyncConnection) -> None:
    """Fail fast on a database this package cannot work with (the worker's ``start()`` and
    every CLI command that reads jobs), for the schema ``conn`` is bound to
    (``pg_connection.connection_class``).

    Raises:
        SchemaNotMigrated: that schema is missing or older than this package.
    """
    from awa_fast.errors import SchemaNotMigrated

    name = getattr(conn, "schema", DEFAULT).name
    hint = "awa-fast migrate" + ("" if name == SCHEMA else f" --schema {name}")

    version = None
    if (await (await conn.execute(statements.SCHEMA_PRESENT)).fetchone() or (None,))[0]:
        version = (await (await conn.execute(statements.SCHEMA_VERSION)).fetchone() or (None,))[0]
    need = current_migration_version()
    if version is None:
        raise SchemaNotMigrated(f"the {name} schema is missing from this database: run `{hint}`")
    if version < need:
        raise SchemaNotMigrated(
            f"the {name} schema is at version {version}, this package needs {need}: run `{hint}`"
        )


@db_errors.maps("migrate")
async def migrate(
    database_url: str, binding: SchemaBinding = DEFAULT, *, use_baseline: bool = True
) -> list[int]:
    """Bring ``binding``'s schema in ``database_url`` to the newest version; returns the
    versions applied now. Runs :func:`migrate_sync` in a thread (migrations are rare and short).

    Raises:
        ReadOnlyDatabase, DatabaseUnavailable, DatabaseError: the database could not be
            reached or rejected a migration (that migration is rolled back); chained to the
            driver's error (``awa_fast.db_errors``).
    """
    return await asyncio.to_thread(migrate_sync, database_url, binding, use_baseline=use_baseline)


@db_errors.maps("migrate")
def migrate_sync(
    database_url: str, binding: SchemaBinding = DEFAULT, *, use_baseline: bool = True
) -> list[int]:
    """Bring ``binding``'s schema (default ``awa_fast``, created if missing) in
    ``database_url`` to the newest version; returns the versions applied now, in order. Each
    schema has its own version table and lock: migrating one never waits for or touches another.

    A schema with no version recorded is created from :func:`baseline` in one transaction,
    which records versions ``1..baseline version`` as applied (they are returned); any later
    migration, and every missing one of a schema that has a version recorded, is applied in
    order, one transaction each. ``use_baseline=False`` applies every migration in order
    instead (the result is the same schema; tests compare the two). The routines
    (:func:`routines`) run in the transaction of the baseline or of the newest migration, or,
    when no migration ran, in one of their own if their digest differs from the recorded one
    and neither the recorded revision nor the schema is newer than this package's, or if they
    were changed by hand since (ADR 043). A transaction the server cancels to break a deadlock
    with running workers (the routines lock ``jobs`` and its slices) is run again.

    Raises:
        DatabaseError: as :func:`migrate`.
    """
    applied_now: list[int] = []
    everything = migrations()
    # No prepared statements, no session SET: works through a transaction pooler too.
    with sync_connection_class(binding).connect(
        database_url, autocommit=True, prepare_threshold=None
    ) as conn:
        # The lock, then a fresh look at what is applied: READ COMMITTED whatever the
        # database's default (at REPEATABLE READ two migrators both saw a version missing);
        # each transaction's own BEGIN says so.
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        if use_baseline:
            applied_now += _locked(conn, binding, partial(_install, conn))
        for version, description, sql in everything:
            if version not in applied_now:
                step = partial(_upgrade, conn, version, description, sql)
                applied_now += _locked(conn, binding, step)
        if not applied_now:
            _locked(conn, binding, partial(_refresh, conn, binding))
    return applied_now


def _install(conn: psycopg.Connection) -> list[int]:
    """A schema with no version recorded: the baseline, its versions recorded (returned), and
    the routines if it is the newest; nothing (``[]``) for a schema with a version recorded."""
    if conn.execute(statements.MIGRATION_ANY_APPLIED).fetchone():
        return []
    version, text = baseline()
    conn.execute(text)
    recorded = []
    for v, description, _ in migrations():
        if v <= version:
            conn.execute(statements.MIGRATION_RECORD, (v, description))
            recorded.append(v)
    if version == current_migration_version():
        _apply_routines(conn)
    return recorded


def _upgrade(conn: psycopg.Connection, version: int, description: str, sql: str) -> list[int]:
    """Migration ``version`` unless recorded (then ``[]``), recorded, with the routines after
    the newest."""
    if conn.execute(statements.MIGRATION_APPLIED, (version,)).fetchone():
        return []
    if _has_statements(sql):
        conn.execute(sql)
    conn.execute(statements.MIGRATION_RECORD, (version, description))
    if version == current_migration_version():
        _apply_routines(conn)
    return [version]


def _refresh(conn: psycopg.Connection, binding: SchemaBinding) -> list[int]:
    """Nothing migrated: the routines only if this package's differ from those applied and
    neither those nor the schema are newer than the package's (an older package never puts its
    routines back, so two never take turns), or if its own were changed by hand since. Reads
    two rows; takes no table lock when nothing is due."""
    state = conn.execute(statements.ROUTINES_STATE).fetchone()
    recorded, revision, fingerprint, now, at = state or (None,) * 5
    if recorded == routines_digest():
        if fingerprint != now:
            # ours, changed by hand since (a trigger dropped or disabled, a function
            # redefined): the queue relies on them as written
            log.warning(
                "schema %s: its functions or triggers were changed since they were applied; "
                "applying them again",
                binding.name,
            )
            _apply_routines(conn)
    elif (revision or 0) <= ROUTINES_REVISION and (at or 0) <= current_migration_version():
        _apply_routines(conn)
    return []


# A transaction that the server cancelled to break a deadlock is run again this many times.
_DEADLOCK_ATTEMPTS = 10


def _locked(
    conn: psycopg.Connection, binding: SchemaBinding, step: Callable[[], list[int]]
) -> list[int]:
    """``step()`` in a transaction of its own holding the migration lock, after the version
    tables' bootstrap; run again from the start when the server cancelled it to break a
    deadlock (the routines' trigger changes lock ``jobs`` and its slices, which running workers
    lock in either order: one of the two is cancelled; nothing of it was written)."""
    for attempt in range(1, _DEADLOCK_ATTEMPTS + 1):
        try:
            with conn.transaction():
                conn.execute(statements.MIGRATE_LOCK, (binding.migrate_lock_key,))
                conn.execute(statements.MIGRATION_BOOTSTRAP)
                return step()
        except psycopg.errors.DeadlockDetected:
            if attempt == _DEADLOCK_ATTEMPTS:
                raise
            time.sleep(0.05 * attempt)  # the other side's retry, often, goes first
    raise AssertionError("unreachable")


def _has_statements(text: str) -> bool:
    """Whether a migration has anything but comments (one whose change was a routine only
    keeps its comments and its version: ADR 043)."""
    return any(line.strip() and not line.lstrip().startswith("--") for line in text.splitlines())
