"""The built-in demo behind ``awa-fast demo``: enqueue N jobs, work them, report throughput.

Steps: migrate; delete the previous rows of queue ``demo`` (and resume it, in case a previous
run left it paused); enqueue N :class:`DemoJob` jobs in one COPY (``insert_many_copy``); start
workers; poll the database until all N are terminal (bounded by ``timeout``), printing a progress
line to stderr every second; stop the workers and print a summary.

With ``processes == 1`` the runtime runs in this process (``AsyncClient.start``). With more, this
process only enqueues and watches, and ``processes`` child processes (``spawn``) each run a
runtime on queue ``demo``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import sys
import time
from typing import Any

DEMO_QUEUE = "demo"
WORKERS_PER_PROCESS = 256
POLL_INTERVAL_S = 0.05
PROGRESS_INTERVAL_S = 1.0

_COUNT_SQL = """
SELECT count(*) FILTER (WHERE state = 'completed'),
       count(*) FILTER (WHERE state IN ('failed', 'consequence_pending')),
       count(*) FILTER (WHERE state = 'cancelled')
FROM awa_fast.jobs WHERE queue = %s"""


@dataclasses.dataclass
class DemoJob:
    """Args of the demo's job kind (``demo_job``)."""

    n: int


async def handle_demo(job: Any) -> None:
    """The demo handler: a trivial computation on the job's number."""
    n = job.args.n
    _ = (n * 2654435761) & 0xFFFFFFFF


def make_client(database_url: str, max_connections: int = 10):
    """An AsyncClient with the demo handler registered on queue ``demo``."""
    from awa_fast import NO_FAILURE_CONSEQUENCE, AsyncClient

    client = AsyncClient(database_url, max_connections=max_connections)
    client.task(DemoJob, queue=DEMO_QUEUE, failure_consequence=NO_FAILURE_CONSEQUENCE)(handle_demo)
    return client


@dataclasses.dataclass
class DemoResult:
    """What a demo run measured (seconds, jobs per second)."""

    jobs: int
    processes: int
    completed: int
    failed: int
    cancelled: int
    enqueue_seconds: float
    enqueue_rate: float
    process_seconds: float
    jobs_per_second: float
    wall_seconds: float
    timed_out: bool


# ---------------------------------------------------------------------------------------------
# worker processes (processes > 1)


def _child_main(database_url: str, stop: Any) -> None:
    """Entry point of a worker child: run a runtime on queue ``demo`` until ``stop`` is set."""
    try:
        _run_loop(_child(database_url, stop))
    except KeyboardInterrupt:
        pass


async def _child(database_url: str, stop: Any) -> None:
    client = make_client(database_url)
    try:
        await client.start([(DEMO_QUEUE, WORKERS_PER_PROCESS)])
        while not stop.is_set():
            await asyncio.sleep(POLL_INTERVAL_S)
    finally:
        await client.close()


# ---------------------------------------------------------------------------------------------
# the run


def _log(message: str) -> None:
    print(f"demo: {message}", file=sys.stderr, flush=True)


async def _counts(client) -> tuple[int, int, int]:
    rows = await client._fetch(_COUNT_SQL, (DEMO_QUEUE,))
    return tuple(rows[0])  # type: ignore[return-value]


