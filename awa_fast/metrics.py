"""Prometheus metrics of the worker runtime and their HTTP exposition (``prometheus_client``).

The metrics live in ``prometheus_client``'s process-global default registry: every runtime of a
process adds to the same series. Two ways to expose them (docs/adr/010-prometheus-exposition.md):

- the launcher (``awa-fast worker --metrics-port N``) gives its children a fresh
  ``PROMETHEUS_MULTIPROC_DIR`` and serves their aggregate on one port (:class:`LauncherExporter`);
- a library process serves its own with ``AsyncClient.start(metrics_port=N)`` (:func:`serve`).

Labels are kept low-cardinality: ``queue``, ``kind``, ``outcome``, ``cause``, ``state``.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    multiprocess,
    start_http_server,
)
from prometheus_client.mmap_dict import MmapedDict

from awa_fast.errors import ConfigError
from awa_fast.repo.maintenance import Rescued
from awa_fast.repo.stats import StatsRepo
from awa_fast.sql.dashboard import LIVE_STATES

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Set in a launcher's children (the launcher serves their metrics): "refresh" in child 0, the
# one that re-reads the database gauges for the machine, "1" in the others.
LAUNCHER_ENV = "AWA_FAST_LAUNCHER_METRICS"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_REFRESH_MS = 5000

# Seconds; claims and finalizes are milliseconds when healthy, seconds when the database is not.
_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

JOBS_FINALIZED = Counter(
    "awa_fast_jobs_finalized",
    "Attempts finalized by this process (applied, not stale), by "
    "outcome: completed, failed, retryable, cancelled, snoozed, waiting_external, or "
    "prompt_failure (the finalize failed and a failure was recorded instead).",
    ["queue", "kind", "outcome"],
)
CLAIM_SECONDS = Histogram(
    "awa_fast_claim_seconds",
    "Duration of one claim statement (seconds).",
    ["queue"],
    buckets=_LATENCY_BUCKETS,
)
FINALIZE_SECONDS = Histogram(
    "awa_fast_finalize_seconds",
    "From a handler's return to its attempt's finalize committing "
    "(seconds; includes the finalizer's group-commit wait).",
    ["queue"],
    buckets=_LATENCY_BUCKETS,
)
QUEUE_DEPTH = Gauge(
    "awa_fast_queue_depth",
    "Jobs per queue in each active state (available, scheduled, "
    "retryable, running, waiting_external, consequence_pending), read through the partial "
    "indexes every metrics refresh.",
    ["queue", "state"],
    multiprocess_mode="livemostrecent",
)
FOLLOW_UPS_INSERTED = Counter(
    "awa_fast_follow_ups_inserted", "Staged follow-ups inserted at their trigger's completion."
)
FOLLOW_UPS_SKIPPED = Counter(
    "awa_fast_follow_ups_skipped", "Staged follow-ups skipped as duplicates (unique key taken)."
)
FOLLOW_UPS_DISCARDED = Counter(
    "awa_fast_follow_ups_discarded",
    "Staged follow-ups dropped because their attempt did not "
    "complete (ADR-046), by the attempt's outcome.",
    ["outcome"],
)
WAIT_FOR_CALLBACK_DISCARDS = Counter(
    "awa_fast_staged_discarded_on_wait_for_callback",
    "Attempts that returned WaitForCallback "
    "with staged follow-ups, which were discarded (ADR-046).",
)
CONSEQUENCES_APPLIED = Counter(
    "awa_fast_consequences_applied", "Failure consequences applied by this process.", ["kind"]
)
CONSEQUENCES_OWED = Gauge(
    "awa_fast_consequences_owed",
    "Failure consequences owed (not yet applied).",
    multiprocess_mode="livemostrecent",
)
CONSEQUENCES_OVERDUE = Gauge(
    "awa_fast_consequences_overdue",
    "Owed consequences retried at least once or due for over a minute.",
    multiprocess_mode="livemostrecent",
)
RESCUES = Counter(
    "awa_fast_rescues",
    "Attempts rescued by this process's maintenance, by cause: heartbeat "
    "(stale), deadline (exceeded), callback (expired).",
    ["cause"],
)
MAINTENANCE_STUCK_ROWS = Gauge(
    "awa_fast_maintenance_stuck_rows",
    "Rows a maintenance loop's passes left unchanged (refused by a trigger, bad data) and retry "
    "apart every pass; 0 on a process that does not lead (ADR 009).",
    ["loop"],
    multiprocess_mode="livesum",
)
LOOP_STALLS = Counter(
    "awa_fast_event_loop_stalls",
    "Times this process's event loop was blocked for a second or more (a handler blocking it, "
    "a long GC pause, CPU starvation); heartbeats go on from the liveness thread meanwhile.",
)
LOOP_STALL_SECONDS = Counter(
    "awa_fast_event_loop_stall_seconds",
    "Seconds this process's event loop spent in stalls of a second or more.",
)
LEASES_EXPIRED = Counter(
    "awa_fast_leases_expired",
    "Attempts cancelled and given back because no heartbeat committed for the process's "
    "heartbeat staleness (database unreachable, process stopped).",
)
LEADER = Gauge(
    "awa_fast_maintenance_leader",
    "1 while this process holds the maintenance leadership.",
    multiprocess_mode="liveall",
)

_RESCUE_CAUSES = {
    "stale_heartbeat": "heartbeat",
    "deadline_exceeded": "deadline",
    "expired_callback": "callback",
}
# The label values the runtime counts with (awa_fast.worker.executor's outcome names), so that
# :func:`prepare` exports each series at 0 before its first count: a dashboard's rate() or an
# alert on a series that does not exist yet sees nothing rather than 0.
FINALIZE_OUTCOMES = (
    "completed",
    "failed",
    "retryable",
    "cancelled",
    "snoozed",
    "waiting_external",
    "prompt_failure",
)
# What discards an attempt's staged follow-ups: any outcome but completed, or a deadline.
DISCARD_OUTCOMES = ("failed", "retryable", "cancelled", "snoozed", "waiting_external", "abandoned")
_DEPTH_STATES = LIVE_STATES  # the states QueueDepth rows can have


# -- instrumentation calls (hot paths: one dict lookup and an add) ----------------------------

# Labelled children by label values: ``labels()`` takes a lock and builds a key on every call.
_finalized: dict[tuple[str, str, str], tuple[Any, Any]] = {}
_claims: dict[str, Any] = {}


def finalized(queue: str, kind: str, outcome: str, seconds: float | None = None) -> None:
    """Count one applied finalize; ``seconds`` from handler return to commit, when measured."""
    series = _finalized.get((queue, kind, outcome))
    if series is None:
        series = _finalized[(queue, kind, outcome)] = (
            JOBS_FINALIZED.labels(queue, kind, outcome),
            FINALIZE_SECONDS.labels(queue),
        )
    series[0].inc()
    if seconds is not None:
        series[1].observe(seconds)


def claimed(queue: str, seconds: float) -> None:
    """One claim statement of ``queue`` took ``seconds``."""
    series = _claims.get(queue)
    if series is None:
        series = _claims[queue] = CLAIM_SECONDS.labels(queue)
    series.observe(seconds)


def follow_ups(inserted: int, skipped: int = 0) -> None:
    if inserted:
        FOLLOW_UPS_INSERTED.inc(inserted)
    if skipped:
        FOLLOW_UPS_SKIPPED.inc(skipped)


def loop_stalled(seconds: float) -> None:
    """The event loop was blocked for ``seconds`` (called from the liveness thread)."""
    LOOP_STALLS.inc()
    LOOP_STALL_SECONDS.inc(seconds)


def leases_expired(n: int) -> None:
    LEASES_EXPIRED.inc(n)


def rescued(rows: list[Rescued]) -> None:
    """Count the jobs a rescue took (``repo.maintenance.Rescued``) by cause."""
    for row in rows:
        reason = row.rescue_reason
        RESCUES.labels(_RESCUE_CAUSES.get(reason, reason)).inc()


class LegacyCounters(Mapping):
    """Read-only view kept for ``awa_fast.worker.executor.metrics`` (ADR-046's process-global
    ``staged_discarded_on_wait_for_callback`` counter), now backed by the Prometheus counter."""

    _KEYS = {"staged_discarded_on_wait_for_callback": WAIT_FOR_CALLBACK_DISCARDS}

    def __getitem__(self, key: str) -> int:
        return int(self._KEYS[key]._value.get())

    def __iter__(self) -> Iterator[str]:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)


def prepare(
    queues: list[str],
    kinds_by_queue: Mapping[str, str],
    consequence_kinds: list[str],
    loops: list[str],
) -> None:
    """Create every series a runtime may count, at 0, before its first count (a counter that
    does not exist yet is absent from the scrape until then).

    Args:
        queues: the started queues (claim and finalize histograms, queue depth).
        kinds_by_queue: ``{kind: queue}`` of the registered handlers; a kind whose queue is
            started gets its finalized series per :data:`FINALIZE_OUTCOMES`.
        consequence_kinds: kinds with a failure consequence (``consequences_applied``).
        loops: the maintenance loops that report stuck rows (``maintenance_stuck_rows``).
    """
    started = set(queues)
    for cause in _RESCUE_CAUSES.values():
        RESCUES.labels(cause)
    for outcome in DISCARD_OUTCOMES:
        FOLLOW_UPS_DISCARDED.labels(outcome)
    for queue in queues:
        if queue not in _claims:
            _claims[queue] = CLAIM_SECONDS.labels(queue)
        FINALIZE_SECONDS.labels(queue)
        for state in _DEPTH_STATES:
            QUEUE_DEPTH.labels(queue, state)
    for kind, queue in kinds_by_queue.items():
        if queue in started:
            for outcome in FINALIZE_OUTCOMES:
                JOBS_FINALIZED.labels(queue, kind, outcome)
    for kind in consequence_kinds:
        CONSEQUENCES_APPLIED.labels(kind)
    for loop in loops:
        MAINTENANCE_STUCK_ROWS.labels(loop)


# -- gauges read from the database ------------------------------------------------------------


async def refresh(conn: Any, queues: list[str]) -> None:
    """Set the queue depth and consequence gauges from the dashboard's bounded statements
    (``sql.dashboard.QUEUE_DEPTH`` / ``CONSEQUENCE_COUNTS``: partial indexes, never the finished
    rows). Every state of ``queues`` and of the queues seen is set, so a drained state reads 0."""
    repo = StatsRepo(conn)
    depth = {(q, s): 0 for q in queues for s in _DEPTH_STATES}
    for row in await repo.queue_depth():
        for s in _DEPTH_STATES:
            depth.setdefault((row.queue, s), 0)
        depth[(row.queue, row.state)] = row.n
    for (queue, state), n in depth.items():
        QUEUE_DEPTH.labels(queue, state).set(n)
    counts = await repo.consequence_counts()
    CONSEQUENCES_OWED.set(counts.owed)
    CONSEQUENCES_OVERDUE.set(counts.overdue)


# -- exposition -------------------------------------------------------------------------------


def check_port(port: Any, field: str = "metrics_port") -> int:
    """``port`` as a TCP port (0 = an ephemeral one).

    Raises:
        ConfigError: not an int in 0..65535, naming ``field``.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(
            f"{field} must be an int in 0..65535 (0 = any free port), got {port!r}",
            field=field,
            limit="0..65535",
        )
    return port


