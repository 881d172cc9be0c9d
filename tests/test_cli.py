"""The ``awa-fast`` command line, driven as a subprocess (``python -m awa_fast``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import awa_fast as awa
from awa_fast.cli import format_table
from awa_fast.schema import current_migration_version, migrations

CLOSED_PORT_DSN = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=5"
TIMEOUT_S = 180


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("AWA_FAST_DATABASE_URL", "DATABASE_URL")}
    env.update(extra)
    return env


def cli(*args: str, dsn: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m awa_fast [--database-url dsn] args...`` and return the finished process."""
    argv = [sys.executable, "-m", "awa_fast"]
    if dsn is not None:
        argv += ["--database-url", dsn]
    return subprocess.run(argv + list(args), capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=env if env is not None else _env())


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


@pytest.fixture
def fresh_db(pg_base_dsn):
    """An empty (not migrated) database, dropped afterwards."""
    name = f"cli_fresh_{os.getpid()}_{os.urandom(3).hex()}"
    with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(pg_base_dsn)
    params["dbname"] = name
    try:
        yield make_conninfo(**params)
    finally:
        with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


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
    assert ok("migrate", dsn=dsn).strip() == f"schema up to date (version {current_migration_version()})"


def test_migrate_sql_needs_no_database():
    # an unreachable URL is never contacted
    out = ok("migrate", "--sql", dsn=CLOSED_PORT_DSN)
    for v, description, text in migrations():
        assert f"-- awa-fast migration {v:03d}: {description}" in out
        assert text.strip() in out
    assert "CREATE TABLE awa_fast.jobs" in out


# ---------------------------------------------------------------------------------------------
# jobs


@pytest.fixture(scope="module")
def jobs(client):
    """Three ``cli_mail`` jobs (queue ``cli_q``) and one ``cli_other`` job (queue ``cli_q2``)."""
    inserted = [client.insert({"to": f"user{i}@example.com"}, kind="cli_mail", queue="cli_q",
                              tags=["t1"], priority=1) for i in range(3)]
    inserted.append(client.insert({"x": 1}, kind="cli_other", queue="cli_q2"))
    return inserted


def test_job_list_table(dsn, jobs):
    out = ok("job", "list", "--queue", "cli_q", dsn=dsn)
    lines = out.strip().splitlines()
    assert lines[0].split() == ["ID", "KIND", "QUEUE", "STATE", "PRIORITY", "ATTEMPT", "RUN_AT",
                                "CREATED_AT"]
    assert set(lines[1]) <= {"-", " "}
    rows = [line.split() for line in lines[2:]]
    mail_ids = [j.id for j in jobs[:3]]
    assert [int(r[0]) for r in rows] == sorted(mail_ids, reverse=True)  # newest first
    for r in rows:
        assert r[1:6] == ["cli_mail", "cli_q", "available", "1", "0/25"]
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
    assert r.stderr.strip() == (f"awa-fast: error: job {job_id} is already cancelled; only "
                                "non-terminal jobs can be cancelled")

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
    assert ok("queue", "pause", "cli_q2", "--by", "ops", dsn=dsn).strip() == "queue cli_q2 paused by ops"
    stat = _stat(dsn, "cli_q2")
    assert stat["paused"] is True
    assert stat["available"] == 1 and stat["total_queued"] == 1
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT paused_by FROM awa_fast.queue_meta WHERE queue = 'cli_q2'"
                            ).fetchone()[0] == "ops"

    # the table shows the paused queue
    lines = ok("queue", "stats", dsn=dsn).strip().splitlines()
    header = lines[0].split()
    assert header[0] == "QUEUE" and header[-1] == "PAUSED"
    row = next(line.split() for line in lines[2:] if line.split()[0] == "cli_q2")
    assert row[-1] == "yes"
    assert row[header.index("AVAILABLE")] == "1"

    assert ok_json("queue", "resume", "cli_q2", dsn=dsn) == {"queue": "cli_q2", "paused": False}
    assert _stat(dsn, "cli_q2")["paused"] is False

    # a queue with no jobs can be paused and shows in stats
    ok("queue", "pause", "cli_empty", dsn=dsn)
    stat = _stat(dsn, "cli_empty")
    assert stat["paused"] is True and stat["total_queued"] == 0
    ok("queue", "resume", "cli_empty", dsn=dsn)


