"""``awa-fast cron``: the stored periodic schedules (list, remove)."""

from __future__ import annotations

from awa_fast.cli.errors import CliError
from awa_fast.cli.output import short_time
from awa_fast.cli.session import Session
from awa_fast.cli.table import Command, Group, arg

CRON_COLUMNS = (
    ("NAME", "name"),
    ("CRON", "cron_expr"),
    ("TIMEZONE", "timezone"),
    ("KIND", "kind"),
    ("QUEUE", "queue"),
    ("POLICY", "missed_fire_policy"),
    ("LAST_FIRE", "last_fire_at"),
    ("NEXT_FIRE", "next_fire_at"),
)


async def cmd_cron_list(s: Session) -> int:
    client = await s.client()
    jobs = await client.list_cron_jobs()
    times = {"last_fire_at", "next_fire_at"}
    rows = [
        [short_time(j.get(f)) if f in times else j.get(f) for _, f in CRON_COLUMNS] for j in jobs
    ]
    s.listing(jobs, [h for h, _ in CRON_COLUMNS], rows, "no cron jobs")
    return 0


async def cmd_cron_remove(s: Session) -> int:
    client = await s.client()
    if not await client.delete_cron_job(s.args.name):
        raise CliError(f"no cron job named {s.args.name!r}")
    return s.report({"name": s.args.name, "removed": True}, f"cron job {s.args.name} removed")


CRON = Group(
    "cron",
    help="periodic (cron) schedules (list, remove)",
    description="Periodic (cron) schedules stored in the database: list, remove.",
    dest="cron_command",
    commands=(
        Command(
            "list",
            cmd_cron_list,
            help="list the stored schedules",
            description="List every stored periodic schedule with its cron "
            "expression, timezone, kind, queue, missed-fire policy, last "
            "and next fire time.",
        ),
        Command(
            "remove",
            cmd_cron_remove,
            help="delete a stored schedule",
            description="Delete a stored periodic schedule (exit 1 if there is none "
            "by that name).\nA process that still registers it stores it "
            "again at its next start().",
            args=(arg("name", metavar="NAME", help="schedule name"),),
        ),
    ),
)
