"""The ``hosts`` scenario: awa-fast's workers on 1, 2 and 4 "hosts" (``--hosts-counts``), each a
network namespace with a link of its own to the server in the root namespace (bench/netns.py),
one worker process per host (``--max-workers`` slots), connected directly or through PgBouncer
in transaction mode (bench/pgbouncer.py, on the server's side of the links, connecting to the
server over its unix socket, ``default_pool_size`` ``--hosts-pool-size``).

For each mode and host count, in a fresh database each:

* ``hosts_drain``: ``--jobs`` no-op jobs seeded, the workers started at once, timed until every
  job is finalized (counted in the database); CPU seconds of the workers, the server (the
  postmaster and its children, bench/soak.py) and PgBouncer over the drain, per job.
* ``hosts_soak``: bench/soak.py's paced producer (in the root namespace, direct) offers
  ``--hosts-rate`` jobs/s for ``--hosts-soak-s`` seconds (120 by default; fewer for a short
  run); CPU per job after the warm-up (workers + server + PgBouncer), p99 pickup.

During both, ``pg_stat_activity`` is sampled every 0.25 s: the peak of the server connections of
the run's database by origin (each host's address; PgBouncer's own over the unix socket; the
producer and the harness on 127.0.0.1). The summary gives, per host count, the pooler's CPU
per job as a ratio to direct (issue 31's goal: at most 1.25x) and the server connections per
host (through PgBouncer: its peak shared by the hosts).
"""

from __future__ import annotations

import copy
import threading

import psycopg
from psycopg.conninfo import make_conninfo

from bench import netns, pgbouncer, soak

MODES = ("direct", "pgbouncer")
CPU_GOAL = 1.25  # the pooler's CPU per job over direct's (issue 31)
SAMPLE_S = 0.25