# ---------------------------------------------------------------------------------------------
# errors, URL resolution


@pytest.mark.parametrize("args", [
    [],
    ["nonsense"],
    ["job"],
    ["job", "dump"],
    ["job", "dump", "abc"],
    ["job", "dump", "0"],
    ["job", "list", "--state", "bogus"],
    ["job", "list", "--limit", "0"],
    ["queue", "pause"],
    ["demo", "--jobs", "-5"],
])
def test_usage_errors_exit_2(args):
    r = cli(*args, dsn=CLOSED_PORT_DSN)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert "usage: awa-fast" in r.stderr
    assert r.stdout == ""


def test_connection_failure_exits_1():
    r = cli("queue", "stats", dsn=CLOSED_PORT_DSN)
    assert r.returncode == 1
    assert r.stderr.startswith("awa-fast: error: could not connect to the database")
    assert "Traceback" not in r.stderr
    for args in (["migrate"], ["job", "dump", "1"], ["demo", "--jobs", "3"]):
        r = cli(*args, dsn=CLOSED_PORT_DSN)
        assert r.returncode == 1, args
        assert r.stderr.startswith("awa-fast: error: could not connect to the database"), args


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


@pytest.mark.parametrize("args, words", [
    ([], ["migrate", "job", "queue", "embedded", "demo", "--database-url", "--json",
          "AWA_FAST_DATABASE_URL", "DATABASE_URL"]),
    (["migrate"], ["--sql"]),
    (["job"], ["list", "dump", "retry", "cancel"]),
    (["job", "list"], ["--state", "--kind", "--queue", "--limit", "--json"]),
    (["job", "dump"], ["ID", "JSON"]),
    (["job", "retry"], ["ID", "failed", "cancelled"]),
    (["job", "cancel"], ["ID"]),
    (["queue"], ["stats", "pause", "resume"]),
    (["queue", "stats"], ["paused", "--json"]),
    (["queue", "pause"], ["QUEUE", "--by"]),
    (["queue", "resume"], ["QUEUE"]),
    (["embedded"], ["stop", "url"]),
    (["embedded", "stop"], ["Stop"]),
    (["embedded", "url"], ["URL"]),
    (["demo"], ["--jobs", "--processes", "--timeout"]),
])
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


def _demo_counts(dsn: str) -> dict:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT state::text, count(*) FROM awa_fast.jobs "
                                 "WHERE queue = 'demo' GROUP BY 1").fetchall())


def test_demo(dsn):
    r = cli("demo", "--jobs", "300", "--timeout", "120", dsn=dsn)
    assert r.returncode == 0, (r.stdout, r.stderr)
    summary = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in r.stdout.strip().splitlines())
    assert summary["jobs enqueued"] == "300"
    assert summary["completed"] == "300"
    assert summary["failed"] == "0"
    for key in ("enqueue rate", "wall time", "throughput", "processing time"):
        assert key in summary
    assert "enqueued 300 jobs" in r.stderr
    assert _demo_counts(dsn) == {"completed": 300}

    # a second run replaces the previous demo rows
    result = ok_json("demo", "--jobs", "120", dsn=dsn)
    assert result["jobs"] == 120 and result["completed"] == 120 and result["failed"] == 0
    assert result["timed_out"] is False and result["jobs_per_second"] > 0
    assert _demo_counts(dsn) == {"completed": 120}


@pytest.mark.slow
def test_demo_multiple_processes(dsn):
    result = ok_json("demo", "--jobs", "400", "--processes", "2", "--timeout", "120", dsn=dsn)
    assert result["completed"] == 400 and result["processes"] == 2
    assert _demo_counts(dsn) == {"completed": 400}


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
        "stopped": False, "data_dir": str(datadir)}

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
