"""Build the released-history fixtures of tests/schema/fixtures/ (ADR 043); run once, from the
repository root, and commit what it writes:

    python -m tests.schema.make_history_fixtures [VERSION ...]

For each version it starts a temporary server, creates the schema with the migrations as
released at commit 9e61ae0 (read with ``git show``, applied as that commit's runner applied
them: one transaction each, recorded in schema_version), fills it with that era's SQL (rows in
every state; the era's own triggers move, count and hold them), and writes ``vNNN.sql.gz``:
the released migrations' text (so that the schema's catalog is the one those migrations made:
a pg_dump restore renames what they left, such as an index column kept across a RENAME COLUMN
and LIKE's not-null constraint names) followed by ``pg_dump --data-only --inserts
--disable-triggers`` of the rows. It then restores that dump in another database, upgrades
it with the released migrations NNN+1.., and writes :func:`tests.schema.history.data` of the
result as ``vNNN.expected.json``: the data an upgrade gave before the routines existed.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys

import psycopg
from psycopg import sql as psql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from awa_fast.embedded.cluster import find_bindir
from awa_fast.embedded.temp import start_temp
from tests.schema.history import FIXTURES, VERSIONS, data, dump_path, expected_path, restore

RELEASED = "9e61ae0"
T0 = "2026-11-30 10:00:00+00"  # the fixtures' clock: finished rows are placed around it


def released_migrations() -> list[tuple[int, str, str]]:
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{RELEASED}:awa_fast/schema/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = []
    for name in names:
        m = re.match(r"^(\d{3})_(\w+)\.sql$", name)
        if m:
            text = subprocess.run(
                ["git", "show", f"{RELEASED}:awa_fast/schema/{name}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            found.append((int(m.group(1)), m.group(2).replace("_", " "), text))
    return sorted(found)


def migrate_released(dsn: str, after: int, upto: int) -> None:
    """The released runner's steps for versions ``after < v <= upto``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE SCHEMA IF NOT EXISTS awa_fast; CREATE TABLE IF NOT EXISTS "
            "awa_fast.schema_version (version integer PRIMARY KEY, description text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, description, text in released_migrations():
            if after < version <= upto:
                with conn.transaction():
                    conn.execute(text)
                    conn.execute(
                        "INSERT INTO awa_fast.schema_version (version, description) "
                        "VALUES (%s, %s)",
                        (version, description),
                    )


