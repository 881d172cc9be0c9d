"""The bench's hosts scenario (bench/hosts.py) in a tiny configuration: two namespace hosts,
direct and through PgBouncer, a small drain and a few seconds of soak. Structure and
completeness only, no timing assertions (the figures are the bench's business). Needs root,
``ip`` and ``pgbouncer`` (``.ci/run`` installs them): a missing one fails, never skips."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import hosts, runner

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.integration  # starts a server of its own
def test_a_tiny_hosts_run_records_every_mode_and_count(tmp_path):
    out = tmp_path / "run.jsonl"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--scenarios",
            "hosts",
            "--hosts-counts",
            "2",
            "--jobs",
            "200",
            "--hosts-soak-s",
            "3",
            "--hosts-rate",
            "50",
            "--max-workers",
            "16",
            "--unsafe-fsync-off",
            "--out",
            str(out),
        ],  # fmt: skip
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    results = [x for x in records if x.get("type") == "result"]
    assert sorted((x["scenario"], x["mode"], x["hosts"]) for x in results) == [
        ("hosts_drain", "direct", 2),
        ("hosts_drain", "pgbouncer", 2),
        ("hosts_soak", "direct", 2),
        ("hosts_soak", "pgbouncer", 2),
    ]
    for x in results:
        assert not x.get("error"), x
        assert x["rate"] and x["cpu_ms_per_job"] is not None, x
        peaks = x["connections"]["peak_by_origin"]
        if x["mode"] == "direct":  # every host connected over its own link, and only there
            assert peaks.get("host0", 0) > 0 and peaks.get("host1", 0) > 0, x
            assert "pgbouncer" not in peaks
        else:  # the server saw PgBouncer's connections only
            assert peaks.get("pgbouncer", 0) > 0 and "host0" not in peaks, x
    drains = [x for x in results if x["scenario"] == "hosts_drain"]
    assert all(x["finalized"] == 200 and not x["timed_out"] for x in drains)
    # PgBouncer's CPU is read (/proc, 10 ms ticks: a 200-job drain may take none); direct: none
    assert all(x["cpu_s"]["pooler"] is not None for x in drains if x["mode"] == "pgbouncer")
    assert all(x["cpu_s"]["pooler"] == 0 for x in drains if x["mode"] == "direct")
    assert "hosts (the pooler's CPU per job over direct's" in r.stdout
    assert "ratio" in r.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scenarios", "hosts", "--hosts-counts", "0"], "--hosts-counts out of range"),
        (["--scenarios", "hosts", "--hosts-counts", "two"], "--hosts-counts out of range"),
        (["--scenarios", "hosts", "--hosts-soak-s", "inf"], "--hosts-soak-s out of range"),
        (["--scenarios", "hosts", "--hosts-rate", "0"], "--hosts-rate out of range"),
        (["--scenarios", "hosts", "--hosts-pool-size", "0"], "--hosts-pool-size out of range"),
        (["--hosts-soak-s", "10"], "applies to the hosts scenario"),
        (["--scenarios", "hosts", "--database-url", "postgresql://x"], "drop --database-url"),
    ],
)
def test_hosts_options_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit):
        runner.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_summary_gives_the_ratio_and_the_connections_per_host():
    def rec(scenario, mode, cpu, peaks):
        return {
            "scenario": scenario,
            "mode": mode,
            "hosts": 2,
            "cpu_ms_per_job": cpu,
            "connections": {"peak_by_origin": peaks},
        }

    lines = hosts.summary_lines(
        [
            rec("hosts_drain", "direct", 0.2, {"host0": 5, "host1": 6, "local": 1}),
            rec("hosts_drain", "pgbouncer", 0.3, {"pgbouncer": 8, "local": 1}),
        ]
    )
    drain = next(line for line in lines if "hosts_drain" in line)
    assert "ratio 1.50x" in drain and "NOT MET" in drain
    assert "direct 5/6" in drain and "PgBouncer 4.0 (8 shared)" in drain
