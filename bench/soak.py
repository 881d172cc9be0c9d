"""The ``soak`` scenario: a steady offered rate for a long time, sampled every few seconds.

A paced producer (``python -m bench.soak_producer``) inserts ``--rate`` no-op jobs per second
for ``--duration`` seconds in small batches on a fixed schedule (one batch per ``--tick-ms``,
holding the jobs that fell due since the last batch, with a few inserts in flight); a batch
issued after its tick is late, and the lateness is recorded. ``--processes`` worker processes
(``python -m bench.child``, workload ``soak``) run the jobs; every handler records its pickup
latency (handler start minus the wall-clock time the producer stamped into the job's args just
before the insert call, so it includes the insert's commit, like ``pickup_latency``).

Every ``--sample-every`` seconds the harness records: jobs produced and completed (completed =
produced - backlog, the backlog counted in the database by the adapter's live-state query, or
worker-side for systems without a cheap one), completion rate against the offered rate, pickup
latency p50/p95/p99 of the jobs picked in the window, the producer's lateness, dead and live
tuples, size (``pg_total_relation_size``), inserts/updates/deletes and autovacuum/autoanalyze
runs of every table of the system, WAL bytes written by the server (enumerated from ``pg_class`` at every sample, so partitions
created or dropped during the run show up), and CPU seconds of the worker processes, the
producer and the PostgreSQL server (``/proc``: the postmaster's live children plus the CPU of
its exited children), with workers + server per completed job (the producer's apart; plus a
connection pooler's when the workers go through one, bench/hosts.py).

The samples go next to the run's JSONL as ``<stem>-soak-<system>.csv`` (one row per window)
and ``.json`` (the same plus per-relation figures and the summary); ``--plot`` draws them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

# -- pickup latency, recorded in the worker processes -----------------------------------------------

# Log-spaced buckets, 2% wide: bucket b holds latencies in (STEP^(b-1), STEP^b] ms.
STEP = 1.02
_LOG_STEP = math.log(STEP)


class PickupRecorder:
    """Pickup latencies of one worker process, as a histogram per wall-clock second."""

    def __init__(self) -> None:
        self.by_second: dict[int, dict[int, int]] = {}

    def record(self, enqueued_at: float) -> None:
        now = time.time()
        ms = max((now - enqueued_at) * 1000.0, 0.001)
        b = math.ceil(math.log(ms) / _LOG_STEP)
        h = self.by_second.setdefault(int(now), {})
        h[b] = h.get(b, 0) + 1

    def take(self, before: int | None = None) -> list[tuple[int, dict[int, int]]]:
        """Remove and return the histograms of the seconds before ``before`` (all if None)."""
        secs = sorted(s for s in self.by_second if before is None or s < before)
        return [(s, self.by_second.pop(s)) for s in secs]


RECORDER = PickupRecorder()


def pickup(enqueued_at: float) -> None:
    """Called by a soak handler with the epoch time stamped into its job's args."""
    RECORDER.record(enqueued_at)


def bucket_ms(b: int) -> float:
    """The upper bound (ms) of latency bucket ``b``."""
    return STEP**b


