"""The built-in demo behind ``awa-fast demo``: an import-graph pipeline over the standard library
of the Python that runs it, worked by the multi-process launcher.

Stage A (``demo_parse_imports``, args :class:`ParseImports`), one job per ``.py`` file under
``sysconfig.get_paths()["stdlib"]`` (``site-packages`` skipped, test directories included):
read the file, ``ast.parse`` it and collect the top-level names of its absolute imports
(``import a.b`` and ``from a.b import c`` give ``a``; relative imports are skipped). For each
distinct name it stages a stage-B job with ``job.enqueue_on_completion(ResolveModule(name),
unique_opts={})`` (ADR-046): the B rows are inserted in the same transaction that completes A,
and the default unique options (kind + args, states including ``completed``) make every distinct
module get exactly one B however many files import it; the other requests are skipped as
duplicates. A file that cannot be read or parsed (the test suite holds deliberately broken ones)
fails its A job with a ``TerminalError`` naming the file and the error; it is counted, not fatal.

ADR-046 allows at most 16 staged follow-ups per attempt. A file importing more than 16 distinct
modules stages the first 15 (in sorted order) plus one continuation A job,
``ParseImports(path, offset=15)``, which re-parses the file and stages the next chunk, and so
on. Names are staged in sorted order everywhere so that concurrent completions take their unique
claims in one global order (ADR-046's multi-insert deadlock note).

Stage B (``demo_resolve_module``, args :class:`ResolveModule`, priority 1 so that Bs run as
soon as they appear, alongside the remaining As): ``importlib.util.find_spec`` on
the top-level name (no module code runs) against the worker's ``sys.path``; the result (found,
origin, file size) is upserted into the table ``awa_fast_demo_modules`` (created by the demo).

The demo parent: migrate; delete the rows of a previous run (both kinds, DLQ included; empty the
result table); enqueue every A job with one COPY (``insert_many_copy``); start ``processes``
worker children with :class:`~awa_fast.supervisor.Supervisor` (this module's ``client``,
queue ``demo``); print a progress line to stderr every second; when every A and B job is
terminal, drain the children and print the report. The check re-parses the files directly
(a plain process pool, no queue): the B rows must be exactly the distinct set of top-level modules imported by the
successfully parsed files (and the failed A jobs exactly the files that do not parse), else
``check: MISMATCH`` and exit status 1. "Skipped as duplicates" is the number of staged requests
(the sum over parsed files of their distinct-module counts) minus the B rows.

Interrupted (Ctrl-C, SIGTERM from a service manager, or the SIGHUP of a closed terminal) while
its jobs run, the parent
drains the children, counts the demo's jobs by kind and state (continuations counted apart),
deletes the unfinished ones (continuations and B jobs included), prints a summary and exits
128 + the signal's number, as a shell reports a process the signal ended: 130 after Ctrl-C,
143 after SIGTERM, 129 after SIGHUP. Interrupted while it migrates the schema, it first waits
for the migration under way to end (each migration is one transaction: it commits or rolls back
whole); interrupted before it began to enqueue its jobs, its summary says nothing was enqueued
(nothing is counted or removed). A second signal, or one after every demo job finished, ends
the process at once (Ctrl-C: 130; SIGTERM, SIGHUP: the default action), with one exception:
during the check (after ``pipeline done``), SIGTERM or SIGHUP (as Ctrl-C) first cancels the
check and terminates its pool's processes, then the demo exits 128 + the signal's number
without a report (none of its processes outlives it). Past ``--timeout`` seconds (default 600)
it stops the same way (drain, count, delete the unfinished jobs, summary ``timed out after
...``) and exits 1.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib.util
import json
import os
import signal
import sys
import sysconfig
import time
import warnings
from typing import Any

import awa_fast as awa
from awa_fast.database_url import from_environment, resolve_database_url
from awa_fast.errors import AwaError, TerminalError
from awa_fast.sql import demo as dsql

DEMO_QUEUE = "demo"
KIND_PARSE = "demo_parse_imports"
KIND_RESOLVE = "demo_resolve_module"
KINDS = (KIND_PARSE, KIND_RESOLVE)
MAX_STAGED = 16  # ADR-046
WORKERS_PER_PROCESS = 32
POLL_INTERVAL_S = 0.1
PROGRESS_INTERVAL_S = 1.0
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}

# Parsing old or deliberately odd files warns (invalid escapes...): not the demo's business.
warnings.filterwarnings("ignore", category=SyntaxWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)


@dataclasses.dataclass
class ParseImports:
    """Stage A: parse ``path``; stage B jobs for its distinct imported modules from ``offset``."""

    path: str
    offset: int = 0


@dataclasses.dataclass
class ResolveModule:
    """Stage B: resolve the top-level module ``name``."""

    name: str


# The worker children load this client (``awa_fast.demo:client``); the launcher passes the
# database URL with --database-url.
client = awa.AsyncClient(max_connections=8)
START_OPTIONS = {"poll_interval_ms": 100, "leader_election_interval_ms": 1000}


# ---------------------------------------------------------------------------------------------
# the stages


def imported_modules(source: bytes, filename: str = "<unknown>") -> list[str]:
    """Sorted distinct top-level names of the absolute imports in ``source``.

    Raises:
        SyntaxError, ValueError: ``source`` does not parse (bad syntax, encoding, NUL bytes).
    """
    tree = ast.parse(source, filename=filename)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return sorted(names)


def file_modules(path: str) -> list[str]:
    """:func:`imported_modules` of the file ``path``.

    Raises:
        TerminalError: the file cannot be read or parsed (message names the file and error).
    """
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        raise TerminalError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        return imported_modules(source, path)
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise TerminalError(f"{path}: {type(exc).__name__}: {exc.msg}{where}") from exc
    except (ValueError, UnicodeError) as exc:
        raise TerminalError(f"{path}: {type(exc).__name__}: {exc}") from exc


def chunk(names: list[str], offset: int) -> tuple[list[str], int | None]:
    """The names an A attempt at ``offset`` stages, and the continuation's offset (or None):
    all the rest if they fit in 16 follow-ups, else 15 plus one continuation."""
    rest = names[offset:]
    if len(rest) <= MAX_STAGED:
        return rest, None
    return rest[: MAX_STAGED - 1], offset + MAX_STAGED - 1


@client.task(
    ParseImports, kind=KIND_PARSE, queue=DEMO_QUEUE, failure_consequence=awa.NO_FAILURE_CONSEQUENCE
)
def parse_imports(job) -> None:
    """Stage A (a ``def`` handler: parsing is CPU work, it runs in the thread pool)."""
    args = job.args
    names, next_offset = chunk(file_modules(args.path), args.offset)
    for name in names:
        job.enqueue_on_completion(
            ResolveModule(name), kind=KIND_RESOLVE, queue=DEMO_QUEUE, priority=1, unique_opts={}
        )
    if next_offset is not None:
        job.enqueue_on_completion(
            ParseImports(args.path, next_offset), kind=KIND_PARSE, queue=DEMO_QUEUE
        )


def resolve(name: str) -> tuple[bool, str | None, int | None]:
    """``(found, origin, size in bytes of the origin file or None)`` of top-level ``name``."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False, None, None
    if spec is None:
        return False, None, None
    origin = spec.origin
    size = None
    if origin and os.path.isfile(origin):
        size = os.path.getsize(origin)
    elif origin is None and spec.submodule_search_locations:
        origin = "namespace package"
    return True, origin, size


