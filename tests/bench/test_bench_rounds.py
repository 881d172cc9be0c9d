"""The bench's burst scenarios run ``--rounds`` rounds, every system once per round, and report
each (scenario, system) once: its median round, with every round's rate. Structure only; no
timing assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import runner

ROOT = Path(__file__).resolve().parents[2]


def _rec(scenario: str, system: str, rate: float | None, **extra) -> dict:
    return {"scenario": scenario, "system": system, "rate": rate, **extra}


def test_the_median_round_is_reported_with_every_rounds_rate():
    merged = runner.merge_rounds(
        [
            _rec("enqueue_unique", "awa_fast", 50.0, elapsed_s=4.0, alternatives_per_s={"a": 50.0}),
            _rec("enqueue_unique", "awa_pg", 40.0),
            _rec("enqueue_unique", "awa_fast", 70.0, elapsed_s=2.0, alternatives_per_s={"a": 70.0}),
            _rec("enqueue_unique", "awa_pg", None, error="boom"),
            _rec("enqueue_unique", "awa_fast", 60.0, elapsed_s=3.0, alternatives_per_s={"a": 60.0}),
            _rec("enqueue_unique", "awa_pg", 30.0),
            _rec("drain_1p", "pgqueuer", None, method="not supported"),
        ]
    )
    fast, pg, queuer = merged
    assert fast["rate"] == 60.0 and fast["elapsed_s"] == 3.0  # the median round's own record
    assert fast["round_rates"] == [50.0, 70.0, 60.0]
    assert fast["alternatives_per_s"] == {"a": 60.0}
    # a failed round is listed, and the median is taken over the rounds that measured a rate
    assert pg["rate"] == 30.0 and pg["round_rates"] == [40.0, None, 30.0]
    assert pg["round_errors"] == ["boom"]
    assert queuer == _rec("drain_1p", "pgqueuer", None, method="not supported")
    assert "rounds: 50 / 70 / 60" in runner.format_row(fast)


@pytest.mark.parametrize("bad", ["0", "-1"])
def test_rounds_below_one_are_rejected(bad, capsys):
    with pytest.raises(SystemExit) as info:
        runner.parse_args(["--rounds", bad])
    assert info.value.code == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err


def _bench(dsn: str, out: Path, *argv: str) -> tuple[list[dict], str]:
    """Run the bench on ``dsn`` writing ``out``: its JSONL records and its stderr."""
    r = subprocess.run(
        [sys.executable, "-m", "bench", "--jobs", "200", *argv, "--database-url", dsn,
         "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return [json.loads(line) for line in out.read_text().splitlines()], r.stderr


@pytest.mark.slow
def test_each_burst_row_is_one_record_over_the_rounds(pg_base_dsn, tmp_path):
    records, stderr = _bench(
        pg_base_dsn, tmp_path / "run.jsonl", "--scenarios", "enqueue,drain", "--rounds", "2"
    )
    assert records[0]["type"] == "header" and records[0]["options"]["rounds"] == 2
    results = records[1:]
    assert [x["scenario"] for x in results] == [
        "enqueue_single",
        "enqueue_many",
        "enqueue_copy",
        "enqueue_unique",
        "drain_1p",
        "drain_2p",
    ]
    for x in results:
        assert len(x["round_rates"]) == 2 and all(x["round_rates"]), x
        assert x["rate"] == min(x["round_rates"]), x  # the lower middle of two
    assert stderr.count("round 1/2:") == 6 and stderr.count("round 2/2:") == 6
    drain = [x for x in results if x["scenario"] == "drain_2p"][0]
    assert drain["finalized"] == 200 and not drain["timed_out"]


@pytest.mark.slow
def test_a_drain_that_timed_out_is_not_repeated(pg_base_dsn, tmp_path):
    records, stderr = _bench(
        pg_base_dsn, tmp_path / "run.jsonl", "--scenarios", "drain", "--rounds", "3",
        "--timeout", "0",
    )  # fmt: skip
    results = records[1:]
    assert [x["scenario"] for x in results] == ["drain_1p", "drain_2p"]
    for x in results:  # its partial rate, from the one round it ran
        assert x["timed_out"] and len(x["round_rates"]) == 1, x
    assert stderr.count("round 1/3:") == 2 and "round 2/3:" not in stderr
