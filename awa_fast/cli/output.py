"""How the CLI prints: aligned tables, JSON, errors on stderr."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime
from datetime import time as dtime
from typing import Any

PROG = "awa-fast"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Render ``rows`` as an aligned text table under ``headers`` (two spaces between columns).

    Columns whose values are all numbers (not booleans) are right-aligned; ``None`` shows as
    ``-``. Returns the table without a trailing newline.
    """
    cells = [[_cell(v) for v in row] for row in rows]
    ncol = len(headers)
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    numeric = [
        bool(rows)
        and all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in rows)
        for i in range(ncol)
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


def short_time(value: str | None) -> str | None:
    """An RFC 3339 timestamp as ``YYYY-MM-DD HH:MM:SSZ`` (UTC), for tables."""
    if value is None:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return value
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC)
    return dt.strftime("%Y-%m-%d %H:%M:%SZ")


def _json_value(value: Any) -> Any:
    # Times as ISO 8601 (what Job.to_dict and the dashboard's JSON give), anything else as text.
    if isinstance(value, (datetime, date, dtime)):
        return value.isoformat()
    return str(value)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False, default=_json_value))


def print_error(
    message: str,
    *,
    json_output: bool,
    kind: str = "CliError",
    text: str | None = None,
    log_format: str = "text",
    **fields: Any,
) -> None:
    """Report an error on stderr: with ``json_output`` one JSON object on one line,
    ``{"error": message, "type": kind, **fields}``; else as a log object with ``log_format``
    ``"json"``; else ``text`` (default: ``awa-fast: error: <message>``)."""
    if json_output:
        obj = {"error": message, "type": kind, **fields}
        print(json.dumps(obj, ensure_ascii=False, default=str), file=sys.stderr)
    elif log_format == "json":  # errors are log objects too
        import logging

        logging.getLogger("awa_fast.cli").error(message)
    else:
        print(f"{PROG}: error: {message}" if text is None else text, file=sys.stderr)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Within it, what is written to stdout (``sys.stdout`` and file descriptor 1, so a C
    extension or a process started meanwhile too) goes to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def drop_stdout() -> None:
    """Point stdout at /dev/null: it failed (a closed pipe, a full disk), and the interpreter's
    flush at exit would fail again with a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
