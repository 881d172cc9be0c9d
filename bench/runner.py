"""The end-to-end benchmark suite: ``awa-fast bench [options]`` (or ``python -m bench`` in a
source checkout, or ``bench.runner:main(argv)``).

Scenarios (``--scenarios``, comma separated; default all but soak):

* ``enqueue``   single ``insert`` rate, ``insert_many`` in batches, COPY ``insert_many_copy``,
  unique enqueue (``unique_opts={}``).
* ``drain``     end-to-end drain of pre-enqueued no-op jobs with 1 and N worker processes:
  durable finalized jobs/s counted in the database, plus WAL bytes and commits per completed job
  from the server's own counters (``pg_current_wal_lsn()``, ``pg_stat_database.xact_commit``).
* ``pipeline``  stage-A handlers stage one stage-B job each through
  ``job.enqueue_on_completion(..., unique_opts={})`` (every B value staged by two A's).
* ``failures``  1/3 RetryAfter(0) once, 1/3 TerminalError, 1/3 Snooze(0) once.
* ``latency``   pickup latency through LISTEN/NOTIFY on an idle queue (large poll interval).
* ``soak``      a paced producer offers ``--rate`` no-op jobs/s for ``--duration`` s to
  ``--processes`` workers; every ``--sample-every`` s: completion rate, backlog, pickup latency
  p50/p95/p99, dead/live tuples, size and autovacuum runs of every table of the system, CPU
  per job. Samples in ``<stem>-soak-<system>.csv/.json``; only when named (it runs for minutes).
* ``capacity`` the highest offered rate each system holds (bench/capacity.py: one soak per step,
  ``--capacity-*`` options; held = kept up and p99 pickup <= ``--capacity-p99-ms``), with the CPU
  per job at it; only when named.
* ``hosts``     awa-fast's workers on 1, 2 and 4 network-namespace hosts, direct and through
  PgBouncer in transaction mode: a drain and a soak each, CPU per job (the pooler's over
  direct's) and server connections per host (bench/hosts.py, ``--hosts-*`` options; needs root,
  ``ip`` and ``pgbouncer``, and its own server: not with ``--database-url``); only when named.

Every system runs in its own fresh database on the same server. Results (one JSONL record per
row, with the environment) go to ``--out``, default ``$AWA_FAST_BENCH_DIR``, else
``$XDG_DATA_HOME/awa-fast/bench`` (``~/.local/share/awa-fast/bench``). See docs/benchmarking.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from bench import capacity, hosts, netns, soak
from bench import server as srv
from bench.systems import NAMES, NotSupported, dist_version, load

SCENARIOS = ("enqueue", "drain", "pipeline", "failures", "latency", "soak", "capacity", "hosts")
DEFAULT_SCENARIOS = tuple(s for s in SCENARIOS if s not in ("soak", "capacity", "hosts"))
ENQUEUE_MODES = ("single", "many", "copy", "unique")
REPO = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_async(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


# -- arguments ------------------------------------------------------------------------------------


def results_dir() -> Path:
    """Where results go without ``--out``: ``$AWA_FAST_BENCH_DIR``, else
    ``$XDG_DATA_HOME/awa-fast/bench``, else ``~/.local/share/awa-fast/bench`` (never the
    installed package)."""
    env = os.environ.get("AWA_FAST_BENCH_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "awa-fast" / "bench"


def parse_args(argv: list[str] | None, prog: str = "python -m bench") -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.replace("``", "`"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="also run the peers (awa-pg, pgqueuer, procrastinate) and print ratios",
    )
    p.add_argument(
        "--systems",
        default=None,
        help=f"comma-separated subset of {','.join(NAMES)} (default: awa_fast, or all with --compare)",
    )
    p.add_argument(
        "--scenarios",
        default=",".join(DEFAULT_SCENARIOS),
        help=f"comma-separated subset of {','.join(SCENARIOS)} (default: all but soak, capacity "
        "and hosts)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=20_000,
        help="jobs for insert_many / COPY / unique enqueue and the drains (default 20000)",
    )
    p.add_argument(
        "--single-jobs",
        type=int,
        default=None,
        help="jobs for the single-insert rate (default jobs/10, i.e. 2000)",
    )
    p.add_argument(
        "--failure-jobs", type=int, default=None, help="jobs of the failure mix (default jobs/2)"
    )
    p.add_argument("--batch", type=int, default=1000, help="insert_many batch size (default 1000)")
    p.add_argument(
        "--processes", type=int, default=2, help="worker processes of the N-process drain"
    )
    p.add_argument(
        "--max-workers", type=int, default=512, help="per-process worker slots (default 512)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of the burst scenarios (enqueue, drain), every system once per round; "
        "each row reports its median round (default 3)",
    )
    p.add_argument("--latency-iterations", type=int, default=200)
    p.add_argument(
        "--poll-ms",
        type=int,
        default=5000,
        help="poll interval of the latency scenario, so pickups come from NOTIFY",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds before a drain gives up and reports its partial rate (default 60)",
    )
    p.add_argument(
        "--database-url",
        default=None,
        help="use this server (scratch databases are created and dropped on it) "
        "instead of a throwaway one",
    )
    p.add_argument(
        "--unsafe-fsync-off",
        action="store_true",
        help="throwaway server with fsync=off/full_page_writes=off (awa_fast.embedded.start_temp "
        "defaults): faster, NOT durable numbers",
    )
    p.add_argument(
        "--out", default=None, help=f"JSONL output (default {results_dir()}/<timestamp>.jsonl)"
    )
    p.add_argument(
        "--plot",
        nargs="?",
        const="",
        default=None,
        help="write a PNG chart (default path: the JSONL path with .png)",
    )
    soak = p.add_argument_group(
        "soak scenario (--scenarios soak; see docs/benchmarking.md, 'Soak')",
        "Worker processes: --processes; slots per process: --max-workers.",
    )
    soak.add_argument(
        "--rate", type=float, default=None, help="offered jobs/s (default %d)" % SOAK_RATE
    )
    soak.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds the producer runs (default %d)" % SOAK_DURATION,
    )
    soak.add_argument(
        "--sample-every",
        type=int,
        default=None,
        help="seconds per sample window, a whole number, at most --duration (default 5, or "
        "--duration if shorter)",
    )
    soak.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds excluded from the steady-state summary (default min(60, duration/5))",
    )
    soak.add_argument(
        "--tick-ms",
        type=float,
        default=None,
        help="producer batch interval in ms: one insert of the jobs due per tick (default 10)",
    )
    soak.add_argument(
        "--producer-lanes",
        type=int,
        default=None,
        help="producer inserts in flight at most (default 4)",
    )
    soak.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        help="seconds to keep sampling after the producer stops, until the backlog is 0 "
        "(default 60)",
    )
    soak.add_argument(
        "--prune-every",
        type=float,
        default=None,
        help="diagnosis only, awa_fast only: the retention pass interval in seconds "
        "(cleanup_interval_ms); default: the engine's",
    )
    soak.add_argument(
        "--completed-retention",
        type=float,
        default=None,
        help="diagnosis only, awa_fast only: keep completed jobs this many seconds "
        "(completed_retention_hours); default: the engine's",
    )
    cap = p.add_argument_group(
        "capacity scenario (--scenarios capacity; bench/capacity.py)",
        "One soak per step (the soak options apply to each step); held = kept up and the worst "
        "window's p99 pickup <= --capacity-p99-ms.",
    )
    cap.add_argument("--capacity-start", type=float, default=1000.0, help="first rate (jobs/s)")
    cap.add_argument(
        "--capacity-step",
        type=float,
        default=1000.0,
        help="linear: the increment; bisect: the resolution (jobs/s, default 1000)",
    )
    cap.add_argument(
        "--capacity-step-s", type=float, default=60.0, help="seconds per step (default 60)"
    )
    cap.add_argument(
        "--capacity-max", type=float, default=64000.0, help="highest rate tried (jobs/s)"
    )
    cap.add_argument(
        "--capacity-p99-ms",
        type=float,
        default=100.0,
        help="p99 pickup a held step stays within (ms, default 100)",
    )
    cap.add_argument(
        "--capacity-search",
        choices=("bisect", "linear"),
        default="bisect",
        help="bisect (double, then halve the interval; default) or linear (+step per step)",
    )
    hg = p.add_argument_group(
        "hosts scenario (--scenarios hosts; bench/hosts.py)",
        "Drains --jobs jobs, then soaks; --max-workers slots per host; --timeout per drain.",
    )
    hg.add_argument(
        "--hosts-counts",
        default="1,2,4",
        help="comma-separated host counts, one worker process per host (default 1,2,4)",
    )
    hg.add_argument(
        "--hosts-soak-s",
        type=float,
        default=120.0,
        help="seconds of each soak (default 120; e.g. 15 for a short run)",
    )
    hg.add_argument(
        "--hosts-rate", type=float, default=1000.0, help="jobs/s offered in the soaks (1000)"
    )
    hg.add_argument(
        "--hosts-pool-size",
        type=int,
        default=10,
        help="PgBouncer's default_pool_size: the server connections it opens (default 10)",
    )
    args = p.parse_args(argv)
    _hosts_args(p, args)
    for flag in ("capacity_start", "capacity_step", "capacity_step_s", "capacity_max"):
        value = getattr(args, flag)
        if not (math.isfinite(value) and value > 0):
            p.error(
                f"--{flag.replace('_', '-')} out of range: {value!r} (must be a finite number > 0)"
            )
    if args.capacity_max < args.capacity_start:
        p.error("--capacity-max must be at least --capacity-start")
    args.single_jobs = args.single_jobs or max(1, args.jobs // 10)
    args.failure_jobs = args.failure_jobs or max(3, args.jobs // 2)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1 (got {args.rounds})")
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in args.scenarios:
        if s not in SCENARIOS:
            p.error(f"unknown scenario {s!r} (choose from {', '.join(SCENARIOS)})")
    if args.systems:
        args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
        for s in args.systems:
            if s not in NAMES:
                p.error(f"unknown system {s!r} (choose from {', '.join(NAMES)})")
    else:
        args.systems = list(NAMES) if args.compare else ["awa_fast"]
    _soak_args(p, args)
    return args


def _hosts_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The hosts scenario's options, checked whether or not it runs (an option is honoured or
    rejected, never ignored)."""
    try:
        counts = [int(c) for c in args.hosts_counts.split(",") if c.strip()]
    except ValueError:
        counts = []
    if not counts or any(not 1 <= c <= 64 for c in counts):
        p.error(
            f"--hosts-counts out of range: {args.hosts_counts!r} (must be whole numbers 1..64, "
            "comma separated)"
        )
    args.hosts_counts = sorted(set(counts))
    for flag, value in (("hosts_soak_s", args.hosts_soak_s), ("hosts_rate", args.hosts_rate)):
        if not (math.isfinite(value) and value > 0):
            p.error(
                f"--{flag.replace('_', '-')} out of range: {value!r} (must be a finite number > 0)"
            )
    if args.hosts_pool_size < 1:
        p.error(f"--hosts-pool-size out of range: {args.hosts_pool_size!r} (must be >= 1)")
    given = [
        f
        for f, d in (("hosts_soak_s", 120.0), ("hosts_rate", 1000.0), ("hosts_pool_size", 10))
        if getattr(args, f) != d
    ] + (["hosts_counts"] if args.hosts_counts != [1, 2, 4] else [])
    scenarios = [s.strip() for s in args.scenarios.split(",")]
    if given and "hosts" not in scenarios:
        p.error(
            f"--{given[0].replace('_', '-')} applies to the hosts scenario: add --scenarios hosts"
        )
    if "hosts" in scenarios and args.database_url:
        p.error(
            "--scenarios hosts starts its own server (listening on the namespaces' links): "
            "drop --database-url"
        )


