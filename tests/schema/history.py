"""Schemas from released history (ADR 043): restoring the dumps in tests/schema/fixtures/ and
reading a schema's data in a form two upgrades can be compared by.

``fixtures/vNNN.sql.gz`` is the awa_fast schema at version NNN as the migrations as released
made it (tests/schema/make_history_fixtures.py, from commit 9e61ae0: functions and triggers of
that era included), with rows in every state filled there (loaded with triggers disabled);
``fixtures/vNNN.expected.json`` is :func:`data` of that dump upgraded by the released
migrations, the result an upgrade gave before the routines existed.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import psycopg
from psycopg import sql as psql

FIXTURES = Path(__file__).parent / "fixtures"
# The released versions with a fixture: before finished storage, its row trigger era, its
# statement trigger era, the last before the routines.
VERSIONS = [9, 12, 19, 28]

# Columns whose value depends on the run (the runner's clock), and bookkeeping the released
# runner did not have.
_SKIPPED = {"schema_version": {"applied_at"}}
_TABLES_SKIPPED = {"schema_routines"}


def dump_path(version: int) -> Path:
    return FIXTURES / f"v{version:03d}.sql.gz"


def expected_path(version: int) -> Path:
    return FIXTURES / f"v{version:03d}.expected.json"


def restore(dsn: str, version: int) -> None:
    """Load the dump of ``version`` into the (empty) database ``dsn``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(gzip.decompress(dump_path(version).read_bytes()).decode())


def data(conn: psycopg.Connection, schema: str = "awa_fast") -> dict[str, list[list[str]]]:
    """Every table's rows of ``schema`` (values as text, sorted), partitions each under its own
    name; done_counts summed over the writing backend (its pid differs per run). Times in UTC
    (sets the session's TimeZone)."""
    conn.execute("SET TimeZone = 'UTC'")
    tables = conn.execute(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY 1""",
        (schema,),
    ).fetchall()
    out: dict[str, list[list[str]]] = {}
    for (table,) in tables:
        if table in _TABLES_SKIPPED:
            continue
        if table == "done_counts":
            query = psql.SQL(
                "SELECT slot::text, bucket::text, queue, state::text, sum(n)::text, "
                "max(newest)::text FROM {} GROUP BY 1, 2, 3, 4"
            ).format(psql.Identifier(schema, table))
        else:
            skipped = _SKIPPED.get(table, set())
            columns = [
                name
                for (name,) in conn.execute(
                    """SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass
                       AND attnum > 0 AND NOT attisdropped ORDER BY attnum""",
                    (psql.Identifier(schema, table).as_string(conn),),
                ).fetchall()
                if name not in skipped
            ]
            query = psql.SQL("SELECT {} FROM {}").format(
                psql.SQL(", ").join(
                    psql.SQL("{}::text").format(psql.Identifier(c)) for c in columns
                ),
                psql.Identifier(schema, table),
            )
        rows = [["" if v is None else v for v in r] for r in conn.execute(query).fetchall()]
        out[table] = sorted(rows)
    return out


def expected(version: int) -> dict[str, list[list[str]]]:
    return json.loads(expected_path(version).read_text())
