"""The ``awa-fast`` command line, driven as a subprocess (``python -m awa_fast``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

import awa_fast as awa
from awa_fast.cli import format_table
from awa_fast.schema import current_migration_version, migration_scripts, migrations
from tests.support import pipe, sigint_as_at_a_terminal

CLOSED_PORT_DSN = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=5"
TIMEOUT_S = 180


def _env(**extra: str) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("AWA_FAST_DATABASE_URL", "DATABASE_URL")
    }
    env.update(extra)
    return env


def cli(*args: str, dsn: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m awa_fast [--database-url dsn] args...`` and return the finished process."""
    argv = [sys.executable, "-m", "awa_fast"]
    if dsn is not None:
        argv += ["--database-url", dsn]
    return subprocess.run(
        argv + list(args),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env if env is not None else _env(),
    )


def ok(*args: str, dsn: str | None = None, env: dict | None = None) -> str:
    r = cli(*args, dsn=dsn, env=env)
    assert r.returncode == 0, (args, r.returncode, r.stdout, r.stderr)
    return r.stdout


def ok_json(*args: str, dsn: str | None = None) -> object:
    return json.loads(ok(*args, "--json", dsn=dsn))


@pytest.fixture(scope="module")
def client(dsn):
    with awa.Client(dsn) as c:
        yield c


# ---------------------------------------------------------------------------------------------
# migrate


def test_migrate_fresh_then_idempotent(fresh_db):
    version = current_migration_version()
    r = cli("job", "list", dsn=fresh_db)
    assert r.returncode == 1
    assert r.stderr.startswith("awa-fast: error: ")
    assert "awa-fast migrate" in r.stderr

    out = ok("migrate", dsn=fresh_db)
    for v, description, _ in migrations():
        assert f"applied migration {v:03d}: {description}" in out
    assert out.strip().splitlines()[-1] == f"schema up to date (version {version})"

    assert ok("migrate", dsn=fresh_db).strip() == f"schema up to date (version {version})"
    assert ok_json("migrate", dsn=fresh_db) == {"applied": [], "version": version}
    assert ok("job", "list", dsn=fresh_db).strip() == "no jobs"


def test_migrate_on_fixture_db_is_up_to_date(dsn):
    assert (
        ok("migrate", dsn=dsn).strip()
        == f"schema up to date (version {current_migration_version()})"
    )


def test_migrate_sql_needs_no_database():
    # an unreachable URL is never contacted
    out = ok("migrate", "--sql", dsn=CLOSED_PORT_DSN)
    for v, description, text in migrations():
        assert f"-- Migration V{v}: {description}" in out  # awa-pg's header
        assert text.strip() in out
    assert "CREATE TABLE awa_fast.jobs" in out


def _migrations_json(after: int, upto: int) -> dict:
    return {
        "from": after,
        "to": upto,
        "migrations": [
            {"version": v, "description": d, "sql": text}
            for v, d, text in migration_scripts(after, upto)
        ],
    }


def test_migrate_sql_modes_print_json_with_json(fresh_db):
    # --sql, --version, --from/--to and --pending printed awa-pg's text under --json
    latest = current_migration_version()
    for args in (["--json", "migrate", "--sql"], ["migrate", "--sql", "--json"]):
        assert json.loads(ok(*args, dsn=CLOSED_PORT_DSN)) == _migrations_json(0, latest), args
    assert ok_json("migrate", "--version", "2", dsn=CLOSED_PORT_DSN) == _migrations_json(1, 2)
    assert ok_json("migrate", "--from", "3", "--to", "5", dsn=CLOSED_PORT_DSN) == (
        _migrations_json(3, 5)
    )
    # an empty range: an empty list, and no note on stderr (text mode prints one there)
    r = cli("migrate", "--from", "4", "--to", "4", "--json", dsn=CLOSED_PORT_DSN)
    assert (r.returncode, r.stderr, json.loads(r.stdout)) == (0, "", _migrations_json(4, 4))
    assert ok_json("migrate", "--pending", dsn=fresh_db) == _migrations_json(0, latest)
    ok("migrate", dsn=fresh_db)
    r = cli("--json", "migrate", "--pending", dsn=fresh_db)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert json.loads(r.stdout) == _migrations_json(latest, latest)