@client.task(
    ResolveModule,
    kind=KIND_RESOLVE,
    queue=DEMO_QUEUE,
    failure_consequence=awa.NO_FAILURE_CONSEQUENCE,
)
async def resolve_module(job) -> None:
    """Stage B: resolve the module and record the result (idempotent upsert)."""
    found, origin, size = resolve(job.args.name)
    pool = await client.pool()
    async with pool.connection() as conn:
        await conn.execute(dsql.UPSERT_RESULT, (job.args.name, found, origin, size))


# ---------------------------------------------------------------------------------------------
# the run


def stdlib_files(limit: int | None = None) -> list[str]:
    """The ``.py`` files of this Python's standard library, sorted (``site-packages`` and
    ``__pycache__`` skipped), at most ``limit``."""
    return _walk(sysconfig.get_paths()["stdlib"])[:limit]


def _walk(root: str) -> list[str]:
    if os.path.isfile(root):
        return [os.path.abspath(root)]
    out: list[str] = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        out.extend(os.path.join(d, f) for f in files if f.endswith(".py"))
    return sorted(os.path.abspath(p) for p in out)


@dataclasses.dataclass
class DemoResult:
    """What a demo run measured and checked."""

    files: int
    processes: int
    a_jobs: int
    a_completed: int
    a_failed: int
    continuations: int
    failures: list  # [{"path", "error"}], first few
    distinct_modules: int
    b_inserted: int
    b_staged: int
    b_skipped_duplicates: int
    b_completed: int
    b_failed: int
    found: int
    not_found: int
    total_size: int
    enqueue_seconds: float
    pipeline_seconds: float
    jobs_per_second: float
    wall_seconds: float
    expected_modules: int
    check_ok: bool
    check_message: str


