"""A program that returns from ``main()`` after ``shutdown()`` without ``close()`` exits: the
pool's own tasks swallow the one cancel ``asyncio.run()`` sends them at exit (see
``awa_fast.connections.close_pool_on_cancel``). Real subprocesses, real PostgreSQL."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNS = 5
TIMEOUT_S = 20

# README-style program minus close(). The resize leaves connects in flight at exit -- the
# condition under which psycopg_pool's workers swallowed the cancel and asyncio.run() hung.
SCRIPT = """
import asyncio, dataclasses, sys
import awa_fast as awa

@dataclasses.dataclass
class Ping:
    n: int

async def main(dsn):
    client = awa.AsyncClient(dsn)
    done = asyncio.Event()

    @client.task(Ping, queue="exit_q")
    async def handle(job):
        done.set()

    await client.insert(Ping(n=1), queue="exit_q")
    await client.start([("exit_q", 1)])
    await asyncio.wait_for(done.wait(), 15)
    await client.shutdown()
    pool = await client.pool()
    await pool.resize(min_size=pool.max_size, max_size=pool.max_size)

asyncio.run(main(sys.argv[1]))
"""


def _run(script: Path, dsn: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), dsn],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


@pytest.mark.slow
def test_return_after_shutdown_without_close_exits(dsn, tmp_path):
    script = tmp_path / "no_close.py"
    script.write_text(SCRIPT)
    for run in range(RUNS):
        try:
            proc = _run(script, dsn)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(
                f"run {run}: still running after {TIMEOUT_S} s without close(); "
                f"stderr: {exc.stderr!r}"
            )
        assert proc.returncode == 0, f"run {run}: {proc.stderr}"


SYNC_SCRIPT = """
import sys
import awa_fast as awa

client = awa.Client(sys.argv[1])
raise ValueError("the script's own bug, before any close()")
"""


def test_a_sync_client_left_open_is_closed_quietly_at_exit(dsn, tmp_path):
    # Its loop thread is a daemon: the exit destroyed the pool's pending tasks, each printing
    # "Task was destroyed but it is pending!" (fresh eyes: four blocks after every script).
    script = tmp_path / "sync_no_close.py"
    script.write_text(SYNC_SCRIPT)
    proc = _run(script, dsn)
    assert proc.returncode == 1, proc.stderr
    assert "ValueError: the script's own bug" in proc.stderr
    assert "Task was destroyed" not in proc.stderr, proc.stderr


FORK_SCRIPT = """
import os, sys, time
import awa_fast as awa

client = awa.Client(sys.argv[1])
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a preforked worker's normal exit: its copy of the client is not its own
started = time.monotonic()
os.waitpid(pid, 0)
print(f"child exited in {time.monotonic() - started:.1f} s")
client.insert({"x": 1}, kind="after_fork")
client.close()
"""


def test_a_forked_child_does_not_close_its_parents_sync_client_at_exit(dsn, tmp_path):
    # The exit-time close ran in the child on the copied client, whose loop thread exists only
    # in the parent, and waited its full 5 s bound (breaker helper).
    script = tmp_path / "fork.py"
    script.write_text(FORK_SCRIPT)
    proc = _run(script, dsn)
    assert proc.returncode == 0, proc.stderr
    took = float(re.search(r"child exited in ([\d.]+) s", proc.stdout).group(1))
    assert took < 2, proc.stdout
