"""The whole CLI's parser: the global options, and the command table in the order ``--help``
lists it."""

from __future__ import annotations

import argparse
import sys

from awa_fast.cli.batch_ops import BATCH_OPS
from awa_fast.cli.bench import BENCH
from awa_fast.cli.consequences import CHECK, CONSEQUENCES
from awa_fast.cli.cron import CRON
from awa_fast.cli.demo import DEMO
from awa_fast.cli.dlq import DLQ
from awa_fast.cli.embedded import EMBEDDED
from awa_fast.cli.jobs import JOB
from awa_fast.cli.migrate import MIGRATE
from awa_fast.cli.options import DB_HELP, LOG_FORMAT_HELP, LOG_FORMATS, SCHEMA_HELP, TRACEBACK_HELP
from awa_fast.cli.output import PROG, drop_stdout, print_json
from awa_fast.cli.queues import QUEUE, QUEUE_STATS
from awa_fast.cli.serve import SERVE
from awa_fast.cli.storage import STORAGE
from awa_fast.cli.table import JSON_HELP, Command, Group, Parser, add_commands
from awa_fast.cli.worker import WORKER

# Every command, once: the order of `awa-fast --help`.
TABLE: tuple[Command | Group, ...] = (
    MIGRATE,
    JOB,
    QUEUE,
    QUEUE_STATS,
    DLQ,
    CRON,
    STORAGE,
    BATCH_OPS,
    EMBEDDED,
    BENCH,
    CHECK,
    CONSEQUENCES,
    SERVE,
    WORKER,
    DEMO,
)


DESCRIPTION = """\
awa-fast: the Awa job queue CLI for awa-fast, administering a job queue stored in PostgreSQL.

Database: --database-url URL, else $AWA_FAST_DATABASE_URL, else $DATABASE_URL, else a
persistent embedded PostgreSQL (started on first use; see `awa-fast embedded`)."""

EPILOG = """\
exit status: 0 success, 1 error (database/connection error, unknown job, wrong state),
2 usage error, 130 Ctrl-C (worker and serve stop gracefully on Ctrl-C or SIGTERM and exit 0;
demo: 143 after SIGTERM, 129 after SIGHUP; serve: 3 when the web server cannot start, 142 when a
stop outlasts its 20 s limit). With --json an error is
one JSON object on stderr: {"error": MESSAGE, "type": ERROR_CLASS} (usage errors: type
UsageError, and "usage"); else one line, and with --traceback (or AWA_FAST_DEBUG=1) the whole
traceback after it.

examples:
  awa-fast migrate
  awa-fast job list --state failed --limit 20
  awa-fast job dump 42
  awa-fast job retry-failed --kind send_email
  awa-fast --json queue stats
  awa-fast dlq list --queue billing
  awa-fast dlq retry-all --kind send_email
  awa-fast demo
  awa-fast worker myapp.jobs:client --processes 4 --queues default:10,emails:4"""


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("awa-fast")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: ``awa-fast X.Y.Z``, or ``{"version": "X.Y.Z"}`` when the parser was built
    for JSON output."""

    def __init__(self, option_strings, dest, json_output: bool = False, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.json_output = json_output

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            if self.json_output:
                print_json({"version": _version()})
            else:
                print(f"{PROG} {_version()}")
            sys.stdout.flush()
        except OSError:  # a closed pipe, a full disk: quietly, as a command's output
            drop_stdout()
            parser.exit(1)
        parser.exit()


def build_parser(*, json_output: bool = False) -> argparse.ArgumentParser:
    """The argparse parser of the whole CLI, built from :data:`TABLE` (each command's handler
    in ``func``, its own parser in ``parser``).

    Args:
        json_output: ``--version`` prints ``{"version": ...}`` (give
            :func:`~awa_fast.cli.entry.json_requested`).

    Its ``parse_args`` raises :class:`~awa_fast.cli.errors.UsageError` where argparse would
    print a usage error and exit 2 (``--help`` and ``--version`` still print and exit 0).
    """
    raw = argparse.RawDescriptionHelpFormatter
    parser = Parser(prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=raw)
    parser.add_argument("--database-url", metavar="URL", default=None, help=DB_HELP)
    parser.add_argument("--schema", metavar="NAME", default=None, help=SCHEMA_HELP)
    parser.add_argument("--json", action="store_true", default=False, help=JSON_HELP)
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text", help=LOG_FORMAT_HELP)
    parser.add_argument("--traceback", action="store_true", default=False, help=TRACEBACK_HELP)
    parser.add_argument(
        "--version",
        action=_VersionAction,
        json_output=json_output,
        help="print the version and exit",
    )
    add_commands(parser, TABLE)
    return parser
