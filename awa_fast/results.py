"""Handler results (awa-pg's): return one of these from a handler to choose the outcome.

Returning ``None`` or any other value completes the job.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, ClassVar

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


def outcome_is(outcome: str) -> Callable[[Any], bool]:
    """A result object's ``is_<outcome>()`` method: True when its ``outcome`` attribute equals
    ``outcome`` (so a class declares which outcomes it can have, once each)."""

    def check(self: Any) -> bool:
        return self.outcome == outcome

    check.__name__ = f"is_{outcome}"
    check.__doc__ = f"True when the outcome is ``{outcome!r}``."
    return check


class _Delayed:
    """A result that carries a delay: ``seconds`` validated by ``_delay``, errors and repr
    under ``_what`` (the public class's name, also for a user's subclass of it)."""

    __slots__ = ("seconds",)
    _what: ClassVar[str]

    def __init__(self, seconds: float):
        self.seconds = _delay(seconds, self._what)

    def __repr__(self) -> str:
        return f"{self._what}({self.seconds})"


class RetryAfter(_Delayed):
    """Fail this attempt and retry after ``seconds`` (float seconds, 0 to 10 years). On the final
    attempt the job is exhausted (failed) instead.

    Raises:
        ValueError: ``seconds`` is negative, not finite or over 10 years."""

    __slots__ = ()
    _what = "RetryAfter"


class Snooze(_Delayed):
    """Put the job back for ``seconds`` (float seconds, 0 to 10 years) without counting the
    attempt.

    Raises:
        ValueError: ``seconds`` is negative, not finite or over 10 years."""

    __slots__ = ()
    _what = "Snooze"


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
