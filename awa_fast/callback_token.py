"""A registered callback's token and the rules of its inputs (the callback id, the timeout),
shared by the callback operations (``awa_fast/callbacks.py``) and the job a handler receives
(``worker/context.py``), which must not import the operations (issue 30: no import circle)."""

from __future__ import annotations

import uuid
from typing import Any

from awa_fast.errors import ValidationError
from awa_fast.results import MAX_DELAY_S


class CallbackToken:
    """A registered callback: ``id`` (UUID string) and ``timeout_at`` (RFC 3339)."""

    __slots__ = ("id", "timeout_at")

    def __init__(self, callback_id: str, timeout_at: str | None = None):
        self.id = callback_id
        self.timeout_at = timeout_at

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"CallbackToken({self.id!r})"


def parse_callback_id(callback_id: Any) -> uuid.UUID:
    """Raises :class:`ValidationError` (field ``callback_id``) unless it is a UUID."""
    try:
        return uuid.UUID(str(getattr(callback_id, "id", callback_id)))
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValidationError(
            f"callback_id is not a UUID: {callback_id!r}", field="callback_id", limit="UUID"
        ) from exc


def check_timeout(timeout_seconds: Any) -> float:
    """Raises :class:`ValidationError` (a ValueError; field ``timeout_seconds``) for a
    negative, non-finite or non-numeric timeout (seconds), or one over 10 years
    (``results.MAX_DELAY_S``; PostgreSQL's interval arithmetic would overflow)."""
    try:
        value = float(timeout_seconds)
    except (TypeError, ValueError, OverflowError):
        value = float("nan")
    if not (0 <= value <= MAX_DELAY_S):
        raise ValidationError(
            f"timeout_seconds must be a finite number between 0 and "
            f"{MAX_DELAY_S:.0f} (10 years), got {timeout_seconds!r}",
            field="timeout_seconds",
            limit=f">= 0 and <= {MAX_DELAY_S:.0f}",
        )
    return value
