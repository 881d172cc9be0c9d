"""A user's mistake gets one line, not a traceback: the CLI (``python -m awa_fast``, run as a
subprocess) reports an application that raises at import, awa's own ``ValidationError`` (a bad
cron expression, a bad time zone), an unreachable or unmigrated database in one line saying
what, where and how to see more; ``--traceback`` or ``AWA_FAST_DEBUG=1`` adds the whole
traceback. The launcher reports such errors once, before any worker process starts."""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import awa_fast as awa

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120
TRACEBACK = "Traceback (most recent call last)"
HINT = "run with --traceback (or AWA_FAST_DEBUG=1) for the whole traceback"

APP = """\
import dataclasses
import awa_fast as awa

client = awa.AsyncClient({dsn!r})


@dataclasses.dataclass
class Tick:
    n: int


@client.task(Tick, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def tick(job):
    pass


{tail}
"""


def _app(where: Path, name: str, dsn: str, tail: str) -> int:
    """Write module ``name`` (a client on ``dsn``, one task, then ``tail``); returns the line
    number of ``tail``'s first line."""
    text = APP.format(dsn=dsn, tail=tail)
    (where / f"{name}.py").write_text(text)
    return text.splitlines().index(tail.splitlines()[0]) + 1


def run(where: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AWA_FAST_DATABASE_URL", "DATABASE_URL", "AWA_FAST_DEBUG")
    }
    base["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "awa_fast", *args],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**base, **env},
    )


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"postgresql://awa@127.0.0.1:{port}/nowhere"


@dataclasses.dataclass
class Gone:
    n: int


BAD_CRON = 'client.periodic("every", "*/5 * * *", Tick, Tick(1))'
BAD_ZONE = 'client.periodic("every", "*/5 * * * *", Tick, Tick(1), timezone="Europe/Nowhere")'


@pytest.mark.parametrize("command", ["check", "worker"])
def test_a_bad_cron_expression_at_import_is_one_line_naming_the_application_line(
    tmp_path, dsn, command
):
    line = _app(tmp_path, "cron_app", dsn, BAD_CRON)
    r = run(tmp_path, command, "cron_app:client")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr == (
        f"awa-fast {command}: error: importing cron_app:client failed: ValidationError: "
        "invalid cron expression '*/5 * * *': expected 5 fields (minute hour day-of-month "
        f"month day-of-week) or an @alias (at {tmp_path}/cron_app.py:{line}); {HINT}\n"
    )
    assert r.stdout == ""  # worker: no child was started


def test_a_bad_time_zone_at_import_is_one_line_and_the_worker_starts_no_child(tmp_path, dsn):
    line = _app(tmp_path, "zone_app", dsn, BAD_ZONE)
    r = run(tmp_path, "worker", "zone_app:client", "--processes", "2")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1, r.stderr
    assert "ValidationError: unknown timezone 'Europe/Nowhere'" in r.stderr
    assert f"(at {tmp_path}/zone_app.py:{line})" in r.stderr
    assert TRACEBACK not in r.stderr and r.stdout == ""


def test_an_application_error_names_its_own_line_not_the_librarys(tmp_path, dsn):
    # raised inside the standard library (json), called from the application's line
    line = _app(tmp_path, "json_app", dsn, 'import json\nCONFIG = json.loads("{not json")')
    r = run(tmp_path, "check", "json_app:client")
    assert r.returncode == 1
    assert "failed: JSONDecodeError: Expecting property name" in r.stderr
    assert f"(at {tmp_path}/json_app.py:{line + 1})" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1


def test_a_syntax_error_and_a_missing_dependency_say_where_and_what_to_do(tmp_path, dsn):
    line = _app(tmp_path, "syntax_app", dsn, "def broken(:\n    pass")
    r = run(tmp_path, "check", "syntax_app:client")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "failed: SyntaxError: " in r.stderr
    assert f"(at {tmp_path}/syntax_app.py:{line})" in r.stderr
    _app(tmp_path, "dep_app", dsn, "import no_such_dependency_xyz")
    r = run(tmp_path, "check", "dep_app:client")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert (
        "ModuleNotFoundError: No module named 'no_such_dependency_xyz' "
        f"(at {tmp_path}/dep_app.py:" in r.stderr
    )
    assert f"is 'no_such_dependency_xyz' installed in this Python ({sys.executable})?" in r.stderr


@pytest.mark.parametrize(
    "how",
    [("check", "--traceback"), ("--traceback", "check"), ("worker", "--traceback"), ("debug",)],
)
def test_traceback_flag_or_debug_env_adds_the_whole_traceback(tmp_path, dsn, how):
    _app(tmp_path, "cron_app", dsn, BAD_CRON)
    if how == ("debug",):
        r = run(tmp_path, "worker", "cron_app:client", AWA_FAST_DEBUG="1")
    else:
        r = run(tmp_path, *how, "cron_app:client")
    assert r.returncode == 1, (r.stdout, r.stderr)
    first, rest = r.stderr.split("\n", 1)
    assert first.endswith(HINT) and "importing cron_app:client failed: ValidationError" in first
    assert rest.startswith(TRACEBACK), r.stderr
    assert rest.count("ValidationError: invalid cron expression") == 1, r.stderr
    assert r.stdout == ""


def test_traceback_flag_applies_to_every_command(dsn, tmp_path):
    r = run(tmp_path, "--database-url", dsn, "job", "dump", "424242424")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    r = run(tmp_path, "--database-url", dsn, "job", "dump", "424242424", "--traceback")
    assert r.returncode == 1, r.stderr
    first, rest = r.stderr.split("\n", 1)
    assert "424242424" in first and rest.startswith(TRACEBACK), r.stderr


