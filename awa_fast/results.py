"""Handler results (awa-pg's): return one of these from a handler to choose the outcome.

Returning ``None`` or any other value completes the job.
"""

from __future__ import annotations


class RetryAfter:
    """Fail this attempt and retry after ``seconds`` (float seconds, >= 0). On the final attempt
    the job is exhausted (failed) instead."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float):
        if seconds < 0:
            raise ValueError("RetryAfter seconds must be >= 0")
        self.seconds = float(seconds)

    def __repr__(self) -> str:
        return f"RetryAfter({self.seconds})"


class Snooze:
    """Put the job back for ``seconds`` (float seconds, >= 0) without counting the attempt."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float):
        if seconds < 0:
            raise ValueError("Snooze seconds must be >= 0")
        self.seconds = float(seconds)

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
