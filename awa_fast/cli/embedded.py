"""``awa-fast embedded``: the persistent embedded PostgreSQL (stop, url)."""

from __future__ import annotations

from awa_fast.cli.output import print_json
from awa_fast.cli.session import Session
from awa_fast.cli.table import COMMON_NO_DB, Command, Group


def cmd_embedded_stop(s: Session) -> int:
    from awa_fast import embedded

    stopped = embedded.stop_persistent()
    data_dir = str(embedded.default_data_dir())
    if s.json:
        print_json({"stopped": stopped, "data_dir": data_dir})
    elif stopped:
        print(f"stopped embedded PostgreSQL at {data_dir}")
    else:
        print(f"embedded PostgreSQL at {data_dir} was not running")
    return 0


def cmd_embedded_url(s: Session) -> int:
    from awa_fast import embedded

    url = embedded.ensure_running()
    return s.report({"url": url, "data_dir": str(embedded.default_data_dir())}, url)


EMBEDDED = Group(
    "embedded",
    help="manage the persistent embedded PostgreSQL (stop, url)",
    description="Manage the persistent embedded PostgreSQL used when no "
    "database URL is configured (data directory: $AWA_PG_DATA, "
    "else $XDG_DATA_HOME/awa-fast/pg18 (~/.local/share/awa-fast/pg18), or "
    "/var/lib/awa-fast/pg18 as root).",
    dest="embedded_command",
    commands=(
        Command(
            "stop",
            cmd_embedded_stop,
            help="stop the embedded server",
            description="Stop the persistent embedded PostgreSQL if it is running.",
            common=COMMON_NO_DB,
        ),
        Command(
            "url",
            cmd_embedded_url,
            help="print the embedded server's URL (starting it if needed)",
            description="Start the persistent embedded PostgreSQL if needed and "
            "print its connection URL.",
            common=COMMON_NO_DB,
        ),
    ),
)
