"""Handler results (awa-pg's): return one of these from a handler to choose the outcome.

Returning ``None`` or any other value completes the job.
"""

from __future__ import annotations

import math
import numbers

# Longest RetryAfter / Snooze: 10 years, so run_at always stays a representable timestamp.
MAX_DELAY_S = 10 * 365 * 86400.0


def _delay(seconds: float, what: str) -> float:
    # a number only: float("5") would accept a string, float(10**400) raises OverflowError
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise ValueError(f"{what} seconds must be a number, got {seconds!r}")
    try:
        value = float(seconds)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or value < 0 or value > MAX_DELAY_S:
        raise ValueError(
            f"{what} seconds must be a finite number between 0 and {MAX_DELAY_S:.0f}"
            f" (10 years), got {seconds!r}"
        )
    return value


class RetryAfter:
    """Fail this attempt and retry after ``seconds`` (float seconds, 0 to 10 years). On the final
    attempt the job is exhausted (failed) instead.

    Raises:
        ValueError: ``seconds`` is negative, not finite or over 10 years."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float):
        self.seconds = _delay(seconds, "RetryAfter")

    def __repr__(self) -> str:
        return f"RetryAfter({self.seconds})"


class Snooze:
    """Put the job back for ``seconds`` (float seconds, 0 to 10 years) without counting the
    attempt.

    Raises:
        ValueError: ``seconds`` is negative, not finite or over 10 years."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float):
        self.seconds = _delay(seconds, "Snooze")

    def __repr__(self) -> str:
        return f"Snooze({self.seconds})"


class Cancel:
    """Cancel the job (terminal); ``reason`` is recorded as ``cancelled: <reason>``."""

    __slots__ = ("reason",)

    def __init__(self, reason: str = "cancelled by handler"):
        self.reason = reason

    def __repr__(self) -> str:
        return f"Cancel({self.reason!r})"


class WaitForCallback:
    """Park the job in ``waiting_external`` until the registered callback resolves.
    ``token`` is the value :meth:`register_callback` returned (or its id string)."""

    __slots__ = ("callback_id",)

    def __init__(self, token):
        self.callback_id = str(getattr(token, "id", token))

    def __repr__(self) -> str:
        return f"WaitForCallback({self.callback_id!r})"