TIMEOUT = "TIMEOUT"  # DemoInterrupted.stopped_by of a run that passed its --timeout


@dataclasses.dataclass
class DemoInterrupted:
    """What an interrupted demo run (Ctrl-C, SIGTERM or SIGHUP, or its ``--timeout``) did
    before it stopped."""

    elapsed_seconds: float
    processes: int
    files: int
    counts: dict  # {"kind:state": jobs} just before the clean-up
    continuations: int  # of the stage-A jobs in ``counts``, those created as continuations
    removed_unfinished: int  # demo jobs deleted because they had not finished
    stopped_by: str = "SIGINT"  # the signal that interrupted it, or TIMEOUT
    interrupted: bool = True
    # False: interrupted before the demo began to enqueue its jobs (while it migrated the schema
    # or deleted a previous run's rows): nothing was counted or removed
    enqueued: bool = True

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a process it ended: 130 after Ctrl-C,
        143 after SIGTERM, 129 after SIGHUP; 1 after the timeout (a failed run)."""
        if self.stopped_by == TIMEOUT:
            return 1
        return 128 + signal.Signals[self.stopped_by].value


@dataclasses.dataclass
class CheckInterrupted:
    """A stop signal (SIGTERM, SIGHUP) arrived during the check, after every demo job
    finished: the check's processes were ended; no report."""

    stopped_by: str

    @property
    def exit_status(self) -> int:
        """128 + the signal's number (143 after SIGTERM, 129 after SIGHUP)."""
        return 128 + signal.Signals[self.stopped_by].value


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


async def _direct(files: list[str], processes: int) -> tuple[set[str], int, dict[str, str]]:
    """Re-parse ``files`` without the queue (a plain process pool): (distinct modules of the
    parsed files, staged requests = sum of their distinct counts, {unparsable path: error}).

    Cancelled (a stop signal), it cancels the pending chunks and terminates the pool's
    processes before it re-raises: none outlives the demo."""
    import concurrent.futures
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