SOAK_RATE = 8000
SOAK_DURATION = 600
SOAK_DEFAULTS = {
    "rate": SOAK_RATE,
    "duration": SOAK_DURATION,
    "sample_every": 5,
    "warmup": None,
    "tick_ms": 10.0,
    "producer_lanes": 4,
    "drain_timeout": 60.0,
    "prune_every": None,
    "completed_retention": None,
}


def _soak_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Soak options are rejected without the soak scenario, the diagnosis ones with a peer."""
    given = [k for k in SOAK_DEFAULTS if getattr(args, k) is not None]
    if given and "soak" not in args.scenarios and "capacity" not in args.scenarios:
        p.error(
            "--" + given[0].replace("_", "-") + " applies to the soak scenario: add "
            "--scenarios soak"
        )
    for flag in ("prune_every", "completed_retention"):
        if getattr(args, flag) is not None and args.systems != ["awa_fast"]:
            p.error(
                f"--{flag.replace('_', '-')} sets awa-fast's retention (diagnosis only): use it "
                "with --systems awa_fast (the peers run with their defaults)"
            )
    for k, v in SOAK_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    finite = math.isfinite
    # flag -> (accepted, the limit); inf passed "> 0" and crashed the run (or never ended)
    checks = {
        "processes": (args.processes >= 1, ">= 1"),
        "max_workers": (args.max_workers >= 1, ">= 1"),
        "rate": (finite(args.rate) and args.rate > 0, "a finite number > 0"),
        "duration": (finite(args.duration) and args.duration > 0, "a finite number > 0"),
        "sample_every": (args.sample_every >= 1, ">= 1"),
        "tick_ms": (finite(args.tick_ms) and args.tick_ms > 0, "a finite number > 0"),
        "producer_lanes": (args.producer_lanes >= 1, ">= 1"),
        "drain_timeout": (finite(args.drain_timeout) and args.drain_timeout >= 0, "finite, >= 0"),
        "warmup": (
            args.warmup is None or 0 <= args.warmup < args.duration,
            ">= 0 and < --duration",
        ),
        "prune_every": (
            args.prune_every is None or (finite(args.prune_every) and args.prune_every > 0),
            "a finite number > 0",
        ),
        "completed_retention": (
            args.completed_retention is None
            or (finite(args.completed_retention) and args.completed_retention > 0),
            "a finite number > 0",
        ),
    }
    for k, (ok, limit) in checks.items():
        if not ok:
            p.error(f"--{k.replace('_', '-')} out of range: {getattr(args, k)!r} (must be {limit})")
    # A window longer than the run only delays the end by a window (one sample after it).
    longest = max(1, int(args.duration))
    if "sample_every" not in given:
        args.sample_every = min(args.sample_every, longest)
    elif args.sample_every > longest:
        p.error(
            f"--sample-every out of range: {args.sample_every!r} (must be at most --duration, "
            f"{longest})"
        )


# -- environment ------------------------------------------------------------------------------------


def environment(admin_dsn: str, args: argparse.Namespace, server_kind: str) -> dict:
    names = (
        "server_version",
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "wal_level",
        "shared_buffers",
        "max_connections",
        "max_wal_size",
        "checkpoint_timeout",
    )
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        settings = {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in names}
    try:
        git = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except Exception:
        git = ""
    return {
        "awa_fast_version": dist_version("awa-fast"),
        "awa_fast_git": git,
        "peers": {
            "awa-pg": dist_version("awa-pg"),
            "pgqueuer": dist_version("pgqueuer"),
            "asyncpg": dist_version("asyncpg"),
            "procrastinate": dist_version("procrastinate"),
        },
        "psycopg": dist_version("psycopg"),
        "uvloop": dist_version("uvloop"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "postgres": settings.pop("server_version"),
        "pg_settings": settings,
        "server": server_kind,
        "options": {
            "jobs": args.jobs,
            "single_jobs": args.single_jobs,
            "failure_jobs": args.failure_jobs,
            "batch": args.batch,
            "rounds": args.rounds,
            "processes": args.processes,
            "max_workers": args.max_workers,
            "latency_iterations": args.latency_iterations,
            "poll_ms": args.poll_ms,
            **({k: getattr(args, k) for k in SOAK_DEFAULTS} if "soak" in args.scenarios else {}),
        },
    }


# -- output -----------------------------------------------------------------------------------------


class Recorder:
    def __init__(self, path: Path, env: dict):
        self.path = path
        self.env = env
        self.records: list[dict] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "w")
        self._fh.write(json.dumps({"type": "header", **env}) + "\n")
        self._fh.flush()

    def add(self, rec: dict) -> None:
        rec = {
            "type": "result",
            **rec,
            "env": self.env,
            "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        self.records.append(rec)
        self._fh.write(json.dumps(rec, default=str) + "\n")
        self._fh.flush()
        # progress (stderr); the table of every row is printed at the end (stdout)
        log(format_row(rec))

    def close(self) -> None:
        self._fh.close()


METHOD_WIDTH = 52  # the longest method text; details come last, so nothing overflows into
HEAD = f"{'scenario':<22} {'system':<14} {'n':>7} {'rate/s':>10} {'method':<{METHOD_WIDTH}} details"


def _details(rec: dict) -> str:
    if rec.get("error"):
        return "ERROR: " + str(rec["error"])[:60]
    if rec.get("scenario") == "soak":
        return soak.details(rec)
    if str(rec.get("scenario", "")).startswith("hosts_"):
        return hosts.details(rec)
    if rec.get("scenario") in ("capacity", "capacity_step"):
        cpu, p99 = rec.get("cpu_ms_per_job"), rec.get("p99_ms_max")
        held = (
            "" if rec["scenario"] == "capacity" else ("held; " if rec.get("held") else "NOT held; ")
        )
        return (
            f"{held}p99 worst {'n/a' if p99 is None else f'{p99:.1f} ms'}, CPU/job "
            f"{'n/a' if cpu is None else f'{cpu:.3f} ms'}"
        )
    parts = []
    if "p50_ms" in rec:
        parts.append(f"p50 {rec['p50_ms']:.1f} p95 {rec['p95_ms']:.1f} p99 {rec['p99_ms']:.1f} ms")
    if "wal_bytes_per_job" in rec:
        parts.append(
            f"WAL {rec['wal_bytes_per_job']:.0f} B/job, {rec['commits_per_job']:.3f} commits/job"
        )
    if "elapsed_s" in rec and "p50_ms" not in rec:
        parts.append(f"{rec['elapsed_s']:.2f} s")
    if "compact_share" in rec:
        parts.append(
            f"batched {rec['compact_share']:.0%} (compact {rec['compact']}, per_job {rec['per_job']})"
        )
    if "vs_plain_drain" in rec:
        parts.append(f"{rec['vs_plain_drain']:.2f}x plain drain")
    if "vs_floor" in rec:
        parts.append(f"stage-A {rec['stage_a_rate']:,.0f}/s = {rec['vs_floor']:.2f}x its floor")
    if "backend_cpu_us" in rec:
        parts.append(f"backend CPU {rec['backend_cpu_us']:.0f} us per completion")
    if rec.get("alternatives_per_s"):
        parts.append(
            "alt/s: "
            + ", ".join(f"{k} {v:,.0f}" for k, v in rec["alternatives_per_s"].items() if v)
        )
    if len(rec.get("round_rates") or ()) > 1:
        parts.append(
            "rounds: " + " / ".join("-" if r is None else f"{r:,.0f}" for r in rec["round_rates"])
        )
    if rec.get("timed_out"):
        parts.append(f"TIMEOUT ({rec['finalized']} of {rec['target']})")
    return "; ".join(parts)


def format_row(rec: dict) -> str:
    rate = rec.get("rate")
    rate_s = "n/a" if rate is None else f"{rate:,.0f}"
    return (
        f"{rec['scenario']:<22} {rec['system']:<14} {rec.get('n', ''):>7} {rate_s:>10} "
        f"{rec.get('method', ''):<{METHOD_WIDTH}} {_details(rec)}"
    ).rstrip()


# -- helpers ----------------------------------------------------------------------------------------


class Databases:
    def __init__(self, admin_dsn: str, run_id: str):
        self.admin = admin_dsn
        self.run_id = run_id

    def fresh(self, system: str, label: str) -> tuple[str, str]:
        name = f"bench_{self.run_id}_{system}_{label}"[:63]
        return name, srv.create_database(self.admin, name)

    def drop(self, name: str) -> None:
        try:
            srv.drop_database(self.admin, name)
        except Exception as exc:
            log(f"could not drop {name}: {exc}")


class Rounds:
    """The records of one burst scenario over ``--rounds`` rounds (every system once per round,
    so a machine that slows down mid-run slows every system alike). A sub-second burst is one
    sample of a noisy machine: two runs minutes apart measured awa-fast's unique enqueue at 41k
    and 56k jobs/s. :meth:`merged` gives one record per (scenario, system)."""

    def __init__(self, rounds: int):
        self.rounds = rounds
        self.round = 0
        self.records: list[dict] = []

    def add(self, rec: dict) -> None:
        self.records.append(rec)
        log(f"round {self.round + 1}/{self.rounds}: {format_row(rec)}")

    def timed_out(self) -> frozenset[tuple[str, str]]:
        """The (scenario, system) pairs whose drain hit ``--timeout`` in an earlier round."""
        return frozenset((r["scenario"], r["system"]) for r in self.records if r.get("timed_out"))

    def merged(self) -> list[dict]:
        return merge_rounds(self.records)


def merge_rounds(records: list[dict]) -> list[dict]:
    """One record per (scenario, system), in first-seen order: the record of the median round
    (the lower middle for an even count) of those that measured a rate, with ``round_rates``
    (every round's rate, None where it failed) and ``alternatives_per_s`` as per-method medians.
    A pair with no rate in any round keeps its first record (an error, or not supported)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["scenario"], r["system"]), []).append(r)
    out = []
    for group in groups.values():
        measured = sorted((r for r in group if r.get("rate") is not None), key=lambda r: r["rate"])
        if not measured:
            out.append(group[0])
            continue
        rec = {**measured[(len(measured) - 1) // 2], "round_rates": [r.get("rate") for r in group]}
        errors = [r["error"] for r in group if r.get("error")]
        if errors:
            rec["round_errors"] = errors
        alts: dict[str, list[float]] = {}
        for r in measured:
            for k, v in (r.get("alternatives_per_s") or {}).items():
                if v:
                    alts.setdefault(k, []).append(v)
        if alts:
            rec["alternatives_per_s"] = {k: statistics.median_low(v) for k, v in alts.items()}
        out.append(rec)
    return out


def _count(conn: psycopg.Connection, query: str, seeded: int) -> int:
    if "%(seeded)s" in query:
        return int(conn.execute(query, {"seeded": seeded}).fetchone()[0])
    return int(conn.execute(query).fetchone()[0])


def _wal_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])


