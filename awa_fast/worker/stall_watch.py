"""Detects the process's event loop stalling -- a handler that blocks it, a long GC pause, CPU
starvation -- from the liveness thread, and says which handler held it (issue 28).

Every ``probe_s`` the watch posts a no-op to the process's loop and notes when it ran. A probe
not run within ``threshold_s`` is a stall: while it lasts, the watch samples the loop thread's
stack (``sys._current_frames``) for the handler whose frame is on it (``locate``). When the
probe finally runs, one WARNING names the stall's length and the handler's kind and job id,
and ``awa_fast_event_loop_stalls_total`` / ``awa_fast_event_loop_stall_seconds_total`` count it.
A stall still going on after ``long_s`` is reported once while it lasts, too.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from awa_fast import metrics

log = logging.getLogger("awa_fast.stall")

#: Seconds between probes of the process's loop.
PROBE_S = 0.1
#: A probe that waits longer than this many seconds is a stall.
THRESHOLD_S = 1.0


class StallWatch:
    """Watches ``main_loop`` (run by thread ``loop_thread_id``) from another loop's coroutine
    :meth:`run`.

    Args:
        main_loop: the loop to watch.
        loop_thread_id: ``threading.get_ident()`` of the thread running ``main_loop``.
        locate: given a frame of that thread's stack, ``(kind, job_id)`` when the frame is the
            one a handler runs under, else ``None``.
        threshold_s: seconds a probe may wait before it counts as a stall.
        long_s: seconds after which a stall still going on is reported while it lasts.
    """

    def __init__(
        self,
        main_loop: asyncio.AbstractEventLoop,
        loop_thread_id: int,
        locate: Callable[[FrameType], tuple[str, int] | None],
        *,
        threshold_s: float = THRESHOLD_S,
        long_s: float = 10.0,
        probe_s: float = PROBE_S,
    ):
        self.main_loop = main_loop
        self.loop_thread_id = loop_thread_id
        self.locate = locate
        self.threshold_s = threshold_s
        self.long_s = max(long_s, threshold_s)
        self.probe_s = probe_s
        self.stalls = 0  # stalls ended so far
        self.last: tuple[float, tuple[str, int] | None] | None = None  # (seconds, holder)
        self._ran: dict[int, float] = {}  # probe number -> monotonic time it ran

    def _ran_at(self, n: int) -> None:
        self._ran[n] = time.monotonic()

    def holder(self) -> tuple[str, int] | None:
        """The ``(kind, job_id)`` whose handler is on the loop thread's stack now, if any."""
        frame = sys._current_frames().get(self.loop_thread_id)
        while frame is not None:
            found = self.locate(frame)
            if found is not None:
                return found
            frame = frame.f_back
        return None

    async def run(self) -> None:
        n = 0
        while True:
            await asyncio.sleep(self.probe_s)
            n += 1
            posted = time.monotonic()
            try:
                self.main_loop.call_soon_threadsafe(self._ran_at, n)
            except RuntimeError:  # the process's loop is closed
                return
            holder: tuple[str, int] | None = None
            told = False
            while n not in self._ran:
                await asyncio.sleep(self.probe_s)
                waited = time.monotonic() - posted
                if waited >= self.threshold_s and holder is None:
                    holder = self.holder()
                if waited >= self.long_s and not told:
                    told = True
                    log.warning(
                        "the event loop has been blocked for %.1f s so far%s",
                        waited,
                        _by(holder),
                        extra=_extra(waited, holder),
                    )
            stalled = self._ran.pop(n) - posted
            if stalled >= self.threshold_s:
                self._ended(stalled, holder)

    def _ended(self, seconds: float, holder: tuple[str, int] | None) -> None:
        self.stalls += 1
        self.last = (seconds, holder)
        metrics.loop_stalled(seconds)
        log.warning(
            "the event loop was blocked for %.1f s%s: its attempts' heartbeats went on from "
            "the liveness thread, but nothing else of this process ran meanwhile; run blocking "
            "work in a def handler or with asyncio.to_thread",
            seconds,
            _by(holder),
            extra=_extra(seconds, holder),
        )


def _by(holder: tuple[str, int] | None) -> str:
    if holder is None:
        return " (not inside a handler)"
    return f" by the handler of job {holder[1]} (kind {holder[0]!r})"


def _extra(seconds: float, holder: tuple[str, int] | None) -> dict[str, Any]:
    return {
        "stall_s": round(seconds, 3),
        "kind": None if holder is None else holder[0],
        "job_id": None if holder is None else holder[1],
    }