async def _demo(
    database_url: str, processes: int, files: list[str], timeout: float
) -> DemoResult | DemoInterrupted | CheckInterrupted:
    from awa_fast.supervisor import Supervisor

    t_wall = time.perf_counter()
    stopped_by = _stop_on_signals()
    c = awa.AsyncClient(database_url, max_connections=2)
    sup = None
    migration: asyncio.Task | None = None
    draining: asyncio.Future | None = None  # the drain after the timeout, once begun
    enqueuing = False  # the COPY of the A jobs began: from here on the demo's jobs may exist
    enqueue_s = 0.0
    t_start = time.perf_counter()
    try:
        try:
            _log("migrating the awa_fast schema (nothing to do when it is current)")
            # c.migrate() runs in a thread, which a cancel does not stop: shielded, so that an
            # interrupt can wait for it below
            migration = asyncio.ensure_future(c.migrate())
            await asyncio.shield(migration)
            await _prepare(c)
            enqueuing = True
            t0 = time.perf_counter()
            await c.insert_many_copy(
                [ParseImports(p) for p in files], kind=KIND_PARSE, queue=DEMO_QUEUE
            )
            enqueue_s = time.perf_counter() - t0
            _log(
                f"enqueued {len(files)} stage-A jobs in {enqueue_s:.3f} s; starting "
                f"{processes} worker process(es)"
            )
            t_start = time.perf_counter()
            sup = Supervisor(
                f"{__name__}:client",
                processes,
                queues=f"{DEMO_QUEUE}:{WORKERS_PER_PROCESS}",
                database_url=database_url,
                out=sys.stderr,
                status_interval=0,
                # the files that do not parse fail on purpose (and are
                # reported at the end): no WARNING line per failed attempt
                log_level="error",
                extra_env={"PYTHONWARNINGS": "ignore"},
            )
            sup.start()
            if await _wait_for_pipeline(c, sup, t_start, timeout):
                # Given up: stop and clean up as after an interrupt (nothing left to compare)
                _log(
                    f"timed out after {timeout:g} s: stopping the workers, then removing the "
                    "demo's unfinished jobs"
                )
                # shielded: a stop signal now waits for this drain instead of starting another
                draining = asyncio.ensure_future(asyncio.to_thread(sup.drain))
                await asyncio.shield(draining)
                sup = None
                return await _stopped(c, t_start, processes, files, TIMEOUT)
            # Every demo job is finished: from here on a SIGTERM/SIGHUP takes the default
            # action, as a Ctrl-C now ends the process (130) without a summary.
            _default_stops()
        except asyncio.CancelledError:  # Ctrl-C (asyncio.Runner), SIGTERM or SIGHUP cancels it
            # after Ctrl-C, a SIGTERM takes the default action, as a second Ctrl-C ends it
            _default_stops()
            name = stopped_by[0] if stopped_by else "SIGINT"
            task = asyncio.current_task()
            if stopped_by and task is not None:
                # our own cancel, handled: a Ctrl-C during the clean-up then ends the process
                # with 130 as a second Ctrl-C does (asyncio.Runner counts cancels)
                task.uncancel()
            _log(
                f"interrupted by {name}: stopping the workers, then removing the demo's "
                "unfinished jobs"
            )
            if migration is not None and not migration.done():
                # Each migration is one transaction: the one under way commits or rolls back
                # whole. Querying before it ended raced it (no jobs table yet).
                _log("waiting for the schema migration under way to end")
                await asyncio.wait({migration})
            if migration is not None and migration.done() and not migration.cancelled():
                if (exc := migration.exception()) is not None:
                    _log(f"the schema migration failed: {exc}")
            if draining is not None:  # the timeout's drain is under way: wait for it
                await asyncio.wait({draining})
                sup = None
            if sup is not None:
                await asyncio.to_thread(sup.drain)
                sup = None
            if not enqueuing:  # none of this run's jobs exist: nothing to count or remove
                return DemoInterrupted(
                    elapsed_seconds=time.perf_counter() - t_start,
                    processes=processes,
                    files=len(files),
                    counts={},
                    continuations=0,
                    removed_unfinished=0,
                    stopped_by=name,
                    enqueued=False,
                )
            return await _stopped(c, t_start, processes, files, name)
        pipeline_s = time.perf_counter() - t_start
        await asyncio.to_thread(sup.drain)
        sup = None

        counts = await _counts(c)
        fail_rows = await _fetch(c, dsql.FAILURES, (KIND_PARSE,))
        b_names = {r[0] for r in await _fetch(c, dsql.ARG_NAMES, (KIND_RESOLVE,))}
        found, not_found, total_size = (await _fetch(c, dsql.RESULT_TOTALS))[0]
        continuations = (await _fetch(c, dsql.CONTINUATIONS, (KIND_PARSE,)))[0][0]
    finally:
        _default_stops()
        if sup is not None:
            await asyncio.to_thread(sup.drain)
        await c.close()

    _log(
        f"pipeline done in {pipeline_s:.1f} s; checking it against a direct parse of the same "
        f"{len(files)} files (a process pool, no queue)"
    )
    # A stop signal during the check ends its pool's processes, then the demo (128 + the signal,
    # no report: the pipeline finished)
    stopped_by = _stop_on_signals()
    try:
        expected, staged, direct_failures = await _direct(files, processes)
    except asyncio.CancelledError:
        if not stopped_by:  # Ctrl-C: asyncio.Runner ends the process (130)
            raise
        _log(f"interrupted by {stopped_by[0]} during the check: its processes were ended")
        return CheckInterrupted(stopped_by[0])
    finally:
        _default_stops()
    problems = []
    missing, extra = sorted(expected - b_names), sorted(b_names - expected)
    if missing or extra:
        problems.append(
            f"B modules differ from the direct computation: missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected {extra[:5]}"
            f"{'...' if len(extra) > 5 else ''}"
        )
    failed_paths = {p for p, _ in fail_rows}
    if failed_paths != set(direct_failures):
        problems.append(
            f"failed A jobs {len(failed_paths)} != unparsable files {len(direct_failures)}"
        )
    b_count = len(b_names)
    b_done = counts.get((KIND_RESOLVE, "completed"), 0)
    if b_done != b_count:
        problems.append(f"{b_count - b_done} B job(s) did not complete")
    a_jobs = sum(n for (k, _), n in counts.items() if k == KIND_PARSE)
    finalized = sum(n for (_, s), n in counts.items() if s in ("completed", "failed", "cancelled"))
    check = (
        f"OK ({b_count} B jobs == {len(expected)} distinct modules computed directly)"
        if not problems
        else "MISMATCH: " + "; ".join(problems)
    )
    return DemoResult(
        files=len(files),
        processes=processes,
        a_jobs=a_jobs,
        a_completed=counts.get((KIND_PARSE, "completed"), 0),
        a_failed=counts.get((KIND_PARSE, "failed"), 0),
        continuations=continuations,
        failures=[{"path": p, "error": e} for p, e in fail_rows],
        distinct_modules=b_count,
        b_inserted=b_count,
        b_staged=staged,
        b_skipped_duplicates=staged - b_count,
        b_completed=b_done,
        b_failed=counts.get((KIND_RESOLVE, "failed"), 0),
        found=found,
        not_found=not_found,
        total_size=int(total_size),
        enqueue_seconds=enqueue_s,
        pipeline_seconds=pipeline_s,
        jobs_per_second=finalized / pipeline_s if pipeline_s else 0.0,
        wall_seconds=time.perf_counter() - t_wall,
        expected_modules=len(expected),
        check_ok=not problems,
        check_message=check,
    )


