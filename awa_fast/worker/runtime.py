"""The worker runtime of one process, started by ``AsyncClient.start`` and stopped by
``AsyncClient.shutdown``: the wiring of its parts and its lifecycle. The parts live apart, each
with its responsibility: the attempts and their supervision (``worker/attempts.py``), the
presence row (``worker/presence.py``), the LISTEN connection (``worker/listener.py``), the
leader's extra tasks (``worker/leader_tasks.py``) and shutdown's bounds
(``worker/shutdown.py``); the dispatchers, finalizer, heartbeat and maintenance are the
worker's own modules."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import os
import threading
from typing import Any

import orjson

from awa_fast import metrics, schema, storage_options
from awa_fast import pooler as pooler_mode
from awa_fast.errors import ConfigError
from awa_fast.repo.queues import QueueRepo
from awa_fast.worker.aging import run_aging
from awa_fast.worker.attempts import Attempts
from awa_fast.worker.config import RuntimeConfig
from awa_fast.worker.context import JobContext
from awa_fast.worker.dispatcher import Dispatcher
from awa_fast.worker.finalizer import Finalizer
from awa_fast.worker.heartbeat import Heartbeat
from awa_fast.worker.idle_poll import IdlePoll
from awa_fast.worker.leader_tasks import BATCH_RUNNER_S, LeaderTasks
from awa_fast.worker.lingering import Lingering
from awa_fast.worker.listener import Listener
from awa_fast.worker.liveness import LEASE_MARGIN, Liveness
from awa_fast.worker.maintenance import STUCK_LOOPS, Maintenance
from awa_fast.worker.observe import Signal
from awa_fast.worker.presence import Presence
from awa_fast.worker.services import Services
from awa_fast.worker.shutdown import (
    CLAIM_HANDOVER_S,
    cancel_and_wait,
    finalizer_closed,
)
from awa_fast.worker.stall_watch import StallWatch
from awa_fast.worker.weighted import OverflowPool

log = logging.getLogger("awa_fast.runtime")


class Runtime:
    """Runs registered handlers in this process (one per ``AsyncClient.start``, which builds
    its :class:`~awa_fast.worker.services.Services`: pool, registry, specs, settler, periodic
    schedules and descriptors, and its :class:`~awa_fast.worker.config.RuntimeConfig`, validated
    by ``worker.config.runtime_config``: this class validates nothing, it wires the parts the
    configuration describes; the runtime reads the services and changes none of the client's
    settings).

    At :meth:`start` it refuses a database whose schema is missing or old
    (``SchemaNotMigrated``: run ``awa-fast migrate``) and a metrics port that cannot be bound
    (``ConfigError``). ``gc_freeze`` (ADR 017): at the end of :meth:`start`, ``gc.freeze()``
    moves every object allocated so far to the permanent generation; :meth:`shutdown` calls
    ``gc.unfreeze()``.

    Raises:
        ConfigError: ``config.storage.queue_storage_schema`` names another schema than the
            services' (start it from a client of that schema).
    """

    def __init__(self, services: Services, config: RuntimeConfig):
        # awa's queue_storage_schema names the schema of the services' connections (the client
        # binds them, ADR 027); given to a runtime bound elsewhere, it is refused, not ignored
        named = config.storage.queue_storage_schema
        if named not in (None, storage_options.AWA_DEFAULT_SCHEMA, services.schema.name):
            raise ConfigError(
                f"queue_storage_schema {named!r} is not this runtime's schema "
                f"{services.schema.name!r} (start it from a client of that schema)",
                field="queue_storage_schema",
                limit=services.schema.name,
            )
        self.services = services
        self.config = config
        self.queues = list(config.queues)
        self.overflow = None
        if config.global_max_workers is not None:  # awa's weighted mode (worker/weighted.py)
            self.overflow = OverflowPool(
                config.global_max_workers - sum(q.min_workers for q in self.queues),
                {q.name: q.weight for q in self.queues},
            )
        self.poll_interval_s = config.poll_interval_ms / 1000
        self.heartbeat_interval_s = config.heartbeat_interval_ms / 1000
        self.callback_poll_interval_s = config.callback_poll_interval_ms / 1000
        self.cron_interval_s = config.cron_interval_ms / 1000
        self.metrics_refresh_s = config.metrics.refresh_ms / 1000
        self.maintenance_config = config.maintenance_config
        self.run_maintenance = config.maintenance
        self.gc_freeze = config.gc_freeze
        # The kinds this process claims, and its presence row (awa_fast.workers).
        self.kinds = sorted(services.registry.handlers)
        self.presence = Presence(
            services,
            [q.name for q in self.queues],
            self.kinds,
            self.heartbeat_interval_s,
            self.maintenance_config,
            self.run_maintenance,
        )
        self.instance = self.presence.instance
        self.leader_tasks = LeaderTasks(services, self.instance)
        self.metrics_exporter: metrics.Exporter | None = None
        # A slot runs a handler, async or def: a def handler needs a thread for the slot's
        # max_workers to be honoured, and Python's default (cores + 4, at most 32) let a claimed
        # job wait for one while its deadline ran. Threads start only when def handlers run.
        self.thread_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=config.handler_threads, thread_name_prefix="awa-fast-handler"
        )
        self.dispatchers: dict[str, Dispatcher] = {}
        # Fired after each step of this runtime that may have changed jobs: a claim that took
        # rows, an attempt that ended (its finalize committed) or parked on its callback, a
        # cancel NOTIFY that flagged an attempt, a maintenance pass that did work. Tests wait
        # on it (``Signal.wait_until``) instead of polling the database.
        self.progress = Signal("runtime progress")
        # Fired for each notification the LISTEN connection receives (value: (channel,
        # payload)), before it is acted on: what this runtime hears, its schema's only.
        self.notifications = Signal("notification")
        lease_s = self.maintenance_config.heartbeat_staleness_ms / 1000
        self.attempts = Attempts(
            self, services, lease_s, self.thread_pool, self.progress, self.dispatchers
        )
        # the attempts' own structures, keyed by attempt (job id, run_lease)
        self.in_flight: dict[tuple[int, int], JobContext] = self.attempts.in_flight
        self._handler_tasks = self.attempts.tasks
        self.outcomes = self.attempts.outcomes
        self.listener = Listener(services, self.poll_interval_s, self._on_notify, self._reheard)
        self.idle_poll: IdlePoll | None = None
        self.released: asyncio.Future | None = None  # shutdown's release step (see shutdown)
        self._tasks: list[asyncio.Task] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.finalizer: Finalizer | None = None
        self.maintenance: Maintenance | None = None
        self.heartbeat: Heartbeat | None = None
        self.liveness: Liveness | None = None  # hosts the heartbeat off this loop
        self.lingering: Lingering | None = None  # def-handler threads outliving their task
        self.stall_watch: StallWatch | None = None

    # -- what tests, embedders and the admin read -----------------------------------------------

    @property
    def attempts_ended(self) -> int:
        """Attempts whose task ended (finalized, released, abandoned)."""
        return self.attempts.ended

    async def wait_attempts_ended(self, n: int) -> None:
        """Wait until ``n`` attempts of this runtime have ended: finalized (or their prompt
        failure recorded), released, or abandoned. A signal for tests and embedders."""
        await self.attempts.wait_ended(n)

    @property
    def min_stale_ms(self) -> int:
        """This process's ``min_stale_ms`` (``Presence.min_stale_ms``)."""
        return self.presence.min_stale_ms

    async def check_unhandled(self) -> list:
        """See ``Presence.check_unhandled``: ``[(queue, kind, available)]``."""
        return await self.presence.check_unhandled()

    async def _evaluate_cron(self, fenced: Any = None) -> int:
        """See ``LeaderTasks.evaluate_cron`` (tests call it to fire one cron pass)."""
        return await self.leader_tasks.evaluate_cron(fenced)

    async def reconcile(self, fenced: Any = None) -> dict:
        """Reconciler tick (leader only): run ``verify_success`` hooks once on recently
        completed jobs of their kinds (verdict and correction in one transaction), then retry
        owed failure consequences that are due, by this runtime's ``maintenance_config`` (read
        at each tick). Writes go through ``fenced`` (``Maintenance.fenced``) when given."""
        from awa_fast.worker.reconcile import reconcile_tick

        return await reconcile_tick(self.services, self.maintenance_config, fenced)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        pool_getter = self.services.pool
        pool = await pool_getter()  # ConfigError: a pooler the client's pooler= does not say
        # The pool left a server that takes no writes (a switchover): the LISTEN connection,
        # which never writes, is on it too and would hear nothing again (awa_fast/primary.py).
        getattr(pool, "on_read_only", []).append(self.listener.leave_server)
        listen_url = self.services.listen_url
        if listen_url is not None and not pooler_mode.session_state_allowed(self.services.pooler):
            await pooler_mode.check_listen_url(listen_url)  # ConfigError: not direct
        async with pool.connection() as conn:
            await schema.check_current(conn)
            await self.presence.seen(conn)
            for q in self.queues:
                # Only an explicit setting is written: a process that says nothing about DLQ
                # leaves the queue's stored policy alone.
                dlq = q.dlq if q.dlq is not None else self.config.dlq_enabled_by_default
                if dlq is not None:
                    await QueueRepo(conn).set_dlq(q.name, bool(dlq))
        await self.leader_tasks.sync_periodic()
        registry = self.services.registry
        metrics.prepare(  # every series at 0 from the start, not only once first counted
            [q.name for q in self.queues],
            {kind: h.queue for kind, h in registry.handlers.items()},
            sorted(registry.consequence_kinds()),
            list(STUCK_LOOPS),
        )
        endpoint = self.config.metrics
        if endpoint.port is not None:  # ConfigError when the port cannot be bound
            self.metrics_exporter = metrics.Exporter(endpoint.port, endpoint.host)
        self._build_parts(pool_getter)
        try:
            if self.listener.url is not None:
                await self.listener.connect()
        except BaseException:
            if self.metrics_exporter is not None:
                self.metrics_exporter.close()
            raise
        self._start_tasks(pool_getter)
        assert self.liveness is not None  # built by _build_parts
        self.liveness.start()  # the beats, the lease check and the stall watch, off this loop
        if self.gc_freeze:
            # What exists now (imports, handlers, pools) lives as long as the process: out of
            # the cyclic collector's full passes, which otherwise stall the loop 15-60 ms every
            # few seconds at 8,000 jobs/s (measured in the soak; 3-4 ms frozen).
            gc.freeze()

    def _build_parts(self, pool_getter: Any) -> None:
        """The parts :meth:`start` runs, built from the configuration: the finalizer, the idle
        poll, a dispatcher per queue, the heartbeat and its liveness thread, the stall watch,
        the lingering-thread keeper."""
        self.finalizer = Finalizer.batching(
            pool_getter,
            batch_size=self.config.finalizer_batch_size,
            staged_completions=self.config.staged_completions,
            specs=self.services.specs,
            settler=self.services.settler,
        )
        self.idle_poll = IdlePoll(pool_getter, self.poll_interval_s, self.kinds)
        for q in self.queues:
            self.dispatchers[q.name] = Dispatcher.for_queue(
                q,
                pool_getter,
                self.attempts.spawn,
                self.poll_interval_s,
                self.kinds,
                self.overflow,
                self.idle_poll,
            )
            self.dispatchers[q.name].claim_ran.subscribe(self._claimed)
        lease_s = self.maintenance_config.heartbeat_staleness_ms / 1000
        self.heartbeat = Heartbeat(
            pool_getter,
            self.attempts.targets,
            self.heartbeat_interval_s,
            database_url=self.services.database_url,
            presence=self.presence.beat,
            pooler=self.services.pooler,
            # a round that has not committed within half the lease is given up on (a backend
            # that stopped answering): the next beats over a new connection, in time
            round_timeout_s=lease_s * (1 - LEASE_MARGIN) / 2,
            binding=self.services.schema,
        )
        loop = asyncio.get_running_loop()
        self.stall_watch = StallWatch(
            loop,
            threading.get_ident(),
            self.attempts.handler_on_stack,
            long_s=self.heartbeat_interval_s,
        )
        self.liveness = Liveness(
            self.heartbeat,
            loop,
            lease_s=lease_s,
            on_lease_expired=self.attempts.lease_expired,
            tasks=(self.stall_watch.run,),
            live_attempts=self.attempts.live,
            oldest_lease=self.attempts.oldest_lease,
        )
        self.lingering = Lingering(
            self.services.database_url,
            self.heartbeat_interval_s,
            self.services.pooler,
            self.services.schema,
        )
        self.attempts.finalizer = self.leader_tasks.finalizer = self.finalizer
        self.attempts.lingering = self.lingering

    def _start_tasks(self, pool_getter: Any) -> None:
        """The runtime's tasks: dispatchers, idle poll, deadline sweep, LISTEN (or the poll's
        note), aging, presence, metrics refresh and, in a maintenance process, maintenance."""
        assert self.idle_poll is not None  # built by _build_parts
        self._tasks = [
            asyncio.create_task(d.run(), name=f"awa-dispatch-{d.queue}")
            for d in self.dispatchers.values()
        ]
        self._tasks.append(asyncio.create_task(self.idle_poll.run(), name="awa-idle-poll"))
        sweep = self.attempts.sweep_deadlines()
        self._tasks.append(asyncio.create_task(sweep, name="awa-deadlines"))
        if self.listener.url is not None:
            self._tasks.append(asyncio.create_task(self.listener.run(), name="awa-listen"))
        else:
            log.info(
                "pooler='transaction' without listen_url: no LISTEN; idle queues are polled "
                "every poll_interval_ms=%d ms (a new job waits at most that long), and a "
                "cancel request reaches a running handler only at its finalize",
                round(self.poll_interval_s * 1000),
            )
        self._tasks += [
            asyncio.create_task(
                run_aging(pool_getter, q.name, q.priority_aging_interval_ms),
                name=f"awa-aging-{q.name}",
            )
            for q in self.queues
            if q.priority_aging_interval_ms > 0
        ]
        self._tasks.append(asyncio.create_task(self.presence.run(), name="awa-presence"))
        if (
            self.config.metrics.port is not None
            or os.environ.get(metrics.LAUNCHER_ENV) == "refresh"
        ):
            self._tasks.append(asyncio.create_task(self._metrics_loop(), name="awa-metrics"))
        if self.run_maintenance:
            self._start_maintenance(pool_getter)

    def _start_maintenance(self, pool_getter: Any) -> None:
        """This process's part in the maintenance leader election, with the runtime's own
        leader tasks (cron, reconciler, batch operations)."""
        mc, leader = self.maintenance_config, self.leader_tasks
        self.maintenance = Maintenance(
            self.services.database_url,
            pool_getter,
            mc,
            on_rescued=leader.on_rescued,
            consequence_kinds=leader.settled_by_reconciler,
            known_kinds=self.services.settler.applier.known_kinds,
            own_attempts=self.attempts.own,
            pooler=self.services.pooler,
            extra_tasks=[
                (self.cron_interval_s, leader.evaluate_cron),
                (mc.reconcile_interval_ms / 1000, self.reconcile),
                (BATCH_RUNNER_S, leader.run_batch_operations),
            ],
            binding=self.services.schema,
        )
        self.maintenance.passed.subscribe(self._maintenance_passed)
        self._tasks.append(asyncio.create_task(self.maintenance.run(), name="awa-maintenance"))

    async def shutdown(self, timeout_ms: int = 2000) -> None:
        """Stop in this order (docs/architecture.md, "Shutdown"): stop claiming (wait for a
        claim in flight to hand over its rows); tell every attempt it is cancelled and wait up
        to ``timeout_ms`` ms for the handlers; cancel the ones still running and give their
        attempts back (a ``def`` handler's attempt only once its thread has finished); let
        every attempt that already returned finish its finalize; stop the background loops;
        flush the finalizer. The caller closes the pool after this returns. Bounded:
        ``shutdown.shutdown_bound_s``."""
        timeout_s = max(timeout_ms, 0) / 1000
        try:
            await self._drain(timeout_s)
        finally:
            self.attempts.stopped = True
            # Also when this shutdown was cancelled or failed: no loop of this runtime may
            # outlive it (a caller's wait_for around shutdown left them all running), and its
            # connections, finalizer and presence row are released by a task of their own,
            # which a cancel of this call does not stop (``released``; close() waits for it).
            for task in [*self._tasks, *self._handler_tasks.values()]:
                task.cancel()
            if self.released is None:
                self.released = asyncio.ensure_future(self._release())
        await asyncio.shield(self.released)

    async def _drain(self, timeout_s: float) -> None:
        for d in self.dispatchers.values():
            d.stop()
        dispatching = [t for t in self._tasks if t.get_name().startswith("awa-dispatch-")]
        if dispatching:
            # Even with timeout_ms=0 a claim in flight gets to hand its rows over: cancelled
            # mid-statement, it could commit rows that no handler would ever run.
            await cancel_and_wait(dispatching, grace_s=max(timeout_s, CLAIM_HANDOVER_S))
        await self.attempts.drain(timeout_s)
        await cancel_and_wait(self._tasks)

    async def _release(self) -> None:
        """Shutdown's second half: flush the finalizer, hand over or remove the presence row,
        close the LISTEN and heartbeat connections, the thread pool, the metrics endpoint.
        Each step is bounded or local; a failure of one is logged and the others run."""
        if self.finalizer is not None:
            await finalizer_closed(self.finalizer)
        # def-handler threads still running keep the presence row (and its min_stale_ms): the
        # lingering thread refreshes it and deletes it after the last one (ADR 020)
        lingering, presence = self.lingering, self.presence
        if lingering is None or not lingering.keep_presence(presence.instance, presence.ttl_ms):
            await presence.gone()
        for closing in (self.listener, self.liveness):
            if closing is not None:
                try:
                    await closing.close()
                except Exception as exc:  # closing a connection the server already dropped
                    log.warning("closing at shutdown: %s: %s", type(exc).__name__, exc)
        self.thread_pool.shutdown(wait=False, cancel_futures=True)
        if self.gc_freeze:
            gc.unfreeze()  # what start() froze is the collector's again
        if self.metrics_exporter is not None:
            self.metrics_exporter.close()

    # -- signals --------------------------------------------------------------------------------

    def _claimed(self, rows: int) -> None:
        if rows:
            self.progress.fire("claimed")

    def _maintenance_passed(self, step: tuple[str, Any]) -> None:
        name, result = step
        if isinstance(result, dict):  # the reconciler's counts
            result = any(result.values())
        if result and not isinstance(result, BaseException):
            self.progress.fire(name)

    def _reheard(self) -> None:
        for d in self.dispatchers.values():
            d.notify()  # we may have missed notifications while reconnecting

    def _on_notify(self, channel: str, payload: str) -> None:
        self.notifications.fire((channel, payload))
        if channel == self.services.schema.channel_queue:
            d = self.dispatchers.get(payload)
            if d is not None:
                d.notify()
        elif channel == self.services.schema.channel_cancel:
            try:
                msg = orjson.loads(payload)
            except orjson.JSONDecodeError:
                return
            if self.attempts.cancel_flagged(msg.get("job_id"), msg.get("run_lease")):
                self.progress.fire("cancel flagged")

    async def _metrics_loop(self) -> None:
        """Refresh the queue depth and consequence gauges every ``metrics_refresh_ms``."""
        names = [q.name for q in self.queues]
        while True:
            try:
                async with (await self.services.pool()).connection() as conn:
                    await metrics.refresh(conn, names)
            except Exception as exc:  # a scrape shows the last values; the next pass retries
                log.warning("metrics refresh failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(self.metrics_refresh_s)
