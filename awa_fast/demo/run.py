"""The demo parent: migrate, enqueue the stage-A jobs, run the worker children, wait, check the
result against a direct parse, and stop cleanly on a signal or the timeout (see
:mod:`awa_fast.demo`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import awa_fast as awa
from awa_fast.database_url import from_environment, resolve_database_url
from awa_fast.demo.pipeline import (
    DEMO_QUEUE,
    KIND_PARSE,
    KIND_RESOLVE,
    KINDS,
    ParseImports,
    _walk,
    file_modules,
    stdlib_files,
)
from awa_fast.demo.report import (
    TIMEOUT,
    CheckInterrupted,
    DemoInterrupted,
    DemoResult,
    embedded_notice,
    format_interrupted,
    format_report,
)
from awa_fast.errors import AwaError, TerminalError
from awa_fast.sql import demo as dsql

WORKERS_PER_PROCESS = 32
POLL_INTERVAL_S = 0.1
PROGRESS_INTERVAL_S = 1.0


def _log(message: str) -> None:
    print(f"demo: {message}", file=sys.stderr, flush=True)


async def _fetch(c, query: str, params: Any = None) -> list[tuple]:
    """The rows of one ``sql.demo`` statement run on a connection of ``c``'s pool (none for a
    statement that returns no rows)."""
    async with (await c.pool()).connection() as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []


async def _counts(c) -> dict[tuple[str, str], int]:
    return {(k, s): n for k, s, n in await _fetch(c, dsql.COUNTS, (list(KINDS),))}


async def _prepare(c) -> None:
    """Delete the rows of a previous run and make the result table (the schema is migrated)."""
    await _fetch(c, dsql.DELETE_JOBS, {"kinds": list(KINDS)})
    await _fetch(c, dsql.DELETE_DLQ, (list(KINDS),))
    await c.resume_queue(DEMO_QUEUE)
    await _fetch(c, dsql.CREATE_RESULTS)
    await _fetch(c, dsql.TRUNCATE_RESULTS)


def _check_one(path: str) -> tuple[str, list[str] | None, str | None]:
    try:
        return path, file_modules(path), None
    except TerminalError as exc:
        return path, None, str(exc)


def _check_many(paths: list[str]) -> list[tuple[str, list[str] | None, str | None]]:
    return [_check_one(p) for p in paths]


CHECK_CHUNK = 32


def _quiet_broken_pool_thread() -> None:
    """Before the check's processes are terminated: Python 3.11's process-pool manager thread,
    finding them gone, sets an exception on futures the cancel already cancelled and dies with
    ``InvalidStateError`` (a traceback on stderr of a run that stopped as asked). Only that
    error of a thread is dropped; every other goes to the previous hook."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if not isinstance(args.exc_value, concurrent.futures.InvalidStateError):
            previous(args)

    threading.excepthook = hook


async def _direct(files: list[str], processes: int) -> tuple[set[str], int, dict[str, str]]:
    """Re-parse ``files`` without the queue (a plain process pool): (distinct modules of the
    parsed files, staged requests = sum of their distinct counts, {unparsable path: error}).

    Cancelled (a stop signal), it cancels the pending chunks and terminates the pool's
    processes before it re-raises: none outlives the demo."""
    import multiprocessing

    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=processes, mp_context=multiprocessing.get_context("spawn")
    )
    try:
        chunks = await asyncio.gather(
            *(
                loop.run_in_executor(pool, _check_many, files[i : i + CHECK_CHUNK])
                for i in range(0, len(files), CHECK_CHUNK)
            )
        )
    except BaseException:
        children = list((pool._processes or {}).values())
        _quiet_broken_pool_thread()
        pool.shutdown(wait=False, cancel_futures=True)
        for child in children:
            child.terminate()
        for child in children:
            child.join(5)
        raise
    await asyncio.to_thread(pool.shutdown)
    expected: set[str] = set()
    staged = 0
    failures: dict[str, str] = {}
    for results in chunks:
        for path, names, error in results:
            if names is None:
                failures[path] = error or ""
                continue
            expected.update(names)
            staged += len(names)
    return expected, staged, failures