def fill(conn: psycopg.Connection, version: int) -> None:
    """Rows in every state, with that version's columns and functions."""
    x = conn.execute
    x("INSERT INTO awa_fast.queue_meta (queue, paused) VALUES ('fixture', false), ('held', true)")
    if version >= 2:
        x("UPDATE awa_fast.queue_meta SET dlq = true WHERE queue = 'fixture'")
    if version >= 20:
        # a verified kind: its completions are listed in verify_due by that era's trigger
        x(
            "INSERT INTO awa_fast.verifier_kinds (kind, state, window_s) "
            "VALUES ('verified', 'active', 3600)"
        )
    live = [
        ("scheduled", "run_at = %(t)s::timestamptz + interval '1 day'"),
        ("available", ""),
        ("running", "attempt = 1, run_lease = 1, heartbeat_at = %(t)s, attempted_at = %(t)s"),
        ("retryable", "attempt = 1, run_at = %(t)s::timestamptz + interval '1 hour'"),
        (
            "waiting_external",
            "attempt = 1, run_lease = 2, callback_id = md5(args::text)::uuid, "
            "callback_timeout_at = %(t)s::timestamptz + interval '1 hour'",
        ),
    ]
    if version >= 2:
        live.append(("consequence_pending", "attempt = 25, run_lease = 3"))
    # (state, finalized_at before T0, mask, kind, running handler, consequence): finished rows
    # in several slices, holding their key (mask 255) or not (2: available only; 64: cancelled)
    finished = [
        ("completed", "1 hour", 255, "plain", False, None),
        ("completed", "90 minutes", 2, "plain", False, None),
        ("completed", "2 days", 255, "verified", False, None),
        ("completed", "5 minutes", 255, "verified", False, None),
        ("failed", "3 hours", 255, "plain", False, None),
        ("failed", "1 day", 2, "plain", False, None),
        ("cancelled", "7 hours", 255, "plain", False, None),
        ("cancelled", "30 minutes", 64, "plain", False, None),
        ("completed", "10 minutes", 255, "plain", True, None),  # its handler still runs: live
    ]
    if version >= 2:
        finished.append(("failed", "20 minutes", 255, "plain", False, "owed"))  # stays live
        finished.append(("failed", "4 hours", 0, "plain", False, "applied"))
    n = 0
    for state, extra in live:
        for queue in ("fixture", "held"):
            n += 1
            x(
                "INSERT INTO awa_fast.jobs (kind, queue, args, state, unique_key, unique_states,"
                " created_at, run_at) VALUES ('plain', %(q)s, %(a)s, %(s)s, %(k)s, 255, %(t)s, %(t)s)",
                {"q": queue, "a": json.dumps({"n": n}), "s": state, "k": bytes([0xF0, n]), "t": T0},
            )
            if extra:
                x(
                    f"UPDATE awa_fast.jobs SET {extra} WHERE args = %(a)s",
                    {"a": json.dumps({"n": n}), "t": T0},
                )
    for state, ago, mask, kind, running, consequence in finished:
        n += 1
        x(
            "INSERT INTO awa_fast.jobs (kind, queue, args, state, attempt, unique_key, "
            "unique_states, created_at, run_at, finalized_at, errors, heartbeat_at"
            + (", consequence_state" if consequence else "")
            + ") VALUES (%(kind)s, 'fixture', %(a)s, %(s)s, 1, %(k)s, %(m)s, %(t)s, %(t)s, "
            "%(t)s::timestamptz - %(ago)s::interval, %(e)s, %(hb)s"
            + (", %(c)s" if consequence else "")
            + ")",
            {
                "kind": kind,
                "a": json.dumps({"n": n}),
                "s": state,
                "k": bytes([0xF1, n]),
                "m": mask,
                "t": T0,
                "ago": ago,
                "e": json.dumps([{"error": "boom"}] if state == "failed" else []),
                "hb": T0 if running else None,
                "c": consequence,
            },
        )
    if version >= 2:
        # one failed job of the DLQ-enabled queue dead-lettered by that era's function
        n += 1
        x(
            "INSERT INTO awa_fast.jobs (kind, queue, args, state, attempt, created_at, run_at, "
            "finalized_at) VALUES ('plain', 'fixture', %(a)s, 'failed', 25, %(t)s, %(t)s, %(t)s)",
            {"a": json.dumps({"n": n}), "t": T0},
        )
        x(
            "SELECT awa_fast.dead_letter_if_enabled(id, 'exhausted') FROM awa_fast.jobs "
            "WHERE args = %s",
            (json.dumps({"n": n}),),
        )
        x("UPDATE awa_fast.dlq SET dlq_at = %s", (T0,))
    if version >= 3:
        x(
            "INSERT INTO awa_fast.cron_jobs (name, cron_expr, kind, queue, last_fire_at, "
            "created_at, updated_at) VALUES ('hourly', '0 * * * *', 'plain', 'fixture', %(t)s, "
            "%(t)s, %(t)s)",
            {"t": T0},
        )
    if version >= 5:
        x("UPDATE awa_fast.leader SET epoch = 7, holder = 'host:1', since = %s", (T0,))
        x(
            "INSERT INTO awa_fast.workers (instance, queues, kinds, started_at, seen_at, "
            "expires_at) VALUES ('host:1', '{fixture}', '{plain,verified}', %(t)s, %(t)s, "
            "%(t)s::timestamptz + interval '1 minute')",
            {"t": T0},
        )
    if version >= 6:
        x(
            "INSERT INTO awa_fast.callback_expressions (job_id, callback_id, expressions) "
            'SELECT id, callback_id, \'{"filter": "true"}\' FROM awa_fast.jobs '
            "WHERE callback_id IS NOT NULL"
        )
    if version >= 7:
        x(
            "INSERT INTO awa_fast.queue_descriptors (queue, display_name, descriptor_hash, "
            "created_at, updated_at, last_seen_at) VALUES ('fixture', 'Fixture', 'h1', %(t)s, "
            "%(t)s, %(t)s)",
            {"t": T0},
        )
    if version >= 8:
        x(
            "INSERT INTO awa_fast.batch_operations (id, op_kind, filter, spec, state, "
            "submitted_at, updated_at) VALUES ('00000000-0000-4000-8000-0000000000b1', "
            "'set_priority', '{}', '{\"priority\": 1}', 'running', %(t)s, %(t)s)",
            {"t": T0},
        )
        x(
            "INSERT INTO awa_fast.batch_operation_items (operation_id, job_id) "
            "SELECT '00000000-0000-4000-8000-0000000000b1', id FROM awa_fast.jobs "
            "WHERE state = 'available'"
        )
    if version >= 25:
        x("UPDATE awa_fast.workers SET min_stale_ms = 60000")
    if version >= 28:
        x(
            "UPDATE awa_fast.leader_lease SET epoch = 7, holder = 'host:1', via_lock = true, "
            "expires_at = %s::timestamptz + interval '30 seconds'",
            (T0,),
        )