async def _demo(database_url: str, jobs: int, processes: int, timeout: float) -> DemoResult:
    t_wall = time.perf_counter()
    from awa_fast.errors import AwaError

    client = make_client(database_url)
    children: list = []
    stop = None
    try:
        await client.migrate()
        await client._fetch("DELETE FROM awa_fast.jobs WHERE queue = %s", (DEMO_QUEUE,))
        await client.resume_queue(DEMO_QUEUE)

        t0 = time.perf_counter()
        await client.insert_many_copy([DemoJob(i) for i in range(jobs)], queue=DEMO_QUEUE)
        enqueue_s = time.perf_counter() - t0
        _log(f"enqueued {jobs} jobs in {enqueue_s:.3f} s ({jobs / enqueue_s:,.0f} jobs/s)")

        t_start = time.perf_counter()
        if processes == 1:
            await client.start([(DEMO_QUEUE, WORKERS_PER_PROCESS)])
        else:
            ctx = multiprocessing.get_context("spawn")
            stop = ctx.Event()
            for _ in range(processes):
                proc = ctx.Process(target=_child_main, args=(database_url, stop),
                                   name="awa-fast-demo-worker", daemon=True)
                proc.start()
                children.append(proc)
            _log(f"started {processes} worker processes")

        deadline = t_start + timeout
        next_progress = time.perf_counter() + PROGRESS_INTERVAL_S
        completed = failed = cancelled = 0
        timed_out = False
        while True:
            completed, failed, cancelled = await _counts(client)
            now = time.perf_counter()
            if completed + failed + cancelled >= jobs:
                break
            if now >= deadline:
                timed_out = True
                break
            dead = [p for p in children if not p.is_alive()]
            if dead:
                raise AwaError(f"demo worker process {dead[0].pid} exited with code "
                                   f"{dead[0].exitcode}")
            if now >= next_progress:
                elapsed = now - t_start
                _log(f"{completed}/{jobs} completed, {failed} failed "
                     f"({completed / elapsed:,.0f} jobs/s)")
                next_progress += PROGRESS_INTERVAL_S
            await asyncio.sleep(POLL_INTERVAL_S)
        process_s = time.perf_counter() - t_start
    finally:
        if stop is not None:
            stop.set()
        await client.close()
        for proc in children:
            await asyncio.to_thread(proc.join, 10)
            if proc.is_alive():
                proc.terminate()
                await asyncio.to_thread(proc.join, 5)
    wall_s = time.perf_counter() - t_wall
    return DemoResult(
        jobs=jobs, processes=processes, completed=completed, failed=failed, cancelled=cancelled,
        enqueue_seconds=enqueue_s, enqueue_rate=jobs / enqueue_s if enqueue_s else 0.0,
        process_seconds=process_s, jobs_per_second=completed / process_s if process_s else 0.0,
        wall_seconds=wall_s, timed_out=timed_out,
    )


def _run_loop(coro) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        return asyncio.run(coro)
    return uvloop.run(coro)


def format_summary(r: DemoResult) -> str:
    """The human-readable summary printed by ``awa-fast demo``."""
    lines = [
        ("jobs enqueued", f"{r.jobs}"),
        ("completed", f"{r.completed}"),
        ("failed", f"{r.failed}"),
        ("enqueue rate", f"{r.enqueue_rate:,.0f} jobs/s ({r.enqueue_seconds:.3f} s, COPY)"),
        ("processing time", f"{r.process_seconds:.3f} s ({r.processes} process"
                            f"{'es' if r.processes > 1 else ''}, {WORKERS_PER_PROCESS} workers each)"),
        ("throughput", f"{r.jobs_per_second:,.0f} jobs/s"),
        ("wall time", f"{r.wall_seconds:.3f} s"),
    ]
    if r.cancelled:
        lines.insert(3, ("cancelled", f"{r.cancelled}"))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in lines)


def run_demo(database_url: str, jobs: int = 5000, processes: int = 1, *, timeout: float = 300.0,
             json_output: bool = False) -> int:
    """Run the demo against ``database_url``; print the summary to stdout (JSON if
    ``json_output``). Returns the exit status: 0 when every job completed, else 1.

    Raises:
        ValueError: ``jobs`` or ``processes`` is below 1.
        AwaError, psycopg.Error: the database failed (the CLI reports these).
    """
    if jobs < 1 or processes < 1:
        raise ValueError("jobs and processes must be >= 1")
    result = _run_loop(_demo(database_url, jobs, processes, timeout))
    if json_output:
        print(json.dumps(dataclasses.asdict(result), indent=2))
    else:
        print(format_summary(result))
    if result.timed_out:
        print(f"awa-fast: error: demo timed out after {timeout:g} s: "
              f"{result.completed}/{jobs} completed", file=sys.stderr)
        return 1
    if result.completed != jobs:
        print(f"awa-fast: error: {jobs - result.completed} of {jobs} demo jobs did not complete",
              file=sys.stderr)
        return 1
    return 0