async def _wait_for_pipeline(c, sup, t_start: float, timeout: float) -> bool:
    """Wait until every demo job is terminal (returns False) or ``timeout`` seconds passed
    (True), with a progress line every second.

    Raises:
        AwaError: the worker processes failed (the supervisor gave up).
    """
    deadline = t_start + timeout
    next_progress = t_start + PROGRESS_INTERVAL_S
    while True:
        counts = await _counts(c)
        live = sum(
            n for (_, s), n in counts.items() if s not in ("completed", "failed", "cancelled")
        )
        now = time.perf_counter()
        if live == 0 and counts:
            return False
        if not sup.check():
            raise AwaError(f"demo workers: {sup.failed}")
        if now >= deadline:
            return True
        if now >= next_progress:
            a_done = counts.get((KIND_PARSE, "completed"), 0)
            a_fail = counts.get((KIND_PARSE, "failed"), 0)
            b_done = counts.get((KIND_RESOLVE, "completed"), 0)
            b_all = sum(n for (k, _), n in counts.items() if k == KIND_RESOLVE)
            _log(
                f"{now - t_start:5.1f} s: A {a_done} completed, {a_fail} failed; "
                f"B {b_done}/{b_all} completed"
            )
            next_progress += PROGRESS_INTERVAL_S
        await asyncio.sleep(POLL_INTERVAL_S)


async def _remove_unfinished(c) -> int:
    """Delete the demo's jobs that did not finish; called after its workers stopped, so a
    ``running`` row belongs to no one. Returns how many."""
    async with (await c.pool()).connection() as conn:
        cur = await conn.execute(dsql.REMOVE_UNFINISHED, (list(KINDS), DEMO_QUEUE))
        return cur.rowcount


async def _stopped(
    c, t_start: float, processes: int, files: list[str], stopped_by: str
) -> DemoInterrupted:
    """Count the demo's jobs, then remove the unfinished ones (its workers have stopped)."""
    counts = await _counts(c)
    continuations = (await _fetch(c, dsql.CONTINUATIONS, (KIND_PARSE,)))[0][0]
    return DemoInterrupted(
        elapsed_seconds=time.perf_counter() - t_start,
        processes=processes,
        files=len(files),
        counts={f"{k}:{st}": n for (k, st), n in sorted(counts.items())},
        continuations=continuations,
        removed_unfinished=await _remove_unfinished(c),
        stopped_by=stopped_by,
    )


# Signals that stop the demo as Ctrl-C does: a service manager's SIGTERM, and the SIGHUP of a
# closed terminal (the worker launcher drains on both).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _stop_on_signals() -> list[str]:
    """Make SIGTERM and SIGHUP stop the running demo as Ctrl-C does: cancel the current task
    (the demo then drains its workers and removes its unfinished jobs). Returns the list the
    signal's name is appended to. A second such signal takes its default action (the process
    ends at once), as a second Ctrl-C ends it."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None  # called from the demo's task
    stopped_by: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        stopped_by.append(sig.name)
        _default_stops()  # a second one takes the default action
        task.cancel()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    return stopped_by


def _default_stops() -> None:
    """Give SIGTERM and SIGHUP back their default action."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.remove_signal_handler(sig)