def hist_percentile(hist: dict[int, int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a bucket histogram, as its bucket's upper bound (ms)."""
    total = sum(hist.values())
    if not total:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= rank:
            return bucket_ms(b)
    return bucket_ms(max(hist))


def merge(into: dict[int, int], hist: dict[int, int]) -> None:
    for b, n in hist.items():
        into[b] = into.get(b, 0) + n


# -- CPU from /proc ---------------------------------------------------------------------------------

_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: the fields start after the last ')'
    return text[text.rindex(")") + 2 :].split()


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (all its threads), None if unreadable."""
    f = _stat(pid)
    return None if f is None else (int(f[11]) + int(f[12])) / _TCK


def process_rss_bytes(pid: int) -> int | None:
    """Resident memory of ``pid`` in bytes (``/proc/<pid>/statm``), None if unreadable."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def postmaster_of(backend_pid: int) -> int | None:
    """The postmaster's pid: the parent of a backend, if it is readable here and a postgres."""
    f = _stat(backend_pid)
    if f is None:
        return None
    ppid = int(f[1])
    try:
        with open(f"/proc/{ppid}/comm") as fh:
            comm = fh.read().strip()
    except OSError:
        return None
    return ppid if comm.startswith(("postgres", "postmaster")) else None


def server_cpu_s(postmaster: int | None) -> float | None:
    """CPU seconds of the whole server: the postmaster's own and its exited children's (reaped,
    in cutime/cstime) plus every live child's (backends, autovacuum, WAL writer, checkpointer)."""
    if postmaster is None:
        return None
    f = _stat(postmaster)
    if f is None:
        return None
    total = sum(int(x) for x in f[11:15])
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        g = _stat(int(entry.name))
        if g is not None and int(g[1]) == postmaster:
            total += int(g[11]) + int(g[12])
    return total / _TCK


# -- database samples -------------------------------------------------------------------------------

RELATIONS_SQL = """
SELECT c.oid::regclass::text,
       COALESCE(pg_partition_root(c.oid), c.oid)::regclass::text,
       COALESCE(s.n_live_tup, 0), COALESCE(s.n_dead_tup, 0),
       COALESCE(s.n_tup_ins, 0), COALESCE(s.n_tup_upd, 0), COALESCE(s.n_tup_del, 0),
       COALESCE(s.autovacuum_count, 0), COALESCE(s.autoanalyze_count, 0),
       COALESCE(pg_total_relation_size(c.oid), 0)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relkind = 'r' AND n.nspname = %s AND c.relname LIKE %s
"""
REL_FIELDS = ("root", "live", "dead", "ins", "upd", "del", "autovacuum", "autoanalyze", "size")
COUNTERS = ("ins", "upd", "del", "autovacuum", "autoanalyze")


def relations(conn: psycopg.Connection, schema: str, pattern: str) -> dict[str, dict]:
    """Every table (partitions included) of ``schema`` whose name is LIKE ``pattern``."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    for attempt in range(3):
        try:
            rows = conn.execute(RELATIONS_SQL, (schema, pattern)).fetchall()
            break
        except psycopg.errors.UndefinedTable:  # a partition dropped under the query
            if attempt == 2:
                raise
    return {r[0]: dict(zip(REL_FIELDS, r[1:])) for r in rows}


# -- child processes --------------------------------------------------------------------------------


class Reader(threading.Thread):
    """Reads a child's stdout lines into ``handle(kind, payload)`` until EOF."""

    def __init__(self, stream, handle):
        super().__init__(daemon=True)
        self.stream, self.handle = stream, handle

    def run(self) -> None:
        for line in self.stream:
            kind, _, rest = line.rstrip("\n").partition(" ")
            try:
                self.handle(kind, rest)
            except Exception as exc:  # a malformed line must not kill the reader
                print(f"soak: bad child line {line!r}: {exc!r}", file=sys.stderr)


class SoakState:
    """What the children reported so far (updated by the reader threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hist_by_second: dict[int, dict[int, int]] = {}
        self.handled = 0
        self.produced = 0
        self.due = 0
        self.late_ms = 0.0  # max lateness since the last sample
        self.producer_done: dict | None = None
        self.worker_stats: list[dict] = []

    def on_worker(self, kind: str, rest: str) -> None:
        if kind == "SOAK":
            msg = json.loads(rest)
            hist = {int(b): n for b, n in msg["hist"].items()}
            with self.lock:
                merge(self.hist_by_second.setdefault(msg["sec"], {}), hist)
                self.handled += sum(hist.values())
        elif kind == "STATS":
            with self.lock:
                self.worker_stats.append(json.loads(rest))

    def on_producer(self, kind: str, rest: str) -> None:
        if kind == "P":
            msg = json.loads(rest)
            with self.lock:
                self.produced, self.due = msg["n"], msg["due"]
                self.late_ms = max(self.late_ms, msg["late_ms"])
        elif kind == "DONE":
            with self.lock:
                self.producer_done = json.loads(rest)

    def take_late(self) -> float:
        with self.lock:
            late, self.late_ms = self.late_ms, 0.0
            return late


def spawn_producer(system: str, dsn: str, args, repo: Path) -> subprocess.Popen:
    cfg = json.dumps(
        {
            "system": system,
            "dsn": dsn,
            "rate": args.rate,
            "duration": args.duration,
            "tick_ms": args.tick_ms,
            "lanes": args.producer_lanes,
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.soak_producer", cfg],
        cwd=str(repo),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    line = proc.stdout.readline()
    if line.strip() != "READY":
        raise RuntimeError(f"{system} producer exited before READY (status {proc.wait()})")
    return proc


# -- the scenario -----------------------------------------------------------------------------------


def worker_options(args) -> dict:
    """The awa-fast start() options the diagnosis flags set (empty: the engine's defaults)."""
    out = {}
    if args.prune_every is not None:
        out["cleanup_interval_ms"] = int(args.prune_every * 1000)
    if args.completed_retention is not None:
        out["completed_retention_hours"] = args.completed_retention / 3600
    return out


def _snapshot(state: SoakState, conn, adapter, postmaster, workers, producer, pooler=None) -> dict:
    with state.lock:
        produced, due, handled = state.produced, state.due, state.handled
        producer_done = state.producer_done is not None  # so `produced` is final
    backlog_sql = adapter.soak_backlog_sql()
    backlog = int(conn.execute(backlog_sql).fetchone()[0]) if backlog_sql else None
    schema, pattern = adapter.soak_relations
    wal = int(conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])
    return {
        "wal": wal,
        "at": time.time(),
        "produced": produced,
        "due": due,
        "handled": handled,
        "producer_done": producer_done,
        "backlog": backlog,
        "late_ms": state.take_late(),
        "relations": relations(conn, schema, pattern),
        "cpu_workers": _sum_cpu(ch.pid for ch in workers),
        "rss_workers": _sum_rss(ch.pid for ch in workers),
        "cpu_producer": process_cpu_s(producer.pid),
        "cpu_postgres": server_cpu_s(postmaster),
        "cpu_pooler": 0.0 if pooler is None else process_cpu_s(pooler),
    }


def _sum_cpu(pids) -> float | None:
    values = [process_cpu_s(p) for p in pids]
    return None if any(v is None for v in values) else sum(values)


def _sum_rss(pids) -> int | None:
    values = [process_rss_bytes(p) for p in pids]
    return None if any(v is None for v in values) else sum(values)


def run(adapter, dbs, args) -> dict:
    """One soak of ``adapter`` in a fresh database (dropped afterwards). Returns the windows
    (``samples``), the ``summary``, ``error`` (None, or why the run stopped early) and what the
    children reported."""
    name, dsn = dbs.fresh(adapter.name, "soak")
    try:
        return _run(adapter, dsn, args)
    finally:
        dbs.drop(name)


def _run(adapter, dsn, args, spawn=None, pooler: int | None = None) -> dict:
    """``spawn(options)``: starts the worker processes (default: ``--processes`` of them here,
    on ``dsn``); ``pooler``: the pid of a connection pooler between them and the server, whose
    CPU counts with theirs and the server's (bench/hosts.py)."""
    from bench.runner import REPO, _spawn_children, log, run_async

    setup = run_async(adapter.setup(dsn))
    state = SoakState()
    options = worker_options(args) if adapter.name == "awa_fast" else {}
    if spawn is None:
        workers = _spawn_children(
            adapter.name, dsn, "soak", args.processes, args.max_workers, options=options
        )
    else:
        workers = spawn(options)
    producer = None
    readers: list[Reader] = []
    snaps: list[dict] = []
    error = None
    t0 = 0.0
    try:
        producer = spawn_producer(adapter.name, dsn, args, REPO)
        readers = [Reader(ch.stdout, state.on_worker) for ch in workers]
        readers.append(Reader(producer.stdout, state.on_producer))
        for r in readers:
            r.start()
        conn = psycopg.connect(dsn, autocommit=True)
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        postmaster = postmaster_of(backend)
        for ch in workers:
            ch.stdin.write("GO\n")
            ch.stdin.flush()
        t0 = float(math.ceil(time.time()) + 1)
        producer.stdin.write(f"GO {t0}\n")
        producer.stdin.flush()
        end = t0 + args.duration
        for k, offset in enumerate(sample_offsets(args.sample_every, args.duration)):
            at = t0 + offset
            time.sleep(max(0.0, at - time.time()))
            snap = _snapshot(state, conn, adapter, postmaster, workers, producer, pooler)
            snap["k"], snap["offset"] = k, offset
            snaps.append(snap)
            if k:
                _progress(adapter.name, state, snaps, t0, log)
            if producer.poll() not in (None, 0):
                raise RuntimeError(f"the producer exited with status {producer.returncode}")
            if any(ch.poll() is not None for ch in workers):
                raise RuntimeError("a worker process exited during the soak")
            if at >= end:
                backlog = _backlog(snap)
                if snap["producer_done"] and backlog == 0:
                    break
                if at >= end + args.drain_timeout:
                    log(f"{adapter.name}: soak backlog {backlog} left after the drain timeout")
                    break
        conn.close()
    except Exception as exc:
        error = repr(exc)
        log(f"{adapter.name}: soak failed: {error}")
    finally:
        if producer is not None and producer.poll() is None:
            try:
                producer.stdin.write("STOP\n")
                producer.stdin.flush()
            except OSError:
                pass
        for ch in workers:
            try:
                ch.stdin.write("STOP\n")
                ch.stdin.flush()
            except OSError:
                pass
        for p in [*workers, *([producer] if producer else [])]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for r in readers:
            r.join(timeout=10)
    samples = windows(snaps, state, t0, args)
    summary = summarize(samples, args, state)
    return {
        "setup": setup,
        "samples": samples,
        "summary": summary,
        "error": error,
        "producer": state.producer_done,
        "worker_stats": state.worker_stats,
        "options": options,
    }


def sample_offsets(step: int, duration: float):
    """Seconds after t0 of the snapshots: every ``step``, plus one at the end of production (so
    no window straddles it), then every ``step`` again while the backlog drains."""
    k = 0
    while k * step < duration:
        yield float(k * step)
        k += 1
    yield float(duration)
    j = 1
    while True:
        yield duration + j * step
        j += 1


def _backlog(snap: dict) -> int:
    if snap["backlog"] is not None:
        return snap["backlog"]
    return snap["produced"] - snap["handled"]


def _progress(system: str, state: SoakState, snaps: list[dict], t0: float, log) -> None:
    a, b = snaps[-2], snaps[-1]
    dt = b["at"] - a["at"]
    p99 = "-"
    if len(snaps) > 2:  # the previous window's histograms are all in by now
        hist: dict[int, int] = {}
        with state.lock:
            for sec in range(int(t0 + snaps[-3]["offset"]), int(t0 + a["offset"])):
                merge(hist, state.hist_by_second.get(sec, {}))
        q = hist_percentile(hist, 0.99)
        p99 = "-" if q is None else f"{q:.0f} ms"
    done_a, done_b = a["produced"] - _backlog(a), b["produced"] - _backlog(b)
    rels = b["relations"]
    dead = max(rels.items(), key=lambda kv: kv[1]["dead"], default=(None, {"dead": 0}))
    size = sum(r["size"] for r in rels.values())
    log(
        f"{system}: soak t={b['at'] - t0:.0f}s produced {b['produced']:,} "
        f"({(b['produced'] - a['produced']) / dt:,.0f}/s, late max {b['late_ms']:.0f} ms) "
        f"completed {(done_b - done_a) / dt:,.0f}/s backlog {_backlog(b):,} p99 (previous "
        f"window) {p99} "
        f"most dead {dead[1]['dead']:,} ({dead[0]}) size {size / 2**20:,.1f} MB"
    )


# -- windows and summary ----------------------------------------------------------------------------


def windows(snaps: list[dict], state: SoakState, t0: float, args) -> list[dict]:
    """One sample per interval between consecutive snapshots."""
    out = []
    with state.lock:
        hists = dict(state.hist_by_second)
    for a, b in zip(snaps, snaps[1:]):
        dt = b["at"] - a["at"]
        lo, hi = int(t0 + a["offset"]), int(t0 + b["offset"])
        hist: dict[int, int] = {}
        for sec in range(lo, hi):
            merge(hist, hists.get(sec, {}))
        done_a, done_b = a["produced"] - _backlog(a), b["produced"] - _backlog(b)
        completed = done_b - done_a
        rels = {}
        for rel, r in b["relations"].items():
            prev = a["relations"].get(rel)
            rels[rel] = {
                "root": r["root"],
                "live": r["live"],
                "dead": r["dead"],
                "size": r["size"],
                **{c: r[c] - (prev[c] if prev else 0) for c in COUNTERS},
            }
        cpu = {}
        for key in ("cpu_workers", "cpu_producer", "cpu_postgres", "cpu_pooler"):
            delta = None if a[key] is None or b[key] is None else round(b[key] - a[key], 3)
            # A process reaped between two reads of one sample drops out of both the live sum
            # and its parent's reaped-children total: the window went negative. Not measured.
            cpu[key + "_s"] = None if delta is not None and delta < 0 else delta
        job_cpu = (
            None
            if cpu["cpu_workers_s"] is None
            or cpu["cpu_postgres_s"] is None
            or cpu["cpu_pooler_s"] is None
            or completed <= 0
            else (cpu["cpu_workers_s"] + cpu["cpu_postgres_s"] + cpu["cpu_pooler_s"])
            * 1000
            / completed
        )
        t_s = b["at"] - t0
        wal = b["wal"] - a["wal"]
        out.append(
            {
                "k": b["k"],
                "t_s": round(t_s, 3),
                "dt_s": round(dt, 3),
                "phase": "produce" if b["offset"] <= args.duration else "drain",
                "offered_rate": args.rate if b["offset"] <= args.duration else 0,
                "produced": b["produced"],
                "produced_rate": (b["produced"] - a["produced"]) / dt,
                "producer_deficit": max(0, b["due"] - b["produced"]),
                "producer_late_max_ms": b["late_ms"],
                "completed": done_b,
                "completion_rate": completed / dt,
                "backlog": _backlog(b),
                "backlog_source": "db" if b["backlog"] is not None else "worker",
                "picked": sum(hist.values()),
                "p50_ms": hist_percentile(hist, 0.50),
                "p95_ms": hist_percentile(hist, 0.95),
                "p99_ms": hist_percentile(hist, 0.99),
                "max_ms": bucket_ms(max(hist)) if hist else None,
                "dead_tuples": sum(r["dead"] for r in rels.values()),
                "live_tuples": sum(r["live"] for r in rels.values()),
                "size_bytes": sum(r["size"] for r in rels.values()),
                "autovacuum_runs": sum(r["autovacuum"] for r in rels.values()),
                "autoanalyze_runs": sum(r["autoanalyze"] for r in rels.values()),
                **cpu,
                "cpu_ms_per_job": job_cpu,
                "rss_workers_mb": None if b["rss_workers"] is None else b["rss_workers"] / 2**20,
                "wal_bytes": wal,
                "wal_bytes_per_job": wal / completed if completed > 0 else None,
                "relations": rels,
            }
        )
    hot = hot_relations(out)
    for w in out:
        w["hot_dead_tuples"] = sum(w["relations"][r]["dead"] for r in hot if r in w["relations"])
        w["hot_size_bytes"] = sum(w["relations"][r]["size"] for r in hot if r in w["relations"])
    return out


def hot_relations(samples: list[dict]) -> list[str]:
    """Tables that took updates or deletes during the run: where dead tuples come from (a table
    that only takes inserts and is dropped whole, like a finished-jobs slice, is not one)."""
    touched: dict[str, int] = {}
    for w in samples:
        for rel, r in w["relations"].items():
            touched[rel] = touched.get(rel, 0) + r["upd"] + r["del"]
    return sorted(rel for rel, n in touched.items() if n > 0)


def warmup_s(args) -> float:
    return args.warmup if args.warmup is not None else min(60.0, args.duration / 5)


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (x, y) points, None with fewer than 2."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return None if den == 0 else sum((x - mx) * (y - my) for x, y in points) / den


def _rate(ws: list[dict]) -> float | None:
    dt = sum(w["dt_s"] for w in ws)
    return sum(w["completion_rate"] * w["dt_s"] for w in ws) / dt if dt else None


# Goals from issue 11 (printed as MET / NOT MET; the run itself never fails on them).
P99_GOAL_MS = 50.0
THIRDS_GOAL = 0.97
HOT_DEAD_GOAL = 20_000
FLAT_GOAL = 1.2  # largest hot-path size, last third / first third of the steady windows


def summarize(samples: list[dict], args, state: SoakState) -> dict:
    warm = warmup_s(args)
    prod = [w for w in samples if w["phase"] == "produce"]
    steady = [w for w in prod if w["t_s"] - w["dt_s"] >= warm - 1e-6]
    # Thirds of the steady production (after warm-up): a slow start must not flatter the ratio.
    third = max(1, len(steady) // 3)
    first, last = _rate(steady[:third]), _rate(steady[-third:])
    offered_total = round(args.rate * args.duration)
    produced = samples[-1]["produced"] if samples else 0
    with state.lock:
        producer = state.producer_done or {}
    backlog_cap = max(2 * args.rate, args.processes * args.max_workers)
    backlog_max = max((w["backlog"] for w in steady), default=None)
    backlog_slope = _slope([(w["t_s"], w["backlog"]) for w in steady])
    on_schedule = (
        producer.get("produced", 0) >= 0.99 * offered_total
        and producer.get("behind_at_end_s", 1e9) <= 1.0
    )
    kept_up = bool(
        on_schedule
        and steady
        and backlog_max is not None
        and backlog_max <= backlog_cap
        and (backlog_slope or 0.0) <= 0.01 * args.rate
    )
    p99s = [w["p99_ms"] for w in steady if w["p99_ms"] is not None]
    hot = hot_relations(samples)
    max_dead: dict[str, int] = {}
    av_runs: dict[str, int] = {}
    for w in samples:
        for rel, r in w["relations"].items():
            max_dead[rel] = max(max_dead.get(rel, 0), r["dead"])
            av_runs[rel] = av_runs.get(rel, 0) + r["autovacuum"]
    size_slope = _slope([(w["t_s"] / 60, w["hot_size_bytes"]) for w in steady])
    total_slope = _slope([(w["t_s"] / 60, w["size_bytes"]) for w in steady])
    # The hot-path size is a saw-tooth (each vacuum truncates the table's empty tail), so two
    # single samples compare a tooth with a trough: compare the thirds' largest sizes instead.
    size_first = max((w["hot_size_bytes"] for w in steady[:third]), default=None)
    size_last = max((w["hot_size_bytes"] for w in steady[-third:]), default=None)
    growth = size_last / size_first if size_first and size_last is not None else None
    cpu_w = [w for w in steady if w["cpu_ms_per_job"] is not None]
    done = sum(w["completion_rate"] * w["dt_s"] for w in cpu_w)
    cpu_ms = (
        sum(
            (w["cpu_workers_s"] or 0) + (w["cpu_postgres_s"] or 0) + (w["cpu_pooler_s"] or 0)
            for w in cpu_w
        )
        * 1000
        / done
        if done > 0
        else None
    )
    # Worker memory over hours: the largest resident size of the thirds (both processes).
    rss_first = max((w["rss_workers_mb"] or 0 for w in steady[:third]), default=None)
    rss_last = max((w["rss_workers_mb"] or 0 for w in steady[-third:]), default=None)
    wal_done = sum(w["completion_rate"] * w["dt_s"] for w in steady)
    wal_per_job = sum(w["wal_bytes"] for w in steady) / wal_done if wal_done > 0 else None
    return {
        "offered_rate": args.rate,
        "duration_s": args.duration,
        "warmup_s": warm,
        "processes": args.processes,
        "offered_total": offered_total,
        "produced": produced,
        "completed": samples[-1]["completed"] if samples else 0,
        "backlog_at_end": samples[-1]["backlog"] if samples else None,
        "drained": bool(samples) and samples[-1]["backlog"] == 0,
        "producer": producer,
        "producer_on_schedule": on_schedule,
        "producer_late_max_ms": max((w["producer_late_max_ms"] for w in prod), default=None),
        "kept_up": kept_up,
        "backlog_max_after_warmup": backlog_max,
        "backlog_bound": backlog_cap,
        "backlog_slope_per_s": backlog_slope,
        "completion_rate_after_warmup": _rate(steady),
        "completion_rate_first_third": first,
        "completion_rate_last_third": last,
        "last_over_first_third": (last / first) if first and last is not None else None,
        "p99_ms_per_window_after_warmup": p99s,
        "p99_ms_max_after_warmup": max(p99s, default=None),
        "windows_p99_over_goal": sum(1 for p in p99s if p > P99_GOAL_MS),
        "p50_ms_median_after_warmup": _median([w["p50_ms"] for w in steady]),
        "hot_relations": hot,
        "hot_dead_tuples_max": max((w["hot_dead_tuples"] for w in samples), default=None),
        "hot_dead_tuples_max_after_warmup": max(
            (w["hot_dead_tuples"] for w in steady), default=None
        ),
        "dead_tuples_max_by_relation": {k: v for k, v in max_dead.items() if v},
        "autovacuum_runs_by_relation": {k: v for k, v in av_runs.items() if v},
        "hot_size_bytes_after_warmup": steady[0]["hot_size_bytes"] if steady else None,
        "hot_size_bytes_at_end": steady[-1]["hot_size_bytes"] if steady else None,
        "hot_size_max_first_third": size_first,
        "hot_size_max_last_third": size_last,
        "hot_size_growth_after_warmup": growth,
        "hot_size_slope_bytes_per_min": size_slope,
        "total_size_slope_bytes_per_min": total_slope,
        "cpu_ms_per_job_after_warmup": cpu_ms,
        "worker_rss_mb_max_first_third": rss_first,
        "worker_rss_mb_max_last_third": rss_last,
        "wal_bytes_per_job_after_warmup": wal_per_job,
    }


def _median(values: list) -> float | None:
    v = sorted(x for x in values if x is not None)
    return v[len(v) // 2] if v else None


def goal_lines(system: str, s: dict) -> list[str]:
    """The issue's soak targets for one system's summary."""

    def line(label, value, ok, goal):
        text = "n/a" if value is None else value
        status = "" if ok is None else ("MET" if ok else "NOT MET")
        return f"  {system:<14} {label:<44} {text:>14}  goal {goal:<14} {status}"

    p99 = s["p99_ms_max_after_warmup"]
    ratio = s["last_over_first_third"]
    dead = s["hot_dead_tuples_max_after_warmup"]
    growth = s["hot_size_growth_after_warmup"]
    return [
        line("kept up (backlog bounded)", "yes" if s["kept_up"] else "no", s["kept_up"], "yes"),
        line(
            "p99 pickup, worst window after warm-up (ms)",
            None if p99 is None else f"{p99:.1f}",
            None if p99 is None else p99 <= P99_GOAL_MS,
            f"<= {P99_GOAL_MS:.0f}",
        ),
        line(
            "completion rate last third / first third",
            None if ratio is None else f"{ratio:.3f}",
            None if ratio is None else ratio >= THIRDS_GOAL,
            f">= {THIRDS_GOAL}",
        ),
        line(
            "hot-path dead tuples, max after warm-up",
            None if dead is None else f"{dead:,}",
            None if dead is None else dead <= HOT_DEAD_GOAL,
            f"<= {HOT_DEAD_GOAL:,}",
        ),
        line(
            "hot-path size, max last / first third",
            None if growth is None else f"{growth:.2f}x",
            None if growth is None else growth <= FLAT_GOAL,
            f"<= {FLAT_GOAL}x",
        ),
    ]


def details(rec: dict) -> str:
    """The table's details cell of a soak record."""
    s = rec.get("summary") or {}
    parts = [f"kept up {'yes' if s.get('kept_up') else 'NO'}"]
    if s.get("p99_ms_max_after_warmup") is not None:
        parts.append(f"p99 max {s['p99_ms_max_after_warmup']:.1f} ms")
    if s.get("last_over_first_third") is not None:
        parts.append(f"last/first third {s['last_over_first_third']:.2f}")
    if s.get("hot_dead_tuples_max") is not None:
        parts.append(f"hot dead max {s['hot_dead_tuples_max']:,}")
    if s.get("hot_size_slope_bytes_per_min") is not None:
        parts.append(f"hot size {s['hot_size_slope_bytes_per_min'] / 2**20:+.2f} MB/min")
    if s.get("cpu_ms_per_job_after_warmup") is not None:
        parts.append(f"{s['cpu_ms_per_job_after_warmup']:.3f} ms CPU/job")
    if s.get("worker_rss_mb_max_first_third") and s.get("worker_rss_mb_max_last_third"):
        parts.append(
            f"worker RSS {s['worker_rss_mb_max_first_third']:,.0f} -> "
            f"{s['worker_rss_mb_max_last_third']:,.0f} MB"
        )
    if s.get("wal_bytes_per_job_after_warmup") is not None:
        parts.append(f"WAL {s['wal_bytes_per_job_after_warmup']:,.0f} B/job")
    if rec.get("samples_csv"):
        parts.append(f"samples {Path(rec['samples_csv']).name}")
    return "; ".join(parts)


# -- files ------------------------------------------------------------------------------------------

CSV_FIELDS = (
    "k",
    "t_s",
    "dt_s",
    "phase",
    "offered_rate",
    "produced",
    "produced_rate",
    "producer_deficit",
    "producer_late_max_ms",
    "completed",
    "completion_rate",
    "backlog",
    "backlog_source",
    "picked",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "max_ms",
    "hot_dead_tuples",
    "hot_size_bytes",
    "dead_tuples",
    "live_tuples",
    "size_bytes",
    "autovacuum_runs",
    "autoanalyze_runs",
    "cpu_workers_s",
    "cpu_producer_s",
    "cpu_postgres_s",
    "cpu_pooler_s",
    "cpu_ms_per_job",
    "rss_workers_mb",
    "wal_bytes",
    "wal_bytes_per_job",
)


def write_files(stem: Path, system: str, result: dict, env: dict) -> tuple[Path, Path]:
    """``<stem>-soak-<system>.csv`` (one row per window) and ``.json`` (everything)."""
    import csv

    base = stem.with_name(f"{stem.name}-soak-{system}")
    csv_path = base.parent / (base.name + ".csv")
    json_path = base.parent / (base.name + ".json")
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_FIELDS)
        for s in result["samples"]:
            w.writerow(["" if s[f] is None else s[f] for f in CSV_FIELDS])
    with open(json_path, "w") as fh:
        json.dump({"system": system, "env": env, **result}, fh, indent=1, default=str)
    return csv_path, json_path


# -- plot -------------------------------------------------------------------------------------------


def plot(runs: dict[str, dict], path: Path, rate: float) -> None:
    """One PNG of every system's soak over time: completion rate vs offered, backlog, p99 pickup,
    dead tuples and size per table (partitions summed under their root), CPU per job."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib: pip install -e '.[bench]'", file=sys.stderr)
        return
    fig, grid = plt.subplots(3, 2, figsize=(17, 13), sharex=True)
    axes = grid.flatten()
    ax_rate, ax_backlog, ax_p99, ax_dead, ax_size, ax_cpu = axes
    styles = ["-", "--", ":", "-."]
    last_t, summary = 0.0, {}
    top = {"backlog": 1.0, "dead": 1.0}  # symlog axes: leave room above the highest point
    for i, (system, run_) in enumerate(runs.items()):
        samples = run_["samples"]
        if not samples:
            continue
        color = f"C{i}"
        t = [w["t_s"] for w in samples]
        kw = {"color": color, "marker": ".", "ms": 4, "label": system}
        ax_rate.plot(t, [w["completion_rate"] for w in samples], **kw)
        ax_backlog.plot(t, [max(w["backlog"], 0) for w in samples], **kw)
        ax_p99.plot(t, [w["p99_ms"] for w in samples], **kw)
        # Produce windows only: a drain window's few jobs carry the whole process's idle CPU
        # (180 ms per job in one run), which flattened every system's curve.
        ax_cpu.plot(
            t, [w["cpu_ms_per_job"] if w["phase"] == "produce" else None for w in samples], **kw
        )
        roots = _by_root(samples)
        top["backlog"] = max(top["backlog"], *(w["backlog"] for w in samples))
        top["dead"] = max(top["dead"], *(max(r["dead"]) for r in roots.values()))
        top_dead = [
            r for r in sorted(roots, key=lambda r: -max(roots[r]["dead"])) if max(roots[r]["dead"])
        ][:4]
        top_size = sorted(roots, key=lambda r: -max(roots[r]["size"]))[:4]
        for j, root in enumerate(top_dead):
            ax_dead.plot(
                t, roots[root]["dead"], color=color, ls=styles[j], label=f"{system}: {root}"
            )
            runs = [(x, y) for x, y, n in zip(t, roots[root]["dead"], roots[root]["av"]) if n]
            if runs:  # a window in which autovacuum processed this table
                ax_dead.plot(*zip(*runs), "v", color=color, ms=6)
        for j, root in enumerate(top_size):
            ax_size.plot(
                t,
                [v / 2**20 for v in roots[root]["size"]],
                color=color,
                ls=styles[j],
                label=f"{system}: {root}",
            )
        last_t = max(last_t, samples[-1]["t_s"])
        summary = run_["summary"]
    for ax in axes:
        if summary.get("warmup_s"):
            ax.axvline(summary["warmup_s"], color="grey", lw=0.8, ls=":")
        if last_t > summary["duration_s"]:
            ax.axvspan(summary["duration_s"], last_t, color="grey", alpha=0.08)
    ax_rate.axhline(rate, color="black", ls="--", lw=1, label="offered")
    ax_rate.set_ylabel("completed jobs/s")
    ax_rate.set_title("completion rate vs offered (per window)")
    ax_backlog.set_ylabel("jobs")
    ax_backlog.set_yscale("symlog", linthresh=100)
    ax_backlog.set_ylim(0, top["backlog"] * 2)
    ax_backlog.set_title("backlog (produced, not finished)")
    ax_p99.axhline(P99_GOAL_MS, color="black", ls="--", lw=1, label=f"{P99_GOAL_MS:.0f} ms goal")
    ax_p99.set_yscale("log")
    ax_p99.set_ylabel("ms")
    ax_p99.set_title("pickup latency p99 (enqueue -> handler start)")
    ax_dead.set_ylabel("dead tuples")
    ax_dead.set_yscale("symlog", linthresh=100)
    ax_dead.set_ylim(0, top["dead"] * 2)
    ax_dead.set_title(
        "dead tuples per table (partitions summed under their root; top 4; v = autovacuum ran)"
    )
    ax_size.set_ylabel("MB")
    ax_size.set_title("size per table incl. indexes and TOAST (top 4)")
    ax_cpu.set_ylabel("ms (log)")
    ax_cpu.set_yscale("log")
    ax_cpu.set_title("CPU per completed job (workers + PostgreSQL), produce windows")
    for ax in grid[-1]:
        ax.set_xlabel("s since the producer started (dotted: end of warm-up; shaded: drain)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"soak chart: {path}")


def _by_root(samples: list[dict]) -> dict[str, dict[str, list]]:
    roots: dict[str, dict[str, list]] = {}
    names = sorted({r["root"] for w in samples for r in w["relations"].values()})
    for root in names:
        roots[root] = {"dead": [], "size": [], "av": []}
    for w in samples:
        for root in names:
            rs = [r for r in w["relations"].values() if r["root"] == root]
            roots[root]["dead"].append(sum(r["dead"] for r in rs))
            roots[root]["size"].append(sum(r["size"] for r in rs))
            roots[root]["av"].append(sum(r["autovacuum"] for r in rs))
    return roots
