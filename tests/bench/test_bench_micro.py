"""The micro-benchmarks in bench/micro (outside testpaths, run with ``--benchmark-only``) still
run: each benchmark body once, with pytest-benchmark's timing disabled, so the suite's time is
unaffected and nothing about speed is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ext_micro_benchmarks_run_once():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "bench/micro",
            "--benchmark-disable",
            "-q",
            "-p",
            "no:xdist",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = r.stdout.strip().splitlines()[-1]
    assert re.search(r"\b\d+ passed", summary) and "skipped" not in summary, summary
