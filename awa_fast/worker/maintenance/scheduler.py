"""The pass scheduler: runs each leader pass at its interval, one task per pass, and records
its health (:class:`LoopHealth`).

Every pass runs the same way, by its loop or by hand (:meth:`PassScheduler.run_pass`, what
tests call to run one pass directly): its rows left stuck are published, its health updated,
its outcome logged and :attr:`PassScheduler.passed` fired. A loop survives every error of its
pass and backs off (``interval * 2^(failures-1)``, at most ``MAX_BACKOFF_S``); it ends only when
the pass finds this process deposed (the leader steps down) or the pool closed (no pass can
run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from awa_fast import metrics
from awa_fast.retryable import Retry, classify
from awa_fast.worker.maintenance.leader import Deposed
from awa_fast.worker.observe import Signal

log = logging.getLogger("awa_fast.maintenance")

MAX_BACKOFF_S = 30.0  # a failing loop retries after interval * 2^(failures-1), at most this
DEAD_AFTER_FAILURES = 3  # a loop that failed this many passes in a row is reported dead
TASK_PREFIX = "awa-maint-"  # a loop's task is named this plus the pass's name


class PassIncomplete(Exception):
    """Some steps of a maintenance pass failed (each logged); the other steps ran. Raised at
    the end of the pass so the loop's health reports it."""


@dataclasses.dataclass
class LoopHealth:
    """One maintenance loop as ``health_check`` reports it.

    Attributes:
        alive: its task is running and it did not fail its last ``DEAD_AFTER_FAILURES`` passes.
        passes: passes completed without error.
        failures: consecutive failed passes (0 after a good one).
        last_error: ``"ExceptionType: message"`` of the latest failure, or ``None``.
        stuck_rows: rows its passes left unchanged and still remember (a trigger refuses
            them, bad data): each warned about once, retried apart every pass while the rows
            behind them go on (``bulk.run_isolated``; ADR 009). For ``prune`` also the rows of
            finished slices whose truncate the last pass saw refused (kept past retention).
            Not a failure of the loop.
    """

    name: str
    alive: bool = True
    passes: int = 0
    failures: int = 0
    last_error: str | None = None
    stuck_rows: int = 0


@dataclasses.dataclass(frozen=True)
class Pass:
    """One kind of leader pass.

    Attributes:
        name: the loop's name (``LoopHealth.name``, the ``passed`` signal, the task name).
        interval_s: seconds from the end of one pass to the start of the next.
        run: one pass; its result goes to the ``passed`` signal.
        stuck: the rows its passes left stuck (``LoopHealth.stuck_rows``), published as
            ``metrics.MAINTENANCE_STUCK_ROWS`` after every pass; ``None``: it reports none.
    """

    name: str
    interval_s: float
    run: Callable[[], Awaitable[Any]]
    stuck: Callable[[], int] | None = None


class PassScheduler:
    """The leader's ``passes``, each run every ``interval_s`` by a task of its own from
    :meth:`start` to :meth:`stop`, or once by :meth:`run_pass`. ``on_deposed()`` is called when a
    pass raises :class:`Deposed` (the election steps down).

    Attributes:
        passed: fired after each pass with ``(name, result or exception)``.
        health: each pass's :class:`LoopHealth`, by name (kept after :meth:`stop`).
        tasks: the running loops' tasks (named ``awa-maint-<name>``).
    """

    def __init__(self, passes: list[Pass], on_deposed: Callable[[], None]):
        self._on_deposed = on_deposed
        self._passes = {p.name: p for p in passes}
        self.health: dict[str, LoopHealth] = {}
        self.tasks: list[asyncio.Task] = []
        self.passed = Signal("maintenance pass")

    def start(self) -> None:
        """Start one loop per pass (fresh health), the first pass of each at once."""
        self.health = {name: LoopHealth(name) for name in self._passes}
        self.tasks = [
            asyncio.create_task(self._loop(p), name=f"{TASK_PREFIX}{p.name}")
            for p in self._passes.values()
        ]

    async def stop(self) -> None:
        """Cancel every loop and wait for them to end."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []

    def report(self) -> dict[str, LoopHealth]:
        """Each loop's health, a loop whose task ended marked dead, with its stuck rows now."""
        for task in self.tasks:
            name = task.get_name().removeprefix(TASK_PREFIX)
            if task.done() and name in self.health:
                self.health[name].alive = False
        for name, health in self.health.items():
            stuck = self._passes[name].stuck if name in self._passes else None
            health.stuck_rows = stuck() if stuck is not None else 0
        return dict(self.health)

    async def run_pass(self, name: str) -> Any:
        """Run pass ``name`` once now, as its loop does: publish its stuck rows, record its
        health, log its failure and fire :attr:`passed`. Returns the pass's result.

        Raises:
            KeyError: no pass of that name.
            Deposed: another process took leadership (``on_deposed`` was called).
            Exception: whatever the pass raised, after it was recorded.
        """
        p = self._passes[name]
        health = self.health.setdefault(name, LoopHealth(name))
        try:
            try:
                result = await p.run()
            finally:
                if p.stuck is not None:
                    metrics.MAINTENANCE_STUCK_ROWS.labels(name).set(p.stuck())
        except asyncio.CancelledError:
            raise
        except Deposed as exc:
            log.warning("maintenance %s: %s; stepping down", name, exc)
            self._on_deposed()
            raise
        except Exception as exc:  # every loop survives every error, logged and backed off
            self._failed(p, health, exc)
            raise
        health.passes += 1
        health.failures = 0
        health.alive = True
        self.passed.fire((name, result))
        return result

    def _failed(self, p: Pass, health: LoopHealth, exc: Exception) -> None:
        health.last_error = f"{type(exc).__name__}: {exc}"
        if _closed(exc):  # ... but a closed pool: no pass can run
            log.info("maintenance %s stops: %s", p.name, exc)
            health.alive = False
        else:
            health.failures += 1
            health.alive = health.failures < DEAD_AFTER_FAILURES
            log.error(
                "maintenance %s failed (%d in a row; next try in %.1f s)",
                p.name,
                health.failures,
                _retry_in(p, health),
                exc_info=True,
            )
        self.passed.fire((p.name, exc))

    async def _loop(self, p: Pass) -> None:
        while True:
            try:
                await self.run_pass(p.name)
                delay = p.interval_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, Deposed) or _closed(exc):
                    return
                delay = _retry_in(p, self.health[p.name])
            # Python 3.11's wait_for (inside the pool) can swallow a cancel that lands as a
            # connection is handed out: honour a pending cancel here so shutdown never hangs.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            await asyncio.sleep(delay)


def _closed(exc: BaseException) -> bool:
    return classify(exc) is Retry.CLOSED


def _retry_in(p: Pass, health: LoopHealth) -> float:
    """Seconds before a failing pass runs again: its interval doubled per failure in a row."""
    return min(max(p.interval_s, 0.1) * 2 ** (health.failures - 1), MAX_BACKOFF_S)
