"""``awa-fast embedded stop`` says "stopped" only once the postmaster's process is gone
(``pg_ctl stop -w`` returns when postmaster.pid is removed, while the process lingers until its
parent reaps it: about 2 s in a container whose init reaps slowly)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "awa_fast", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture
def data_dir():
    parent = Path(tempfile.mkdtemp(prefix="awa-pg-stop", dir="/tmp"))
    os.chmod(parent, 0o755)  # the server account must be able to enter it when we are root
    env = {
        k: v for k, v in os.environ.items() if k not in ("AWA_FAST_DATABASE_URL", "DATABASE_URL")
    }
    env["AWA_PG_DATA"] = str(parent / "pg")
    env["PYTHONPATH"] = str(ROOT)
    try:
        yield parent / "pg", env
    finally:
        try:
            cli(env, "embedded", "stop")
        finally:
            shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.integration
def test_embedded_stop_returns_once_the_postmaster_process_is_gone(data_dir):
    datadir, env = data_dir
    r = cli(env, "embedded", "url")
    assert r.returncode == 0, r.stderr
    pid = int((datadir / "postmaster.pid").read_text().split("\n", 1)[0])
    assert Path(f"/proc/{pid}").exists()
    r = cli(env, "embedded", "stop")
    assert r.returncode == 0 and r.stdout == f"stopped embedded PostgreSQL at {datadir}\n", (
        r.stdout,
        r.stderr,
    )
    # neither running nor an unreaped zombie: the pid is gone when "stopped" is printed
    assert not Path(f"/proc/{pid}").exists(), Path(f"/proc/{pid}/stat").read_text()