def _database(base: str, name: str) -> str:
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(psql.SQL("CREATE DATABASE {}").format(psql.Identifier(name)))
    return make_conninfo(**{**conninfo_to_dict(base), "dbname": name})


_BOOTSTRAP = (
    "CREATE SCHEMA IF NOT EXISTS awa_fast;\nCREATE TABLE IF NOT EXISTS awa_fast.schema_version "
    "(version integer PRIMARY KEY, description text NOT NULL, applied_at timestamptz NOT NULL "
    "DEFAULT now());\n"
)


def replay(version: int) -> str:
    """The released migrations 1..version as one script (their records come with the data)."""
    return _BOOTSTRAP + "".join(
        f"-- released migration {v:03d}: {d}\n{text.strip()}\n\n"
        for v, d, text in released_migrations()
        if v <= version
    )


def data_dump(dsn: str, seeded: list[str]) -> str:
    """The schema's rows as INSERTs with every trigger disabled while they load (the era's
    triggers already moved, counted and held them), after deleting the rows its migrations
    seed (``seeded`` tables)."""
    out = subprocess.run(
        [
            str(find_bindir() / "pg_dump"),
            "--data-only",
            "--inserts",
            "--disable-triggers",
            "--schema=awa_fast",
            dsn,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # psql meta-commands of newer pg_dump releases (\restrict): the fixture runs as plain SQL
    rows = "\n".join(line for line in out.splitlines() if not line.startswith("\\"))
    deletes = "".join(f"DELETE FROM awa_fast.{table};\n" for table in seeded)
    return f"{deletes}{rows}\n"


def seeded_tables(base: str, version: int) -> list[str]:
    """Tables the released migrations 1..version leave rows in."""
    dsn = _database(base, f"history_{version}_seeded")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(replay(version))
        tables = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'awa_fast' AND c.relkind = 'r' AND c.relname <> 'schema_version' "
            "ORDER BY 1"
        ).fetchall()
        return [
            table
            for (table,) in tables
            if conn.execute(f"SELECT EXISTS (SELECT FROM awa_fast.{table})").fetchone()[0]
        ]


def build(base: str, version: int) -> None:
    made = _database(base, f"history_{version}_made")
    migrate_released(made, 0, version)
    with psycopg.connect(made, autocommit=True) as conn:
        fill(conn, version)
    header = (
        f"-- The awa_fast schema at released version {version:03d} (commit {RELEASED}) with rows "
        "in every state:\n-- written by tests/schema/make_history_fixtures.py, read by "
        "tests/schema/history.py.\n"
    )
    fixture = header + replay(version) + data_dump(made, seeded_tables(base, version))
    dump_path(version).write_bytes(gzip.compress(fixture.encode(), 9, mtime=0))
    upgraded = _database(base, f"history_{version}_upgraded")
    restore(upgraded, version)
    migrate_released(upgraded, version, 10_000)
    with psycopg.connect(upgraded) as conn:
        expected_path(version).write_text(json.dumps(data(conn), indent=1, sort_keys=True) + "\n")


def main(argv: list[str]) -> None:
    FIXTURES.mkdir(exist_ok=True)
    server = start_temp()
    try:
        for version in [int(v) for v in argv] or VERSIONS:
            build(server.dsn, version)
            print(f"wrote {dump_path(version)} and {expected_path(version)}")
    finally:
        server.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
