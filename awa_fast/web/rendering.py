"""How the dashboard's pages show values: the Jinja2 environment, its filters (times, ages,
JSON) and globals (the job states, the read bounds)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.templating import Jinja2Templates

from awa_fast.job import JobState
from awa_fast.sql import dashboard as bounds

HERE = Path(__file__).parent
STATES = tuple(str(s) for s in JobState)
RETRYABLE_STATES = ("failed", "cancelled", "waiting_external")
FINISHED_STATES = ("completed", "failed", "cancelled")


def _ts(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    seconds = (datetime.now(UTC) - value).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            text = f"{seconds / size:.0f}{unit}"
            break
    else:
        text = f"{seconds:.0f}s"
    return f"in {text}" if future else f"{text} ago"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=True)


def error_parts(entry: Any) -> dict:
    """An ``errors`` entry as ``{attempt, at, head, trace, terminal, raw}`` for the template."""
    if not isinstance(entry, dict):
        return {"attempt": None, "at": None, "head": _pretty(entry), "trace": "", "terminal": False}
    text = str(entry.get("error", ""))
    head, _, trace = text.partition("\n")
    return {
        "attempt": entry.get("attempt"),
        "at": entry.get("at"),
        "head": head,
        "trace": trace,
        "terminal": bool(entry.get("terminal")),
    }


def templates() -> Jinja2Templates:
    """The pages' templates (``templates/``) with the filters and globals above."""
    found = Jinja2Templates(directory=str(HERE / "templates"))
    env = found.env
    env.filters.update(ts=_ts, ago=_ago, pretty=_pretty)
    env.globals.update(
        states=STATES,
        bounds=bounds,
        retryable_states=RETRYABLE_STATES,
        finished_states=FINISHED_STATES,
    )
    return found
