"""Log output of the CLI and of the worker processes, on the standard :mod:`logging` module.

``text`` (the default) is one human line per record. ``json`` is one JSON object per line,
formatted by python-json-logger: ``ts`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``,
``message``, then any fields the process adds to every line (a worker child: ``child``,
``pid``) and the record's own ``extra`` fields (``kind``, ``job_id``, ``attempt``, ...), and
``exc_info`` with the traceback when there is one.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from pythonjsonlogger.json import JsonFormatter

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _JsonFormatter(JsonFormatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


def formatter(
    log_format: str, *, text_format: str = TEXT_FORMAT, static: dict[str, Any] | None = None
) -> logging.Formatter:
    """A formatter for ``log_format`` (``"text"`` with ``text_format``, or ``"json"`` with
    ``static`` fields on every line).

    Raises:
        ValueError: ``log_format`` is not one of :data:`FORMATS`.
    """
    if log_format == "text":
        return logging.Formatter(text_format)
    if log_format == "json":
        return _JsonFormatter(
            "{asctime}{levelname}{name}{message}",
            style="{",
            rename_fields={"asctime": "ts", "levelname": "level", "name": "logger"},
            static_fields=dict(static or {}),
            json_ensure_ascii=False,
        )
    raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {log_format!r}")


def configure(
    log_format: str,
    level: str,
    *,
    stream: TextIO | None = None,
    text_format: str = TEXT_FORMAT,
    static: dict[str, Any] | None = None,
) -> None:
    """Make the root logger write records of ``level`` (``"debug"`` ... ``"error"``) and above
    to ``stream`` (default stderr) in ``log_format``, replacing its handlers.

    Raises:
        ValueError: an unknown ``log_format`` or ``level``.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(log_format, text_format=text_format, static=static))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def line(fmt: logging.Formatter, logger: str, message: str, level: int = logging.INFO) -> str:
    """``message`` formatted by ``fmt`` as a record of ``logger`` made now (for output that a
    process prints itself, such as the launcher's status lines)."""
    return fmt.format(
        logging.makeLogRecord(
            {
                "name": logger,
                "levelno": level,
                "levelname": logging.getLevelName(level),
                "msg": message,
            }
        )
    )