class _DemoRun:
    """One demo run, phase by phase: what a stop signal or the timeout must undo depends on
    the phase it arrives in (the migration under way, the workers, the drain begun)."""

    def __init__(self, database_url: str, processes: int, files: list[str], timeout: float):
        self.database_url = database_url
        self.processes = processes
        self.files = files
        self.timeout = timeout
        self.c = awa.AsyncClient(database_url, max_connections=2)
        self.sup: Any = None
        self.migration: asyncio.Task | None = None
        self.draining: asyncio.Future | None = None  # the drain after the timeout, once begun
        self.enqueuing = False  # the COPY of the A jobs began: from here on its jobs may exist
        self.enqueue_s = 0.0
        self.t_wall = self.t_start = time.perf_counter()

    async def run(self) -> DemoResult | DemoInterrupted | CheckInterrupted:
        stopped_by = _stop_on_signals()
        try:
            try:
                if await self._pipeline():
                    return await self._timed_out()
                # Every demo job is finished: from here on a SIGTERM/SIGHUP takes the default
                # action, as a Ctrl-C now ends the process (130) without a summary.
                _default_stops()
            except asyncio.CancelledError:  # Ctrl-C (asyncio.Runner), SIGTERM or SIGHUP
                return await self._interrupted(stopped_by)
            pipeline_s = time.perf_counter() - self.t_start
            await self._drain()
            collected = await self._collect()
        finally:
            _default_stops()
            await self._drain()
            await self.c.close()
        return await self._check(pipeline_s, collected)

    async def _drain(self) -> None:
        if self.sup is not None:
            sup, self.sup = self.sup, None
            await asyncio.to_thread(sup.drain)

    async def _pipeline(self) -> bool:
        """Migrate, enqueue, start the workers and wait: True when the timeout passed."""
        from awa_fast.launcher_config import launcher_config
        from awa_fast.supervisor import Supervisor

        _log("migrating the awa_fast schema (nothing to do when it is current)")
        # c.migrate() runs in a thread, which a cancel does not stop: shielded, so that an
        # interrupt can wait for it
        self.migration = asyncio.ensure_future(self.c.migrate())
        await asyncio.shield(self.migration)
        await _prepare(self.c)
        self.enqueuing = True
        t0 = time.perf_counter()
        await self.c.insert_many_copy(
            [ParseImports(p) for p in self.files], kind=KIND_PARSE, queue=DEMO_QUEUE
        )
        self.enqueue_s = time.perf_counter() - t0
        _log(
            f"enqueued {len(self.files)} stage-A jobs in {self.enqueue_s:.3f} s; starting "
            f"{self.processes} worker process(es)"
        )
        self.t_start = time.perf_counter()
        config = launcher_config(
            "awa_fast.demo:client",
            self.processes,
            queues=f"{DEMO_QUEUE}:{WORKERS_PER_PROCESS}",
            database_url=self.database_url,
            status_interval=0,
            # the files that do not parse fail on purpose (and are reported at the end): no
            # WARNING line per failed attempt
            log_level="error",
            extra_env={"PYTHONWARNINGS": "ignore"},
        )
        self.sup = Supervisor(config, out=sys.stderr)
        self.sup.start()
        return await _wait_for_pipeline(self.c, self.sup, self.t_start, self.timeout)

    async def _timed_out(self) -> DemoInterrupted:
        """Given up: stop and clean up as after an interrupt (nothing left to compare)."""
        _log(
            f"timed out after {self.timeout:g} s: stopping the workers, then removing the "
            "demo's unfinished jobs"
        )
        # shielded: a stop signal now waits for this drain instead of starting another
        self.draining = asyncio.ensure_future(asyncio.to_thread(self.sup.drain))
        await asyncio.shield(self.draining)
        self.sup = None
        return await _stopped(self.c, self.t_start, self.processes, self.files, TIMEOUT)

    async def _interrupted(self, stopped_by: list[str]) -> DemoInterrupted:
        # after Ctrl-C, a SIGTERM takes the default action, as a second Ctrl-C ends it
        _default_stops()
        name = stopped_by[0] if stopped_by else "SIGINT"
        task = asyncio.current_task()
        if stopped_by and task is not None:
            # our own cancel, handled: a Ctrl-C during the clean-up then ends the process with
            # 130 as a second Ctrl-C does (asyncio.Runner counts cancels)
            task.uncancel()
        _log(
            f"interrupted by {name}: stopping the workers, then removing the demo's unfinished jobs"
        )
        migration = self.migration
        if migration is not None and not migration.done():
            # Each migration is one transaction: the one under way commits or rolls back whole.
            # Querying before it ended raced it (no jobs table yet).
            _log("waiting for the schema migration under way to end")
            await asyncio.wait({migration})
        if migration is not None and migration.done() and not migration.cancelled():
            if (exc := migration.exception()) is not None:
                _log(f"the schema migration failed: {exc}")
        if self.draining is not None:  # the timeout's drain is under way: wait for it
            await asyncio.wait({self.draining})
            self.sup = None
        await self._drain()
        if not self.enqueuing:  # none of this run's jobs exist: nothing to count or remove
            return DemoInterrupted(
                elapsed_seconds=time.perf_counter() - self.t_start,
                processes=self.processes,
                files=len(self.files),
                counts={},
                continuations=0,
                removed_unfinished=0,
                stopped_by=name,
                enqueued=False,
            )
        return await _stopped(self.c, self.t_start, self.processes, self.files, name)

    async def _collect(self) -> dict[str, Any]:
        """What the queue's side of the check reads, while the client is open."""
        c = self.c
        found, not_found, total_size = (await _fetch(c, dsql.RESULT_TOTALS))[0]
        return {
            "counts": await _counts(c),
            "fail_rows": await _fetch(c, dsql.FAILURES, (KIND_PARSE,)),
            "b_names": {r[0] for r in await _fetch(c, dsql.ARG_NAMES, (KIND_RESOLVE,))},
            "found": found,
            "not_found": not_found,
            "total_size": total_size,
            "continuations": (await _fetch(c, dsql.CONTINUATIONS, (KIND_PARSE,)))[0][0],
        }

    async def _check(self, pipeline_s: float, got: dict[str, Any]) -> DemoResult | CheckInterrupted:
        _log(
            f"pipeline done in {pipeline_s:.1f} s; checking it against a direct parse of the "
            f"same {len(self.files)} files (a process pool, no queue)"
        )
        # A stop signal during the check ends its pool's processes, then the demo (128 + the
        # signal, no report: the pipeline finished)
        stopped_by = _stop_on_signals()
        try:
            expected, staged, direct_failures = await _direct(self.files, self.processes)
        except asyncio.CancelledError:
            if not stopped_by:  # Ctrl-C: asyncio.Runner ends the process (130)
                raise
            _log(f"interrupted by {stopped_by[0]} during the check: its processes were ended")
            return CheckInterrupted(stopped_by[0])
        finally:
            _default_stops()
        return self._result(pipeline_s, got, expected, staged, direct_failures)

    def _result(
        self,
        pipeline_s: float,
        got: dict[str, Any],
        expected: set[str],
        staged: int,
        direct_failures: dict[str, str],
    ) -> DemoResult:
        counts, b_names, fail_rows = got["counts"], got["b_names"], got["fail_rows"]
        problems = _problems(expected, b_names, {p for p, _ in fail_rows}, direct_failures)
        b_count = len(b_names)
        b_done = counts.get((KIND_RESOLVE, "completed"), 0)
        if b_done != b_count:
            problems.append(f"{b_count - b_done} B job(s) did not complete")
        finished = ("completed", "failed", "cancelled")
        finalized = sum(n for (_, s), n in counts.items() if s in finished)
        check = (
            f"OK ({b_count} B jobs == {len(expected)} distinct modules computed directly)"
            if not problems
            else "MISMATCH: " + "; ".join(problems)
        )
        return DemoResult(
            files=len(self.files),
            processes=self.processes,
            a_jobs=sum(n for (k, _), n in counts.items() if k == KIND_PARSE),
            a_completed=counts.get((KIND_PARSE, "completed"), 0),
            a_failed=counts.get((KIND_PARSE, "failed"), 0),
            continuations=got["continuations"],
            failures=[{"path": p, "error": e} for p, e in fail_rows],
            distinct_modules=b_count,
            b_inserted=b_count,
            b_staged=staged,
            b_skipped_duplicates=staged - b_count,
            b_completed=b_done,
            b_failed=counts.get((KIND_RESOLVE, "failed"), 0),
            found=got["found"],
            not_found=got["not_found"],
            total_size=int(got["total_size"]),
            enqueue_seconds=self.enqueue_s,
            pipeline_seconds=pipeline_s,
            jobs_per_second=finalized / pipeline_s if pipeline_s else 0.0,
            wall_seconds=time.perf_counter() - self.t_wall,
            expected_modules=len(expected),
            check_ok=not problems,
            check_message=check,
        )