def check_host(host: Any, field: str = "metrics_host") -> str:
    """Raises ConfigError: ``host`` is not a non-empty string (an address or name to bind)."""
    if not isinstance(host, str) or not host:
        raise ConfigError(
            f"{field} must be a non-empty string (an address to bind), got {host!r}", field=field
        )
    return host


# What a dead process's files hold that the collector sums across processes (the gauges are
# all live: mark_process_dead removes them).
_ACCUMULATED = ("counter", "histogram", "summary")


class SettledFilesCollector(multiprocess.MultiProcessCollector):
    """``prometheus_client``'s multiprocess collector, minus the ``.db`` files a process has
    created and not yet sized. Such a file is 0 bytes for a moment, and reading it raises, which
    fails the whole scrape with HTTP 500; a child killed in that moment leaves it for good, so
    every later scrape failed (prometheus/client_python issue 1199, open in 0.26). A file that
    vanishes meanwhile (a dead child's live gauges) is skipped too."""

    def __init__(self, registry: Any, path: str | None = None):
        self.directory = path or os.environ.get(MULTIPROC_ENV, "")
        self._lock = threading.Lock()  # a scrape never sees a fold half done
        super().__init__(registry, path)

    def collect(self) -> Any:
        with self._lock:
            files = []
            for name in glob.glob(os.path.join(self.directory, "*.db")):
                try:
                    if os.stat(name).st_size > 0:
                        files.append(name)
                except FileNotFoundError:
                    pass
            return self.merge(files, accumulate=True)

    def fold(self, pid: int) -> None:
        """Add the counters and histograms of process ``pid``, which has exited, to one archive
        file per type (``counter_archive.db``, ...) and remove its own files. A scrape merges
        every file in the directory, so without this each restart of a child left two files
        for good and every later scrape read them: 52 ms with none, about 2 s after 200
        restarts. The sums are unchanged (the collector adds these types file by file)."""
        with self._lock:
            for typ in _ACCUMULATED:
                path = os.path.join(self.directory, f"{typ}_{pid}.db")
                try:
                    sized = os.stat(path).st_size > 0
                except FileNotFoundError:
                    continue
                if sized:
                    archive = os.path.join(self.directory, f"{typ}_archive.db")
                    totals: dict[str, float] = {}
                    for source in [archive, path] if os.path.exists(archive) else [path]:
                        for key, value, _ts, _pos in MmapedDict.read_all_values_from_file(source):
                            totals[key] = totals.get(key, 0.0) + value
                    staged = archive + ".new"  # not *.db: never read half written
                    if os.path.exists(staged):
                        os.remove(staged)  # MmapedDict would keep what a failed fold wrote
                    out = MmapedDict(staged)
                    try:
                        for key, value in totals.items():
                            out.write_value(key, value, 0.0)
                    finally:
                        out.close()
                    os.replace(staged, archive)
                os.remove(path)