def _psql(dsn: str, script: str) -> subprocess.CompletedProcess:
    """Run ``script`` with ``psql`` as a user would pipe ``awa-fast migrate --sql`` into it
    (stopping at the first error), or, without psql on the machine, as one script with
    psycopg (stops at the first error too)."""
    psql = shutil.which("psql")
    if psql is not None:
        argv = [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", "-"]
        return subprocess.run(argv, input=script, capture_output=True, text=True, timeout=60)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(script.encode())
    except psycopg.Error as exc:
        return subprocess.CompletedProcess(["psycopg"], 3, "", str(exc))
    return subprocess.CompletedProcess(["psycopg"], 0, "", "")


def _recorded(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT version, description FROM awa_fast.schema_version ORDER BY version"
        ).fetchall()
    return [(v, d) for v, d in rows]


def test_migrate_sql_applied_by_hand_keeps_the_runners_bookkeeping(fresh_db):
    # `awa-fast migrate --to 10 | psql` left no awa_fast.schema_version: every command then said
    # "the awa_fast schema is missing", and `awa-fast migrate` failed on `type "job_state"
    # already exists`
    latest = current_migration_version()
    out = ok("migrate", "--to", "10", dsn=CLOSED_PORT_DSN)
    for v, description, text in migrations()[:10]:
        assert f"-- Migration V{v}: {description}\n" in out  # awa-pg's header, kept
        assert text.strip() in out
    r = _psql(fresh_db, out)
    assert r.returncode == 0, r.stderr
    assert _recorded(fresh_db) == [(v, d) for v, d, _ in migrations()[:10]]  # as the runner's
    r = cli("job", "list", dsn=fresh_db)
    assert r.returncode == 1 and f"schema is at version 10, this package needs {latest}" in (
        r.stderr
    ), r.stderr
    assert ok_json("migrate", "--pending", dsn=fresh_db)["from"] == 10

    assert ok_json("migrate", dsn=fresh_db) == {
        "applied": list(range(11, latest + 1)),
        "version": latest,
    }
    assert _recorded(fresh_db) == [(v, d) for v, d, _ in migrations()]
    assert ok("job", "list", dsn=fresh_db).strip() == "no jobs"
    ok("queue", "pause", "q", "--create", dsn=fresh_db)
    assert "q" in ok("queue", "stats", dsn=fresh_db)


def test_migrate_pending_applied_by_hand_brings_the_schema_to_latest(fresh_db):
    latest = current_migration_version()
    assert _psql(fresh_db, ok("migrate", "--to", "4", dsn=CLOSED_PORT_DSN)).returncode == 0
    # the `sql` of --json is the same script, applied by any client
    printed = ok_json("migrate", "--pending", dsn=fresh_db)
    assert printed["from"] == 4 and [m["version"] for m in printed["migrations"]] == list(
        range(5, latest + 1)
    )
    r = _psql(fresh_db, "\n".join(m["sql"] for m in printed["migrations"]))
    assert r.returncode == 0, r.stderr
    assert _recorded(fresh_db) == [(v, d) for v, d, _ in migrations()]
    assert ok("migrate", dsn=fresh_db).strip() == f"schema up to date (version {latest})"
    assert ok("job", "list", dsn=fresh_db).strip() == "no jobs"

    # a migration applied again is refused before it runs, and rolled back; so is one whose
    # predecessor is not recorded
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("DELETE FROM awa_fast.schema_version WHERE version IN (7, 8)")
    for version, expected in ((5, "migration 5 is already applied"), (8, "7 is not applied")):
        r = _psql(fresh_db, ok("migrate", "--version", str(version), dsn=CLOSED_PORT_DSN))
        assert r.returncode != 0 and expected in r.stderr, r.stderr
    assert [v for v, _ in _recorded(fresh_db)] == [
        v for v in range(1, latest + 1) if v not in (7, 8)
    ]


@pytest.mark.parametrize(
    "args, named, text",
    [
        (["--from", "10", "--to", "3"], "--from 10", "is after --to 3"),
        (["--from", "-5"], "--from -5", "0..LATEST"),
        (["--from", "LATEST+1"], "--from LATEST+1", "0..LATEST"),
        (["--to", "-1"], "--to -1", "0..LATEST"),
        (["--to", "LATEST+1"], "--to LATEST+1", "0..LATEST"),
        (["--from", "2", "--to", "LATEST+1"], "--to LATEST+1", "0..LATEST"),
    ],
)
def test_migrate_from_to_outside_the_versions_is_a_usage_error(args, named, text):
    # `--from 10 --to 3` printed "No migrations in range (10, 3]" and exited 0, and `--from -5`
    # was accepted, while `--version -1` was out of range
    latest = current_migration_version()

    def fill(word: str) -> str:
        return word.replace("LATEST+1", str(latest + 1)).replace("LATEST", str(latest))

    args, named, text = [fill(a) for a in args], fill(named), fill(text)
    r = cli("migrate", *args, dsn=CLOSED_PORT_DSN)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert named in r.stderr and text in r.stderr, r.stderr
    assert "usage: awa-fast migrate" in r.stderr, r.stderr
    r = cli("--json", "migrate", *args, dsn=CLOSED_PORT_DSN)
    assert r.returncode == 2
    error = _one_json_error(r)
    assert error["type"] == "UsageError" and named in error["error"], error
    assert text in error["error"], error


@pytest.mark.parametrize(
    "args, named",
    [
        (["--pending", "--sql"], "--sql"),
        (["--pending", "--version", "2"], "--version"),
        (["--pending", "--from", "2"], "--from"),
        (["--version", "2", "--to", "5"], "--to"),
        (["--version", "2", "--from", "1", "--to", "5"], "--from, --to"),
    ],
)
def test_migrate_modes_that_pick_different_ranges_are_refused(args, named):
    # --pending used to win over --sql/--version/--from/--to, and --version over --from/--to,
    # printing a range other than the one asked for (nothing silently ignored).
    r = cli("migrate", *args, dsn=CLOSED_PORT_DSN)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert "cannot be combined with " + named in r.stderr, r.stderr
    assert "usage: awa-fast migrate" in r.stderr, r.stderr
    error = _one_json_error(cli("--json", "migrate", *args, dsn=CLOSED_PORT_DSN))
    assert error["type"] == "UsageError" and named in error["error"], error


def _one_json_error(r: subprocess.CompletedProcess) -> dict:
    """The error ``r`` printed under --json: one JSON object on one line of stderr."""
    assert r.stdout == "", r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    error = json.loads(lines[0])
    assert isinstance(error["error"], str) and error["error"], error
    return error


@pytest.mark.parametrize(
    "args, status, kind, text",
    [
        # the central handler: an error of the command, raised
        (["queue", "stats"], 1, "CliError", "awa-fast: error: could not connect"),
        (["job", "dump", "987654321"], 1, "JobNotFound", "awa-fast: error: job not found"),
        (["cron", "remove", "no_such_cron"], 1, "CliError", "awa-fast: error: no cron job"),
        # errors a command prints itself
        (["migrate", "--version", "999"], 1, "CliError", "Version 999 is out of range"),
        (["job", "retry-failed"], 1, "CliError", "Specify exactly one of --kind or --queue"),
        (["check", "tests.no_such_module:client"], 2, "AppSpecError", "awa-fast check: error:"),
        (["serve"], 2, "UsageError", "awa-fast serve: error: --json does not apply"),
        # usage errors: argparse's, and the commands' own checks of their arguments
        (["job", "list", "--limit", "x"], 2, "UsageError", "usage: awa-fast job list"),
        (["no-such-command"], 2, "UsageError", "usage: awa-fast"),
        (["dlq", "retry-all"], 2, "UsageError", "usage: awa-fast dlq retry-all"),
        (["worker", "tests.launcher_app:client"], 2, "UsageError", "usage: awa-fast worker"),
        (["bench"], 2, "UsageError", "usage: awa-fast bench"),
    ],
)
def test_errors_under_json_are_one_json_object(dsn, args, status, kind, text):
    # errors went to stderr as text whatever --json said
    uses_db = args[0] in ("job", "cron")
    env = _env(PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    for where in ("before", "after"):
        argv = ["--json", *args] if where == "before" else [*args, "--json"]
        if args[0] == "bench" and where == "after":
            continue  # what follows 'bench' is the suite's
        r = cli(*argv, dsn=dsn if uses_db else CLOSED_PORT_DSN, env=env)
        assert r.returncode == status, (argv, r.stdout, r.stderr)
        error = _one_json_error(r)
        assert error["type"] == kind, (argv, error)
    # the same error as text without --json (serve, worker and bench: the --json is the error)
    if args[0] not in ("serve", "worker", "bench"):
        r = cli(*args, dsn=dsn if uses_db else CLOSED_PORT_DSN, env=env)
        assert r.returncode == status and text in r.stderr, (args, r.stderr)
        assert error["error"] in r.stderr, (error, r.stderr)


def test_an_import_error_under_check_json_carries_the_traceback():
    root = str(Path(__file__).resolve().parents[2])
    r = cli(
        "--json",
        "check",
        "tests.launcher_app:client",
        env=_env(PYTHONPATH=root, AWA_FAST_LAUNCHER_FAIL="import"),
    )
    assert r.returncode == 1, (r.stdout, r.stderr)
    error = _one_json_error(r)
    assert error["type"] == "RuntimeError"
    assert re.fullmatch(
        r"importing tests.launcher_app:client failed: RuntimeError: launcher_app: failing at "
        r"import on purpose \(at .*/tests/launcher_app\.py:\d+\)",
        error["error"],
    ), error
    assert error["traceback"].startswith("Traceback (most recent call last):")


def test_version_under_json():
    for args in (["--json", "--version"], ["--version", "--json"]):
        r = cli(*args)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"version": cli("--version").stdout.split()[-1]}


# ---------------------------------------------------------------------------------------------
# jobs


@pytest.fixture(scope="module")
def jobs(client):
    """Three ``cli_mail`` jobs (queue ``cli_q``) and one ``cli_other`` job (queue ``cli_q2``)."""
    inserted = [
        client.insert(
            {"to": f"user{i}@example.com"}, kind="cli_mail", queue="cli_q", tags=["t1"], priority=1
        )
        for i in range(3)
    ]
    inserted.append(client.insert({"x": 1}, kind="cli_other", queue="cli_q2"))
    return inserted


def test_job_list_table(dsn, jobs):
    out = ok("job", "list", "--queue", "cli_q", dsn=dsn)
    lines = out.strip().splitlines()
    assert lines[0].split() == [
        "ID",
        "KIND",
        "QUEUE",
        "STATE",
        "PRIORITY",
        "ATTEMPT",
        "PROGRESS",
        "RUN_AT",
        "CREATED_AT",
    ]
    assert set(lines[1]) <= {"-", " "}
    rows = [line.split() for line in lines[2:]]
    mail_ids = [j.id for j in jobs[:3]]
    assert [int(r[0]) for r in rows] == sorted(mail_ids, reverse=True)  # newest first
    for r in rows:
        assert r[1:7] == ["cli_mail", "cli_q", "available", "1", "0/25", "-"]
    # columns are aligned: every row is as wide as the rule under the header
    assert len({len(line) for line in lines[1:]}) == 1


def test_job_list_json_and_filters(dsn, jobs):
    listed = ok_json("job", "list", "--kind", "cli_mail", dsn=dsn)
    assert [j["id"] for j in listed] == sorted((j.id for j in jobs[:3]), reverse=True)
    assert listed[0]["args"] == {"to": "user2@example.com"}
    assert listed[0]["tags"] == ["t1"] and listed[0]["state"] == "available"

    # global --json before the command works too
    r = ok("--json", "job", "list", "--queue", "cli_q2", dsn=dsn)
    assert [j["id"] for j in json.loads(r)] == [jobs[3].id]

    assert len(ok_json("job", "list", "--queue", "cli_q", "--limit", "2", dsn=dsn)) == 2
    assert ok_json("job", "list", "--queue", "cli_q", "--state", "failed", dsn=dsn) == []
    assert ok("job", "list", "--queue", "no_such_queue", dsn=dsn).strip() == "no jobs"


def test_an_empty_listing_by_an_unknown_name_says_so_on_stderr(dsn, jobs):
    # A typo in a reading command's filter: the listing stays empty (exit 0, stdout as before),
    # and stderr names the closest known names, as the commands that change state do.
    r = cli("job", "list", "--queue", "cli_qq", dsn=dsn)
    assert (r.returncode, r.stdout.strip()) == (0, "no jobs"), r.stderr
    assert r.stderr.startswith("awa-fast: note: no queue named 'cli_qq'"), r.stderr
    assert "did you mean 'cli_q'" in r.stderr, r.stderr
    r = cli("job", "list", "--kind", "cli_mial", dsn=dsn)
    assert (r.returncode, r.stdout.strip()) == (0, "no jobs"), r.stderr
    assert "no kind named 'cli_mial'" in r.stderr and "'cli_mail'" in r.stderr, r.stderr
    r = cli("dlq", "depth", "--queue", "cli_qq", dsn=dsn)
    assert (r.returncode, r.stdout.strip()) == (0, "0"), r.stderr
    assert "did you mean 'cli_q'" in r.stderr, r.stderr
    # a known name with nothing to list: no note; --json: stderr stays for error objects
    r = cli("job", "list", "--queue", "cli_q", "--state", "failed", dsn=dsn)
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "no jobs", "")
    r = cli("job", "list", "--queue", "cli_qq", "--json", dsn=dsn)
    assert (r.returncode, json.loads(r.stdout), r.stderr) == (0, [], "")