def _problems(
    expected: set[str], b_names: set[str], failed_paths: set[str], direct_failures: dict
) -> list[str]:
    """How the queue's result differs from the direct parse's."""
    problems = []
    missing, extra = sorted(expected - b_names), sorted(b_names - expected)
    if missing or extra:
        problems.append(
            f"B modules differ from the direct computation: missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected {extra[:5]}"
            f"{'...' if len(extra) > 5 else ''}"
        )
    if failed_paths != set(direct_failures):
        problems.append(
            f"failed A jobs {len(failed_paths)} != unparsable files {len(direct_failures)}"
        )
    return problems


async def _demo(
    database_url: str, processes: int, files: list[str], timeout: float
) -> DemoResult | DemoInterrupted | CheckInterrupted:
    return await _DemoRun(database_url, processes, files, timeout).run()


def _run_loop(coro) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_demo(
    database_url: str | None,
    processes: int | None = None,
    *,
    limit: int | None = None,
    extra_paths: list[str] | None = None,
    timeout: float = 600.0,
    json_output: bool = False,
) -> int:
    """Run the demo against ``database_url`` (``None``: the shared rule of
    :mod:`awa_fast.database_url`; the embedded server's footprint is announced before it
    starts) with ``processes`` worker processes (default one per core) over the first ``limit``
    standard-library files plus ``extra_paths`` (files or directories); print the report (JSON
    if ``json_output``). Returns 0 when the check passed, 1 when it did not or the run passed
    ``timeout`` seconds, and when interrupted (see the module's docstring) 130 after Ctrl-C
    (SIGINT), 143 after SIGTERM, 129 after SIGHUP.

    Raises:
        ValueError: ``processes`` or ``limit`` below 1, or an extra path that does not exist.
        AwaError, psycopg.Error: the database or the worker processes failed.
    """
    processes = processes or os.cpu_count() or 1
    if processes < 1 or (limit is not None and limit < 1):
        raise ValueError("processes and limit must be >= 1")
    files = stdlib_files(limit)
    for extra in extra_paths or []:
        if not os.path.exists(extra):
            raise AwaError(f"--extra-path {extra}: no such file or directory")
        files.extend(p for p in _walk(extra) if p not in files)
    if not files:
        raise AwaError("no .py files to process")
    _log(
        f"{len(files)} .py files, {processes} worker process(es), queue '{DEMO_QUEUE}': stage A "
        "parses each file's imports and stages one stage-B job per distinct module, which "
        "resolves it; the rows of a previous demo run are deleted first. Ctrl-C, SIGTERM or "
        "SIGHUP stops it, prints a summary and removes its unfinished jobs."
    )
    if database_url is None:
        if from_environment() is None:
            from awa_fast import embedded

            for line in embedded_notice(embedded.footprint()):
                _log(line)
        database_url = resolve_database_url(None)
    result = _run_loop(_demo(database_url, processes, files, timeout))
    if isinstance(result, CheckInterrupted):
        return result.exit_status
    if json_output:
        print(json.dumps(dataclasses.asdict(result), indent=2))
    elif isinstance(result, DemoInterrupted):
        print(format_interrupted(result))
    else:
        print(format_report(result))
    if isinstance(result, DemoInterrupted):
        return result.exit_status
    return 0 if result.check_ok else 1
