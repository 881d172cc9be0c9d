"""What a demo run reports: its result, an interrupted run's summary, and the notice said
before the embedded server starts."""

from __future__ import annotations

import dataclasses
import signal

from awa_fast.demo.pipeline import DEMO_QUEUE, KIND_PARSE, KIND_RESOLVE, MAX_STAGED


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