def test_job_dump(dsn, jobs, client):
    job = jobs[0]
    dumped = json.loads(ok("job", "dump", str(job.id), dsn=dsn))
    assert dumped == json.loads(json.dumps(client.get_job(job.id).to_dict(), default=str))
    assert dumped["id"] == job.id and dumped["kind"] == "cli_mail"
    assert dumped["args"] == {"to": "user0@example.com"}
    assert dumped["max_attempts"] == 25 and dumped["errors"] == []
    # --json is accepted (the output is JSON either way)
    assert ok_json("job", "dump", str(job.id), dsn=dsn) == dumped


def test_job_cancel_then_retry(dsn, jobs, client):
    job_id = jobs[1].id
    out = ok("job", "cancel", str(job_id), dsn=dsn)
    assert out.strip() == f"job {job_id} cancelled"
    assert str(client.get_job(job_id).state) == "cancelled"

    r = cli("job", "cancel", str(job_id), dsn=dsn)
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f"awa-fast: error: job {job_id} is already cancelled; only "
        "non-terminal jobs can be cancelled"
    )

    retried = ok_json("job", "retry", str(job_id), dsn=dsn)
    assert retried["id"] == job_id and retried["state"] == "available" and retried["attempt"] == 0
    assert str(client.get_job(job_id).state) == "available"

    r = cli("job", "retry", str(job_id), dsn=dsn)
    assert r.returncode == 1
    assert f"job {job_id} is available" in r.stderr

    cancelled = ok_json("job", "cancel", str(job_id), dsn=dsn)
    assert cancelled["state"] == "cancelled"
    assert ok("job", "retry", str(job_id), dsn=dsn).startswith(f"job {job_id} retried")


@pytest.mark.parametrize("command", ["dump", "retry", "cancel"])
def test_unknown_job_exits_1(dsn, command):
    r = cli("job", command, "987654321", dsn=dsn)
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.strip() == "awa-fast: error: job not found: 987654321"


# ---------------------------------------------------------------------------------------------
# queues


def _stat(dsn: str, queue: str) -> dict:
    stats = ok_json("queue", "stats", dsn=dsn)
    return next(s for s in stats if s["queue"] == queue)


def test_queue_pause_resume_stats(dsn, jobs):
    assert _stat(dsn, "cli_q2")["paused"] is False
    assert (
        ok("queue", "pause", "cli_q2", "--by", "ops", dsn=dsn).strip()
        == "queue cli_q2 paused by ops"
    )
    stat = _stat(dsn, "cli_q2")
    assert stat["paused"] is True
    assert stat["available"] == 1 and stat["total_queued"] == 1
    with psycopg.connect(dsn) as conn:
        assert (
            conn.execute(
                "SELECT paused_by FROM awa_fast.queue_meta WHERE queue = 'cli_q2'"
            ).fetchone()[0]
            == "ops"
        )

    # the table shows the paused queue
    lines = ok("queue", "stats", dsn=dsn).strip().splitlines()
    header = lines[0].split()
    assert header[0] == "QUEUE" and header[-1] == "PAUSED"
    row = next(line.split() for line in lines[2:] if line.split()[0] == "cli_q2")
    assert row[-1] == "yes"
    assert row[header.index("AVAILABLE")] == "1"

    assert ok_json("queue", "resume", "cli_q2", dsn=dsn) == {"queue": "cli_q2", "paused": False}
    assert _stat(dsn, "cli_q2")["paused"] is False

    # a queue with no jobs can be paused (with --create: nothing knows the name yet) and
    # shows in stats
    ok("queue", "pause", "cli_empty", "--create", dsn=dsn)
    stat = _stat(dsn, "cli_empty")
    assert stat["paused"] is True and stat["total_queued"] == 0
    ok("queue", "resume", "cli_empty", dsn=dsn)


# ---------------------------------------------------------------------------------------------
# admin: dump-run, retry-failed, discard, drain


def _make_failed(
    dsn: str,
    client,
    kind: str,
    queue: str,
    *,
    unique: bool = False,
    args: dict | None = None,
    attempts: int = 2,
) -> int:
    """Insert a job and turn it into a failed one with one errors entry per attempt."""
    job = client.insert(
        args or {"n": 1}, kind=kind, queue=queue, tags=["cli"], unique_opts={} if unique else None
    )
    errors = [
        {"error": f"boom {i}", "attempt": i, "at": "2024-01-01T00:00:00+00:00"}
        for i in range(1, attempts + 1)
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE awa_fast.jobs SET state = 'failed', attempt = %s, run_lease = %s, "
            "finalized_at = now(), attempted_at = now(), errors = %s::jsonb "
            "WHERE id = %s",
            (attempts, attempts, json.dumps(errors), job.id),
        )
    return job.id