def _run_loop(coro) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        return asyncio.run(coro)
    return uvloop.run(coro)


def format_report(r: DemoResult, max_failures: int = 5) -> str:
    """The human-readable report printed by ``awa-fast demo``."""
    lines = [
        (
            "files processed",
            f"{r.files} ({r.processes} worker process{'es' if r.processes != 1 else ''})",
        ),
        (
            "stage A jobs",
            f"{r.a_jobs} ({r.files} files + {r.continuations} continuations for "
            f"files importing > {MAX_STAGED} modules)",
        ),
        ("A completed", f"{r.a_completed}"),
        ("A failed", f"{r.a_failed} (files that cannot be read or parsed)"),
        ("distinct modules", f"{r.distinct_modules}"),
        ("B jobs inserted", f"{r.b_inserted}"),
        ("B skipped as dup", f"{r.b_skipped_duplicates} (of {r.b_staged} staged requests)"),
        ("B completed", f"{r.b_completed} ({r.b_failed} failed)"),
        (
            "modules found",
            f"{r.found} ({r.not_found} not found; {r.total_size:,} bytes of module files)",
        ),
        ("enqueue", f"{r.files} A jobs in {r.enqueue_seconds:.3f} s (COPY)"),
        ("wall time", f"{r.pipeline_seconds:.2f} s pipeline, {r.wall_seconds:.2f} s total"),
        ("throughput", f"{r.jobs_per_second:,.0f} jobs/s (A+B finalized)"),
    ]
    width = max(len(k) for k, _ in lines)
    out = [f"{k.ljust(width)}  {v}" for k, v in lines]
    if r.failures:
        out.append("first failures:")
        for f in r.failures[:max_failures]:
            out.append(f"  {f['error']}")
        if len(r.failures) > max_failures:
            out.append(f"  ... and {len(r.failures) - max_failures} more")
    out.append(f"check: {r.check_message}")
    return "\n".join(out)


