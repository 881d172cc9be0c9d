"""``awa-fast queue``: stats, pause, resume, drain (and awa-pg's hidden ``queue-stats``)."""

from __future__ import annotations

import dataclasses

from awa_fast.cli.names import known_queue
from awa_fast.cli.output import print_json
from awa_fast.cli.session import Session
from awa_fast.cli.table import Command, Group, arg

STAT_COLUMNS = (
    ("QUEUE", "queue"),
    ("QUEUED", "total_queued"),
    ("SCHEDULED", "scheduled"),
    ("AVAILABLE", "available"),
    ("RETRYABLE", "retryable"),
    ("RUNNING", "running"),
    ("FAILED", "failed"),
    ("WAITING_EXT", "waiting_external"),
    ("CONSEQ_PENDING", "consequence_pending"),
    ("OWED", "consequences_owed"),
    ("OVERDUE", "consequences_overdue"),
    ("DONE_1H", "completed_last_hour"),
    ("LAG_S", "lag_seconds"),
    ("UNHANDLED", "unhandled"),
    ("PAUSED", "paused"),
)


async def cmd_queue_stats(s: Session) -> int:
    client = await s.client()
    stats = await client.queue_stats()
    unhandled = await client.unhandled_kinds() if any(st.unhandled for st in stats) else []
    s.listing(
        [dataclasses.asdict(st) for st in stats],
        [h for h, _ in STAT_COLUMNS],
        [[getattr(st, f) for _, f in STAT_COLUMNS] for st in stats],
        "no queues",
    )
    if unhandled and not s.json:
        print(
            "UNHANDLED: available jobs no live worker serves (none works their queue with "
            "a handler for their kind; they wait):"
        )
        for u in unhandled:
            print(f"  queue {u['queue']}: {u['available']} job(s) of kind {u['kind']}")
    return 0


async def cmd_queue_pause(s: Session) -> int:
    client = await s.client()
    if not s.args.create:  # a typo would be stored, and listed from then on
        await known_queue(client, s.args.queue, create_flag="--create")
    await client.pause_queue(s.args.queue, s.args.by)
    if s.json:
        print_json({"queue": s.args.queue, "paused": True, "paused_by": s.args.by})
    else:
        by = f" by {s.args.by}" if s.args.by else ""
        print(f"queue {s.args.queue} paused{by}")
    return 0


async def cmd_queue_resume(s: Session) -> int:
    client = await s.client()
    await known_queue(client, s.args.queue)
    await client.resume_queue(s.args.queue)
    return s.report({"queue": s.args.queue, "paused": False}, f"queue {s.args.queue} resumed")


# ---------------------------------------------------------------------------------------------
# admin: failed jobs, runs, draining


async def cmd_queue_drain(s: Session) -> int:
    client = await s.client()
    await known_queue(client, s.args.queue)
    n = await client.drain_queue(s.args.queue)
    return s.report(
        {"queue": s.args.queue, "drained": n},
        f"drained queue {s.args.queue}: {n} waiting job(s) cancelled",
    )


# ---------------------------------------------------------------------------------------------
# dead-letter queue


QUEUE_NAME = arg("queue", metavar="QUEUE", help="queue name")

QUEUE = Group(
    "queue",
    help="queue statistics, pausing and draining (stats, pause, resume, drain)",
    description="Queue statistics, pausing and draining: stats, pause, resume, drain.",
    dest="queue_command",
    commands=(
        Command(
            "stats",
            cmd_queue_stats,
            help="per-queue job counts",
            description="Per-queue job counts by state, completions in the last "
            "hour, lag (age in seconds of the oldest available job) and "
            "whether the queue is paused.",
        ),
        Command(
            "pause",
            cmd_queue_pause,
            help="stop workers claiming from a queue",
            description="Pause a queue: workers stop claiming its jobs (running jobs finish). "
            "A name no job, worker, schedule or setting knows of is an error (exit 1, with the "
            "closest known names) unless --create is given.",
            args=(
                QUEUE_NAME,
                arg("--by", metavar="WHO", help="who paused it (recorded in queue_meta.paused_by)"),
                arg(
                    "--create",
                    action="store_true",
                    help="pause a queue nothing knows of yet (else an unknown name is an error)",
                ),
            ),
        ),
        Command(
            "resume",
            cmd_queue_resume,
            help="let workers claim from a queue again",
            description="Resume a paused queue and wake its workers (exit 1 for a queue nothing "
            "knows of).",
            args=(QUEUE_NAME,),
        ),
        Command(
            "drain",
            cmd_queue_drain,
            help="cancel every waiting job of a queue",
            description="Drain a queue: cancel every job waiting to run (available, "
            "scheduled, retryable). Running and waiting_external jobs "
            "are left alone. Prints how many were cancelled. Exit 1 for a queue nothing knows "
            "of.",
            args=(QUEUE_NAME,),
        ),
    ),
)

# awa-pg's hidden top-level alias of `queue stats`
QUEUE_STATS = Command("queue-stats", cmd_queue_stats, help=None)