def _commits(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return int(
            conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()[0]
        )


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# -- scenarios --------------------------------------------------------------------------------------


def scenario_enqueue(adapter, dbs: Databases, args, rec: Recorder | Rounds) -> None:
    for mode in ENQUEUE_MODES:
        n = args.single_jobs if mode == "single" else args.jobs
        if adapter.name == "procrastinate" and mode == "unique":
            n = args.single_jobs  # one job per call: keep it as long as the single-insert run
        name, dsn = dbs.fresh(adapter.name, f"enq_{mode}")
        base = {
            "scenario": f"enqueue_{mode}",
            "system": adapter.name,
            "version": adapter.version,
            "n": n,
        }
        try:
            setup = run_async(adapter.setup(dsn))
            log(f"{adapter.name}: enqueue {mode} x {n}")
            r = run_async(adapter.enqueue(dsn, mode, n, args.batch))
            rec.add(
                {
                    **base,
                    **setup,
                    "rate": n / r["elapsed"],
                    "elapsed_s": r["elapsed"],
                    "method": r["method"],
                    **(
                        {"alternatives_per_s": r["alternatives_per_s"]}
                        if "alternatives_per_s" in r
                        else {}
                    ),
                }
            )
        except NotSupported:
            rec.add({**base, "rate": None, "method": "not supported"})
        except Exception as exc:
            rec.add({**base, "rate": None, "error": repr(exc)})
        finally:
            dbs.drop(name)


def _spawn_children(
    system: str,
    dsn: str | list[str],
    workload: str,
    processes: int,
    max_workers: int,
    options: dict | None = None,
    *,
    wrap=None,
    env: dict[str, str] | None = None,
):
    """Start ``processes`` worker children (bench/child.py) and wait for each one's READY.
    ``dsn``: one URL for all, or one per child; ``wrap(i, argv)``: the argv child ``i`` runs
    instead (bench/hosts.py: inside host ``i``'s namespace); ``env``: added to the environment."""
    children = []
    for i in range(processes):
        cfg = json.dumps(
            {
                "system": system,
                "dsn": dsn if isinstance(dsn, str) else dsn[i],
                "workload": workload,
                "max_workers": max_workers,
                **({"options": options} if options else {}),
            }
        )
        argv = [sys.executable, "-m", "bench.child", cfg]
        children.append(
            subprocess.Popen(
                argv if wrap is None else wrap(i, argv),
                cwd=str(REPO),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
                env=None if env is None else {**os.environ, **env},
            )
        )
    try:
        for ch in children:
            while True:
                line = ch.stdout.readline()
                if not line:
                    raise RuntimeError(f"{system} worker exited before READY (status {ch.wait()})")
                if line.strip() == "READY":
                    break
    except BaseException:
        for ch in children:  # none is left running
            ch.kill()
            ch.wait()
        raise
    return children


def _stop_children(children) -> list[dict]:
    stats = []
    for ch in children:
        try:
            ch.stdin.write("STOP\n")
            ch.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
    for ch in children:
        try:
            out, _ = ch.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            ch.kill()
            out, _ = ch.communicate()
        for line in (out or "").splitlines():
            if line.startswith("STATS "):
                stats.append(json.loads(line[6:]))
    return stats


def wait_finalized(
    mon: psycopg.Connection, query: str, seeded: int, target: int, timeout: float, label: str
) -> tuple[int, float, bool, int]:
    """Count finalized jobs (``query`` on ``mon``) from now until ``target`` or ``timeout``
    seconds; returns (finalized, elapsed seconds, timed out, counts run)."""
    t0 = time.perf_counter()
    last_log, timed_out, polls = t0, False, 0
    while True:
        done = _count(mon, query, seeded)
        polls += 1
        now = time.perf_counter()
        if done >= target:
            break
        if now - t0 > timeout:
            timed_out = True
            break
        if now - last_log > 5:
            log(f"{label} {done}/{target} finalized after {now - t0:.1f} s")
            last_log = now
        # The count scans the jobs table (several ms of server CPU on this machine): a fixed
        # 20 polls/s taxed a slow drain's server with up to a third of its CPU per job. Polling
        # every 1 % of the elapsed time (50 ms .. 1 s) bounds the monitor's load and keeps the
        # timing error within about 1 %.
        time.sleep(min(1.0, max(0.05, (now - t0) / 100)))
    return done, now - t0, timed_out, polls


def drain(adapter, dbs: Databases, args, workload: str, processes: int, label: str) -> dict:
    """Seed ``workload``, start ``processes`` workers, time until every job is finalized."""
    name, dsn = dbs.fresh(adapter.name, label)
    try:
        setup = run_async(adapter.setup(dsn))
        n = args.failure_jobs if workload == "failmix" else args.jobs
        log(f"{adapter.name}: seeding {n} {workload} jobs")
        target = run_async(adapter.seed(dsn, workload, n))
        query = adapter.count_query(workload)
        children = _spawn_children(adapter.name, dsn, workload, processes, args.max_workers)
        try:
            time.sleep(1.2)  # let setup statistics reach pg_stat_database
            wal0, commits0 = _wal_lsn(dsn), _commits(dsn)
            own_commits = 2  # the two snapshot statements above run in dsn's database
            mon = psycopg.connect(dsn, autocommit=True)
            for ch in children:
                ch.stdin.write("GO\n")
                ch.stdin.flush()
            done, elapsed, timed_out, polls = wait_finalized(
                mon, query, n, target, args.timeout, f"{adapter.name}: {label}"
            )
            own_commits += polls
            wal1 = _wal_lsn(dsn)
            mon.close()
        finally:
            stats = _stop_children(children)
        time.sleep(0.3)
        commits1 = _commits(dsn)
        own_commits += 2
        commits = max(0, commits1 - commits0 - own_commits)
        out = {
            "system": adapter.name,
            "version": adapter.version,
            **setup,
            "n": target,
            "target": target,
            "finalized": done,
            "timed_out": timed_out,
            "rate": done / elapsed,
            "elapsed_s": elapsed,
            "processes": processes,
            "wal_bytes": wal1 - wal0,
            "commits": commits,
            "wal_bytes_per_job": (wal1 - wal0) / max(done, 1),
            "commits_per_job": commits / max(done, 1),
            "child_stats": stats,
        }
        if stats and any("compact" in s for s in stats):
            agg = {
                k: sum(s.get(k, 0) for s in stats)
                for k in (
                    "compact",
                    "per_job",
                    "stale",
                    "batches",
                    "follow_ups_inserted",
                    "follow_ups_skipped",
                )
            }
            out.update(agg)
            total = agg["compact"] + agg["per_job"]
            out["compact_share"] = agg["compact"] / total if total else 0.0
        return out
    finally:
        dbs.drop(name)


def scenario_drain(
    adapter, dbs, args, rec: Recorder | Rounds, skip: frozenset[tuple[str, str]] = frozenset()
) -> None:
    """The 1- and N-process drains, but not the (scenario, system) pairs in ``skip``."""
    for procs in (1, args.processes):
        label = f"drain_{procs}p"
        if (label, adapter.name) in skip:
            continue
        base = {"scenario": label, "system": adapter.name, "version": adapter.version}
        try:
            r = drain(adapter, dbs, args, "noop", procs, label)
            rec.add({**base, **r, "method": f"{procs} process(es) x {args.max_workers} slots"})
        except Exception as exc:
            rec.add({**base, "rate": None, "error": repr(exc)})


def scenario_pipeline(adapter, dbs, args, rec: Recorder, rates: dict) -> None:
    """Stage-A jobs each leading to one stage-B job (every B value from two A's). awa-fast
    stages B (ADR-046: inserted iff A's completion commits); a peer's handler enqueues B itself,
    the nearest thing it has. For awa-fast, the per-job floor follows in the same run."""
    base = {
        "scenario": f"pipeline_{args.processes}p",
        "system": adapter.name,
        "version": adapter.version,
    }
    if not adapter.supports("pipeline"):
        rec.add({**base, "rate": None, "method": "not supported"})
        return
    method = getattr(
        adapter, "pipeline_method", "A stages B via enqueue_on_completion(unique_opts={})"
    )
    try:
        r = drain(adapter, dbs, args, "pipeline", args.processes, "pipeline")
        plain = rates.get((adapter.name, args.processes))
        if plain:
            r["vs_plain_drain"] = r["rate"] / plain
        # stage-A completions a second: the per-job transactions (n of the 1.5 n jobs)
        r["stage_a_rate"] = r["rate"] * args.jobs / r["target"]
        if adapter.name == "awa_fast":
            floor = pipeline_floor(dbs, args)
            rec.add(floor)
            if floor.get("rate"):
                r["vs_floor"] = r["stage_a_rate"] / floor["rate"]
        rec.add({**base, **r, "method": method})
    except Exception as exc:
        rec.add({**base, "rate": None, "error": repr(exc)})


def pipeline_floor(dbs, args) -> dict:
    """The per-job staged completion statement alone (bench/staged_statement.py): ``args.jobs``
    stage-A completions on as many connections as the pipeline's workers hold (10 per process),
    triggers on, on the same durable server; the pipeline's stage-A rate is compared to it."""
    from bench import staged_statement

    connections = args.processes * int(os.environ.get("BENCH_AWA_FAST_CONNECTIONS", "10"))
    base = {"scenario": "pipeline_floor", "system": "awa_fast", "n": args.jobs}
    method = f"COMPLETE_WITH_FOLLOW_UPS alone, {connections} connections, triggers on"
    name = f"bench_{dbs.run_id}_pipeline_floor"
    try:
        rate, cpu_us = staged_statement.measure(dbs.admin, name, args.jobs, connections, False, 0)
    except Exception as exc:
        return {**base, "rate": None, "method": method, "error": repr(exc)}
    return {**base, "rate": rate, "backend_cpu_us": cpu_us, "method": method}


def scenario_failures(adapter, dbs, args, rec: Recorder) -> None:
    base = {"scenario": "failure_mix_1p", "system": adapter.name, "version": adapter.version}
    try:
        r = drain(adapter, dbs, args, "failmix", 1, "failures")
        rec.add({**base, **r, "method": "1/3 retry once, 1/3 terminal, 1/3 snooze once"})
    except Exception as exc:
        rec.add({**base, "rate": None, "error": repr(exc)})


def scenario_latency(adapter, dbs, args, rec: Recorder) -> None:
    base = {
        "scenario": "pickup_latency",
        "system": adapter.name,
        "version": adapter.version,
        "n": args.latency_iterations,
    }
    name, dsn = dbs.fresh(adapter.name, "latency")
    try:
        setup = run_async(adapter.setup(dsn))
        log(f"{adapter.name}: pickup latency x {args.latency_iterations}")
        lat = run_async(adapter.pickup_latency(dsn, args.latency_iterations, args.poll_ms))
        rec.add(
            {
                **base,
                **setup,
                "rate": None,
                "p50_ms": percentile(lat, 0.5),
                "p95_ms": percentile(lat, 0.95),
                "p99_ms": percentile(lat, 0.99),
                "mean_ms": statistics.fmean(lat),
                "max_ms": max(lat),
                "method": f"insert -> handler start, poll {args.poll_ms} ms (NOTIFY wakes)",
            }
        )
    except Exception as exc:
        rec.add({**base, "rate": None, "error": repr(exc)})
    finally:
        dbs.drop(name)


def scenario_soak(adapter, dbs: Databases, args, rec: Recorder, out: Path, runs: dict) -> None:
    base = {"scenario": "soak", "system": adapter.name, "version": adapter.version}
    method = (
        f"{args.rate:,.0f}/s offered for {args.duration:.0f} s, "
        f"{args.processes} process(es) x {args.max_workers} slots"
    )
    if not adapter.supports("soak"):
        rec.add({**base, "rate": None, "method": "not supported"})
        return
    log(f"{adapter.name}: soak {method}")
    try:
        r = soak.run(adapter, dbs, args)
    except Exception as exc:
        rec.add({**base, "rate": None, "method": method, "error": repr(exc)})
        return
    csv_path, json_path = soak.write_files(out.with_suffix(""), adapter.name, r, rec.env)
    runs[adapter.name] = r
    s = r["summary"]
    rec.add(
        {
            **base,
            **r["setup"],
            "n": s["completed"],
            "rate": s["completion_rate_after_warmup"],
            "method": method,
            "summary": s,
            "retention": r["options"] or "engine default",
            "producer": r["producer"],
            "samples_csv": str(csv_path),
            "samples_json": str(json_path),
            **({"error": r["error"]} if r["error"] else {}),
        }
    )


SUSTAINED = ("soak", "capacity", "capacity_step")


def scenario_capacity(adapter, dbs: Databases, args, rec: Recorder, runs: dict) -> None:
    base = {"scenario": "capacity", "system": adapter.name, "version": adapter.version}
    method = (
        f"{args.capacity_search} from {args.capacity_start:,.0f}/s, resolution "
        f"{args.capacity_step:,.0f}/s, {args.capacity_step_s:.0f} s per step, "
        f"{args.processes} process(es); held: kept up, p99 <= {args.capacity_p99_ms:.0f} ms"
    )
    if not adapter.supports("soak"):
        rec.add({**base, "rate": None, "method": "not supported"})
        return
    try:
        r = capacity.run(adapter, dbs, args, log)
    except Exception as exc:
        rec.add({**base, "rate": None, "method": method, "error": repr(exc)})
        return
    runs[adapter.name] = r
    for step in r["steps"]:
        rec.add(
            {
                "scenario": "capacity_step",
                "system": adapter.name,
                "version": adapter.version,
                "rate": step["completion_rate"],
                "method": f"{step['offered']:,.0f}/s offered for {args.capacity_step_s:.0f} s",
                **step,
            }
        )
    at = r["at_capacity"] or {}
    rec.add(
        {
            **base,
            "n": len(r["steps"]),
            "rate": r["held"],
            "method": method,
            "cpu_ms_per_job": at.get("cpu_ms_per_job"),
            "p99_ms_max": at.get("p99_ms_max"),
        }
    )


def capacity_lines(runs: dict[str, dict], args) -> list[str]:
    """The capacity table and the issue's target (>= 3x the best peer's highest held rate)."""
    out = [f"capacity (highest offered rate held; {args.capacity_step_s:.0f} s per step):"]
    for system, r in runs.items():
        at = r["at_capacity"] or {}
        cpu = at.get("cpu_ms_per_job")
        bound = " (the highest tried: a lower bound)" if r["held"] == args.capacity_max else ""
        steps = ", ".join(f"{s['offered']:,.0f}{'' if s['held'] else ' x'}" for s in r["steps"])
        out.append(
            f"  {system:<14} held {('%s/s' % format(r['held'], ',.0f')) if r['held'] else 'none':>12}"
            f"  CPU/job at it {('%.3f ms' % cpu) if cpu else 'n/a':>10}  steps: {steps}{bound}"
        )
    mine = (runs.get("awa_fast") or {}).get("held")
    peers = [r["held"] or 0 for s, r in runs.items() if s != "awa_fast"]
    if mine and peers:
        best = max(peers)
        value = mine / best if best else float("inf")
        out.append(
            f"  awa_fast / best peer {value:.2f}x  goal >= 3.00x  {'MET' if value >= 3 else 'NOT MET'}"
        )
    return out


# -- summary ----------------------------------------------------------------------------------------


def _by(records: list[dict]) -> dict:
    return {(r["scenario"], r["system"]): r for r in records}


def ratios(records: list[dict], systems: list[str]) -> list[str]:
    idx = _by(records)
    peers = [s for s in systems if s != "awa_fast"]
    if not peers or not records:
        return []
    lines = [f"{'ratio awa_fast/peer':<22} " + " ".join(f"{p:>14}" for p in peers)]
    for scen in dict.fromkeys(r["scenario"] for r in records):
        me = idx.get((scen, "awa_fast"))
        if me is None:
            continue
        cells = []
        for p in peers:
            other = idx.get((scen, p))
            if scen == "pickup_latency":
                a, b = (me or {}).get("p95_ms"), (other or {}).get("p95_ms")
                cells.append(f"{b / a:>13.2f}x" if a and b else f"{'n/a':>14}")  # lower is better
            else:
                a, b = (me or {}).get("rate"), (other or {}).get("rate")
                cells.append(f"{a / b:>13.2f}x" if a and b else f"{'n/a':>14}")
        lines.append(f"{scen:<22} " + " ".join(cells))
    lines.append(
        "(pickup_latency: peer p95 / awa_fast p95, higher = awa_fast faster; "
        "wal: see the drain rows)"
    )
    return lines


def targets(records: list[dict], processes: int) -> list[str]:
    idx = _by(records)

    def rate(scen, sys_):
        r = idx.get((scen, sys_))
        return None if r is None else r.get("rate")

    out = []

    def check(label, value, goal, fmt="{:.2f}x", lower_is_better=False):
        if value is None:
            out.append(f"  {label:<58} n/a")
            return
        ok = value <= goal if lower_is_better else value >= goal
        out.append(
            f"  {label:<58} {fmt.format(value):>10}  goal {'<=' if lower_is_better else '>='} "
            f"{fmt.format(goal)}  {'MET' if ok else 'NOT MET'}"
        )

    def ratio(scen, peer):
        a, b = rate(scen, "awa_fast"), rate(scen, peer)
        return a / b if a and b else None

    d = f"drain_{processes}p"
    # issue 32's burst goals
    check(f"no-op drain {processes} processes vs awa-pg", ratio(d, "awa_pg"), 5.0)
    check(f"no-op drain {processes} processes vs pgqueuer", ratio(d, "pgqueuer"), 2.5)
    check("COPY enqueue vs awa-pg insert_many_copy", ratio("enqueue_copy", "awa_pg"), 1.0)
    alt = (idx.get(("enqueue_copy", "awa_pg")) or {}).get("alternatives_per_s") or {}
    me = rate("enqueue_copy", "awa_fast")
    if alt.get("enqueue_many_copy") and me:
        check("COPY enqueue vs awa-pg enqueue_many_copy (info)", me / alt["enqueue_many_copy"], 1.0)
    check("single insert vs awa-pg", ratio("enqueue_single", "awa_pg"), 2.0)
    check("unique enqueue vs awa-pg", ratio("enqueue_unique", "awa_pg"), 1.0)
    lat = idx.get(("pickup_latency", "awa_fast"))
    check(
        "pickup latency idle p95 (ms)",
        lat and lat.get("p95_ms"),
        20.0,
        "{:.1f}",
        lower_is_better=True,
    )
    pipe = idx.get((f"pipeline_{processes}p", "awa_fast"))
    # issue 32: the staged path against its own floor, and against the peers' nearest thing
    check("staged pipeline vs its per-job floor (stage-A rate)", pipe and pipe.get("vs_floor"), 0.8)
    for peer in ("awa_pg", "pgqueuer", "procrastinate"):
        if (f"pipeline_{processes}p", peer) in idx:
            check(
                f"staged pipeline vs {peer}'s non-atomic pipeline",
                ratio(pipe["scenario"] if pipe else "", peer),
                1.0,
            )
    walr = idx.get(("drain_1p", "awa_fast"))
    check(
        "WAL per completed no-op job, 1 process (B)",
        walr and walr.get("wal_bytes_per_job"),
        1.8 * 1024,
        "{:.0f}",
        lower_is_better=True,
    )
    walr = idx.get((d, "awa_fast"))
    check(
        f"WAL per completed no-op job, {processes} processes (B)",
        walr and walr.get("wal_bytes_per_job"),
        1.8 * 1024,
        "{:.0f}",
        lower_is_better=True,
    )
    return out


def plot(records: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib: pip install matplotlib", file=sys.stderr)
        return
    systems = list(dict.fromkeys(r["system"] for r in records))
    rate_scen = [s for s in dict.fromkeys(r["scenario"] for r in records) if s != "pickup_latency"]
    idx = _by(records)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [4, 1]})
    width = 0.8 / max(1, len(systems))
    for i, sys_ in enumerate(systems):
        vals = [(idx.get((s, sys_)) or {}).get("rate") or 0 for s in rate_scen]
        ax1.bar([x + i * width for x in range(len(rate_scen))], vals, width, label=sys_)
    ax1.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(rate_scen))])
    ax1.set_xticklabels(rate_scen, rotation=30, ha="right")
    ax1.set_yscale("log")
    ax1.set_ylabel("jobs/s (log)")
    ax1.set_title("throughput (durable, finalized in the database)")
    ax1.legend()
    for i, sys_ in enumerate(systems):
        r = idx.get(("pickup_latency", sys_)) or {}
        ax2.bar(
            [i - 0.2, i + 0.2],
            [r.get("p50_ms") or 0, r.get("p95_ms") or 0],
            0.4,
            color=["C%d" % i, "C%d" % i],
            alpha=1.0,
        )
    ax2.set_xticks(range(len(systems)))
    ax2.set_xticklabels(systems, rotation=30, ha="right")
    ax2.set_ylabel("ms (left bar p50, right bar p95)")
    ax2.set_title("pickup latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"chart: {path}")


# -- main -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, prog: str = "python -m bench") -> int:
    t_main = time.perf_counter()
    args = parse_args(argv, prog)
    adapters, skipped = [], {}
    for name in args.systems:
        try:
            adapters.append(load(name))
        except ImportError as exc:
            skipped[name] = f"not importable: {exc}"
    if not adapters:  # before a server is started and its WAL warmed for nothing
        for k, v in skipped.items():
            print(f"skipped {k}: {v}", file=sys.stderr)
        print(
            f"{prog}: no system to run (pip install -e '.[compare]' for the peers)", file=sys.stderr
        )
        return 1
    net = None
    if "hosts" in args.scenarios:
        try:  # before the server, which listens on their links
            net = netns.Hosts(max(args.hosts_counts))
        except netns.NetnsError as exc:
            print(f"{prog}: the hosts scenario cannot run: {exc}", file=sys.stderr)
            return 1
    try:
        return _run(args, prog, t_main, adapters, skipped, net)
    finally:
        if net is not None:
            net.close()


def _run(args, prog: str, t_main: float, adapters, skipped, net) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else results_dir() / f"{stamp}.jsonl"
    server = None
    if args.database_url:
        admin, server_kind = args.database_url, "external (--database-url)"
    elif args.unsafe_fsync_off:
        from awa_fast.embedded import start_temp

        log("starting a throwaway PostgreSQL (start_temp: fsync=off, full_page_writes=off)")
        server = (
            start_temp()
            if net is None
            else srv.start_for_hosts(net.server_ips, [h.subnet for h in net], srv.TEST_SETTINGS)
        )
        admin, server_kind = server.dsn, "throwaway start_temp() -- fsync=off, NOT durable"
    else:
        log(
            "starting a throwaway PostgreSQL with fsync=on, full_page_writes=on, synchronous_commit=on"
        )
        server = (
            srv.start_durable()
            if net is None
            else srv.start_for_hosts(net.server_ips, [h.subnet for h in net])
        )
        admin, server_kind = (
            server.dsn,
            "throwaway, durable settings (bench/server.py start_durable)",
        )
        try:
            warm = srv.warm_wal(admin)
        except BaseException:
            server.stop()
            raise
        log(
            f"warmed the server's WAL: {warm['wal_bytes'] / 2**20:,.0f} MiB written, "
            f"{warm['segments']:.0f} segments to recycle ({warm['seconds']:.1f} s)"
        )
        server_kind += f"; WAL warmed to {warm['segments']:.0f} recycled segments"
    try:
        env = environment(admin, args, server_kind)
        env["skipped_systems"] = skipped
        print(
            f"awa-fast {env['awa_fast_version']} ({env['awa_fast_git']}) | peers "
            + ", ".join(f"{k} {v}" for k, v in env["peers"].items())
        )
        print(
            f"Python {env['python']} | PostgreSQL {env['postgres']} | {env['cores']} cores | "
            f"{env['server']}"
        )
        print("settings: " + ", ".join(f"{k}={v}" for k, v in env["pg_settings"].items()))
        print("options: " + ", ".join(f"{k}={v}" for k, v in env["options"].items()))
        for k, v in skipped.items():
            print(f"skipped {k}: {v}")
        print(HEAD)
        rec = Recorder(out, env)
        dbs = Databases(admin, stamp.replace("-", ""))
        rates: dict = {}
        soak_runs: dict[str, dict] = {}
        capacity_runs: dict[str, dict] = {}
        hosts_records: list[dict] = []
        t_all = time.perf_counter()
        for scen in SCENARIOS:
            if scen not in args.scenarios:
                continue
            if scen in ("enqueue", "drain"):
                rounds = Rounds(args.rounds)
                for rounds.round in range(args.rounds):
                    for a in adapters:
                        if scen == "enqueue":
                            scenario_enqueue(a, dbs, args, rounds)
                        else:  # a drain that timed out reported a partial rate: once is enough
                            scenario_drain(a, dbs, args, rounds, rounds.timed_out())
                for merged in rounds.merged():
                    rec.add(merged)
                    if merged["scenario"].startswith("drain_") and merged.get("rate"):
                        rates[(merged["system"], merged["processes"])] = merged["rate"]
                continue
            if scen == "hosts":
                a = next((a for a in adapters if a.name == "awa_fast"), None)
                if a is None:
                    log("hosts: awa_fast only; not among --systems")
                    continue
                assert net is not None and server is not None
                hosts_records = hosts.run(a, dbs, args, net, server, rec, log)
                continue
            for a in adapters:
                if scen == "pipeline":
                    if a.name == "awa_fast" and (a.name, args.processes) not in rates:
                        # the ratio needs the plain drain with the same process count
                        try:
                            r = drain(a, dbs, args, "noop", args.processes, "plain_for_pipeline")
                            rates[(a.name, args.processes)] = r["rate"]
                        except Exception as exc:
                            log(f"plain drain for the pipeline ratio failed: {exc!r}")
                    scenario_pipeline(a, dbs, args, rec, rates)
                elif scen == "failures":
                    if a.supports("failmix"):
                        scenario_failures(a, dbs, args, rec)
                elif scen == "latency":
                    scenario_latency(a, dbs, args, rec)
                elif scen == "soak":
                    scenario_soak(a, dbs, args, rec, out, soak_runs)
                elif scen == "capacity":
                    scenario_capacity(a, dbs, args, rec, capacity_runs)
        rec.close()
        print()
        print(HEAD)
        for r in rec.records:
            print(format_row(r))
        lines = ratios(
            [
                r
                for r in rec.records
                if r["scenario"] not in ("soak", "capacity_step", "pipeline_floor")
            ],
            [a.name for a in adapters],
        )
        if lines:
            print()
            print("\n".join(lines))
        burst = [
            r
            for r in rec.records
            if r["scenario"] not in SUSTAINED and not r["scenario"].startswith("hosts_")
        ]
        if burst:
            print()
            print("targets (the project's benchmark goals, docs/benchmarking.md):")
            print("\n".join(targets(burst, args.processes)))
        if soak_runs:
            print()
            print(
                f"soak targets (from issue 11; {args.rate:,.0f} jobs/s for {args.duration:.0f} s):"
            )
            for system, r in soak_runs.items():
                print("\n".join(soak.goal_lines(system, r["summary"])))
        if capacity_runs:
            print()
            print("\n".join(capacity_lines(capacity_runs, args)))
        if hosts_records:
            print()
            print("\n".join(hosts.summary_lines(hosts_records)))
        print(
            f"\nresults: {out} ({time.perf_counter() - t_main:.0f} s in all, "
            f"{time.perf_counter() - t_all:.0f} s of scenarios)"
        )
        if args.plot is not None:
            chart = Path(args.plot) if args.plot else out.with_suffix(".png")
            if burst:
                plot(burst, chart)
            if soak_runs:
                soak_chart = chart.with_name(chart.stem + "-soak.png") if burst else chart
                soak.plot(soak_runs, soak_chart, args.rate)
            if capacity_runs:
                capacity.plot(
                    capacity_runs,
                    chart.with_name(chart.stem + "-capacity.png"),
                    args.capacity_p99_ms,
                )
        return 0
    finally:
        if server is not None:
            server.stop()
