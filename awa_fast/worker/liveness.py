"""Liveness beaten from a thread of its own (issue 28; docs/architecture.md, "Which executions
can overlap").

The heartbeat (and the progress flush that rides on it) runs on a private event loop in a
daemon thread, so a handler that blocks the process's event loop -- a ``time.sleep`` in an
``async def``, a CPU-bound call, a sync driver -- cannot stop the beats: its attempts stay
honestly alive (their handlers are still running) and nobody rescues them by heartbeat age.

What a thread cannot beat through -- a database that does not answer, a network cut, the whole
process stopped (SIGSTOP) -- the same thread turns into an end: once no round of beats has
committed for an attempt for the process's own ``heartbeat_staleness_ms`` (less a tenth) --
the database did not answer, or the row is no longer that attempt's (rescued while the process
was stopped) -- the attempt is handed to ``on_lease_expired`` (the runtime cancels their handlers and gives them
back), before a rescuer using the same staleness may take them. When the process's loop is
blocked as well, nothing can cancel a handler: a launcher's child (``EXIT_ON_BLOCKED_EXPIRY``)
then ends itself, the only end of an execution no rescuer can overlap; a library process logs
an ERROR naming what may run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from awa_fast.worker.heartbeat import Heartbeat

log = logging.getLogger("awa_fast.liveness")

#: The lease ends this fraction of the staleness early: a rescuer's clock starts at the beat's
#: commit, ours at its send, and the cancel needs the process's loop to run.
LEASE_MARGIN = 0.1
#: Seconds between the checks of the lease (at most; a tenth of the lease when shorter).
LEASE_CHECK_S = 0.5
#: Seconds ``close()`` waits for the thread to end.
CLOSE_S = 5.0
#: Set by the launcher's children (supervisor.py): exit when a lease ends on a blocked loop.
EXIT_ON_BLOCKED_EXPIRY = False
#: The exit status of a child that ended itself so (the launcher restarts it).
EXIT_LEASE_LOST = 75


class Liveness:
    """Hosts ``heartbeat``'s loops, the lease check and the extra coroutines of ``tasks`` (say
    the loop-stall watch) on an event loop in a daemon thread.

    Args:
        heartbeat: the process's :class:`Heartbeat` (its connection is used on this thread only).
        main_loop: the process's event loop, where notifications and ``on_lease_expired`` run.
        lease_s: seconds (the process's ``heartbeat_staleness_ms`` / 1000) after a round of
            beats was sent for which the attempts it covered are certainly not rescued by a
            rescuer with the same staleness.
        on_lease_expired: called on ``main_loop`` when the lease of some attempt is about to
            end (it ends the attempts whose lease did).
        oldest_lease: ``time.monotonic()`` from which the oldest lease of a running handler's
            attempt runs (its last beat's send, else its claim), or ``None`` when none runs;
            read from this thread.
        tasks: coroutine functions run on the thread's loop beside the beats until :meth:`close`.
        live_attempts: how many attempts of the process have a handler still running (read
            from this thread when the process's loop did not take the expiry in time).
    """

    def __init__(
        self,
        heartbeat: Heartbeat,
        main_loop: asyncio.AbstractEventLoop,
        *,
        lease_s: float,
        on_lease_expired: Callable[[], None],
        oldest_lease: Callable[[], float | None] = lambda: None,
        tasks: tuple[Callable[[], Coroutine[Any, Any, None]], ...] = (),
        live_attempts: Callable[[], int] = lambda: 0,
    ):
        self.live_attempts = live_attempts
        self.oldest_lease = oldest_lease
        self._taken = 0.0  # when the process's loop last ran an expiry
        self.heartbeat = heartbeat
        self.main_loop = main_loop
        self.lease_s = lease_s
        self.on_lease_expired = on_lease_expired
        self._extra = tasks
        self.loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._beats: asyncio.Task | None = None
        self._started = threading.Event()
        self.expiries = 0  # rounds of expired leases handed to the runtime

    def start(self) -> None:
        """Start the thread (returns once its loop runs)."""
        self.heartbeat.host(self.loop, self.main_loop.call_soon_threadsafe)
        self._thread = threading.Thread(target=self._main, name="awa-liveness", daemon=True)
        self._thread.start()
        self._started.wait()

    @property
    def beating(self) -> bool:
        """The thread runs and its heartbeat loop has not ended (health_check)."""
        thread, beats = self._thread, self._beats
        return thread is not None and thread.is_alive() and beats is not None and not beats.done()

    def run(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Future:
        """Run ``coro`` on the liveness loop; await the result from the process's loop."""
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        finally:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self._end_leftovers())
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def _end_leftovers(self) -> None:
        # What the beats left running (a round given up on, still cancelling): cancelled and
        # awaited here, bounded, so no pending task of a closed loop is destroyed later by the
        # garbage collector in whatever thread it runs ("Task was destroyed but it is pending").
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=CLOSE_S)

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self._started.set()
        hb = self.heartbeat
        self._beats = asyncio.create_task(hb.run(), name="awa-heartbeat")
        tasks = [
            self._beats,
            asyncio.create_task(hb.run_progress(), name="awa-progress"),
            asyncio.create_task(self._watch_lease(), name="awa-lease"),
        ] + [asyncio.create_task(fn(), name="awa-liveness-task") for fn in self._extra]
        await self._stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await hb.close()

    async def _watch_lease(self) -> None:
        check_s = min(LEASE_CHECK_S, self.lease_s / 10)
        ends_after = self.lease_s * (1 - LEASE_MARGIN)
        posted: float | None = None  # when the pending expiry was handed to the process's loop
        while True:
            await asyncio.sleep(check_s)
            oldest = self.oldest_lease()
            now = time.monotonic()
            if oldest is None or now - oldest < ends_after:
                posted = None
                continue
            if posted is None or self._taken >= posted:
                posted = now
                self.expiries += 1
                self.main_loop.call_soon_threadsafe(self._expire)
            elif now - posted >= self.lease_s * LEASE_MARGIN / 2 and self.live_attempts():
                self._blocked_expiry(now - oldest)  # the loop has not run it

    def _expire(self) -> None:
        self._taken = time.monotonic()
        self.on_lease_expired()

    def _blocked_expiry(self, late: float) -> None:
        # The process's loop has not run the expiry: its handlers cannot be cancelled.
        if EXIT_ON_BLOCKED_EXPIRY:
            log.critical(
                "no heartbeat committed for %.1f s and the event loop is blocked: this worker "
                "process exits so that none of its %d running attempt(s) overlaps its rescue",
                late,
                self.live_attempts(),
            )
            logging.shutdown()
            os._exit(EXIT_LEASE_LOST)
        log.error(
            "no heartbeat committed for %.1f s and the event loop is blocked: %d running "
            "attempt(s) of this process may be rescued and run again while they still run",
            late,
            self.live_attempts(),
        )

    async def close(self) -> None:
        """Stop the beats, close the heartbeat connection and end the thread (bounded by
        ``CLOSE_S``; a thread still stuck then is a daemon and dies with the process)."""
        thread = self._thread
        if thread is None:
            return
        self._thread = None
        stop = self._stop
        if stop is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # its loop already ended
                self.loop.call_soon_threadsafe(stop.set)
        await asyncio.to_thread(thread.join, CLOSE_S)
        if thread.is_alive():
            log.warning("the liveness thread did not end within %g s; left behind", CLOSE_S)
