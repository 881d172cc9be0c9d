"""``awa-fast storage status``: awa's storage-transition report (one engine here, so status
only)."""

from __future__ import annotations

import json

from awa_fast.cli.output import print_json
from awa_fast.cli.session import Session
from awa_fast.cli.table import Command, Group


async def cmd_storage_status(s: Session) -> int:
    # awa's `storage status`: the report of AsyncClient.storage_status(), a JSON object
    client = await s.client()
    report = json.loads(await client.storage_status())
    if s.json:
        print_json(report)
    else:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


STORAGE = Group(
    "storage",
    help="storage engine status (status)",
    description="The storage engine's state, in awa's storage-transition report shape.",
    dest="storage_command",
    commands=(
        Command(
            "status",
            cmd_storage_status,
            help="print the storage status report (JSON)",
            description="Print AsyncClient.storage_status() as JSON: current_engine and "
            "active_engine are awa_fast, state active; awa-fast has one engine, so no "
            "transition is possible (see docs/compat.md).",
        ),
    ),
)
