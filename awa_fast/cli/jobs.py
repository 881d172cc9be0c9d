"""``awa-fast job``: list, dump, dump-run, retry, cancel, retry-failed, discard."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from awa_fast.cli.errors import CliError
from awa_fast.cli.names import known_kind, known_queue, note_unknown_filter
from awa_fast.cli.options import positive_int
from awa_fast.cli.output import format_table, print_json, short_time
from awa_fast.cli.session import Session
from awa_fast.cli.table import Command, Group, arg
from awa_fast.job import Job

JOB_STATES = (
    "scheduled",
    "available",
    "running",
    "completed",
    "retryable",
    "failed",
    "cancelled",
    "waiting_external",
    "consequence_pending",
)


JOB_COLUMNS = (
    "ID",
    "KIND",
    "QUEUE",
    "STATE",
    "PRIORITY",
    "ATTEMPT",
    "PROGRESS",
    "RUN_AT",
    "CREATED_AT",
)


def _progress(progress: dict | None, width: int = 30) -> str | None:
    """``set_progress``'s percent and message, e.g. ``40% parsing``; None without progress."""
    if not progress or progress.get("percent") is None:
        return None
    text = f"{progress['percent']}%"
    message = " ".join(str(progress.get("message") or "").split())
    if message:
        text += " " + (message if len(message) <= width else message[: width - 3] + "...")
    return text


def _job_row(job) -> list:
    return [
        job.id,
        job.kind,
        job.queue,
        str(job.state),
        job.priority,
        f"{job.attempt}/{job.max_attempts}",
        _progress(job.progress),
        short_time(job.run_at),
        short_time(job.created_at),
    ]


async def cmd_job_list(s: Session) -> int:
    client = await s.client()
    a = s.args
    jobs = await client.list_jobs(state=a.state, kind=a.kind, queue=a.queue, limit=a.limit)
    s.listing([j.to_dict() for j in jobs], JOB_COLUMNS, [_job_row(j) for j in jobs], "no jobs")
    if not jobs and not s.json:
        await note_unknown_filter(s, client, queue=a.queue, kind=a.kind)
    return 0


async def cmd_job_dump(s: Session) -> int:
    client = await s.client()
    job = await client.get_job(s.args.id)
    print_json(job.to_dict())
    return 0


async def _transition(
    s: Session, change: Callable[[Any, int], Awaitable[Job | None]], refused: str
) -> Job:
    """Job ``--id`` after ``change(client, id)``; when the change returns None (the job's state
    does not allow it), a CliError: ``refused`` formatted with the ``id`` and current ``state``.

    Raises:
        JobNotFound: there is no such job.
    """
    client = await s.client()
    job = await change(client, s.args.id)
    if job is None:
        state = str((await client.get_job(s.args.id)).state)  # raises JobNotFound
        raise CliError(refused.format(id=s.args.id, state=state))
    return job


async def cmd_job_retry(s: Session) -> int:
    job = await _transition(
        s,
        lambda client, job_id: client.retry(job_id),
        "job {id} is {state}; only failed, cancelled or waiting_external jobs can be retried",
    )
    return s.report(job.to_dict(), f"job {job.id} retried (now {job.state}, queue {job.queue})")


async def cmd_job_cancel(s: Session) -> int:
    job = await _transition(
        s,
        lambda client, job_id: client.cancel(job_id),
        "job {id} is already {state}; only non-terminal jobs can be cancelled",
    )
    return s.report(job.to_dict(), f"job {job.id} cancelled")


async def cmd_job_dump_run(s: Session) -> int:
    client = await s.client()
    print(await client.dump_run(s.args.id, s.args.attempt))
    return 0


RETRY_FAILED_SHOWN = 20  # rows listed by `job retry-failed` (the count covers all)


