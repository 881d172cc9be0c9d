"""The bench's soak scenario (bench/soak.py) end to end, short: a paced producer, two worker
processes, samples written as CSV and JSON. Structure and completeness only; no timing
assertions (speed is the bench's business, not the tests').

The long soak (the issue's 10 minutes at 8,000 jobs/s) is behind the ``long_soak`` marker:
``python -m pytest tests/bench/test_bench_soak.py -m long_soak``.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import runner, soak

ROOT = Path(__file__).resolve().parents[2]


def _bench(*argv: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _check_run(out: Path, rate: float, duration: float) -> dict:
    """The files a soak run writes hold every field, and every offered job completed."""
    csv_path = out.with_name(f"{out.stem}-soak-awa_fast.csv")
    json_path = out.with_name(f"{out.stem}-soak-awa_fast.json")
    with open(csv_path, newline="") as fh:
        rows = list(csv.reader(fh))
    assert tuple(rows[0]) == soak.CSV_FIELDS
    body = [dict(zip(rows[0], r)) for r in rows[1:]]
    assert len(body) >= 2 and all(len(r) == len(rows[0]) for r in rows[1:])
    assert {r["phase"] for r in body} >= {"produce"}
    assert all(r["backlog_source"] == "db" for r in body)

    data = json.loads(json_path.read_text())
    assert data["error"] is None
    samples, summary = data["samples"], data["summary"]
    offered = round(rate * duration)
    assert summary["offered_total"] == offered
    assert summary["produced"] == offered and summary["completed"] == offered
    assert summary["drained"] is True and summary["backlog_at_end"] == 0
    assert data["producer"]["produced"] == offered and data["producer"]["failed"] is None
    # every job was picked by a handler and measured once
    assert sum(w["picked"] for w in samples) == offered
    assert any(w["p99_ms"] is not None for w in samples)
    for w in samples:
        assert set(soak.CSV_FIELDS) <= set(w)
        assert w["relations"], "the system's tables are sampled"
        for rel in w["relations"].values():
            assert set(rel) == {"root", "live", "dead", "size", *soak.COUNTERS}
        assert w["cpu_workers_s"] is not None
        assert w["rss_workers_mb"] > 10  # both worker processes' resident memory, sampled
    # the tables that took updates or deletes are named, with their worst dead-tuple count
    assert summary["hot_relations"]
    assert summary["hot_dead_tuples_max"] is not None
    for key in (
        "kept_up",
        "p99_ms_per_window_after_warmup",
        "last_over_first_third",
        "hot_size_slope_bytes_per_min",
        "autovacuum_runs_by_relation",
        "cpu_ms_per_job_after_warmup",
        "wal_bytes_per_job_after_warmup",
        "worker_rss_mb_max_first_third",
        "worker_rss_mb_max_last_third",
    ):
        assert key in summary, key

    records = [json.loads(line) for line in out.read_text().splitlines()]
    (rec,) = [r for r in records if r.get("scenario") == "soak"]
    assert rec["system"] == "awa_fast" and rec["n"] == offered
    assert rec["retention"] == "engine default"
    assert rec["samples_csv"] == str(csv_path)
    return data


@pytest.mark.slow
def test_short_soak_writes_samples_and_completes_every_job(pg_base_dsn, tmp_path):
    out = tmp_path / "run.jsonl"
    r = _bench(
        "--scenarios",
        "soak",
        "--rate",
        "500",
        "--duration",
        "12",
        "--database-url",
        pg_base_dsn,
        "--out",
        str(out),
        "--plot",
        timeout=240,
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    _check_run(out, 500, 12)
    assert (tmp_path / "run.png").stat().st_size > 0  # only soak ran: its chart takes the path
    assert "soak targets (from issue 11" in r.stdout


def test_relations_are_enumerated_at_every_sample_partitions_included(dsn):
    """Tables another change adds (time-sliced partitions included) show up without the bench
    naming them; a dropped partition disappears; partitions report their root."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        before = soak.relations(conn, "awa_fast", "%")
        # the finished-job slices (migration 010) are partitions already
        slices = {rel for rel in before if rel.startswith("awa_fast.jobs_done_")}
        assert len(slices) == 64
        assert all(before[rel]["root"] == "awa_fast.jobs_done" for rel in slices)
        assert before and all(r["root"] == rel for rel, r in before.items() if rel not in slices)
        conn.execute(
            "CREATE TABLE awa_fast.soak_probe (at timestamptz NOT NULL, v int)"
            " PARTITION BY RANGE (at)"
        )
        for day in (1, 2):
            conn.execute(
                f"CREATE TABLE awa_fast.soak_probe_{day} PARTITION OF awa_fast.soak_probe"
                f" FOR VALUES FROM ('2026-12-0{day}') TO ('2026-12-0{day + 1}')"
            )
        conn.execute(
            "INSERT INTO awa_fast.soak_probe"
            " SELECT '2026-12-01'::timestamptz + i * interval '1 minute', i"
            " FROM generate_series(1, 2000) i"
        )
        after = soak.relations(conn, "awa_fast", "%")
        probes = {rel: r for rel, r in after.items() if rel.startswith("awa_fast.soak_probe")}
        # the partitioned parent has no storage of its own: only its partitions are listed
        assert set(probes) == {"awa_fast.soak_probe_1", "awa_fast.soak_probe_2"}
        assert {r["root"] for r in probes.values()} == {"awa_fast.soak_probe"}
        assert all(r["size"] > 0 for r in probes.values())
        assert set(before) <= set(after)
        conn.execute("DROP TABLE awa_fast.soak_probe_1")
        dropped = soak.relations(conn, "awa_fast", "soak_probe%")
        assert set(dropped) == {"awa_fast.soak_probe_2"}
        conn.execute("DROP TABLE awa_fast.soak_probe")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rate", "100"], "--rate applies to the soak scenario"),
        (["--scenarios", "soak", "--compare", "--prune-every", "5"], "--prune-every sets"),
        (["--scenarios", "soak", "--completed-retention", "0"], "--completed-retention out of"),
        (["--scenarios", "soak", "--sample-every", "0"], "--sample-every out of range"),
        # inf passed "> 0": the run crashed later (exit 0) or never ended
        (["--scenarios", "soak", "--rate", "inf"], "--rate out of range: inf (must be a finite"),
        (["--scenarios", "soak", "--duration", "inf"], "--duration out of range: inf (must be"),
        (["--scenarios", "soak", "--tick-ms", "inf"], "--tick-ms out of range: inf"),
        (["--scenarios", "soak", "--drain-timeout", "inf"], "--drain-timeout out of range: inf"),
        (["--scenarios", "soak", "--processes", "0"], "--processes out of range: 0 (must be >= 1)"),
        (["--scenarios", "soak", "--max-workers", "0"], "--max-workers out of range: 0 (must be"),
        (["--processes", "-1"], "--processes out of range: -1"),  # the drain scenario too
        (
            ["--scenarios", "soak", "--sample-every", "30", "--duration", "2"],
            "--sample-every out of range: 30 (must be at most --duration, 2)",
        ),
    ],
)
def test_soak_options_are_honoured_or_rejected(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        runner.parse_args(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_default_sample_window_is_no_longer_than_the_run():
    # a 2 s run sampled every 5 s ran 7 s: one more full window after the end
    assert runner.parse_args(["--scenarios", "soak", "--duration", "2"]).sample_every == 2
    assert runner.parse_args(["--scenarios", "soak", "--duration", "0.5"]).sample_every == 1
    assert runner.parse_args(["--scenarios", "soak", "--duration", "60"]).sample_every == 5
    args = runner.parse_args(["--scenarios", "soak", "--duration", "3", "--sample-every", "3"])
    assert args.sample_every == 3


def test_soak_runs_only_when_named():
    assert "soak" not in runner.parse_args([]).scenarios
    assert runner.parse_args(["--scenarios", "soak"]).scenarios == ["soak"]


@pytest.mark.long_soak
@pytest.mark.integration  # starts a durable server of its own
def test_long_soak_at_the_issue_rate(tmp_path):
    """10 minutes at 8,000 jobs/s on a durable throwaway server (about 12 minutes); deselected
    unless ``-m long_soak`` (tests/conftest.py)."""
    out = tmp_path / "long.jsonl"
    r = _bench("--scenarios", "soak", "--out", str(out), "--plot", timeout=3600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    _check_run(out, runner.SOAK_RATE, runner.SOAK_DURATION)