def _state(client, job_id: int) -> str:
    return str(client.get_job(job_id).state)


def test_job_dump_run(dsn, client):
    job_id = _make_failed(dsn, client, "cli_run", "cli_run_q", attempts=3)
    run = json.loads(ok("job", "dump-run", str(job_id), dsn=dsn))
    assert run["job_id"] == job_id and run["attempt"] == 3 and run["current_attempt"] == 3
    assert run["error"]["error"] == "boom 3" and run["run_lease"] == 3
    assert run["job"]["kind"] == "cli_run" and run["in_dlq"] is False
    first = ok_json("job", "dump-run", str(job_id), "--attempt", "1", dsn=dsn)
    assert first["attempt"] == 1 and first["error"]["error"] == "boom 1"

    r = cli("job", "dump-run", str(job_id), "--attempt", "9", dsn=dsn)
    assert r.returncode == 1
    assert (
        r.stderr.strip() == f"awa-fast: error: job {job_id} has no attempt 9 (attempts so far: 3)"
    )
    r = cli("job", "dump-run", "987654321", dsn=dsn)
    assert r.returncode == 1 and r.stderr.strip() == "awa-fast: error: job not found: 987654321"


def test_job_retry_failed_and_discard(dsn, client):
    a = _make_failed(dsn, client, "cli_rf", "cli_rf_q1")
    b = _make_failed(dsn, client, "cli_rf", "cli_rf_q2")
    c = _make_failed(dsn, client, "cli_rf_other", "cli_rf_q1")

    out = ok("job", "retry-failed", "--kind", "cli_rf", dsn=dsn)
    lines = out.strip().splitlines()
    assert lines[0] == "retried 2 failed job(s) of kind cli_rf"
    assert lines[1].split() == [
        "ID",
        "KIND",
        "QUEUE",
        "STATE",
        "PRIORITY",
        "ATTEMPT",
        "PROGRESS",
        "RUN_AT",
        "CREATED_AT",
    ]
    rows = [line.split() for line in lines[3:]]
    assert sorted(int(r[0]) for r in rows) == [a, b]
    assert all(r[3] == "available" and r[5] == "0/25" for r in rows)
    assert _state(client, a) == _state(client, b) == "available"
    assert _state(client, c) == "failed"

    retried = ok_json("job", "retry-failed", "--queue", "cli_rf_q1", dsn=dsn)
    assert [j["id"] for j in retried] == [c] and retried[0]["state"] == "available"
    assert (
        ok("job", "retry-failed", "--queue", "cli_rf_q1", dsn=dsn).strip()
        == "retried 0 failed job(s) of queue cli_rf_q1"
    )

    d1 = _make_failed(dsn, client, "cli_disc", "cli_disc_q")
    d2 = _make_failed(dsn, client, "cli_disc", "cli_disc_q")
    keep = client.insert({"x": 1}, kind="cli_disc", queue="cli_disc_q")
    assert (
        ok("job", "discard", "--kind", "cli_disc", dsn=dsn).strip()
        == "discarded 2 failed job(s) of kind cli_disc"
    )
    for job_id in (d1, d2):
        with pytest.raises(awa.JobNotFound):
            client.get_job(job_id)
    assert _state(client, keep.id) == "available"
    assert ok_json("job", "discard", "--kind", "cli_disc", dsn=dsn) == {
        "kind": "cli_disc",
        "discarded": 0,
    }


def test_queue_drain(dsn, client):
    ids = [client.insert({"i": i}, kind="cli_drain", queue="cli_drain_q").id for i in range(3)]
    failed = _make_failed(dsn, client, "cli_drain", "cli_drain_q")
    assert (
        ok("queue", "drain", "cli_drain_q", dsn=dsn).strip()
        == "drained queue cli_drain_q: 3 waiting job(s) cancelled"
    )
    assert {_state(client, i) for i in ids} == {"cancelled"}
    assert _state(client, failed) == "failed"
    assert ok_json("queue", "drain", "cli_drain_q", dsn=dsn) == {
        "queue": "cli_drain_q",
        "drained": 0,
    }


# ---------------------------------------------------------------------------------------------
# dead-letter queue


def _dead_letter(dsn: str, client, kind: str, queue: str, **kw) -> int:
    job_id = _make_failed(dsn, client, kind, queue, **kw)
    assert client.move_failed_to_dlq(job_id, "manual")
    return job_id


def test_dlq_list_and_depth(dsn, client):
    a = _dead_letter(dsn, client, "cli_dlq_a", "cli_dlq_q1")
    b = _dead_letter(dsn, client, "cli_dlq_b", "cli_dlq_q1")
    c = _dead_letter(dsn, client, "cli_dlq_a", "cli_dlq_q2")

    lines = ok("dlq", "list", "--kind", "cli_dlq_a", dsn=dsn).strip().splitlines()
    assert lines[0].split() == ["ID", "KIND", "QUEUE", "ATTEMPT", "REASON", "DLQ_AT", "LAST_ERROR"]
    assert set(lines[1]) <= {"-", " "}
    rows = [line.split() for line in lines[2:]]
    assert [int(r[0]) for r in rows] == [c, a]  # newest first
    assert rows[1][1:5] == ["cli_dlq_a", "cli_dlq_q1", "2/25", "manual"]
    assert rows[1][-2:] == ["boom", "2"]
    # aligned: every row's REASON and LAST_ERROR cells start under their headers
    for header, value in (("REASON", "manual"), ("LAST_ERROR", "boom 2")):
        col = lines[0].index(header)
        assert all(line[col:].startswith(value) for line in lines[2:])

    listed = ok_json("dlq", "list", "--queue", "cli_dlq_q1", dsn=dsn)
    assert [e["id"] for e in listed] == [b, a]
    assert listed[0]["dlq_reason"] == "manual" and listed[0]["original_run_lease"] == 2
    assert listed[0]["state"] == "failed" and listed[0]["kind"] == "cli_dlq_b"
    assert [
        e["id"]
        for e in ok_json("dlq", "list", "--queue", "cli_dlq_q1", "--before-id", str(b), dsn=dsn)
    ] == [a]
    assert len(ok_json("dlq", "list", "--tag", "cli", "--limit", "1", dsn=dsn)) == 1
    future = "2999-01-01T00:00:00"
    assert {e["id"] for e in ok_json("dlq", "list", "--before-dlq-at", future, dsn=dsn)} >= {
        a,
        b,
        c,
    }
    assert ok("dlq", "list", "--kind", "nothing_here", dsn=dsn).strip() == "no matching DLQ entries"

    assert ok("dlq", "depth", "--queue", "cli_dlq_q1", dsn=dsn).strip() == "2"
    assert ok_json("dlq", "depth", "--queue", "cli_dlq_q2", dsn=dsn) == {
        "queue": "cli_dlq_q2",
        "depth": 1,
    }
    depth = ok_json("dlq", "depth", dsn=dsn)
    assert depth["by_queue"]["cli_dlq_q1"] == 2 and depth["by_queue"]["cli_dlq_q2"] == 1
    assert depth["total"] == sum(depth["by_queue"].values())
    lines = ok("dlq", "depth", dsn=dsn).strip().splitlines()
    assert lines[0].split() == ["QUEUE", "DEPTH"]
    assert ["cli_dlq_q1", "2"] in [line.split() for line in lines[2:]]
    assert lines[-1] == f"total: {depth['total']}"


