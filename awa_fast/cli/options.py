"""Argument types and the help texts several commands share (``--help`` imports no more)."""

from __future__ import annotations

import argparse
import math
from datetime import UTC, datetime

from awa_fast.app_loader import DEBUG_ENV


def _int_in(text: str, low: int, high: int, noun: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {noun}: {text!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be in {low}..{high}, got {text}")
    return value


def positive_int(text: str) -> int:
    """An id or a limit: an integer in 1..2**63-1 (bigint in the database)."""
    return _int_in(text, 1, 2**63 - 1, "integer")


def port(text: str) -> int:
    """A TCP port, 0..65535 (0: any free one)."""
    return _int_in(text, 0, 65535, "port")


def positive_float(text: str) -> float:
    """A finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not 0 < value < math.inf:  # NaN and inf too: a drain of `inf` s overflowed at SIGTERM
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def iso_time(text: str) -> datetime:
    """An ISO 8601 timestamp; a naive one is taken as UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid ISO 8601 timestamp: {text!r}") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


TRACEBACK_HELP = (
    f"after an error's one line, print its whole traceback (also: {DEBUG_ENV}=1); for "
    "worker and check also of the application's own errors (an import that raises)"
)
LOG_FORMATS = ("text", "json")  # awa_fast.log_format.FORMATS (not imported: --help stays light)
LOG_FORMAT_HELP = (
    "logs as text lines (default) or one JSON object per line (ts, level, logger, "
    "message, extra fields such as kind, job_id, attempt); for worker: the "
    "children's logs and the launcher's status lines"
)
DB_HELP = (
    "PostgreSQL URL (default: $AWA_FAST_DATABASE_URL, $DATABASE_URL, else the embedded server)"
)
SCHEMA_HELP = (
    "the schema of the awa-fast objects to use (default: $AWA_FAST_SCHEMA, else awa_fast); "
    "each schema of a database is its own queue system"
)
WORKER_DB_HELP = (
    "PostgreSQL URL, overriding the client's (default: the URL the client was built "
    "with, else $AWA_FAST_DATABASE_URL, $DATABASE_URL, else the embedded server)"
)