def _registry() -> Any:
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        SettledFilesCollector(registry)
        return registry
    return REGISTRY


class Exporter:
    """One HTTP endpoint serving ``/metrics`` in a daemon thread (``prometheus_client``'s
    server). ``port`` is the bound port (useful with 0)."""

    def __init__(
        self,
        port: int,
        host: str = DEFAULT_HOST,
        registry: Any = None,
        *,
        field: str = "metrics_port",
        host_field: str = "metrics_host",
    ):
        check_port(port, field)
        check_host(host, host_field)
        try:
            self._server, self._thread = start_http_server(
                port, addr=host, registry=registry if registry is not None else _registry()
            )
        except OSError as exc:
            raise ConfigError(
                f"{field}={port}: cannot listen on {host}:{port}: {exc}", field=field
            ) from None
        self.host = host
        self.port = self._server.server_port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class LauncherExporter(Exporter):
    """The launcher's endpoint: aggregates its children through a multiprocess directory made
    fresh for this run (``children_env`` carries it), removed by :meth:`close`."""

    def __init__(self, port: int, host: str = DEFAULT_HOST):
        self.directory = tempfile.mkdtemp(prefix="awa-fast-metrics-")
        registry = CollectorRegistry()
        self._collector = SettledFilesCollector(registry, path=self.directory)
        try:
            super().__init__(
                port, host, registry, field="--metrics-port", host_field="--metrics-host"
            )
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def children_env(self, *, refresh: bool) -> dict:
        """The environment of a child; ``refresh``: this child re-reads the database gauges."""
        return {MULTIPROC_ENV: self.directory, LAUNCHER_ENV: "refresh" if refresh else "1"}

    def child_exited(self, pid: int) -> None:
        """Drop the live gauges (leadership, depth) of a child that exited; its counters and
        histograms stay, folded into the run's archive files (:meth:`SettledFilesCollector.fold`)."""
        multiprocess.mark_process_dead(pid, self.directory)
        self._collector.fold(pid)

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.directory, ignore_errors=True)