def test_dlq_retry(dsn, client):
    job_id = _dead_letter(dsn, client, "cli_dlq_r", "cli_dlq_rq")
    lease = client.get_dlq_job(job_id).original_run_lease
    assert (
        ok("dlq", "retry", str(job_id), dsn=dsn).strip()
        == f"job {job_id} retried from the DLQ (now available, queue cli_dlq_rq)"
    )
    job = client.get_job(job_id)
    assert str(job.state) == "available" and job.attempt == 0 and job.run_lease == lease

    r = cli("dlq", "retry", str(job_id), dsn=dsn)
    assert r.returncode == 1
    assert r.stderr.strip() == f"awa-fast: error: job {job_id} is not in the DLQ"

    other = _dead_letter(dsn, client, "cli_dlq_r", "cli_dlq_rq")
    retried = ok_json("dlq", "retry", str(other), dsn=dsn)
    assert retried["id"] == other and retried["state"] == "available"


def test_dlq_retry_unique_conflict_exits_1_and_changes_nothing(dsn, client):
    dead = _dead_letter(dsn, client, "cli_dlq_u", "cli_dlq_uq", unique=True, args={"o": 1})
    live = client.insert({"o": 1}, kind="cli_dlq_u", queue="cli_dlq_uq", unique_opts={})
    r = cli("dlq", "retry", str(dead), dsn=dsn)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip() == (
        f"awa-fast: error: cannot retry DLQ job {dead}: its unique key "
        f"is held by job {live.id} (available); the job stays in the DLQ "
        "(nothing changed)"
    )
    assert client.get_dlq_job(dead) is not None
    assert str(client.get_job(live.id).state) == "available"
    # retry-all skips it
    assert (
        ok("dlq", "retry-all", "--kind", "cli_dlq_u", dsn=dsn).strip()
        == "retried 0 job(s) from the DLQ"
    )
    assert client.get_dlq_job(dead) is not None


def test_dlq_retry_all_and_purge(dsn, client):
    a = _dead_letter(dsn, client, "cli_dlq_bulk", "cli_dlq_bq")
    b = _dead_letter(dsn, client, "cli_dlq_bulk", "cli_dlq_bq")
    c = _dead_letter(dsn, client, "cli_dlq_bulk2", "cli_dlq_bq")
    assert (
        ok("dlq", "retry-all", "--kind", "cli_dlq_bulk", dsn=dsn).strip()
        == "retried 2 job(s) from the DLQ"
    )
    assert _state(client, a) == _state(client, b) == "available"
    assert ok_json("dlq", "retry-all", "--queue", "cli_dlq_bq", "--tag", "cli", dsn=dsn) == {
        "retried": 1
    }
    assert _state(client, c) == "available"

    p1 = _dead_letter(dsn, client, "cli_dlq_p", "cli_dlq_pq")
    p2 = _dead_letter(dsn, client, "cli_dlq_p", "cli_dlq_pq")
    assert (
        ok("dlq", "purge", "--kind", "cli_dlq_p", "--before-id", str(p2), dsn=dsn).strip()
        == "purged 1 DLQ entry"
    )
    assert client.get_dlq_job(p1) is None and client.get_dlq_job(p2) is not None
    assert ok_json("dlq", "purge", "--queue", "cli_dlq_pq", dsn=dsn) == {"purged": 1}
    _dead_letter(dsn, client, "cli_dlq_p", "cli_dlq_pq")
    assert ok("dlq", "purge", "--all", dsn=dsn).strip().startswith("purged ")
    assert ok_json("dlq", "depth", dsn=dsn) == {"total": 0, "by_queue": {}}
    assert ok("dlq", "depth", dsn=dsn).strip() == "DLQ is empty"
    assert ok("dlq", "list", dsn=dsn).strip() == "DLQ is empty"
    assert ok_json("dlq", "retry-all", "--all", dsn=dsn) == {"retried": 0}


@pytest.mark.parametrize(
    "args, message",
    [
        (["dlq", "retry-all"], "give at least one filter, or --all"),
        (["dlq", "purge"], "give at least one filter, or --all"),
        (["dlq", "retry-all", "--all", "--kind", "k"], "--all cannot be combined with a filter"),
        (["dlq", "purge", "--all", "--before-id", "5"], "--all cannot be combined with a filter"),
    ],
)
def test_dlq_bulk_needs_filter_or_all(args, message):
    r = cli(*args, dsn=CLOSED_PORT_DSN)  # a usage error: the database is never contacted
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"usage: awa-fast {' '.join(args[:2])}")
    assert message in r.stderr


# ---------------------------------------------------------------------------------------------
# cron


def test_consequences_json_gives_times_in_iso_8601(dsn, client):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE awa_fast.jobs")
    assert ok("consequences", dsn=dsn).strip() == "no failure consequence is owed"
    job = client.insert({"x": 1}, kind="cli_owing")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE awa_fast.jobs SET state = 'consequence_pending', consequence_state = 'owed', "
            "consequence_reason = 'terminal_error', consequence_path = 'failed', "
            "consequence_attempts = 0, consequence_retry_at = '2024-05-01T01:00:00Z', "
            "finalized_at = now() WHERE id = %s",
            (job.id,),
        )
    [owed] = [r for r in ok_json("consequences", dsn=dsn) if r["id"] == job.id]
    assert owed["retry_at"] == "2024-05-01T01:00:00+00:00", owed


def test_cron_list_and_remove(dsn, client):
    assert ok("cron", "list", dsn=dsn).strip() == "no cron jobs"
    assert ok_json("cron", "list", dsn=dsn) == []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO awa_fast.cron_jobs (name, cron_expr, timezone, kind, queue, "
            "last_fire_at) VALUES ('cli_nightly', '0 3 * * *', 'Europe/Paris', "
            "'cli_report', 'cli_cron_q', '2024-05-01T01:00:00Z'), "
            "('cli_often', '*/5 * * * *', 'UTC', 'cli_tick', 'default', NULL)"
        )

    lines = ok("cron", "list", dsn=dsn).strip().splitlines()
    assert lines[0].split() == [
        "NAME",
        "CRON",
        "TIMEZONE",
        "KIND",
        "QUEUE",
        "POLICY",
        "LAST_FIRE",
        "NEXT_FIRE",
    ]
    assert lines[2].startswith("cli_nightly  0 3 * * *")
    assert (
        "Europe/Paris  cli_report  cli_cron_q  coalesce  2024-05-01 01:00:00Z  "
        "2024-05-02 01:00:00Z" in lines[2]
    )
    assert lines[3].startswith("cli_often")
    listed = ok_json("cron", "list", dsn=dsn)
    assert [j["name"] for j in listed] == ["cli_nightly", "cli_often"]
    assert listed[0]["cron_expr"] == "0 3 * * *" and listed[0]["kind"] == "cli_report"
    assert listed[0]["next_fire_at"].startswith("2024-05-02T01:00:00")

    assert ok("cron", "remove", "cli_nightly", dsn=dsn).strip() == "cron job cli_nightly removed"
    assert ok_json("cron", "remove", "cli_often", dsn=dsn) == {"name": "cli_often", "removed": True}
    r = cli("cron", "remove", "cli_often", dsn=dsn)
    assert r.returncode == 1
    assert r.stderr.strip() == "awa-fast: error: no cron job named 'cli_often'"
    assert client.list_cron_jobs() == []


