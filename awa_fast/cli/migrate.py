"""``awa-fast migrate``: apply the schema migrations, or print their SQL."""

from __future__ import annotations

import sys

from awa_fast.cli.errors import UsageError
from awa_fast.cli.output import print_json
from awa_fast.cli.session import Session
from awa_fast.cli.table import Command, arg


async def cmd_migrate(s: Session) -> int:
    from awa_fast import schema

    a = s.args
    # Each mode picks its own range: two of them together would leave one silently unused.
    ranged = [f for f, v in (("--from", a.from_version), ("--to", a.to)) if v is not None]
    if a.pending and (a.sql or a.version is not None or ranged):
        others = (["--sql"] if a.sql else []) + (["--version"] if a.version is not None else [])
        raise UsageError(
            f"--pending cannot be combined with {', '.join(others + ranged)}", a.parser
        )
    if a.version is not None and ranged:
        raise UsageError(f"--version cannot be combined with {', '.join(ranged)}", a.parser)
    if a.pending:
        # awa's --pending: the SQL of the migrations this database has not applied yet.
        client = await s.client(need_schema=False)
        async with (await client.pool()).connection() as conn:
            done = await schema.applied_version(conn) or 0
        return print_migrations(s, done, schema.current_migration_version())
    if a.sql or a.version is not None or a.from_version is not None or a.to is not None:
        # SQL-printing modes (awa-pg's): no database needed.
        latest = schema.current_migration_version()
        if a.version is not None:
            if not 1 <= a.version <= latest:
                message = f"Version {a.version} is out of range. Valid versions: 1..{latest}"
                return s.fail(message, text=message)  # awa-pg's text, without our prefix
            return print_migrations(s, a.version - 1, a.version)
        after = 0 if a.from_version is None else a.from_version
        upto = latest if a.to is None else a.to
        for flag, value in (("--from", a.from_version), ("--to", a.to)):
            if value is not None and not 0 <= value <= latest:
                raise UsageError(
                    f"{flag} {value} is out of range: valid versions are 0..{latest}",
                    a.parser,
                )
        if after > upto:
            raise UsageError(
                f"--from {after} is after --to {upto}: the range is --from < version <= --to",
                a.parser,
            )
        return print_migrations(s, after, upto)
    client = await s.client(need_schema=False)
    applied = await client.migrate()
    async with (await client.pool()).connection() as conn:
        version = await schema.applied_version(conn)
    names = {v: d for v, d, _ in schema.migrations()}
    if s.json:
        print_json({"applied": applied, "version": version})
    elif applied:
        for v in applied:
            print(f"applied migration {v:03d}: {names.get(v, '')}".rstrip())
        print(f"schema up to date (version {version})")
    else:
        print(f"schema up to date (version {version})")
    return 0


def print_migrations(s: Session, after: int, upto: int) -> int:
    """Print the SQL of migrations ``after < version <= upto``: awa-pg's format, or with
    ``--json`` ``{"from": after, "to": upto, "migrations": [{"version", "description", "sql"}]}``."""
    from awa_fast import schema

    # Each migration as a transaction that also keeps the runner's bookkeeping (its lock, the
    # schema_version table, the version's record), so the printed SQL can be applied by hand.
    from awa_fast.schema_binding import resolve

    found = schema.migration_scripts(after, upto, resolve())
    if s.json:
        print_json(
            {
                "from": after,
                "to": upto,
                "migrations": [
                    {"version": v, "description": d, "sql": text} for v, d, text in found
                ],
            }
        )
        return 0
    if after >= upto:
        print(f"No migrations in range ({after}, {upto}].", file=sys.stderr)
        return 0
    for version, description, text in found:
        print(f"-- Migration V{version}: {description}\n{text}\n")
    return 0


MIGRATE = Command(
    "migrate",
    cmd_migrate,
    help="create or upgrade the awa_fast schema (or --schema's)",
    description="Apply every missing awa_fast schema migration (idempotent, "
    "safe to run concurrently).\nPrints the versions applied, or "
    "'schema up to date (version N)';\n"
    '--json: {"applied": [...], "version": N}. --sql, --version, --from/--to and '
    "--pending\nprint SQL instead, "
    "each migration a transaction that also records its version as the runner\n"
    "does, to apply by hand in order (awa-fast migrate --to N | psql -v ON_ERROR_STOP=1);\n"
    '--json: {"from": A, "to": B, "migrations": [{"version", "description",\n'
    '"sql"}, ...]}, the migrations A < version <= B.',
    raw=True,
    args=(
        arg(
            "--sql",
            action="store_true",
            help="print the SQL of all migrations instead of applying them (needs no database)",
        ),
        arg(
            "--version",
            type=int,
            metavar="N",
            help="print the SQL of migration N only (needs no database; exit 1 if out of range)",
        ),
        arg(
            "--from",
            type=int,
            dest="from_version",
            metavar="N",
            help="print the SQL of migrations after N (exclusive; 0..latest; needs no database)",
        ),
        arg(
            "--to",
            type=int,
            metavar="N",
            help="print the SQL of migrations up to N (inclusive; --from..latest; needs no "
            "database)",
        ),
        arg(
            "--pending",
            action="store_true",
            help="print the SQL of the migrations this database has not applied",
        ),
    ),
)
