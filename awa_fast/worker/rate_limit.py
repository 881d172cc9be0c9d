"""Per-queue claim rate limit: a token bucket local to one dispatcher (awa's ADR-010).

``max_rate`` tokens per second refill a bucket of ``burst`` tokens; each claimed job takes one.
A dispatcher claims at most ``min(free slots, tokens)`` rows, so over any window of ``t``
seconds one process claims at most ``burst + max_rate * t`` jobs of that queue. The limit is
per process, as in awa: N processes working the queue may claim N times as much.
"""

from __future__ import annotations

import time


class TokenBucket:
    """Args: max_rate: tokens per second (> 0); burst: bucket size in tokens (>= 1)."""

    def __init__(self, max_rate: float, burst: int, clock=time.monotonic):
        self.max_rate = max_rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.max_rate)
        self._at = now

    def available(self) -> int:
        """Whole tokens available now."""
        self._refill()
        return int(self._tokens)

    def take(self, n: int) -> None:
        """Spend ``n`` tokens (taken before a claim; :meth:`refund` returns the unused)."""
        self._refill()
        self._tokens -= n

    def refund(self, n: int) -> None:
        """Give back ``n`` tokens taken before a claim that returned fewer rows (never past
        ``burst``)."""
        if n > 0:
            self._refill()
            self._tokens = min(float(self.burst), self._tokens + n)

    def wait_s(self) -> float:
        """Seconds until one whole token is available (0 if one is)."""
        self._refill()
        return max(0.0, (1.0 - self._tokens) / self.max_rate)
