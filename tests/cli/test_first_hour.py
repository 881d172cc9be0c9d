"""The first hour of a new user, as they meet it: the README example run as written, one
database-URL rule for the library, the CLI and the launcher (real subprocesses, real
PostgreSQL)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import psycopg
import pytest

import awa_fast as awa
from tests.cli.test_cli import CLOSED_PORT_DSN, TIMEOUT_S, _env, cli
from tests.first_hour_app import Ping
from tests.support import job_row

ROOT = Path(__file__).resolve().parents[2]


def readme_block(heading: str) -> str:
    """The first ```python block after ``## heading`` in README.md."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(f"## {heading}\n") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _poll(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return value


def _state(dsn: str, job_id: int) -> str:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT state::text FROM awa_fast.jobs_all WHERE id = %s", (job_id,)
        ).fetchone()[0]


def _worker_until_completed(dsn: str, job_id: int, app: str, *args: str, cwd, env) -> str:
    """Run ``awa-fast worker app --processes 1 args...`` until job ``job_id`` completes, then
    SIGTERM it; asserts a clean exit and returns its stdout."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "awa_fast", "worker", app, "--processes", "1", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _poll(lambda: _state(dsn, job_id) == "completed", 60, "the worker to complete the job")
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    return out


# ---------------------------------------------------------------------------------------------
# one database-URL story


def test_readme_example_runs_as_written(dsn, tmp_path):
    script = tmp_path / "readme_example.py"
    script.write_text(readme_block("Using it"))
    assert "localhost" not in script.read_text()
    r = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=tmp_path,
        env=_env(AWA_FAST_DATABASE_URL=dsn, DATABASE_URL=CLOSED_PORT_DSN),
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout == "sending to a@example.com\n"
    # nothing failed on the way (a completion that fell back to row by row logged it)
    assert "Traceback" not in r.stderr and "failed" not in r.stderr, r.stderr
    with psycopg.connect(dsn) as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'send_email' "
                "AND state = 'completed'"
            ).fetchone()[0]
            >= 1
        )


def test_readme_example_is_a_module_that_check_and_the_worker_import(dsn, tmp_path):
    section = (ROOT / "README.md").read_text().split("## Using it\n", 1)[1].split("\n## ", 1)[0]
    commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    assert "python example.py" in commands
    assert "awa-fast check example:client" in commands
    assert "awa-fast worker example:client" in commands
    (tmp_path / "example.py").write_text(readme_block("Using it"))
    env = _env(AWA_FAST_DATABASE_URL=dsn, DATABASE_URL=CLOSED_PORT_DSN)
    r = subprocess.run(
        [sys.executable, "-m", "awa_fast", "check", "example:client"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "sending to" not in r.stdout  # importing it did not run main()
    with awa.Client(dsn) as c:
        job = c.insert({"to": "w@example.com"}, kind="send_email")
    out = _worker_until_completed(dsn, job.id, "example:client", cwd=tmp_path, env=env)
    assert "sending to w@example.com\n" in out and "restarting" not in out


def test_clients_without_url_resolve_like_the_cli(dsn, monkeypatch):
    monkeypatch.setenv("AWA_FAST_DATABASE_URL", dsn)
    monkeypatch.setenv("DATABASE_URL", CLOSED_PORT_DSN)
    with awa.Client() as c:  # the sync client, through the same resolver
        assert c.async_client.database_url == dsn
        job = c.insert(Ping(1), queue="fh_env")
        assert c.get_job(job.id).queue == "fh_env"
    monkeypatch.delenv("AWA_FAST_DATABASE_URL")
    monkeypatch.setenv("DATABASE_URL", dsn)
    assert awa.AsyncClient().database_url == dsn
    # an explicit URL wins over the environment (and is connected to at once, as in awa-pg)
    with pytest.raises(awa.DatabaseError, match="could not connect"):
        awa.AsyncClient(CLOSED_PORT_DSN)


def test_worker_without_url_uses_the_environment(dsn):
    with awa.Client(dsn) as c:
        job = c.insert(Ping(2), queue="fh_q")
    env = _env(AWA_FAST_DATABASE_URL=dsn, DATABASE_URL=CLOSED_PORT_DSN)
    out = _worker_until_completed(
        dsn, job.id, "tests.first_hour_app:client", "--queues", "fh_q:2", cwd=ROOT, env=env
    )
    assert "ready (queues: fh_q:2)" in out


def test_worker_help_tells_one_story():
    r = subprocess.run(
        [sys.executable, "-m", "awa_fast", "worker", "--help"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=_env(),
    )
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert (
        "--database-url, else the URL the client was built with, else "
        "$AWA_FAST_DATABASE_URL, $DATABASE_URL, else the embedded server" in text
    )
    assert "the client's own URL is used" not in text


# ---------------------------------------------------------------------------------------------
# progress: visible while the handler runs, and in `job list`


@dataclasses.dataclass
class Crunch:
    n: int


async def test_progress_is_written_on_its_own_cadence_and_listed(dsn):
    client = awa.AsyncClient(dsn, max_connections=4)
    started, release = asyncio.Event(), asyncio.Event()

    @client.task(Crunch, queue="fh_prog", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def crunch(job):
        job.set_progress(40, "halfway there")
        started.set()
        await release.wait()

    job = await client.insert(Crunch(1), queue="fh_prog")
    # heartbeats every 60 s: only the progress cadence can write it while the handler waits
    await client.start(
        [("fh_prog", 1)],
        heartbeat_interval_ms=60_000,
        heartbeat_staleness_ms=180_000,
        maintenance=False,
    )
    try:
        await asyncio.wait_for(started.wait(), 30)
        rt = client.runtime
        ctx = next(c for c in rt.in_flight.values() if c.id == job.id)
        cond = rt.heartbeat.progress_written
        async with cond:
            await asyncio.wait_for(cond.wait_for(lambda: ctx.progress_snapshot() is None), 10)
        row = await job_row(dsn, job.id)
        assert row["state"] == "running"
        assert row["progress"] == {"percent": 40, "message": "halfway there"}
        assert rt.heartbeat.beats == 0

        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "awa_fast",
            "--database-url",
            dsn,
            "job",
            "list",
            "--queue",
            "fh_prog",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_env(),
        )
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
        assert proc.returncode == 0, err
        header, _rule, line = out.decode().splitlines()
        assert "PROGRESS" in header.split()
        assert re.search(
            rf"^\s*{job.id}\s+crunch\s+fh_prog\s+running\s+2\s+1/25\s+"
            r"40% halfway there\s+\d{4}-",
            line,
        ), line
    finally:
        release.set()
        await client.shutdown()
        await client.close()


# ---------------------------------------------------------------------------------------------
# CLI odds and ends


def test_retry_failed_prints_a_count_and_the_first_rows(dsn):
    with awa.Client(dsn) as c:
        jobs = c.insert_many([{"n": i} for i in range(45)], kind="fh_many", queue="fh_rf")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE awa_fast.jobs SET state = 'failed', attempt = 1, run_lease = 1, "
            "finalized_at = now() WHERE kind = 'fh_many'"
        )
    r = cli("--database-url", dsn, "job", "retry-failed", "--kind", "fh_many")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "retried 45 failed job(s) of kind fh_many"
    assert len(lines) == 1 + 2 + 20 + 1
    assert {int(line.split()[0]) for line in lines[3:23]} <= {j.id for j in jobs}
    assert lines[-1] == ("... and 25 more (awa-fast job list --kind fh_many --state available)")
    with psycopg.connect(dsn) as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'fh_many' AND state = 'available'"
            ).fetchone()[0]
            == 45
        )


# ---------------------------------------------------------------------------------------------
# a kind registered for queue X, inserted without queue=


async def test_insert_without_queue_of_a_kind_registered_elsewhere_warns_once(dsn):
    from tests.first_hour_app import Pay

    client = awa.AsyncClient(dsn)
    client.task(Pay, queue="fh_pay2", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)(
        lambda job: None
    )
    try:
        with pytest.warns(
            awa.QueueMismatchWarning,
            match=r"job kind 'pay' is registered for "
            r"queue 'fh_pay2' on this client but was inserted without queue=, "
            r"so it went to 'default'",
        ) as record:
            job = await client.insert(Pay(1))
        assert job.queue == "default"  # awa-pg's semantics are kept
        assert record[0].filename == __file__  # points at the caller's insert
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            await client.insert(Pay(2))  # once per kind
            await client.insert(Pay(3), queue="fh_pay2")  # explicit queue: no warning
            await client.insert(Pay(4), queue="default")  # explicitly default: no warning
            await client.insert(Ping(1))  # a kind without a registration here
        other = awa.AsyncClient(dsn)
        other.task(Pay, queue="fh_pay2")(lambda job: None)
        with pytest.warns(awa.QueueMismatchWarning):
            rows = await other.insert_many([Pay(4), Pay(5)])
        assert {r.queue for r in rows} == {"default"}
        await other.close()
    finally:
        await client.close()


def test_check_notes_kinds_registered_off_default():
    r = cli("check", "tests.first_hour_app:client", env=_env(PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    assert "note: kinds registered for a queue other than 'default'" in r.stdout
    assert "  pay -> queue fh_pay\n" in r.stdout and "  ping -> queue fh_q\n" in r.stdout


def test_version():
    r = cli("--version")
    assert r.returncode == 0
    assert re.fullmatch(r"awa-fast \d+\.\d+\.\d+\S*\n", r.stdout), r.stdout


def test_bench_help_names_the_command_and_every_scenario():
    r = cli("bench", "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: awa-fast bench ")
    for scenario in ("enqueue", "drain", "pipeline", "failures", "latency", "soak"):
        assert re.search(rf"^\* `{scenario}`\s+\S", r.stdout, re.M), scenario
    assert "~/.local/share/awa-fast/bench" in r.stdout


def test_bench_results_go_to_the_user_directory_with_a_method_column(pg_base_dsn, tmp_path):
    env = _env(XDG_DATA_HOME=str(tmp_path))
    env.pop("AWA_FAST_BENCH_DIR", None)
    r = cli(
        "bench", "--scenarios", "enqueue", "--jobs", "40", "--database-url", pg_base_dsn, env=env
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    written = list((tmp_path / "awa-fast" / "bench").glob("*.jsonl"))
    assert len(written) == 1 and f"results: {written[0]} " in r.stdout
    lines = r.stdout.splitlines()
    head = max(i for i, line in enumerate(lines) if line.startswith("scenario "))
    header = lines[head]
    assert header.split() == ["scenario", "system", "n", "rate/s", "method", "details"]
    at = header.index("method")
    rows = [line for line in lines[head + 1 :] if line.startswith("enqueue_")]
    assert len(rows) == 4
    for row in rows:  # every method starts in its own column, after a blank
        assert row[at - 1] == " " and row[at] != " ", row


# ---------------------------------------------------------------------------------------------
# --log-format json


def _json_lines(text: str) -> list[dict]:
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    for r in records:
        assert list(r)[:4] == ["ts", "level", "logger", "message"], r
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", r["ts"]), r
    return records


def test_json_formatter_carries_extra_fields():
    from awa_fast import log_format

    record = logging.makeLogRecord(
        {
            "name": "awa_fast.runtime",
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": "job %s failed",
            "args": (7,),
            "kind": "pay",
            "job_id": 7,
            "attempt": 2,
        }
    )
    out = json.loads(log_format.formatter("json", static={"pid": 1}).format(record))
    assert out["message"] == "job 7 failed" and out["level"] == "WARNING"
    assert (out["kind"], out["job_id"], out["attempt"], out["pid"]) == ("pay", 7, 2, 1)
    with pytest.raises(ValueError, match="log format must be one of text, json"):
        log_format.formatter("xml")


def test_cli_errors_in_json(dsn):
    r = cli("--log-format", "json", "--database-url", CLOSED_PORT_DSN, "job", "list")
    assert r.returncode == 1 and r.stdout == ""
    [rec] = _json_lines(r.stderr)
    assert rec["level"] == "ERROR" and rec["logger"] == "awa_fast.cli"
    assert rec["message"].startswith("could not connect to the database")
    r = cli("job", "list", "--log-format", "bogus")
    assert r.returncode == 2 and "invalid choice: 'bogus'" in r.stderr


def test_worker_json_logs_and_the_drain_timeout_names_what_it_released(dsn):
    from tests.first_hour_app import Boom, Stall

    with awa.Client(dsn) as c:
        job = c.insert(Stall(1), queue="fh_stall")
        failing = c.insert(Boom(1), queue="fh_stall", max_attempts=1)
    env = _env(AWA_FAST_DATABASE_URL=dsn)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "awa_fast",
            "worker",
            "tests.first_hour_app:client",
            "--processes",
            "1",
            "--queues",
            "fh_stall:2",
            "--drain-timeout",
            "0.5",
            "--log-format",
            "json",
            "--status-interval",
            "3600",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _poll(lambda: _state(dsn, job.id) == "running", 60, "the handler to start")
        _poll(lambda: _state(dsn, failing.id) == "failed", 60, "the failing job to fail")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (out, err)
    launcher = _json_lines(out)
    assert {r["logger"] for r in launcher} == {"awa_fast.launcher"}
    assert any(
        re.fullmatch(r"child 0 pid \d+ ready \(queues: fh_stall:2\)", r["message"])
        for r in launcher
    )
    children = _json_lines(err)
    assert all(r["child"] == 0 and isinstance(r["pid"], int) for r in children)
    [released] = [
        r
        for r in children
        if r["logger"] == "awa_fast.runtime" and r["message"].startswith("drain timeout")
    ]
    assert released["level"] == "WARNING"
    assert released["released"] == 1 and released["released_job_ids"] == [job.id]
    assert f"job ids {job.id}" in released["message"]
    assert _state(dsn, job.id) == "available"
    [failed] = [r for r in children if r.get("job_id") == failing.id]  # never the args
    assert (failed["kind"], failed["attempt"], failed["level"]) == ("boom", 1, "WARNING")
    assert "RuntimeError: boom on purpose" in failed["message"]


# ---------------------------------------------------------------------------------------------
# `pip install .` gives a working `awa-fast serve`


def test_the_dashboards_imports_are_core_dependencies():
    import ast
    import importlib.metadata
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {
        re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0].lower().replace("_", "-")
        for d in project["dependencies"]
    }
    assert project["optional-dependencies"]["web"] == []  # kept as an alias
    dists = importlib.metadata.packages_distributions()
    imported = set()
    for path in (ROOT / "awa_fast" / "web").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported - set(sys.stdlib_module_names) - {"awa_fast"}}
    assert third_party >= {"starlette", "uvicorn"}
    for module in third_party:
        assert {d.lower() for d in dists[module]} & core, module
    # Starlette's templates, SessionMiddleware and form parsing import these lazily
    assert {"jinja2", "itsdangerous", "python-multipart"} <= core