def format_interrupted(r: DemoInterrupted) -> str:
    """The summary printed when ``awa-fast demo`` is interrupted (a stop signal) or passes
    its ``--timeout``."""

    def n(kind: str, *states: str) -> int:
        return sum(r.counts.get(f"{kind}:{st}", 0) for st in states)

    def total(kind: str) -> int:
        return sum(v for k, v in r.counts.items() if k.startswith(kind + ":"))

    unfinished = ("available", "scheduled", "retryable", "running")
    a_all, b_all = total(KIND_PARSE), total(KIND_RESOLVE)
    head = (
        f"{'timed out' if r.stopped_by == TIMEOUT else f'interrupted by {r.stopped_by}'} "
        f"after {r.elapsed_seconds:.1f} s ({r.processes} "
        f"worker process{'es' if r.processes != 1 else ''}, {r.files} files)"
    )
    if not r.enqueued:
        return "\n".join(
            [
                head,
                "nothing was enqueued yet (the demo was migrating the schema or deleting a "
                "previous run's rows); nothing removed",
            ]
        )
    return "\n".join(
        [
            head,
            f"stage A: {n(KIND_PARSE, 'completed')} completed, {n(KIND_PARSE, 'failed')} failed, "
            f"{n(KIND_PARSE, *unfinished)} unfinished ({a_all} jobs: "
            f"{a_all - r.continuations} files + {r.continuations} continuations)",
            f"stage B: {n(KIND_RESOLVE, 'completed')} completed of {b_all} staged so far",
            f"removed {r.removed_unfinished} unfinished demo job(s) from queue '{DEMO_QUEUE}'; "
            "finished rows stay until the next `awa-fast demo` deletes them",
        ]
    )


def embedded_notice(fp: dict) -> list[str]:
    """What using the embedded server does to this machine (``embedded.footprint()``), said
    before it starts."""
    where = f"in {fp['data_dir']}"
    who = (
        f"as the system account '{fp['os_user']}'"
        if fp["system_account"]
        else f"as {fp['os_user']}"
    )
    if fp["running"]:
        lines = [f"using the embedded PostgreSQL already running {where} ({who})"]
    else:
        created = (
            " (created now with useradd: PostgreSQL refuses to run as root)"
            if fp["creates_user"]
            else ""
        )
        lines = [f"starting the embedded PostgreSQL 18 {where}, {who}{created}"]
    remove = f"`rm -rf {fp['data_dir']}`"
    if fp.get("data_dir_parent"):
        remove += f", `rmdir {fp['data_dir_parent']}` if that leaves it empty"
    if fp["system_account"]:
        # the account may have existed before and serve something else: never say "delete it"
        # unconditionally
        if fp.get("binaries_copy"):
            remove += f", `rm -rf {fp['binaries_copy']}`"
        remove += f" and, if nothing else uses that account, `userdel {fp['os_user']}`"
    lines.append(
        f"it keeps running after the demo: `awa-fast embedded stop` stops it; to "
        f"remove it, stop it, then {remove}"
    )
    return [
        "no database configured (--database-url, AWA_FAST_DATABASE_URL, DATABASE_URL):",
        *("  " + line for line in lines),
    ]


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
