"""The maintenance service: the election loop and, while this process leads, the leader passes
(promote, rescue, callback rescue, prune, hot vacuum, the counter fold and the runtime's extra
tasks) on one :class:`PassScheduler`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from awa_fast import metrics
from awa_fast.repo.maintenance import Rescued
from awa_fast.schema_binding import DEFAULT, SchemaBinding
from awa_fast.worker.maintenance.config import MaintenanceConfig, check_retention
from awa_fast.worker.maintenance.leader import Fenced, Leadership
from awa_fast.worker.maintenance.passes import PassContext
from awa_fast.worker.maintenance.promote import promote as promote_due
from awa_fast.worker.maintenance.prune import Prune
from awa_fast.worker.maintenance.rescue import Rescue
from awa_fast.worker.maintenance.scheduler import (
    DEAD_AFTER_FAILURES,
    LoopHealth,
    Pass,
    PassScheduler,
)
from awa_fast.worker.maintenance.vacuum import HotVacuum
from awa_fast.worker.observe import Signal

log = logging.getLogger("awa_fast.maintenance")

# The bulk.Recurring (by ``what``) of each leader loop's passes that redo rows (stuck_rows).
_PASSES_OF = {
    "promote": ("promote",),
    "rescue": ("rescue",),
    "callback_rescue": ("callback rescue",),
    "prune": ("stale mark settle", "DLQ prune", "queue retention"),
}
# The loops that report stuck rows (metrics.MAINTENANCE_STUCK_ROWS's ``loop`` label).
STUCK_LOOPS = tuple(_PASSES_OF)


class Maintenance:
    """Runs the leader election loop and, while leader, the maintenance loops.

    ``on_rescued`` (optional) is awaited with the rescued rows after each rescue commits
    (registered Rescued specs). ``consequence_kinds()`` lists the kinds whose final-attempt
    rescue goes to ``consequence_pending`` instead of ``failed`` (the settler then settles them
    in the reconciler: the failure consequence and exhausted specs). ``own_attempts()`` lists
    the attempts this process still runs (``"id:run_lease"``): a stale heartbeat never rescues
    them (their beats stalled; a passed deadline still does). ``extra_tasks`` are
    ``(interval_s, fn)``; ``fn(fenced)`` gets :meth:`fenced` for its write transactions.
    ``pooler`` is the client's connection mode: ``"transaction"`` elects by the lease row
    alone (on a connection of its own without session state); otherwise the advisory lock on
    the lock connection comes first (ADR 028).

    Raises:
        ConfigError: a retention awa does not accept (:func:`check_retention`).
    """

    def __init__(
        self,
        database_url: str,
        pool_getter: Callable,
        config: MaintenanceConfig,
        on_rescued: Callable[[list[Rescued]], Awaitable[None]] | None = None,
        extra_tasks: list[tuple[float, Callable[[Fenced], Awaitable[Any]]]] | None = None,
        consequence_kinds: Callable[[], list[str]] = list,
        known_kinds: Callable[[], list[str]] = list,
        own_attempts: Callable[[], list[str]] = list,
        pooler: str | None = None,
        binding: SchemaBinding = DEFAULT,
    ):
        check_retention(config)
        self.database_url = database_url
        self.config = config
        self.binding = binding
        self.pooler = pooler
        self.leader = Leadership(database_url, pool_getter, config, pooler, binding)
        self.via_lock = self.leader.via_lock
        self.ctx = PassContext(config, pool_getter, self.leader.fenced)
        self.counts = self.ctx.counts
        self.rescuer = Rescue(self.ctx, on_rescued, consequence_kinds, known_kinds, own_attempts)
        self.pruner = Prune(self.ctx)
        self.vacuum = HotVacuum(self.ctx, database_url, pooler, binding)
        self.extra_tasks = extra_tasks or []
        self._deposed = asyncio.Event()
        self.scheduler = PassScheduler(self._passes(), on_deposed=self._deposed.set)
        # fired after each pass of a leader loop with (loop name, its result or exception)
        self.passed = self.scheduler.passed
        # consecutive election attempts that failed with an error (not "another process
        # leads") and the latest error: health_check reports an election that keeps failing
        self.election_failures = 0
        self.election_error: str | None = None
        # fired after each election attempt of run() (value: its exception, or None)
        self.elections = Signal("election attempt")
        # fired when this process takes or gives up leadership (value: is_leader)
        self.leadership = Signal("leadership")

    @property
    def is_leader(self) -> bool:
        """Whether this process holds the lease (``Leadership.is_leader``)."""
        return self.leader.is_leader

    @property
    def epoch(self) -> int | None:
        """The epoch this process took when elected (``None`` before; kept after stepping
        down: its passes are fenced at it)."""
        return self.leader.epoch

    @property
    def loops(self) -> dict[str, LoopHealth]:
        """The health of each leader loop, by name, as last recorded (see :meth:`loop_health`)."""
        return self.scheduler.health

    def _passes(self) -> list[Pass]:
        c = self.config
        rescue_ms = min(c.heartbeat_rescue_interval_ms, c.deadline_rescue_interval_ms)
        runs: list[tuple[str, float, Callable[[], Awaitable[Any]]]] = [
            ("promote", c.promote_interval_ms / 1000, self.promote),
            ("rescue", rescue_ms / 1000, self.rescue_running),
            ("callback_rescue", c.callback_rescue_interval_ms / 1000, self.rescue_callbacks),
            ("prune", c.cleanup_interval_ms / 1000, self.prune),
            ("vacuum_hot", c.hot_vacuum_interval_ms / 1000, self.vacuum_hot),
        ]
        if c.terminal_count_rollup_interval_ms is not None:
            runs.append(
                ("counter_fold", c.terminal_count_rollup_interval_ms / 1000, self.fold_counts)
            )
        runs += [
            (getattr(fn, "__name__", repr(fn)).lstrip("_"), s, functools.partial(fn, self.fenced))
            for s, fn in self.extra_tasks
        ]
        return [
            Pass(
                name,
                s,
                fn,
                functools.partial(self.stuck_rows, name) if name in _PASSES_OF else None,
            )
            for name, s, fn in runs
        ]

    async def run(self) -> None:
        """Elect forever (cancel to stop; the lock connection is closed on the way out)."""
        interval = self.config.leader_check_ms / 1000
        try:
            while True:
                try:
                    await self._elect()
                    self.election_failures, self.election_error = 0, None
                    self.elections.fire(None)
                except Exception as exc:  # the election loop itself must never end
                    log.warning("leader election failed: %s: %s", type(exc).__name__, exc)
                    self.election_failures += 1
                    self.election_error = f"{type(exc).__name__}: {exc}"
                    await self._step_down()
                    self.elections.fire(exc)
                # A pass that found itself deposed wakes the election at once.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._deposed.wait(), interval)
        finally:
            await self._step_down()

    async def _elect(self) -> None:
        if self.is_leader:
            if self._deposed.is_set():
                await self._step_down()
            else:
                # the lease renewed at our epoch (on the lock connection, if any: still
                # connected) means still leader
                if await self.leader.renew():
                    return
                log.warning("maintenance leadership lost: the epoch moved past %s", self.epoch)
                await self._step_down()
        self._deposed.clear()
        if await self.acquire():
            self.scheduler.start()

    async def acquire(self) -> bool:
        """Try to take leadership now (``Leadership.acquire``). Starts no loops (:meth:`run`
        does); passes may be run by hand afterwards. Returns ``is_leader``.

        Raises:
            psycopg.Error: the database failed (the caller steps down).
        """
        if self.is_leader:
            return True
        if not await self.leader.acquire():
            return False
        self.leadership.fire(True)
        return True

    async def _step_down(self) -> None:
        await self.scheduler.stop()
        self.pruner.refused_slices = {}
        for loop in _PASSES_OF:  # what a leader's passes remembered is no longer this process's
            metrics.MAINTENANCE_STUCK_ROWS.labels(loop).set(0)
        was_leader = await self.leader.resign()
        await self.vacuum.close()
        if was_leader:
            self.leadership.fire(False)

    def fenced(
        self, *, bounded: bool = False
    ) -> AbstractAsyncContextManager[psycopg.AsyncConnection]:
        """A pool connection in a transaction fenced at this process's epoch, the only way a
        leader pass writes (``Leadership.fenced``; ``bounded``: the lock wait and idle bounds
        of the maintenance passes).

        Raises:
            Deposed: another process took leadership (nothing of this transaction commits).
        """
        return self.leader.fenced(bounded=bounded)

    async def run_pass(self, name: str) -> Any:
        """Run the leader pass ``name`` (``"promote"``, ``"prune"``, ...) once now, as its loop
        does, health and ``passed`` included (``PassScheduler.run_pass``)."""
        return await self.scheduler.run_pass(name)

    def loop_health(self) -> dict[str, LoopHealth]:
        """The leader loops' state (empty when this process is not the leader)."""
        if not self.is_leader:
            return {}
        return self.scheduler.report()

    @property
    def election_failing(self) -> bool:
        """Whether this process's last ``DEAD_AFTER_FAILURES`` election attempts all failed with
        an error (``election_error``; a trigger refusing the epoch bump, say): then no process
        may lead, and nothing promotes, rescues or prunes."""
        return self.election_failures >= DEAD_AFTER_FAILURES

    def stuck_rows(self, loop: str) -> int:
        """Rows the passes of leader loop ``loop`` left unchanged and remember, and for
        ``"prune"`` the rows of the finished slices whose truncate the last expiry pass saw
        refused (see :class:`LoopHealth`)."""
        rows = sum(len(self.ctx.recurring[what].left) for what in _PASSES_OF.get(loop, ()))
        if loop == "prune":
            rows += sum(self.pruner.refused_slices.values())
        return rows

    async def promote(self) -> int:
        """The promote pass (``maintenance.promote.promote``): the rows promoted."""
        return await promote_due(self.ctx)

    async def rescue_running(self) -> list[Rescued]:
        """The heartbeat / deadline rescue loop's pass (see :meth:`rescue`)."""
        return await self.rescuer.rescue(callbacks=False)

    async def rescue_callbacks(self) -> list[Rescued]:
        """The expired-callback rescue loop's pass (``callback_rescue_interval_ms``)."""
        return await self.rescuer.rescue(running=False)

    async def rescue(self, *, running: bool = True, callbacks: bool = True) -> list[Rescued]:
        """One rescue pass (:meth:`Rescue.rescue`): the rows rescued."""
        return await self.rescuer.rescue(running=running, callbacks=callbacks)

    async def prune(self) -> int:
        """The prune pass (:meth:`Prune.prune`): the rows removed."""
        return await self.pruner.prune()

    async def fold_counts(self) -> int:
        """The counter fold (:meth:`Prune.fold_counts`)."""
        return await self.pruner.fold_counts()

    async def expire_slices(self) -> int:
        """The finished slices' expiry (:meth:`Prune.expire_slices`): the rows removed."""
        return await self.pruner.expire_slices()

    async def vacuum_hot(self) -> bool:
        """The hot-table vacuum pass (:meth:`HotVacuum.vacuum_hot`): whether it vacuumed."""
        return await self.vacuum.vacuum_hot()
