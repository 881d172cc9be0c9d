"""The examples in examples/ run as their docstrings say, against a real database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(example: str, dsn: str) -> list[str]:
    """Run ``examples/<example>`` with ``$DATABASE_URL`` = ``dsn``; its stdout lines (exit 0)."""
    env = {k: v for k, v in os.environ.items() if k != "AWA_FAST_DATABASE_URL"}
    env["DATABASE_URL"] = dsn
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / example)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_reserve_stock_releases_the_reservation_and_settles_the_job(fresh_db):
    # It read the job's consequence from awa_fast.jobs, where a finished job no longer is
    # (ADR 016), and printed "consequence: None"; and it ignored $DATABASE_URL.
    lines = _run("reserve_stock.py", fresh_db)
    assert "consequence_pending" in " ".join(lines), lines
    assert lines[-1] == (
        "release attempts: 3; consequence: ('applied', 'terminal_error', 'failure'); "
        "widget stock: 10"
    ), lines


def test_an_awa_07_application_starts_unchanged_but_for_the_import(fresh_db):
    # examples/awa07_app.py is configured as awa 0.7 documents an application: the dict queue
    # form with per-queue retention and awa's queue-storage options at start().
    example = (EXAMPLES / "awa07_app.py").read_text()
    assert "import awa_fast as awa" in example and "\nimport awa\n" not in example
    lines = _run("awa07_app.py", fresh_db)
    assert [ln.split(" state = ")[1] for ln in lines[:3]] == ["completed"] * 3, lines
    assert lines[-1] == "sent: alice@example.com, bob@example.com", lines