def test_a_worker_on_an_unreachable_database_says_so_once_and_starts_no_child(tmp_path):
    url = closed_port_url()
    port = url.rsplit(":", 1)[1].split("/")[0]
    _app(tmp_path, "nodb_app", url, "# nothing more")
    r = run(tmp_path, "worker", "nodb_app:client", "--processes", "2")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stdout == "", r.stdout  # no child started, nothing restarted
    assert r.stderr.count("\n") == 1, r.stderr
    assert re.match(
        rf"awa-fast worker: error: cannot reach the database at 127\.0\.0\.1:{port} "
        r"\(tried for \d+ s\): connection failed: .*Connection refused.*; no worker process "
        r"started\n",
        r.stderr,
    ), r.stderr


def test_a_worker_on_a_database_not_migrated_says_to_migrate_once(tmp_path, fresh_db):
    _app(tmp_path, "fresh_app", fresh_db, "# nothing more")
    r = run(tmp_path, "worker", "fresh_app:client", "--processes", "2")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stdout == "", r.stdout  # no child started
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("awa-fast worker: error: fresh_app:client: cannot start: ")
    assert "awa-fast migrate" in r.stderr


# ---------------------------------------------------------------------------------------------
# queue names: a typo is an error with the closest known names, not a new queue


def _queue_meta(dsn: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT queue, paused FROM awa_fast.queue_meta ORDER BY 1").fetchall()


@pytest.fixture
def two_queues(dsn):
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE awa_fast.jobs, awa_fast.queue_meta, awa_fast.dlq")
    with awa.Client(dsn) as c:
        c.insert({"n": 1}, kind="typo_kind", queue="emails")
        c.insert({"n": 2}, kind="typo_kind", queue="images")
    return dsn


@pytest.mark.parametrize(
    "args",
    [
        ("queue", "pause", "emials"),
        ("queue", "resume", "emials"),
        ("queue", "drain", "emials"),
        ("job", "retry-failed", "--queue", "emials"),
        ("dlq", "retry-all", "--queue", "emials"),
        ("dlq", "purge", "--queue", "emials"),
    ],
)
def test_a_queue_command_on_an_unknown_queue_is_an_error_with_a_hint(tmp_path, two_queues, args):
    r = run(tmp_path, "--database-url", two_queues, *args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith(
        "awa-fast: error: no queue named 'emials' (no job, worker, schedule or setting names "
        "it); did you mean 'emails'?"
    ), r.stderr
    assert r.stderr.count("\n") == 1 and r.stdout == ""
    assert _queue_meta(two_queues) == []  # nothing stored: `queue stats` lists no typo
    with awa.Client(two_queues) as c:
        assert sorted(st.queue for st in c.queue_stats()) == ["emails", "images"]
        assert len(c.list_jobs(state="available")) == 2  # nothing drained


def test_pause_of_a_new_queue_needs_create_and_a_known_one_does_not(tmp_path, two_queues):
    r = run(tmp_path, "--database-url", two_queues, "queue", "pause", "later")
    assert r.returncode == 1 and "known queues: emails, images (--create uses a new name)" in (
        r.stderr
    ), r.stderr
    r = run(tmp_path, "--database-url", two_queues, "queue", "pause", "later", "--create")
    assert r.returncode == 0 and r.stdout == "queue later paused\n", r.stderr
    r = run(tmp_path, "--database-url", two_queues, "queue", "pause", "images")
    assert r.returncode == 0, r.stderr
    # a queue known only from its settings row (paused before its first job) is known now
    r = run(tmp_path, "--database-url", two_queues, "queue", "resume", "later")
    assert r.returncode == 0 and r.stdout == "queue later resumed\n", r.stderr
    assert _queue_meta(two_queues) == [("images", True), ("later", False)]


# ---------------------------------------------------------------------------------------------
# kind names: a typo in a bulk command on failed or dead-lettered jobs is an error


@pytest.mark.parametrize(
    "args",
    [
        ("job", "discard", "--kind", "typo_knd"),
        ("job", "retry-failed", "--kind", "typo_knd"),
        ("dlq", "retry-all", "--kind", "typo_knd"),
        ("dlq", "purge", "--kind", "typo_knd"),
    ],
)
def test_a_bulk_command_on_an_unknown_kind_is_an_error_with_a_hint(tmp_path, two_queues, args):
    r = run(tmp_path, "--database-url", two_queues, *args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr == (
        "awa-fast: error: no kind named 'typo_knd' (no job, worker or schedule has it); did you "
        "mean 'typo_kind'?\n"
    )


async def test_a_kind_whose_jobs_all_finished_is_known(tmp_path, two_queues):
    from awa_fast.testing import AwaTestClient

    client = awa.AsyncClient(two_queues)
    try:
        await client.insert(Gone(1), queue="emails")

        async def fail(job):
            raise awa.TerminalError("no")

        await AwaTestClient(client).work_one(Gone, fail, queue="emails")
    finally:
        await client.close()
    r = run(tmp_path, "--database-url", two_queues, "job", "discard", "--kind", "gone")
    assert r.returncode == 0 and r.stdout == "discarded 1 failed job(s) of kind gone\n", r.stderr


def test_a_command_on_an_unreachable_database_says_so_in_one_line(tmp_path):
    # libpq's message has a second line ("\tIs the server running on that host...")
    r = run(tmp_path, "--database-url", closed_port_url(), "queue", "stats")
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("awa-fast: error: could not connect to the database")
    assert r.stderr.count("\n") == 1 and "Is the server running" in r.stderr, r.stderr
