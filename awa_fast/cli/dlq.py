"""``awa-fast dlq``: the dead-letter queue (list, depth, retry, retry-all, purge)."""

from __future__ import annotations

import argparse
from typing import Any

from awa_fast.cli.errors import CliError
from awa_fast.cli.names import known_kind, known_queue, note_unknown_filter
from awa_fast.cli.options import iso_time, positive_int
from awa_fast.cli.output import print_json, short_time
from awa_fast.cli.session import Session
from awa_fast.cli.table import Command, Group, arg


def _last_error(errors: list, width: int = 60) -> str | None:
    if not errors:
        return None
    last = errors[-1]
    text = str(last.get("error", last) if isinstance(last, dict) else last)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


DLQ_COLUMNS = ("ID", "KIND", "QUEUE", "ATTEMPT", "REASON", "DLQ_AT", "LAST_ERROR")


def _dlq_filters(a: argparse.Namespace) -> dict:
    out = {"kind": a.kind, "queue": a.queue, "tag": a.tag}
    if hasattr(a, "before_id"):
        out.update(before_id=a.before_id, before_dlq_at=a.before_dlq_at)
    return out


async def cmd_dlq_list(s: Session) -> int:
    client = await s.client()
    entries = await client.list_dlq(**_dlq_filters(s.args), limit=s.args.limit)
    rows = [
        [
            e.job.id,
            e.job.kind,
            e.job.queue,
            f"{e.job.attempt}/{e.job.max_attempts}",
            e.reason,
            short_time(e.dlq_at.isoformat()),
            _last_error(e.job.errors),
        ]
        for e in entries
    ]
    empty = "DLQ is empty" if not any(_dlq_filters(s.args).values()) else "no matching DLQ entries"
    s.listing([e.to_dict() for e in entries], DLQ_COLUMNS, rows, empty)
    if not entries and not s.json:
        await note_unknown_filter(s, client, queue=s.args.queue, kind=s.args.kind)
    return 0


async def cmd_dlq_depth(s: Session) -> int:
    client = await s.client()
    if s.args.queue is not None:
        n = await client.dlq_depth(queue=s.args.queue)
        if s.json:
            print_json({"queue": s.args.queue, "depth": n})
        else:
            print(n)
        if n == 0:
            await note_unknown_filter(s, client, queue=s.args.queue)
        return 0
    by_queue = await client.dlq_depth_by_queue()
    total = sum(by_queue.values())
    rows = [[q, n] for q, n in by_queue.items()]
    s.listing({"total": total, "by_queue": by_queue}, ("QUEUE", "DEPTH"), rows, "DLQ is empty")
    if rows and not s.json:
        print(f"total: {total}")
    return 0


async def cmd_dlq_retry(s: Session) -> int:
    client = await s.client()
    job = await client.retry_from_dlq(s.args.id)  # UniqueConflict: exit 1 with its message
    if job is None:
        raise CliError(f"job {s.args.id} is not in the DLQ")
    return s.report(
        job.to_dict(), f"job {job.id} retried from the DLQ (now {job.state}, queue {job.queue})"
    )


async def _matching(s: Session) -> tuple[Any, dict]:
    """The client and the filters of ``retry-all`` / ``purge``: at least one filter or
    ``--all`` (a usage error otherwise), each queue or kind one something knows of."""
    filters = _dlq_filters(s.args)
    given = any(v is not None for v in filters.values())
    if s.args.all and given:
        s.args.parser.error("--all cannot be combined with a filter")
    if not s.args.all and not given:
        s.args.parser.error("give at least one filter, or --all for every DLQ entry")
    client = await s.client()
    if filters["queue"] is not None:  # a typo would match nothing, silently
        await known_queue(client, filters["queue"])
    if filters["kind"] is not None:
        await known_kind(client, filters["kind"])
    return client, filters


async def cmd_dlq_retry_all(s: Session) -> int:
    client, filters = await _matching(s)
    n = await client.bulk_retry_from_dlq(**filters, allow_all=s.args.all)
    return s.report({"retried": n}, f"retried {n} job(s) from the DLQ")


async def cmd_dlq_purge(s: Session) -> int:
    client, filters = await _matching(s)
    n = await client.purge_dlq(**filters, allow_all=s.args.all)
    return s.report({"purged": n}, f"purged {n} DLQ entr{'y' if n == 1 else 'ies'}")


FILTERS = (
    arg("--kind", help="only entries of this kind"),
    arg("--queue", help="only entries from this queue"),
    arg("--tag", help="only entries carrying this tag"),
)
PAGING = (
    arg("--before-id", type=positive_int, metavar="N", help="only entries with a job id below N"),
    arg(
        "--before-dlq-at",
        type=iso_time,
        metavar="ISO",
        help="only entries dead-lettered before this ISO 8601 time (naive = UTC)",
    ),
)
ALL = arg("--all", action="store_true", help="every DLQ entry (no filter)")

DLQ = Group(
    "dlq",
    help="dead-letter queue (list, depth, retry, retry-all, purge)",
    description="Dead-letter queue: failed jobs of queues with DLQ enabled "
    "(or moved there by an admin), never claimed.\nSubcommands: "
    "list, depth, retry, retry-all, purge.",
    dest="dlq_command",
    commands=(
        Command(
            "list",
            cmd_dlq_list,
            help="list DLQ entries, newest first",
            description="List dead-lettered jobs, newest first, with the reason, "
            "when, and the last error.",
            args=(
                *FILTERS,
                *PAGING,
                arg(
                    "--limit",
                    type=positive_int,
                    default=50,
                    metavar="N",
                    help="at most N entries (default: 50)",
                ),
            ),
        ),
        Command(
            "depth",
            cmd_dlq_depth,
            help="number of DLQ entries (per queue)",
            description="Number of dead-lettered jobs: per queue with a total, or "
            "for one --queue (prints just the number).",
            args=(arg("--queue", help="only this queue"),),
        ),
        Command(
            "retry",
            cmd_dlq_retry,
            help="re-enqueue one DLQ entry",
            description="Move one dead-lettered job back to the job table under the "
            "same id, available with attempt 0 (errors kept).\nExit 1 if "
            "it is not in the DLQ, or if a live job holds its unique key "
            "(nothing changes).",
            args=(arg("id", type=positive_int, metavar="ID", help="job id"),),
        ),
        Command(
            "retry-all",
            cmd_dlq_retry_all,
            help="re-enqueue matching DLQ entries",
            description="Re-enqueue every matching DLQ entry (as `dlq retry`). Give "
            "at least one filter, or --all.\nEntries whose unique key is "
            "held by a live job are skipped. Prints how many were retried.",
            args=(*FILTERS, ALL),
        ),
        Command(
            "purge",
            cmd_dlq_purge,
            help="delete matching DLQ entries",
            description="Delete matching DLQ entries for good. Give at least one "
            "filter, or --all. Prints how many were deleted.",
            args=(*FILTERS, *PAGING, ALL),
        ),
    ),
)