class ConnectionSampler(threading.Thread):
    """Peaks of the server connections of database ``dbname`` by origin, sampled every
    ``SAMPLE_S`` until :meth:`stop`: ``peaks[origin]`` and ``peak_total`` (every origin but the
    harness's own). Origins: a host's name (``host0`` ...) by its address in ``addresses``,
    ``pgbouncer`` (the unix socket: only PgBouncer uses it), ``local`` (127.0.0.1)."""

    def __init__(self, admin_dsn: str, dbname: str, addresses: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.admin_dsn, self.dbname, self.addresses = admin_dsn, dbname, addresses
        self.peaks: dict[str, int] = {}
        self.peak_total = 0
        self._stop_event = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
                while not self._stop_event.is_set():
                    rows = conn.execute(
                        "SELECT host(client_addr), count(*) FROM pg_stat_activity "
                        "WHERE datname = %s AND backend_type = 'client backend' "
                        "AND pid <> pg_backend_pid() GROUP BY 1",
                        (self.dbname,),
                    ).fetchall()
                    counts: dict[str, int] = {}
                    for addr, n in rows:
                        origin = "pgbouncer" if addr is None else self.addresses.get(addr, "local")
                        counts[origin] = counts.get(origin, 0) + n
                    for origin, n in counts.items():
                        self.peaks[origin] = max(self.peaks.get(origin, 0), n)
                    total = sum(n for o, n in counts.items() if o != "local")
                    self.peak_total = max(self.peak_total, total)
                    self._stop_event.wait(SAMPLE_S)
        except Exception as exc:  # reported with the record, never silently
            self.error = repr(exc)

    def stop(self) -> dict:
        self._stop_event.set()
        if self.ident is not None:  # started
            self.join(timeout=10)
        return {
            "peak_by_origin": dict(sorted(self.peaks.items())),
            "peak_total": self.peak_total,
            **({"sampler_error": self.error} if self.error else {}),
        }


class Deployment:
    """The worker processes of one mode and host count: their URLs, environment, and the
    namespaces they run in."""

    def __init__(self, mode: str, hosts: list[netns.Host], bouncer=None) -> None:
        self.mode, self.hosts, self.bouncer = mode, hosts, bouncer
        self.env = {"AWA_FAST_POOLER": "transaction"} if bouncer is not None else {}
        self.addresses = {h.ip: f"host{h.index}" for h in hosts}

    def urls(self, dsn: str) -> list[str]:
        if self.bouncer is None:
            return [make_conninfo(dsn, host=h.server_ip) for h in self.hosts]
        return [self.bouncer.url(dsn, h.server_ip) for h in self.hosts]

    def wrap(self, i: int, argv: list[str]) -> list[str]:
        return self.hosts[i].argv(argv)

    def spawn(self, dsn: str, workload: str, max_workers: int, options: dict | None = None):
        from bench.runner import _spawn_children

        return _spawn_children(
            "awa_fast",
            self.urls(dsn),
            workload,
            len(self.hosts),
            max_workers,
            options,
            wrap=self.wrap,
            env=self.env,
        )

    @property
    def pooler_pid(self) -> int | None:
        return None if self.bouncer is None else self.bouncer.pid

    def describe(self, max_workers: int) -> str:
        how = "direct" if self.bouncer is None else "PgBouncer transaction"
        return f"{len(self.hosts)} host(s) x 1 process x {max_workers} slots, {how}"


def _cpu(workers, postmaster: int | None, pooler: int | None) -> dict[str, float | None]:
    return {
        "workers": soak._sum_cpu(ch.pid for ch in workers),
        "server": soak.server_cpu_s(postmaster),
        "pooler": 0.0 if pooler is None else soak.process_cpu_s(pooler),
    }


def drain(adapter, dbs, args, dep: Deployment, label: str) -> dict:
    """``args.jobs`` no-op jobs drained by the deployment's workers: rate, CPU per job, peak
    server connections."""
    from bench.runner import _stop_children, run_async, wait_finalized

    name, dsn = dbs.fresh(adapter.name, label)
    try:
        run_async(adapter.setup(dsn))
        target = run_async(adapter.seed(dsn, "noop", args.jobs))
        query = adapter.count_query("noop")
        children = dep.spawn(dsn, "noop", args.max_workers)
        sampler = ConnectionSampler(dbs.admin, name, dep.addresses)
        try:
            mon = psycopg.connect(dsn, autocommit=True)
            postmaster = soak.postmaster_of(mon.execute("SELECT pg_backend_pid()").fetchone()[0])
            sampler.start()
            cpu0 = _cpu(children, postmaster, dep.pooler_pid)
            for ch in children:
                ch.stdin.write("GO\n")
                ch.stdin.flush()
            done, elapsed, timed_out, _ = wait_finalized(
                mon, query, args.jobs, target, args.timeout, f"hosts: {label}"
            )
            cpu1 = _cpu(children, postmaster, dep.pooler_pid)
            mon.close()
        finally:
            stats = _stop_children(children)
            connections = sampler.stop()
        cpu = {k: None if cpu0[k] is None or cpu1[k] is None else cpu1[k] - cpu0[k] for k in cpu0}
        measured = all(v is not None for v in cpu.values()) and done > 0
        return {
            "n": target,
            "target": target,
            "finalized": done,
            "timed_out": timed_out,
            "rate": done / elapsed,
            "elapsed_s": elapsed,
            "cpu_s": cpu,
            "cpu_ms_per_job": (
                sum(v for v in cpu.values() if v is not None) * 1000 / done if measured else None
            ),
            "connections": connections,
            "child_stats": stats,
        }
    finally:
        dbs.drop(name)


def soak_run(adapter, dbs, args, dep: Deployment, label: str) -> dict:
    """bench/soak.py's soak with the deployment's workers; its summary and peak connections."""
    name, dsn = dbs.fresh(adapter.name, label)
    sampler = ConnectionSampler(dbs.admin, name, dep.addresses)
    try:
        soak_args = copy.copy(args)
        soak_args.rate = args.hosts_rate
        soak_args.duration = args.hosts_soak_s
        soak_args.processes = len(dep.hosts)
        soak_args.sample_every = max(1, min(5, int(args.hosts_soak_s // 4)))
        soak_args.warmup = None
        sampler.start()
        r = soak._run(
            adapter,
            dsn,
            soak_args,
            spawn=lambda options: dep.spawn(dsn, "soak", args.max_workers, options),
            pooler=dep.pooler_pid,
        )
    finally:
        connections = sampler.stop()
        dbs.drop(name)
    s = r["summary"]
    return {
        "n": s["completed"],
        "rate": s["completion_rate_after_warmup"],
        "cpu_ms_per_job": s["cpu_ms_per_job_after_warmup"],
        "p99_ms_max": s["p99_ms_max_after_warmup"],
        "kept_up": s["kept_up"],
        "connections": connections,
        **({"error": r["error"]} if r["error"] else {}),
    }


def run(adapter, dbs, args, net: netns.Hosts, server, rec, log) -> list[dict]:
    """Every mode and host count: one ``hosts_drain`` and one ``hosts_soak`` record each (added
    to ``rec``); returns them."""
    out = []
    for mode in MODES:
        for count in args.hosts_counts:
            hosts = net.hosts[:count]
            bouncer_cm = (
                pgbouncer.running(
                    server.socket_dsn,
                    "transaction",
                    listen=[h.server_ip for h in hosts],
                    default_pool_size=args.hosts_pool_size,
                )
                if mode == "pgbouncer"
                else None
            )
            base = {"system": "awa_fast", "version": adapter.version, "mode": mode, "hosts": count}
            try:
                bouncer = bouncer_cm.__enter__() if bouncer_cm is not None else None
            except Exception as exc:
                for scenario in ("hosts_drain", "hosts_soak"):
                    rec.add({**base, "scenario": scenario, "rate": None, "error": repr(exc)})
                continue
            try:
                dep = Deployment(mode, hosts, bouncer)
                method = dep.describe(args.max_workers)
                for scenario, fn in (("hosts_drain", drain), ("hosts_soak", soak_run)):
                    label = f"{scenario}_{mode}_{count}"
                    log(f"hosts: {scenario} {method}")
                    try:
                        r = {
                            **base,
                            "scenario": scenario,
                            "method": method,
                            **fn(adapter, dbs, args, dep, label),
                        }
                    except Exception as exc:
                        r = {**base, "scenario": scenario, "method": method, "rate": None,
                             "error": repr(exc)}  # fmt: skip
                    rec.add(r)
                    out.append(r)
            finally:
                if bouncer_cm is not None:
                    bouncer_cm.__exit__(None, None, None)
    return out


def details(rec: dict) -> str:
    """The table's details cell of a hosts record."""
    parts = []
    cpu = rec.get("cpu_ms_per_job")
    parts.append(f"CPU/job {'n/a' if cpu is None else f'{cpu:.3f} ms'}")
    if rec.get("scenario") == "hosts_soak":
        p99 = rec.get("p99_ms_max")
        parts.append(f"p99 worst {'n/a' if p99 is None else f'{p99:.1f} ms'}")
        parts.append(f"kept up {'yes' if rec.get('kept_up') else 'NO'}")
    conns = rec.get("connections") or {}
    if conns:
        by = ", ".join(f"{k} {v}" for k, v in conns.get("peak_by_origin", {}).items())
        parts.append(f"server conns peak {conns.get('peak_total')} ({by})")
    if rec.get("timed_out"):
        parts.append(f"TIMEOUT ({rec['finalized']} of {rec['target']})")
    return "; ".join(parts)


def summary_lines(records: list[dict]) -> list[str]:
    """Per host count and phase: the pooler's CPU per job over direct's (goal <= 1.25x), and
    the peak server connections per host in each mode."""
    idx = {(r["scenario"], r["mode"], r["hosts"]): r for r in records}
    out = ["hosts (the pooler's CPU per job over direct's; server connections per host, peak):"]
    for scenario in ("hosts_drain", "hosts_soak"):
        for count in sorted({r["hosts"] for r in records}):
            direct = idx.get((scenario, "direct", count)) or {}
            pooled = idx.get((scenario, "pgbouncer", count)) or {}
            a, b = direct.get("cpu_ms_per_job"), pooled.get("cpu_ms_per_job")
            ratio = b / a if a and b else None
            verdict = "" if ratio is None else ("MET" if ratio <= CPU_GOAL else "NOT MET")
            per_host_direct = _per_host(direct, count)
            per_host_pooled = _per_host(pooled, count)
            out.append(
                f"  {scenario:<12} {count} host(s)  CPU/job direct "
                f"{'n/a' if a is None else f'{a:.3f} ms'}, PgBouncer "
                f"{'n/a' if b is None else f'{b:.3f} ms'}, ratio "
                f"{'n/a' if ratio is None else f'{ratio:.2f}x'} (goal <= {CPU_GOAL:.2f}x) {verdict}"
                f"; server connections per host: direct {per_host_direct}, "
                f"PgBouncer {per_host_pooled}"
            )
    return out


def _per_host(rec: dict, count: int) -> str:
    conns = (rec.get("connections") or {}).get("peak_by_origin") or {}
    if not conns:
        return "n/a"
    if "pgbouncer" in conns:  # the pooler's server connections, shared by the hosts
        return f"{conns['pgbouncer'] / count:.1f} ({conns['pgbouncer']} shared)"
    hosts = [conns.get(f"host{i}", 0) for i in range(count)]
    return "/".join(str(n) for n in hosts)