# ---------------------------------------------------------------------------------------------
# errors, URL resolution


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["nonsense"],
        ["job"],
        ["job", "dump"],
        ["job", "dump", "abc"],
        ["job", "dump", "0"],
        ["job", "list", "--state", "bogus"],
        ["job", "list", "--limit", "0"],
        ["queue", "pause"],
        ["demo", "--limit", "0"],
        ["demo", "--processes", "0"],
        ["worker"],
        ["worker", "tests.launcher_app:client", "--processes", "0"],
        ["worker", "tests.launcher_app:client", "--queues", "q:zero"],
        ["job", "dump-run"],
        ["job", "dump-run", "1", "--attempt", "0"],
        ["job", "discard"],
        ["queue", "drain"],
        ["dlq"],
        ["dlq", "retry"],
        ["dlq", "list", "--before-dlq-at", "yesterday"],
        ["dlq", "list", "--limit", "0"],
        ["cron"],
        ["cron", "remove"],
    ],
)
def test_usage_errors_exit_2(args):
    r = cli(*args, dsn=CLOSED_PORT_DSN)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert "usage: awa-fast" in r.stderr
    assert r.stdout == ""


def test_connection_failure_exits_1():
    r = cli("queue", "stats", dsn=CLOSED_PORT_DSN)
    assert r.returncode == 1
    assert r.stderr.startswith("awa-fast: error: could not connect to the database")
    assert "(the URL given explicitly)" in r.stderr
    assert "Traceback" not in r.stderr
    # where the URL came from: a DATABASE_URL left set for another application (fresh eyes)
    env = {k: v for k, v in _env().items() if k not in ("AWA_FAST_DATABASE_URL",)}
    r = cli("queue", "stats", env={**env, "DATABASE_URL": CLOSED_PORT_DSN})
    assert r.returncode == 1
    assert "could not connect to the database (the URL from $DATABASE_URL)" in r.stderr
    for args in (["migrate"], ["job", "dump", "1"], ["demo", "--limit", "3"]):
        r = cli(*args, dsn=CLOSED_PORT_DSN)
        assert r.returncode == 1, args
        # (the demo first says what it is about to do, on lines of its own)
        errors = r.stderr[r.stderr.index("awa-fast: error:") :]
        assert errors.startswith("awa-fast: error: could not connect to the database"), args
        assert "Traceback" not in r.stderr


def test_database_url_from_environment(dsn, jobs):
    # AWA_FAST_DATABASE_URL wins over DATABASE_URL
    env = _env(AWA_FAST_DATABASE_URL=dsn, DATABASE_URL=CLOSED_PORT_DSN)
    assert "cli_q" in ok("queue", "stats", env=env)
    env = _env(DATABASE_URL=dsn)
    assert "cli_q" in ok("queue", "stats", env=env)
    # --database-url wins over both, also after the subcommand
    env = _env(AWA_FAST_DATABASE_URL=CLOSED_PORT_DSN, DATABASE_URL=CLOSED_PORT_DSN)
    assert "cli_q" in ok("queue", "stats", "--database-url", dsn, env=env)


# ---------------------------------------------------------------------------------------------
# help


@pytest.mark.parametrize(
    "args, words",
    [
        (
            [],
            [
                "migrate",
                "job",
                "queue",
                "dlq",
                "cron",
                "embedded",
                "demo",
                "worker",
                "--database-url",
                "--json",
                "AWA_FAST_DATABASE_URL",
                "DATABASE_URL",
            ],
        ),
        (["migrate"], ["--sql"]),
        (["job"], ["list", "dump", "dump-run", "retry", "cancel", "retry-failed", "discard"]),
        (["job", "list"], ["--state", "--kind", "--queue", "--limit", "--json"]),
        (["job", "dump"], ["ID", "JSON"]),
        (["job", "retry"], ["ID", "failed", "cancelled"]),
        (["job", "cancel"], ["ID"]),
        (["job", "dump-run"], ["ID", "--attempt", "latest", "JSON", "--json"]),
        (["job", "retry-failed"], ["--kind", "--queue", "exactly one", "attempt 0", "unique key"]),
        (["job", "discard"], ["--kind", "failed"]),
        (["queue"], ["stats", "pause", "resume", "drain"]),
        (["queue", "drain"], ["QUEUE", "available", "scheduled", "retryable", "Running"]),
        (["dlq"], ["list", "depth", "retry", "retry-all", "purge"]),
        (
            ["dlq", "list"],
            [
                "--kind",
                "--queue",
                "--tag",
                "--before-id",
                "--before-dlq-at",
                "--limit",
                "default: 50",
                "newest first",
                "--json",
            ],
        ),
        (["dlq", "depth"], ["--queue", "total"]),
        (["dlq", "retry"], ["ID", "same id", "attempt 0", "unique key"]),
        (["dlq", "retry-all"], ["--kind", "--queue", "--tag", "--all", "filter"]),
        (
            ["dlq", "purge"],
            ["--kind", "--queue", "--tag", "--before-id", "--before-dlq-at", "--all"],
        ),
        (["cron"], ["list", "remove"]),
        (["cron", "list"], ["cron", "timezone", "next", "--json"]),
        (["cron", "remove"], ["NAME"]),
        (["queue", "stats"], ["paused", "--json"]),
        (["queue", "pause"], ["QUEUE", "--by"]),
        (["queue", "resume"], ["QUEUE"]),
        (["embedded"], ["stop", "url"]),
        (["embedded", "stop"], ["Stop"]),
        (["embedded", "url"], ["URL"]),
        (
            ["demo"],
            [
                "--limit",
                "--processes",
                "--extra-path",
                "--timeout",
                "standard library",
                "unique",
                "duplicates",
            ],
        ),
        (
            ["worker"],
            [
                "APP",
                "module:attribute",
                "--processes",
                "--queues",
                "--drain-timeout",
                "--status-interval",
                "START_OPTIONS",
                "SIGTERM",
                "[child N pid P]",
            ],
        ),
    ],
)
def test_help(args, words):
    r = cli(*args, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {' '.join(['awa-fast', *args])}")
    for word in words:
        assert word in r.stdout, (args, word)


def test_format_table_aligns_and_right_justifies_numbers():
    out = format_table(["ID", "NAME", "OK"], [[1, "a", True], [100, "long name", None]])
    assert out.splitlines() == [
        " ID  NAME       OK",
        "---  ---------  ---",
        "  1  a          yes",
        "100  long name  -",
    ]


# ---------------------------------------------------------------------------------------------
# demo


def test_demo(dsn):
    """The demo end to end is tests/cli/test_demo.py; here: a small run through the CLI."""
    r = cli("demo", "--limit", "20", "--processes", "1", dsn=dsn)
    assert r.returncode == 0, (r.stdout, r.stderr)
    summary = dict(
        re.split(r"\s{2,}", line.strip(), maxsplit=1)
        for line in r.stdout.strip().splitlines()
        if re.search(r"\S\s{2,}\S", line)
    )
    assert summary["files processed"].startswith("20 ")
    for key in (
        "A completed",
        "A failed",
        "distinct modules",
        "B jobs inserted",
        "B skipped as dup",
        "wall time",
        "throughput",
    ):
        assert key in summary
    assert "check: OK" in r.stdout


def test_demo_extra_path_must_exist(dsn):
    r = cli("demo", "--limit", "1", "--extra-path", "/nonexistent/awa-fast-demo", dsn=dsn)
    assert r.returncode == 1
    assert r.stderr.startswith("awa-fast: error: --extra-path /nonexistent/awa-fast-demo")


# ---------------------------------------------------------------------------------------------
# embedded


@pytest.fixture
def embedded_data_dir():
    parent = Path(tempfile.mkdtemp(prefix="awa-pg-cli", dir="/tmp"))
    os.chmod(parent, 0o755)  # the server account must be able to enter it when we are root
    datadir = parent / "pg"
    env = _env(AWA_PG_DATA=str(datadir))
    try:
        yield datadir, env
    finally:
        try:
            cli("embedded", "stop", env=env)
        finally:
            shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.slow
def test_embedded_url_default_database_and_stop(embedded_data_dir):
    datadir, env = embedded_data_dir
    assert json.loads(ok("embedded", "stop", "--json", env=env)) == {
        "stopped": False,
        "data_dir": str(datadir),
    }

    r = cli("embedded", "url", env=env)
    assert r.returncode == 0, r.stderr
    url = r.stdout.strip()
    assert url == f"postgresql://postgres@/postgres?host={datadir}&port=5432"
    assert "started embedded PostgreSQL" in r.stderr

    # without a URL anywhere, commands use the embedded server (already running: silent)
    r = cli("migrate", env=env)
    assert r.returncode == 0 and r.stderr == ""
    assert "schema up to date" in r.stdout

    assert ok("embedded", "stop", env=env).strip() == f"stopped embedded PostgreSQL at {datadir}"
    assert "was not running" in ok("embedded", "stop", env=env)


# ---------------------------------------------------------------------------------------------
# a wrong module:client: the same exit status from `check` as from `worker`


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tests.no_such_module:client", "cannot import module 'tests.no_such_module'"),
        ("tests.launcher_app:nope", "module 'tests.launcher_app' has no attribute 'nope'"),
        ("tests.launcher_app:Nap", "tests.launcher_app:Nap is a type, not an awa_fast AsyncClient"),
    ],
)
def test_check_of_a_wrong_application_spec_is_a_usage_error(spec, message):
    root = str(Path(__file__).resolve().parents[2])
    r = cli("check", spec, env=_env(PYTHONPATH=root))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"awa-fast check: error: {message}"), r.stderr
    assert r.stdout == ""