async def cmd_job_retry_failed(s: Session) -> int:
    if bool(s.args.kind) == bool(s.args.queue):
        # awa-pg's message and exit status, before any connection
        message = "Specify exactly one of --kind or --queue"
        return s.fail(message, text=message)
    client = await s.client()
    if s.args.queue is not None:
        await known_queue(client, s.args.queue)
    else:
        await known_kind(client, s.args.kind)
    result = await client.retry_failed(kind=s.args.kind, queue=s.args.queue)
    jobs = result.jobs
    what = f"kind {s.args.kind}" if s.args.kind else f"queue {s.args.queue}"
    if s.json:
        print_json([j.to_dict() for j in jobs])
    else:
        skipped = result.matched - len(jobs)
        print(
            f"retried {len(jobs)} failed job(s) of {what}"
            + (
                f" (matched {result.matched}; {skipped} raced, hold a taken unique key or "
                "still owe a failure consequence)"
                if skipped > 0
                else ""
            )
        )
        shown = jobs[:RETRY_FAILED_SHOWN]
        if shown:
            print(format_table(JOB_COLUMNS, [_job_row(j) for j in shown]))
        if len(jobs) > len(shown):
            flag = f"--kind {s.args.kind}" if s.args.kind else f"--queue {s.args.queue}"
            print(
                f"... and {len(jobs) - len(shown)} more (awa-fast job list {flag} "
                "--state available)"
            )
    return 0


async def cmd_job_discard(s: Session) -> int:
    client = await s.client()
    await known_kind(client, s.args.kind)  # a typo would discard nothing, silently
    n = await client.discard_failed(s.args.kind)
    return s.report(
        {"kind": s.args.kind, "discarded": n},
        f"discarded {n} failed job(s) of kind {s.args.kind}",
    )


JOB_ID = arg("id", type=positive_int, metavar="ID", help="job id")

JOB = Group(
    "job",
    help="inspect and manage jobs (list, dump, dump-run, retry, cancel, retry-failed, discard)",
    description="Inspect and manage jobs: list, dump, dump-run, retry, "
    "cancel, retry-failed, discard.",
    dest="job_command",
    commands=(
        Command(
            "list",
            cmd_job_list,
            help="list jobs, newest first",
            description="List jobs, newest first, optionally filtered.",
            args=(
                arg("--state", choices=JOB_STATES, help="only jobs in this state"),
                arg("--kind", help="only jobs of this kind"),
                arg("--queue", help="only jobs in this queue"),
                arg(
                    "--limit",
                    type=positive_int,
                    default=50,
                    metavar="N",
                    help="at most N jobs (default: 50)",
                ),
            ),
        ),
        Command(
            "dump",
            cmd_job_dump,
            help="print one job as JSON",
            description="Print every field of one job as JSON (exit 1 if no such job).",
            args=(JOB_ID,),
        ),
        Command(
            "retry",
            cmd_job_retry,
            help="make a failed/cancelled/waiting_external job available again",
            description="Make a failed, cancelled or waiting_external job available "
            "again with attempt 0.\nExit 1 if the job does not exist or "
            "is in another state.",
            args=(JOB_ID,),
        ),
        Command(
            "cancel",
            cmd_job_cancel,
            help="cancel a job that has not finished",
            description="Cancel a non-terminal job (a running attempt is told to "
            "stop).\nExit 1 if the job does not exist or is already "
            "completed, failed or cancelled.",
            args=(JOB_ID,),
        ),
        Command(
            "dump-run",
            cmd_job_dump_run,
            help="print one attempt of a job as JSON",
            description="Print one attempt (run) of a job as JSON: the attempt "
            "number, the error recorded for it, progress, run lease, "
            "timestamps and the whole job.\nDead-lettered jobs are read "
            "from the DLQ. Exit 1 if no such job or attempt.",
            args=(
                JOB_ID,
                arg(
                    "--attempt",
                    type=positive_int,
                    metavar="N",
                    help="attempt number (default: the latest)",
                ),
            ),
        ),
        Command(
            "retry-failed",
            cmd_job_retry_failed,
            help="make every failed job of a kind or queue available again",
            description="Make every failed job of one kind or one queue available "
            "again with attempt 0 (give exactly one of --kind, --queue)."
            "\nJobs whose unique key is now held by another live job are "
            f"skipped and stay failed. Prints the count and the first "
            f"{RETRY_FAILED_SHOWN} jobs (--json: all of them).",
            # awa-pg checks "exactly one" itself (exit 1), not through argparse (exit 2).
            args=(
                arg("--kind", help="retry the failed jobs of this kind"),
                arg("--queue", help="retry the failed jobs in this queue"),
            ),
        ),
        Command(
            "discard",
            cmd_job_discard,
            help="delete the failed jobs of a kind",
            description="Delete every failed job of one kind (jobs whose failure "
            "consequence is still owed are kept). Prints how many.",
            args=(arg("--kind", required=True, help="job kind"),),
        ),
    ),
)
