"""The bench's capacity scenario (bench/capacity.py): which rates it tries, what it records.
Structure only, no timing assertions (the highest rate held is the bench's figure)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import capacity, runner

ROOT = Path(__file__).resolve().parents[2]


def _tried(argv: list[str], verdict) -> list[float]:
    """The rates the search tries when ``verdict(rate)`` says whether a step holds."""
    args = runner.parse_args(["--scenarios", "capacity", *argv])
    gen = capacity._rates(args)
    out = []
    try:
        rate = next(gen)
        while True:
            out.append(rate)
            rate = gen.send(verdict(rate))
    except StopIteration:
        return out


def test_bisect_doubles_then_halves_to_the_resolution():
    tried = _tried([], lambda rate: rate <= 13_500)
    assert tried[:5] == [1000, 2000, 4000, 8000, 16000]
    assert tried[5:] == [12000, 14000, 13000]  # 13,000 held, 14,000 not: within 1,000


def test_linear_steps_until_a_step_does_not_hold():
    tried = _tried(
        ["--capacity-search", "linear", "--capacity-start", "500", "--capacity-step", "500"],
        lambda rate: rate < 2000,
    )
    assert tried == [500, 1000, 1500, 2000]


def test_the_search_stops_at_the_highest_rate_allowed():
    assert _tried(["--capacity-max", "4000"], lambda rate: True) == [1000, 2000, 4000]
    assert _tried(["--capacity-search", "linear", "--capacity-max", "2500"], lambda r: True) == [
        1000,
        2000,
    ]


def test_a_system_that_holds_nothing_stops_after_one_step():
    assert _tried([], lambda rate: False) == [1000]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--capacity-step", "0"], "--capacity-step out of range: 0.0"),
        (["--capacity-step-s", "inf"], "--capacity-step-s out of range: inf"),
        (["--capacity-start", "5000", "--capacity-max", "1000"], "--capacity-max must be at least"),
        (["--capacity-search", "random"], "invalid choice: 'random'"),
    ],
)
def test_capacity_options_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        runner.parse_args(["--scenarios", "capacity", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_capacity_runs_only_when_named():
    assert "capacity" not in runner.parse_args([]).scenarios


@pytest.mark.slow
def test_a_short_capacity_run_records_every_step_and_the_rate_held(pg_base_dsn, tmp_path):
    out = tmp_path / "cap.jsonl"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--scenarios",
            "capacity",
            "--capacity-start",
            "200",
            "--capacity-max",
            "400",
            "--capacity-step",
            "200",
            "--capacity-step-s",
            "4",
            "--database-url",
            pg_base_dsn,
            "--out",
            str(out),
            "--plot",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    steps = [x for x in records if x.get("scenario") == "capacity_step"]
    (final,) = [x for x in records if x.get("scenario") == "capacity"]
    assert [s["offered"] for s in steps] == [200, 400]
    for s in steps:
        assert s["completion_rate"] and s["p99_ms_max"] is not None and s["error"] is None
    held = [s["offered"] for s in steps if s["held"]]
    assert final["rate"] == (max(held) if held else None)
    assert "capacity (highest offered rate held" in r.stdout
    assert (tmp_path / "cap-capacity.png").stat().st_size > 0