def test_check_does_not_connect_to_the_url_the_client_was_built_with(tmp_path):
    # AsyncClient(url) connected at construction: check ("without touching the database")
    # failed with a traceback on an unreachable URL
    from tests.runtime.test_launcher import closed_port_url

    (tmp_path / "elsewhere.py").write_text(
        "import dataclasses\nimport awa_fast as awa\n"
        f"client = awa.AsyncClient({closed_port_url()!r})\n"
        "@dataclasses.dataclass\nclass Ping:\n    n: int\n"
        "@client.task(Ping, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)\n"
        "async def ping(job):\n    pass\n"
    )
    t0 = time.monotonic()
    r = _run_in(tmp_path, "check", "elsewhere:client")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "could not connect" not in r.stderr, r.stderr
    assert "start() would accept this configuration (1 registered kind)" in r.stdout
    assert time.monotonic() - t0 < 9


def _run_in(where: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m awa_fast args...`` in ``where`` (an application's directory), with the
    source tree on the path."""
    return subprocess.run(
        [sys.executable, "-m", "awa_fast", *args],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=_env(PYTHONPATH=str(Path(__file__).resolve().parents[2])),
    )


def test_check_json_is_json_when_the_application_prints_at_import(tmp_path):
    # stdout was "loading config...\n" followed by the JSON object
    (tmp_path / "chatty.py").write_text(
        "import dataclasses, os, sys\nimport awa_fast as awa\n"
        "print('loading config...')\n"
        "sys.stdout.write('no newline')\nsys.stdout.flush()\n"
        "os.write(1, b'straight to fd 1\\n')\n"
        "client = awa.AsyncClient()\n"
        "@dataclasses.dataclass\nclass Ping:\n    n: int\n"
        "@client.task(Ping, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)\n"
        "async def ping(job):\n    pass\n"
    )
    r = _run_in(tmp_path, "--json", "check", "chatty:client")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert json.loads(r.stdout)["registered"] == ["ping"], r.stdout
    for text in ("loading config...", "no newline", "straight to fd 1"):
        assert text in r.stderr, r.stderr


def test_check_of_an_application_whose_import_raises_exits_1():
    root = str(Path(__file__).resolve().parents[2])
    r = cli(
        "check",
        "tests.launcher_app:client",
        env=_env(PYTHONPATH=root, AWA_FAST_LAUNCHER_FAIL="import"),
    )
    assert r.returncode == 1, (r.stdout, r.stderr)
    # one line (tests/cli/test_cli_errors.py: its form, and --traceback)
    assert r.stderr.startswith(
        "awa-fast check: error: importing tests.launcher_app:client failed: RuntimeError: "
        "launcher_app: failing at import on purpose (at "
    ), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


def test_check_and_worker_help_state_what_they_report_and_exit():
    check = " ".join(cli("check", "--help").stdout.split())
    for phrase in (
        "failure-consequence declaration",
        "ConfigError",
        "client.start(**START_OPTIONS) would raise",
        "a queue other than 'default'",
        "1 when a kind is undeclared, start() would fail or importing APP raises, "
        "2 when APP names no module or no AsyncClient",
    ):
        assert phrase in check, phrase
    worker = " ".join(cli("worker", "--help").stdout.split())
    assert (
        "exit 2 if its module cannot be found or it names no AsyncClient, 1 if importing it "
        "raises or start() would reject its START_OPTIONS"
    ) in worker


def test_commands_on_an_older_schema_say_to_migrate(fresh_db):
    # only a missing jobs table was caught: on migrations 1-5 `job list` printed `database
    # error: relation "awa_fast.jobs_all" does not exist` and `queue pause` reported success
    from awa_fast import sql as statements

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(statements.MIGRATION_BOOTSTRAP)
        for version, description, text in migrations()[:5]:
            conn.execute(text)
            conn.execute(statements.MIGRATION_RECORD, (version, description))
    need = current_migration_version()
    for args in (["job", "list"], ["queue", "stats"], ["queue", "pause", "q"], ["dlq", "list"]):
        r = cli(*args, dsn=fresh_db)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert (
            f"the awa_fast schema is at version 5, this package needs {need}: run "
            "`awa-fast migrate`" in r.stderr
        ), (args, r.stderr)


def test_text_that_is_not_utf8_is_a_one_line_error(dsn):
    # a byte that is not UTF-8 in an argument, or "\ud800" in JSON: a UnicodeEncodeError traceback
    for args in (
        [b"job", b"list", b"--kind", b"a\xffb"],
        [b"queue", b"pause", b"q\xff"],
        [
            b"batch-ops",
            b"preview",
            b"--op-kind",
            b"set_priority",
            b"--spec",
            b'{"priority": 1}',
            b"--filter",
            b'{"queue": "\\ud800"}',
        ],
    ):
        r = subprocess.run(
            [sys.executable, "-m", "awa_fast", "--database-url", dsn, *args],
            capture_output=True,
            timeout=TIMEOUT_S,
            env=_env(),
        )
        err = r.stderr.decode("utf-8", "replace")
        assert r.returncode == 1 and "Traceback" not in err, (args, err)
        # (a queue name meets the name rule first, which names the field)
        assert (
            "awa-fast: error: an argument is not valid UTF-8 text" in err
            or "awa-fast: error: queue must be valid Unicode" in err
        ), (args, err)


def test_output_a_terminal_cannot_encode_is_escaped(dsn, client):
    client.insert({"x": 1}, kind="cli_mail", queue="café_q")
    for args in (["queue", "stats"], ["--json", "queue", "stats"]):
        r = cli(*args, dsn=dsn, env=_env(PYTHONIOENCODING="ascii"))
        assert r.returncode == 0 and "Traceback" not in r.stderr, (args, r.stderr)
        assert "caf\\xe9_q" in r.stdout, (args, r.stdout)


def test_ctrl_c_while_the_pool_connects_exits_in_bounded_time(dsn):
    # psycopg_pool's connect task catches the cancel and schedules another attempt, and asyncio's
    # runner waited for it forever: one Ctrl-C hung the command (breaker helper)
    import socket
    import threading

    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    info = conninfo_to_dict(dsn)
    listener = socket.create_server(("127.0.0.1", 0))
    stalled = threading.Event()
    held: list[socket.socket] = []

    def proxy() -> None:
        # the CLI's probe and the client's reachability check reach the server; the pool's
        # connections are held
        passed = 0
        while True:
            try:
                client_sock, _ = listener.accept()
            except OSError:
                return
            if passed == 2:
                held.append(client_sock)
                stalled.set()
                continue
            passed += 1
            upstream = socket.create_connection((info["host"], int(info["port"])))
            for a, b in ((client_sock, upstream), (upstream, client_sock)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    threading.Thread(target=proxy, daemon=True).start()
    url = make_conninfo(dsn, host="127.0.0.1", port=str(listener.getsockname()[1]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "awa_fast", "--database-url", url, "queue", "stats"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=sigint_as_at_a_terminal,
    )
    try:
        assert stalled.wait(30), "the pool never connected"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
    finally:
        proc.kill()
        listener.close()
        for sock in held:
            sock.close()


ROOT = Path(__file__).resolve().parents[2]

# Sends SIGINT while the child imports the module named by INTERRUPTED, then runs the rest.
_SIGINT_DURING_IMPORT = """
import os, signal, sys

class InterruptImport:
    fired = False

    def find_spec(self, name, path=None, target=None):
        if name == INTERRUPTED and not self.fired:
            self.fired = True
            print("SIGINT while importing", name, flush=True)
            os.kill(os.getpid(), signal.SIGINT)  # raised in the import, as a Ctrl-C would be
        return None

sys.meta_path.insert(0, InterruptImport())
"""


def _console_script() -> str:
    """What pip writes into the ``awa-fast`` script for pyproject.toml's entry point."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts["awa-fast"].split(":")
    return f"import sys\nfrom {module} import {func}\nsys.exit({func}())\n"


def _interrupted_at_start(module: str, entry: str) -> subprocess.CompletedProcess:
    code = f"INTERRUPTED = {module!r}\n{_SIGINT_DURING_IMPORT}\n{entry}"
    return subprocess.run(
        [sys.executable, "-c", code, "--version"],  # --version: exit 0 had the Ctrl-C been lost
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=_env(),
        preexec_fn=sigint_as_at_a_terminal,
    )


@pytest.mark.parametrize(
    "module",
    [
        "awa_fast.client",  # the package's own imports (about 200 ms of them)
        "psycopg",
        "orjson",  # _native holds SIGINT through this import and delivers it after
        "argparse",  # imported by awa_fast.cli only
        "awa_fast.embedded",  # imported by main() before it parses the arguments
    ],
)
def test_ctrl_c_while_the_awa_fast_script_imports_exits_130_without_a_traceback(module):
    # the console script imported awa_fast.cli outside main(): Python's KeyboardInterrupt
    # traceback when Ctrl-C came in the first 200 ms
    r = _interrupted_at_start(module, _console_script())
    assert r.stdout == f"SIGINT while importing {module}\n", (r.stdout, r.stderr)
    assert (r.returncode, r.stderr.strip()) == (130, ""), (r.returncode, r.stderr[-3000:])


def test_ctrl_c_while_python_m_awa_fast_imports_the_cli_exits_130_without_a_traceback():
    # (the package itself is imported by Python before awa_fast/__main__.py runs)
    entry = "import runpy\nrunpy.run_module('awa_fast', run_name='__main__', alter_sys=True)\n"
    r = _interrupted_at_start("argparse", entry)
    assert r.stdout == "SIGINT while importing argparse\n", (r.stdout, r.stderr)
    assert (r.returncode, r.stderr.strip()) == (130, ""), (r.returncode, r.stderr[-3000:])


def test_global_options_before_bench_reach_the_suite():
    # `awa-fast --database-url URL bench ...` was "unrecognized arguments" (only a leading
    # 'bench' passed its arguments through), and the URL would not have reached the suite.
    r = cli("bench", "--scenarios", "enqueue", "--systems", "awa_fast", dsn=CLOSED_PORT_DSN)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "could not connect to the database" in r.stderr and "port 1 " in r.stderr, r.stderr
    r = cli("--log-format", "text", "--data=" + CLOSED_PORT_DSN, "bench", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: awa-fast bench"), r.stderr
    r = cli("bench", "--database-url", CLOSED_PORT_DSN, dsn=CLOSED_PORT_DSN)
    assert r.returncode == 2 and "both before and after 'bench'" in r.stderr, r.stderr


def test_commands_that_print_no_data_do_not_offer_json_and_bench_refuses_log_format():
    # worker --help and serve --help listed --json, which both refuse; --log-format json
    # before bench was accepted and went unused (the suite prints its own report lines).
    for command in ("worker", "serve"):
        r = cli(command, "--help")
        assert r.returncode == 0 and "--json" not in r.stdout, r.stdout
    r = cli("--log-format", "json", "bench", "--help")
    assert r.returncode == 2 and "--log-format does not apply to bench" in r.stderr, r.stderr


@pytest.mark.parametrize("args", [["--version"], ["--json", "--version"]])
def test_version_into_a_closed_pipe_exits_1_quietly(args):
    # --version printed outside the commands' broken-pipe handling: a traceback.
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "awa_fast", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT_S,
            env=_env(),
        )
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (1, "")


def test_json_given_a_value_is_a_json_usage_error_and_bench_sees_an_abbreviated_url():
    error = _one_json_error(cli("--json=1", "job", "list"))
    assert error["type"] == "UsageError" and "--json" in error["error"], error
    # the suite's --data is its --database-url: with one given before 'bench', a conflict
    r = cli("bench", "--data", CLOSED_PORT_DSN, dsn=CLOSED_PORT_DSN)
    assert r.returncode == 2 and "both before and after 'bench'" in r.stderr, r.stderr


def test_batch_submit_without_a_filter_names_the_cli_flag():
    # it said "pass allow_all=True", the Python keyword, to a command-line user
    r = cli(
        "batch-ops",
        "submit",
        "--op-kind",
        "set_priority",
        "--spec",
        '{"priority": 1}',
        dsn=CLOSED_PORT_DSN,
    )
    assert r.returncode == 2 and "give --filter, or --all for every queued job" in r.stderr, (
        r.stderr
    )
    assert "allow_all" not in r.stderr


def test_serve_refused_for_good_does_not_claim_it_waited(dsn):
    # A database that does not exist fails at the first try; the message said "(tried for
    # 30 s)" (fresh eyes).
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    params["dbname"] = "no_such_database_here"
    r = cli("serve", "--port", "0", dsn=make_conninfo(**params))
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert 'database "no_such_database_here" does not exist' in r.stderr, r.stderr
    assert "tried for" not in r.stderr, r.stderr
