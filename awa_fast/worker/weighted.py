"""Weighted concurrency (awa's weighted mode, ``start(global_max_workers=N)``): the capacity the
queues of one process share beyond their guaranteed ``min_workers``.

Each queue keeps its ``min_workers`` slots to itself (its dispatcher's own ``free`` count). The
rest of ``global_max_workers`` (``N - sum(min_workers)``) is this pool. A queue asks for overflow
permits when it claims; it gets at most its share of the *whole* pool, ``ceil(total * weight /
contending weight)`` where the contending queues are those asking now or holding permits, and
never more than is free. So an idle queue's share goes to the busy ones (work-conserving), and
when several are busy each converges to its weighted share as permits are released. The rule is
awa's (``awa-worker`` ``OverflowPool::try_acquire``); one event loop runs all dispatchers of a
process, so no lock is needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable


class OverflowPool:
    """The shared permits. ``weights`` maps each weighted queue to its weight (>= 1)."""

    def __init__(self, total: int, weights: dict[str, int]):
        self.total = total
        self.weights = dict(weights)
        self.held = {q: 0 for q in weights}
        self.demand = {q: 0 for q in weights}
        self._wakers: dict[str, Callable[[], None]] = {}

    def register(self, queue: str, wake: Callable[[], None]) -> None:
        """``wake()`` is called when permits are released while ``queue`` is asking."""
        self._wakers[queue] = wake

    def try_acquire(self, queue: str, wanted: int) -> int:
        """Grant up to ``wanted`` permits to ``queue`` (0 clears its demand); returns how many."""
        self.demand[queue] = wanted
        if wanted <= 0:
            return 0
        available = self.total - sum(self.held.values())
        if available <= 0:
            return 0
        contending = sum(
            w for q, w in self.weights.items() if self.demand[q] > 0 or self.held[q] > 0
        )
        share = math.ceil(self.total * self.weights[queue] / contending)
        granted = max(0, min(wanted, available, share - self.held[queue]))
        self.held[queue] += granted
        return granted

    def release(self, queue: str, n: int) -> None:
        """Give ``n`` permits of ``queue`` back and wake the other queues that are asking."""
        if n <= 0:
            return
        self.held[queue] = max(0, self.held[queue] - n)
        for other, wake in self._wakers.items():
            if other != queue and self.demand[other] > 0:
                wake()
