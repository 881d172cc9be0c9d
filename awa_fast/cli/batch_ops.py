"""``awa-fast batch-ops``: awa's durable batch operations (list, get, preview, submit, cancel,
purge), run by the maintenance leader."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from awa_fast.cli.errors import CliError
from awa_fast.cli.options import positive_int
from awa_fast.cli.output import short_time
from awa_fast.cli.session import Session
from awa_fast.cli.table import Command, Group, arg

BATCH_COLUMNS = (
    ("ID", "id"),
    ("KIND", "op_kind"),
    ("STATE", "state"),
    ("MATCHED", "total_matched"),
    ("PROCESSED", "processed"),
    ("SKIPPED", "skipped"),
    ("ERRORED", "errored"),
    ("SUBMITTED", "submitted_at"),
    ("BY", "submitted_by"),
)


def _json_arg(value: str | None, name: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError as exc:
        raise CliError(f"--{name} is not JSON: {exc}") from None


def _operation_text(op: dict) -> str:
    return (
        f"batch operation {op['id']} ({op['op_kind']}): {op['state']}, matched "
        f"{op['total_matched'] if op['total_matched'] is not None else '-'}, processed "
        f"{op['processed']}, skipped {op['skipped']}, errored {op['errored']}"
        + (f"; last error: {op['last_error']}" if op["last_error"] else "")
    )


async def cmd_batch_list(s: Session) -> int:
    ops = await (await s.client()).list_batch_operations(state=s.args.state, limit=s.args.limit)
    rows = [
        [short_time(o[f]) if f == "submitted_at" else o[f] for _, f in BATCH_COLUMNS] for o in ops
    ]
    s.listing(ops, [h for h, _ in BATCH_COLUMNS], rows, "no batch operations")
    return 0


async def cmd_batch_get(s: Session) -> int:
    op = await (await s.client()).get_batch_operation(s.args.id)
    return s.report(op, _operation_text(op))


async def cmd_batch_preview(s: Session) -> int:
    found = await (await s.client()).preview_batch_operation(
        s.args.op_kind,
        spec=_json_arg(s.args.spec, "spec"),
        filter=_json_arg(s.args.filter, "filter"),
    )
    return s.report(
        found,
        f"{found['total_matched']} queued job(s) match; first ids: "
        f"{', '.join(str(r['id']) for r in found['sample']) or '-'}",
    )


async def cmd_batch_submit(s: Session) -> int:
    flt = _json_arg(s.args.filter, "filter")
    if not flt and not s.args.all:  # the library's own error names its allow_all=True
        s.args.parser.error("give --filter, or --all for every queued job")
    op = await (await s.client()).submit_batch_operation(
        s.args.op_kind,
        spec=_json_arg(s.args.spec, "spec"),
        filter=flt,
        submitted_by=s.args.submitted_by,
        allow_all=s.args.all,
    )
    return s.report(
        op,
        f"submitted batch operation {op['id']} ({op['op_kind']}); the maintenance leader runs it",
    )


async def cmd_batch_cancel(s: Session) -> int:
    op = await (await s.client()).cancel_batch_operation(s.args.id)
    return s.report(op, _operation_text(op))


async def cmd_batch_purge(s: Session) -> int:
    try:
        before = datetime.fromisoformat(s.args.before.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(f"--before is not an ISO 8601 time: {s.args.before!r}") from None
    if before.tzinfo is None:
        before = before.replace(tzinfo=UTC)
    n = await (await s.client()).purge_batch_operations(before, limit=s.args.limit)
    return s.report({"purged": n}, f"purged {n} finalized batch operation(s)")


OPERATION_ID = arg("id", metavar="ID", help="operation id (UUID)")
OPERATION = (
    arg("--op-kind", required=True, choices=("set_priority", "move_queue")),
    arg("--spec", required=True, help='JSON: {"priority": 1-4} or {"queue": Q[, "priority": P]}'),
    arg("--filter", help="JSON: kind, queue, ids, tag, state, created_at_gte, created_at_lt"),
)


def _example(text: str) -> str:
    return (
        f"{text.capitalize()}, e.g. --op-kind set_priority "
        '--filter \'{"queue": "default"}\' --spec '
        "'{\"priority\": 1}'."
    )


BATCH_OPS = Group(
    "batch-ops",
    help="durable batch operations (list, get, preview, submit, cancel, purge)",
    description="awa's durable batch operations (set_priority, "
    "move_queue) over queued jobs, run by the maintenance "
    "leader.",
    dest="batch_command",
    commands=(
        Command(
            "list",
            cmd_batch_list,
            help="list operations, newest first",
            args=(
                arg("--state", help="only operations in this state"),
                arg("--limit", type=positive_int, default=100, help="most rows (default 100)"),
            ),
        ),
        Command("get", cmd_batch_get, help="show one operation", args=(OPERATION_ID,)),
        Command(
            "cancel",
            cmd_batch_cancel,
            help="cancel an operation (cooperative)",
            args=(OPERATION_ID,),
        ),
        Command(
            "preview",
            cmd_batch_preview,
            help="count and sample matching jobs",
            description=_example("count and sample matching jobs"),
            args=OPERATION,
        ),
        Command(
            "submit",
            cmd_batch_submit,
            help="submit an operation",
            description=_example("submit an operation"),
            args=(
                *OPERATION,
                arg(
                    "--submitted-by",
                    help="recorded as the submitter (default: the database user)",
                ),
                arg("--all", action="store_true", help="allow an empty filter (every queued job)"),
            ),
        ),
        Command(
            "purge",
            cmd_batch_purge,
            help="delete finalized operations",
            args=(
                arg("--before", required=True, help="finalized before this ISO 8601 time"),
                arg("--limit", type=positive_int, default=1000, help="most rows (default 1000)"),
            ),
        ),
    ),
)
