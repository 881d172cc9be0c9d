"""The worker runtime of one process: dispatchers, handler tasks, finalizer, heartbeat, listener
and maintenance, started by ``AsyncClient.start`` and stopped by ``AsyncClient.shutdown``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import gc
import logging
import math
import os
import socket
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg

from awa_fast import (
    batch_ops,
    bulk,
    descriptors,
    metrics,
    pg_connection,
    schema,
    sql,
    storage_options,
)
from awa_fast import pooler as pooler_mode
from awa_fast.errors import ConfigError
from awa_fast.job import Job
from awa_fast.retryable import Retry, classify
from awa_fast.worker import executor as ex
from awa_fast.worker.aging import run_aging
from awa_fast.worker.cancellation import raise_if_cancelling
from awa_fast.worker.config import HEARTBEAT_SAFETY, RuntimeConfig
from awa_fast.worker.context import JobContext
from awa_fast.worker.dispatcher import Dispatcher
from awa_fast.worker.finalizer import Finalized, Finalizer, FinalizeRequest
from awa_fast.worker.heartbeat import Heartbeat
from awa_fast.worker.idle_poll import IdlePoll
from awa_fast.worker.lingering import Lingering
from awa_fast.worker.liveness import LEASE_MARGIN, Liveness
from awa_fast.worker.maintenance import STUCK_LOOPS, Maintenance
from awa_fast.worker.observe import Signal
from awa_fast.worker.services import Services
from awa_fast.worker.stall_watch import StallWatch
from awa_fast.worker.weighted import OverflowPool

log = logging.getLogger("awa_fast.runtime")
# The LISTEN loop's longest pause between reconnects (the other loops': MAX_BACKOFF_S, 30 s):
# after a failover it is back within seconds of the promotion however long the outage was
# (docs/deployment.md, "Failover"); meanwhile the dispatchers poll.
LISTEN_BACKOFF_MAX_S = 5.0

DEADLINE_SWEEP_S = 0.5
CLAIM_HANDOVER_S = 5.0  # shutdown: longest wait for a claim in flight to return its rows
# Shutdown's bound, after its drain timeout, on the attempts still ending (cancelled handlers
# giving back, returned ones finalizing) and on the finalizer's last flush: a handler that
# ignores cancellation or a database that does not answer must not keep shutdown from ending.
SHUTDOWN_GRACE_S = 10.0
PRESENCE_GONE_S = 2.0  # removing the presence row at shutdown (it expires on its own)


def shutdown_bound_s(timeout_s: float) -> float:
    """The longest a shutdown with drain timeout ``timeout_s`` (seconds) can take, in seconds,
    from the bounds of its phases (``Runtime._drain``, ``_release``): the dispatchers' claims
    in flight (``max(timeout_s, CLAIM_HANDOVER_S)``, then a cancel), the handlers
    (``timeout_s``), the attempts left after it (``SHUTDOWN_GRACE_S`` + 1 s), the runtime's own
    tasks (a cancel), the finalizer's last flush (``SHUTDOWN_GRACE_S``) and the presence row
    (``PRESENCE_GONE_S``). A cancel (``_cancel_and_wait``) gives up ``SHUTDOWN_GRACE_S`` after
    its first round and waits 1 s per round. The launcher's kill deadline is derived from it
    (``supervisor.kill_after_s``)."""
    cancel = SHUTDOWN_GRACE_S + 1.0
    return (
        max(timeout_s, CLAIM_HANDOVER_S)
        + cancel
        + timeout_s
        + SHUTDOWN_GRACE_S
        + 1.0
        + cancel
        + SHUTDOWN_GRACE_S
        + PRESENCE_GONE_S
    )


BATCH_RUNNER_S = 0.2  # the leader's batch-operation runner: one step (a chunk) per interval
UNHANDLED_CHECK_S = 30.0  # how often a process looks for waiting kinds no live worker handles


def _free_slot_when_done(thread: concurrent.futures.Future, dispatcher: Dispatcher) -> None:
    """Give ``dispatcher`` its slot back when the handler ``thread`` ends (from that thread,
    through the dispatcher's loop; nothing if the loop is closed by then)."""
    loop = asyncio.get_running_loop()

    def done(_: concurrent.futures.Future) -> None:
        try:
            loop.call_soon_threadsafe(dispatcher.slot_freed)
        except RuntimeError:  # the loop is closed: the process is ending
            pass

    thread.add_done_callback(done)


def _thread_runs(ctx: JobContext) -> bool:
    """True when ``ctx``'s ``def`` handler thread has started and not finished (a thread that
    had not started is cancelled here and never will)."""
    thread = ctx.thread
    return thread is not None and not thread.cancel() and not thread.done()


async def _cancel_and_wait(tasks: list, grace_s: float = 0.0) -> None:
    """Let ``tasks`` end by themselves for ``grace_s`` seconds, then cancel them until they
    are done: on Python 3.11 a cancel racing ``asyncio.wait_for`` (psycopg_pool's getconn) can
    be swallowed, so one cancel is not enough. At most ``SHUTDOWN_GRACE_S`` after the first
    cancel: a task in a statement the database does not answer (psycopg's cancel request waits
    for the server too) is left, cancelled, and logged by name."""
    live = [t for t in tasks if not t.done()]
    if live and grace_s > 0:
        _, pending = await asyncio.wait(live, timeout=grace_s)
        live = list(pending)
    give_up = time.monotonic() + SHUTDOWN_GRACE_S
    while live:
        if time.monotonic() >= give_up:
            log.error(
                "%d task(s) did not end within %g s of their cancel (the database did not "
                "answer?); left behind: %s",
                len(live),
                SHUTDOWN_GRACE_S,
                ", ".join(sorted(t.get_name() for t in live)),
            )
            return
        for t in live:
            t.cancel()
        _, pending = await asyncio.wait(live, timeout=1.0)
        live = list(pending)
    await asyncio.gather(*tasks, return_exceptions=True)


def _log_failed_attempt(ctx: JobContext, outcome: ex.Outcome) -> None:
    """One line per failed or retried attempt: kind, id, attempt, the error's type and message
    (its first line; never the job's args), and what happens next ("retry in N s", or "not
    retried (reason)": the settlement then fails, dead-letters or owes the attempt)."""
    error = (outcome.error or {}).get("error") or "the handler asked for it (no error)"
    head = error.split("\n", 1)[0][:500]
    if outcome.kind == ex.RETRY:
        then = f"retry in {outcome.delay or 0:.1f} s"
    else:  # failed, dead-lettered or owing its kind's consequence: the settlement decides
        then = f"not retried ({outcome.reason})"
    log.warning(
        "job %s (%s) attempt %d/%d failed: %s; %s",
        ctx.id,
        ctx.kind,
        ctx.attempt,
        ctx.max_attempts,
        head,
        then,
        extra={"kind": ctx.kind, "job_id": ctx.id, "attempt": ctx.attempt, "outcome": outcome.kind},
    )


def _first(ids: list[int], n: int = 20) -> str:
    """``ids`` for a log line: all of them, or the first ``n`` and how many more."""
    head = ", ".join(map(str, ids[:n]))
    return head if len(ids) <= n else f"{head} and {len(ids) - n} more"


@dataclasses.dataclass(slots=True)
class _Ending:
    """How an attempt's run ended, for its clean-up: ``released`` (its slot is freed),
    ``abandoned`` (at its deadline, to rescue), ``applied`` (its outcome's write: None when
    none was made, False when stale)."""

    released: bool = False
    abandoned: bool = False
    applied: bool | None = None


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
        # This process's presence row (awa_fast.workers) and the kinds it claims.
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.kinds = sorted(services.registry.handlers)
        self.unhandled_warned: set[tuple[str, str]] = set()
        # schedules the cron pass cannot evaluate or fire, warned about once (periodic.evaluate)
        self.cron_problems = bulk.Recurring()
        self.metrics_exporter: metrics.Exporter | None = None
        # A slot runs a handler, async or def: a def handler needs a thread for the slot's
        # max_workers to be honoured, and Python's default (cores + 4, at most 32) let a claimed
        # job wait for one while its deadline ran. Threads start only when def handlers run.
        self.thread_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=config.handler_threads, thread_name_prefix="awa-fast-handler"
        )
        # Every structure is keyed by attempt (job id, run_lease).
        self.in_flight: dict[tuple[int, int], JobContext] = {}
        self.lingering: Lingering | None = None  # def-handler threads outliving their task
        self.attempts_ended = 0  # attempts whose task ended (finalized, released, abandoned)
        self._attempt_ended = asyncio.Event()
        self._handler_tasks: dict[tuple[int, int], asyncio.Task] = {}
        self._giving_back: set[asyncio.Future] = set()  # see _never_started
        self.dispatchers: dict[str, Dispatcher] = {}
        self.idle_poll: IdlePoll | None = None
        self._stopped = False  # shutdown() returned: attempts ending later are left to rescue
        self.released: asyncio.Future | None = None  # shutdown's release step (see shutdown)
        self._tasks: list[asyncio.Task] = []
        self._listen_conn: psycopg.AsyncConnection | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.finalizer: Finalizer | None = None
        self.maintenance: Maintenance | None = None
        self.heartbeat: Heartbeat | None = None
        self.liveness: Liveness | None = None  # hosts the heartbeat off this loop
        self.stall_watch: StallWatch | None = None
        self.outcomes: dict[str, int] = {}
        # Fired after each step of this runtime that may have changed jobs: a claim that took
        # rows, an attempt that ended (its finalize committed) or parked on its callback, a
        # cancel NOTIFY that flagged an attempt, a maintenance pass that did work. Tests wait
        # on it (``Signal.wait_until``) instead of polling the database.
        self.progress = Signal("runtime progress")
        # Fired for each notification the LISTEN connection receives (value: (channel,
        # payload)), before it is acted on: what this runtime hears, its schema's only.
        self.notifications = Signal("notification")

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        pool_getter = self.services.pool
        pool = await pool_getter()  # ConfigError: a pooler the client's pooler= does not say
        # The pool left a server that takes no writes (a switchover): the LISTEN connection,
        # which never writes, is on it too and would hear nothing again (awa_fast/primary.py).
        getattr(pool, "on_read_only", []).append(self._leave_listen_server)
        listen_url = self.services.listen_url
        if listen_url is not None and not pooler_mode.session_state_allowed(self.services.pooler):
            await pooler_mode.check_listen_url(listen_url)  # ConfigError: not direct
        async with pool.connection() as conn:
            await schema.check_current(conn)
            await self._seen(conn)
            for q in self.queues:
                # Only an explicit setting is written: a process that says nothing about DLQ
                # leaves the queue's stored policy alone.
                dlq = q.dlq if q.dlq is not None else self.config.dlq_enabled_by_default
                if dlq is not None:
                    await conn.execute(sql.SET_QUEUE_DLQ, (q.name, bool(dlq)))
        await self._sync_periodic()
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
            if self._listen_url() is not None:
                await self._listen_connect()
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
            weighted = self.overflow is not None
            self.dispatchers[q.name] = Dispatcher(
                q.name,
                pool_getter=pool_getter,
                spawn=self._spawn,
                max_workers=q.min_workers if weighted else q.max_workers,
                deadline_ms=q.deadline_duration_ms,
                claim_batch_size=q.claim_batch_size,
                poll_interval_s=self.poll_interval_s,
                rate_limit=q.rate_limit,
                kinds=self.kinds,
                overflow=self.overflow,
                cap=q.cap,
                idle_poll=self.idle_poll,
                claimers=q.claimers,
            )
            self.dispatchers[q.name].claim_ran.subscribe(self._claimed)
        self.heartbeat = Heartbeat(
            pool_getter,
            self._heartbeat_targets,
            self.heartbeat_interval_s,
            database_url=self.services.database_url,
            presence=self._beat_presence,
            pooler=self.services.pooler,
            # a round that has not committed within half the lease is given up on (a backend
            # that stopped answering): the next beats over a new connection, in time
            round_timeout_s=self.maintenance_config.heartbeat_staleness_ms
            / 1000
            * (1 - LEASE_MARGIN)
            / 2,
            binding=self.services.schema,
        )
        loop = asyncio.get_running_loop()
        self.stall_watch = StallWatch(
            loop,
            threading.get_ident(),
            self._handler_on_stack,
            long_s=self.heartbeat_interval_s,
        )
        self.liveness = Liveness(
            self.heartbeat,
            loop,
            lease_s=self.maintenance_config.heartbeat_staleness_ms / 1000,
            on_lease_expired=self._lease_expired,
            tasks=(self.stall_watch.run,),
            live_attempts=self._live_attempts,
            oldest_lease=self._oldest_lease,
        )
        self.lingering = Lingering(
            self.services.database_url,
            self.heartbeat_interval_s,
            self.services.pooler,
            self.services.schema,
        )

    def _start_tasks(self, pool_getter: Any) -> None:
        """The runtime's tasks: dispatchers, idle poll, deadline sweep, LISTEN (or the poll's
        note), aging, presence, metrics refresh and, in a maintenance process, maintenance."""
        assert self.idle_poll is not None  # built by _build_parts
        self._tasks = [
            asyncio.create_task(d.run(), name=f"awa-dispatch-{d.queue}")
            for d in self.dispatchers.values()
        ]
        self._tasks.append(asyncio.create_task(self.idle_poll.run(), name="awa-idle-poll"))
        self._tasks.append(asyncio.create_task(self._sweep_deadlines(), name="awa-deadlines"))
        if self._listen_url() is not None:
            self._tasks.append(asyncio.create_task(self._listen_loop(), name="awa-listen"))
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
        self._tasks.append(asyncio.create_task(self._presence_loop(), name="awa-presence"))
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
        mc = self.maintenance_config
        self.maintenance = Maintenance(
            self.services.database_url,
            pool_getter,
            mc,
            on_rescued=self._on_rescued,
            consequence_kinds=self._settled_by_reconciler,
            known_kinds=self.services.settler.applier.known_kinds,
            own_attempts=self._own_attempts,
            pooler=self.services.pooler,
            extra_tasks=[
                (self.cron_interval_s, self._evaluate_cron),
                (mc.reconcile_interval_ms / 1000, self.reconcile),
                (BATCH_RUNNER_S, self._run_batch_operations),
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
        flush the finalizer. The caller closes the pool after this returns."""
        timeout_s = max(timeout_ms, 0) / 1000
        try:
            await self._drain(timeout_s)
        finally:
            self._stopped = True
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
            await _cancel_and_wait(dispatching, grace_s=max(timeout_s, CLAIM_HANDOVER_S))
        for ctx in self.in_flight.values():
            ctx.cancel_flag()
        pending = dict(self._handler_tasks)
        if pending:
            _, still = await asyncio.wait(pending.values(), timeout=timeout_s)
            given_back = []
            for key, task in pending.items():
                attempt = self.in_flight.get(key)
                # A handler that returned is finalizing: let it finish, never cancel it.
                if task in still and (attempt is None or not attempt.returned):
                    task.cancel()
                    thread = attempt.thread if attempt is not None else None
                    if thread is None or not thread.running():
                        # (a running def thread's attempt is logged apart: kept, not given back)
                        given_back.append(key[0])
            if given_back:
                log.warning(
                    "drain timeout (%g s) passed: %d handler(s) still running were "
                    "cancelled and their attempts given back to available: job ids %s",
                    timeout_s,
                    len(given_back),
                    _first(sorted(given_back)),
                    extra={"released": len(given_back), "released_job_ids": sorted(given_back)},
                )
            if still:
                await self._wait_bounded(still, pending)
        await _cancel_and_wait(self._tasks)

    async def _release(self) -> None:
        """Shutdown's second half: flush the finalizer, hand over or remove the presence row,
        close the LISTEN and heartbeat connections, the thread pool, the metrics endpoint.
        Each step is bounded or local; a failure of one is logged and the others run."""
        if self.finalizer is not None:
            try:
                await asyncio.wait_for(self.finalizer.close(), SHUTDOWN_GRACE_S)
            except TimeoutError:
                log.error(
                    "the finalizer's last flush did not end within %g s (the database did "
                    "not answer): the attempts it held stay running and are rescued",
                    SHUTDOWN_GRACE_S,
                )
        # def-handler threads still running keep the presence row (and its min_stale_ms): the
        # lingering thread refreshes it and deletes it after the last one (ADR 020)
        lingering = self.lingering
        if lingering is None or not lingering.keep_presence(self.instance, self._presence_ttl_ms):
            try:
                async with asyncio.timeout(PRESENCE_GONE_S):
                    async with (await self.services.pool()).connection() as conn:
                        await conn.execute(sql.WORKER_GONE, (self.instance,))
            except (Exception, TimeoutError) as exc:  # the row expires on its own
                log.warning("could not remove this worker's presence row: %r", exc)
        for closing in (self._listen_conn, self.liveness):
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

    def _left_after_shutdown(self, ctx: JobContext) -> None:
        # Shutdown has returned (its bound passed): nothing of this runtime touches the
        # database any more (the client may have closed its pool; a late statement would
        # open a new one). The attempt stays running; heartbeat rescue takes it.
        log.error(
            "job %s (%s) ended after shutdown had returned: its attempt stays running until "
            "heartbeat rescue",
            ctx.id,
            ctx.kind,
        )

    async def _wait_bounded(self, still: set, pending: dict) -> None:
        """Wait up to ``SHUTDOWN_GRACE_S`` for the attempt tasks left after the drain (the
        cancelled ones giving their attempts back, the returned ones finalizing). A task still
        running then (a handler that ignores its cancellation, a finalize the database does
        not answer) is cancelled (again) and left: its attempt stays ``running`` and heartbeat
        rescue takes it over once this process stops beating it. Logged with the job ids."""
        _, stuck = await asyncio.wait(still, timeout=SHUTDOWN_GRACE_S)
        if not stuck:
            return
        ids = sorted(key[0] for key, task in pending.items() if task in stuck)
        log.error(
            "%d attempt(s) did not end within %g s of the drain (a handler that ignores its "
            "cancellation, or a finalize the database did not answer): left running for "
            "heartbeat rescue: job ids %s",
            len(ids),
            SHUTDOWN_GRACE_S,
            _first(ids),
            extra={"stuck": len(ids), "stuck_job_ids": ids},
        )
        for task in stuck:
            task.cancel()
        await asyncio.wait(stuck, timeout=1.0)

    # -- handler tasks --------------------------------------------------------------------------

    def _spawn(self, row: tuple, claim_sent: float) -> None:
        ctx = JobContext(row, self)
        # Keyed by attempt: a superseded attempt of a re-claimed job stays supervised (deadline,
        # shutdown cancel flag, cancel NOTIFY, heartbeat) until its own task ends.
        key = (ctx.id, ctx.run_lease)
        # The lease runs from the claim's send, not from now: its rows may have waited on a
        # blocked loop, unbeaten, while a rescuer's clock ran from the claim's commit.
        ctx.claimed_mono = claim_sent
        self.in_flight[key] = ctx
        task = asyncio.get_running_loop().create_task(self._run(ctx))
        self._handler_tasks[key] = task
        task.add_done_callback(lambda _t: self._never_started(ctx))

    def _never_started(self, ctx: JobContext) -> None:
        # A task cancelled before its first step (a lease expiry, a deadline sweep or a
        # shutdown in the loop iteration that spawned it) never runs _run's ``finally``: its
        # attempt would stay in flight (and this process's own, never rescued by it) forever.
        key = (ctx.id, ctx.run_lease)
        if self.in_flight.get(key) is not ctx:
            return  # _run ran and cleaned up
        self.in_flight.pop(key, None)
        self._handler_tasks.pop(key, None)
        self.dispatchers[ctx.queue].slot_freed()
        log.warning(
            "job %s (%s) was cancelled before its handler started; its attempt is given back",
            ctx.id,
            ctx.kind,
        )
        if not self._stopped and self.finalizer is not None:
            giving = asyncio.ensure_future(self._give_back(ctx))
            self._giving_back.add(giving)  # held until done (the loop keeps weak references)
            giving.add_done_callback(self._giving_back.discard)
        else:
            self._attempt_done()

    async def _give_back(self, ctx: JobContext) -> None:
        try:
            assert self.finalizer is not None
            await self.finalizer.submit(FinalizeRequest.release(ctx))
        except Exception as exc:  # it stays running until rescue
            log.warning("giving back job %s's attempt failed: %s", ctx.id, exc)
        finally:
            self._attempt_done()

    def _attempt_done(self) -> None:
        self.attempts_ended += 1
        self._attempt_ended.set()
        self.progress.fire("attempt ended")

    def _lease_ran_out(self, ctx: JobContext) -> bool:
        """No beat has beaten ``ctx`` (nor its claim been sent) for nearly this process's
        ``heartbeat_staleness_ms``: a rescuer may take it any moment."""
        lease_s = self.maintenance_config.heartbeat_staleness_ms / 1000
        since = max(ctx.claimed_mono, ctx.beaten_mono)
        return time.monotonic() - since >= lease_s * (1 - LEASE_MARGIN)

    def _heartbeat_targets(self):
        return list(self.in_flight.values())  # one C-level copy: safe from the liveness thread

    def _live_attempts(self) -> int:
        return sum(1 for c in list(self.in_flight.values()) if not c.returned and not c.lease_lost)

    def _oldest_lease(self) -> float | None:
        live = [
            max(c.claimed_mono, c.beaten_mono)
            for c in list(self.in_flight.values())
            if not c.returned and not c.waiting and not c.lease_lost
        ]
        return min(live) if live else None

    def _own_attempts(self) -> list[str]:
        # 'id:run_lease' of every attempt this process still runs (sql.RESCUE's %(own)s)
        return [f"{job_id}:{lease}" for job_id, lease in list(self.in_flight)]

    def _handler_on_stack(self, frame: Any) -> tuple[str, int] | None:
        # Called from the liveness thread during a stall: is ``frame`` an attempt's task frame?
        for key, task in list(self._handler_tasks.items()):
            if getattr(task.get_coro(), "cr_frame", None) is frame:
                ctx = self.in_flight.get(key)
                return None if ctx is None else (ctx.kind, ctx.id)
        return None

    def _lease_expired(self) -> None:
        """Attempts that no beat has beaten (nor their claim started) for nearly this process's
        ``heartbeat_staleness_ms`` -- the database did not answer, or the row is no longer
        theirs -- may soon be taken by a rescuer. Their handlers are cancelled and the attempts
        given back (guarded by their lease), so no execution of theirs overlaps the rescued
        one's (docs/architecture.md, "Which executions can overlap")."""
        lease_s = self.maintenance_config.heartbeat_staleness_ms / 1000
        now = time.monotonic()
        cutoff = now - lease_s * (1 - LEASE_MARGIN)
        lost = []
        oldest = now
        for key, ctx in list(self.in_flight.items()):
            since = max(ctx.claimed_mono, ctx.beaten_mono)
            if ctx.returned or ctx.waiting or ctx.lease_lost or since > cutoff:
                continue
            oldest = min(oldest, since)
            ctx.lease_lost = True
            task = self._handler_tasks.get(key)
            if task is not None:
                task.cancel()
                lost.append(ctx)
        if lost:
            metrics.leases_expired(len(lost))
            log.warning(
                "no heartbeat committed for %.1f s (the database did not answer, or this "
                "process was stopped and the job rescued): %d attempt(s) cancelled and given "
                "back before a rescuer runs them again: %s",
                now - oldest,
                len(lost),
                ", ".join(f"job {c.id} ({c.kind})" for c in lost[:10]),
                extra={"lease_lost_job_ids": [c.id for c in lost]},
            )

    async def _run(self, ctx: JobContext) -> None:
        dispatcher = self.dispatchers[ctx.queue]
        finalizer = self.finalizer
        assert finalizer is not None  # set by start()
        end = _Ending()
        try:
            handler = self.services.registry.get(ctx.kind)
            lease_out = self._lease_ran_out(ctx)
            if lease_out or handler is None:
                await self._give_back_unrun(ctx, not lease_out, dispatcher, end)
                return
            try:
                outcome = await ex.execute(handler, ctx, self.thread_pool)
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    await self._handler_cancelled(ctx, dispatcher, end)
                    return
                # Raised by the handler's own code (an inner task was cancelled): an ordinary
                # failure of this attempt, not ours to release.
                outcome = ex.handler_error(ctx, exc)
            ctx.returned = True
            dispatcher.slot_freed()
            end.released = True
            self.outcomes[outcome.kind] = self.outcomes.get(outcome.kind, 0) + 1
            if outcome.kind in (ex.FAIL, ex.RETRY):
                _log_failed_attempt(ctx, outcome)
            if self._stopped:
                self._left_after_shutdown(ctx)
                return
            returned_at = time.perf_counter()
            result = await finalizer.submit(FinalizeRequest.of(ctx, outcome))
            end.applied = result is not Finalized.STALE
            if result is Finalized.APPLIED:
                metrics.finalized(
                    ctx.queue, ctx.kind, outcome.kind, time.perf_counter() - returned_at
                )
            elif result is Finalized.PROMPT_FAILURE:
                metrics.finalized(ctx.queue, ctx.kind, "prompt_failure")
        except Exception as exc:
            if classify(exc) is Retry.CLOSED:  # (the pool closed under it: one line per job)
                log.warning(
                    "finalizing job %s (%s) failed: %s; it stays running until rescue",
                    ctx.id,
                    ctx.kind,
                    exc,
                )
            else:
                log.exception(
                    "finalizing job %s (%s) failed; it stays running until rescue",
                    ctx.id,
                    ctx.kind,
                )
        finally:
            if not end.released:
                dispatcher.slot_freed()
            self.in_flight.pop((ctx.id, ctx.run_lease), None)
            self._handler_tasks.pop((ctx.id, ctx.run_lease), None)
            try:
                if (end.applied is False or end.abandoned) and not self._stopped:
                    # Stale (maybe cancelled or failed externally while it ran) or abandoned
                    # at its deadline: its handler is done now, so clear the "still running"
                    # mark.
                    await self._ack_ended(ctx)
            finally:
                self._attempt_done()

    async def _give_back_unrun(
        self, ctx: JobContext, no_handler: bool, dispatcher: Dispatcher, end: _Ending
    ) -> None:
        """Hand an attempt back, uncounted, without starting its handler."""
        if no_handler:
            # The claim takes only kinds with a handler here; a job claimed anyway (its
            # handler dropped after start) is never failed for it: hand it back uncounted.
            log.error(
                "job %s of kind %r was claimed but this process has no handler for "
                "it; released for a worker that has one",
                ctx.id,
                ctx.kind,
            )
        else:
            # Claimed while the loop was blocked (or by a claim that took nearly the
            # staleness): a rescuer may already run it again, so its handler never starts.
            ctx.lease_lost = True
            metrics.leases_expired(1)
            log.warning(
                "job %s (%s) waited %.1f s after its claim was sent, nearly the heartbeat "
                "staleness: given back without running its handler (it may be rescued "
                "already)",
                ctx.id,
                ctx.kind,
                time.monotonic() - ctx.claimed_mono,
                extra={"lease_lost_job_ids": [ctx.id]},
            )
        dispatcher.slot_freed()
        end.released = True
        assert self.finalizer is not None
        await self.finalizer.submit(FinalizeRequest.release(ctx))

    async def _handler_cancelled(
        self, ctx: JobContext, dispatcher: Dispatcher, end: _Ending
    ) -> None:
        """The runtime cancelled the handler (its deadline, shutdown, a lease that ran out):
        the attempt is abandoned to rescue, kept until its thread ends, or given back."""
        assert self.finalizer is not None and self.lingering is not None
        if ctx.staged_follow_ups is not None:
            ctx.staged_follow_ups.discard("abandoned", ctx.kind)
        end.released = True
        if ctx.deadline_expired:
            # Abandoned at its deadline: rescue takes it over. A thread cannot be stopped: its
            # mark stays fresh until it ends, so the rescued job is not run again meanwhile;
            # otherwise the mark is cleared.
            self.outcomes[ex.ABANDON] = self.outcomes.get(ex.ABANDON, 0) + 1
            if _thread_runs(ctx):
                # ... and it keeps its handler thread, so it keeps its slot: a job claimed
                # into the slot would wait for a thread while its own deadline ran.
                _free_slot_when_done(ctx.thread, dispatcher)
                self.lingering.watch(ctx, release=False)
            else:
                dispatcher.slot_freed()
                end.abandoned = True
            return
        dispatcher.slot_freed()
        if _thread_runs(ctx):
            # A thread cannot be stopped: releasing now would let another worker run the job
            # while this thread still does.
            log.warning(
                "job %s (%s): its handler thread is still running; the attempt is given back "
                "when the thread finishes",
                ctx.id,
                ctx.kind,
            )
            self.lingering.watch(ctx, release=True)
            return
        # Shutdown gave up waiting: hand the attempt back, uncounted.
        if self._stopped:
            self._left_after_shutdown(ctx)
            return
        result = await self.finalizer.submit(FinalizeRequest.release(ctx))
        end.applied = result is Finalized.APPLIED

    def _claimed(self, rows: int) -> None:
        if rows:
            self.progress.fire("claimed")

    def _maintenance_passed(self, step: tuple[str, Any]) -> None:
        name, result = step
        if isinstance(result, dict):  # the reconciler's counts
            result = any(result.values())
        if result and not isinstance(result, BaseException):
            self.progress.fire(name)

    async def wait_attempts_ended(self, n: int) -> None:
        """Wait until ``n`` attempts of this runtime have ended: finalized (or their prompt
        failure recorded), released, or abandoned. A signal for tests and embedders."""
        while self.attempts_ended < n:
            self._attempt_ended.clear()
            await self._attempt_ended.wait()

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

    async def _ack_ended(self, ctx: JobContext) -> None:
        try:
            async with (await self.services.pool()).connection() as conn:
                await conn.execute(sql.ACK_ATTEMPT_ENDED, {"id": ctx.id, "lease": ctx.run_lease})
        except Exception as exc:  # the mark goes stale on its own
            log.warning("could not acknowledge the end of job %s's attempt: %s", ctx.id, exc)

    async def _sweep_deadlines(self) -> None:
        """Cancel handlers whose attempt deadline passed (checked every half second)."""
        while True:
            await asyncio.sleep(DEADLINE_SWEEP_S)
            try:
                self._abandon_overdue(datetime.now(UTC))
            except Exception:  # the sweep must survive every error
                log.exception("deadline sweep failed")

    def _abandon_overdue(self, now: datetime) -> None:
        for key, ctx in list(self.in_flight.items()):
            deadline = ctx.deadline_at
            if (
                deadline is not None
                and deadline <= now
                and not ctx.returned
                and not ctx.waiting
                and not ctx.deadline_expired
            ):
                ctx.deadline_expired = True
                task = self._handler_tasks.get(key)
                if task is not None:
                    log.warning(
                        "job %s (%s) passed its deadline: abandoning the attempt", ctx.id, ctx.kind
                    )
                    task.cancel()

    async def _on_rescued(self, rows: list[tuple]) -> None:
        """Rescued specs: best effort, each in its own transaction after the rescue committed."""
        specs = self.services.specs
        wanted = [r for r in rows if specs.has(r[1], "rescued")]
        if not wanted:
            return
        finalizer = self.finalizer
        assert finalizer is not None  # set by start()
        pool = await self.services.pool()
        for job_id, kind, _state, reason, _exhausted in wanted:
            try:
                async with pool.connection() as conn:
                    cur = await conn.execute(sql.GET_JOB, (job_id,))
                    row = await cur.fetchone()
                if row is None:  # gone since (pruned, or moved to the DLQ)
                    log.warning(
                        "rescued follow-up spec of %s job %s: the job is gone", kind, job_id
                    )
                    continue
                job = Job.from_row(row)
                requests = specs.requests(
                    kind, "rescued", job.args, job, job_id, job.metadata, reason
                )
                async with pool.connection() as conn:
                    async with conn.transaction():
                        await finalizer.insert_follow_ups(conn, kind, job_id, requests)
            except Exception:
                log.exception(
                    "rescued follow-up spec of %s job %s failed (best effort)", kind, job_id
                )

    # -- periodic jobs ----------------------------------------------------------------------------

    async def _sync_periodic(self) -> None:
        """Upsert the client's registered periodic schedules into awa_fast.cron_jobs."""
        from awa_fast import periodic

        jobs = list(self.services.periodic_jobs.values())
        if jobs:
            async with (await self.services.pool()).connection() as conn:
                await periodic.sync_schedules(conn, jobs)

    async def _run_batch_operations(self, fenced: Any) -> int:
        """Leader only (a Maintenance extra task): one step of the batch-operation runner
        (``batch_ops.run_once``) in a leader-fenced transaction."""
        try:
            async with fenced() as conn:
                return await batch_ops.run_once(conn, self.instance)
        finally:
            raise_if_cancelling()

    async def _evaluate_cron(self, fenced: Any = None) -> int:
        """Leader only (a Maintenance extra task): enqueue due periodic fires, in a leader-fenced
        transaction when ``fenced`` (``Maintenance.fenced``) is given."""
        from awa_fast import periodic

        try:
            if fenced is None:
                async with (await self.services.pool()).connection() as conn:
                    return await periodic.evaluate(conn, self.cron_problems)
            async with fenced() as conn:
                return await periodic.evaluate(conn, self.cron_problems)
        finally:
            raise_if_cancelling()  # see worker/cancellation.py

    async def reconcile(self, fenced: Any = None) -> dict:
        """Reconciler tick (leader only): run ``verify_success`` hooks once on recently
        completed jobs of their kinds (verdict and correction in one transaction), then retry
        owed failure consequences that are due. Writes go through ``fenced``
        (``Maintenance.fenced``) when given."""
        from awa_fast.worker.reconcile import reconcile_tick

        return await reconcile_tick(self.services, self.maintenance_config, fenced)

    def _settled_by_reconciler(self) -> list[str]:
        """Kinds whose final-attempt rescue waits in ``consequence_pending`` for the settler
        (``Settler.pending_kinds``)."""
        return self.services.settler.pending_kinds()

    # -- presence and unhandled kinds -----------------------------------------------------------

    @property
    def min_stale_ms(self) -> int:
        """The shortest heartbeat staleness (ms) under which this process's live attempts, their
        "still running" marks and, while it leads, its lock connection never look stale: two
        heartbeat intervals (``HEARTBEAT_SAFETY``) and, if it runs maintenance, two leader
        checks. Written with its presence row; every process's rescue and leader displacement
        wait at least the longest such value of a live process (migration 025), so one started
        with a short ``heartbeat_staleness_ms`` never rescues another's live attempt."""
        beats = HEARTBEAT_SAFETY * self.heartbeat_interval_s * 1000
        checks = 2 * self.maintenance_config.leader_check_ms if self.run_maintenance else 0
        return math.ceil(max(beats, checks))

    @property
    def _presence_ttl_ms(self) -> float:
        """How long the presence row outlives its last refresh (ms)."""
        return max(
            self.maintenance_config.heartbeat_staleness_ms, 3 * self.heartbeat_interval_s * 1000
        )

    async def _beat_presence(self, conn: Any) -> None:
        # With every round of heartbeats (the liveness thread): the presence row, and with it
        # min_stale_ms (ADR 020), lives as long as the beats do.
        await conn.execute(
            sql.WORKER_SEEN,
            {
                "instance": self.instance,
                "kinds": self.kinds,
                "queues": [q.name for q in self.queues],
                "ttl_ms": self._presence_ttl_ms,
                "min_stale_ms": self.min_stale_ms,
            },
        )

    async def _seen(self, conn: Any) -> None:
        await self._beat_presence(conn)
        # the descriptors this process declares: stored at start, refreshed with presence
        await descriptors.sync(
            conn,
            self.services.queue_descriptors,
            self.services.kind_descriptors,
        )

    async def check_unhandled(self) -> list[tuple[str, str, int]]:
        """Refresh this process's presence row, then look in its queues for available jobs no
        live worker has a handler for; log each ``(queue, kind)`` once (an error: they wait
        until a worker with a handler starts). Returns ``[(queue, kind, available)]``."""
        async with (await self.services.pool()).connection() as conn:
            await self._seen(conn)
            cur = await conn.execute(sql.UNHANDLED_IN_QUEUES, ([q.name for q in self.queues],))
            rows = await cur.fetchall()
        for queue, kind, n in rows:
            if (queue, kind) not in self.unhandled_warned:
                self.unhandled_warned.add((queue, kind))
                log.error(
                    "queue %r holds %d available job(s) of kind %r, which no live worker "
                    "has a handler for (this process handles: %s); they wait for a worker "
                    "that has one",
                    queue,
                    n,
                    kind,
                    ", ".join(self.kinds),
                )
        return rows

    async def _presence_loop(self) -> None:
        """Keep the presence row fresh (every heartbeat interval) and check for unhandled
        kinds (every ``UNHANDLED_CHECK_S`` s); survives every error."""
        next_check = 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                if loop.time() >= next_check:
                    await self.check_unhandled()
                    next_check = loop.time() + UNHANDLED_CHECK_S
                else:
                    async with (await self.services.pool()).connection() as conn:
                        await self._seen(conn)
            except Exception as exc:  # presence is advisory; never let the loop end
                log.warning("worker presence update failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(min(self.heartbeat_interval_s, UNHANDLED_CHECK_S))

    # -- notifications --------------------------------------------------------------------------

    def _listen_url(self) -> str | None:
        """Where the LISTEN connection goes: ``database_url``, unless that is a transaction
        pooler (LISTEN there hears nothing): then ``listen_url``, or none (polling)."""
        if pooler_mode.session_state_allowed(self.services.pooler):
            return self.services.database_url
        return self.services.listen_url

    async def _listen_connect(self) -> psycopg.AsyncConnection:
        url = self._listen_url()
        assert url is not None  # the listen loop runs only with a URL
        conn = await pg_connection.connection_class(self.services.schema).connect(
            url, autocommit=True, connect_timeout=10
        )
        await conn.execute(sql.LISTEN_QUEUE)
        await conn.execute(sql.LISTEN_CANCEL)
        self._listen_conn = conn
        return conn

    async def _listen_loop(self) -> None:
        failures = 0
        while True:
            try:
                conn = self._listen_conn
                if conn is None or conn.closed:
                    conn = await self._listen_connect()
                    failures = 0
                    for d in self.dispatchers.values():
                        d.notify()  # we may have missed notifications while reconnecting
                async for note in conn.notifies():
                    self._on_notify(note.channel, note.payload)
            except Exception as exc:  # the listen loop must survive every error
                # Backed off like every loop (a database down for minutes must not log a
                # line per poll interval); the dispatchers poll meanwhile.
                failures += 1
                delay = min(self.poll_interval_s * 2 ** (failures - 1), LISTEN_BACKOFF_MAX_S)
                log.warning(
                    "LISTEN connection lost (%s: %s); polling until it is back "
                    "(reconnecting in %.2f s)",
                    type(exc).__name__,
                    exc,
                    delay,
                )
                self._listen_conn = None
                raise_if_cancelling()  # see worker/cancellation.py
                await asyncio.sleep(delay)

    def _leave_listen_server(self) -> None:
        conn = self._listen_conn
        if conn is None or conn.closed or self.services.pooler == "transaction":
            return  # (through a transaction pooler it listens on listen_url: its own server)
        self._listen_conn = None
        log.warning("the LISTEN connection's server takes no writes; reconnecting")
        # closing it ends the listen loop's wait, which then reconnects (libpq chooses again)
        task = asyncio.get_running_loop().create_task(conn.close())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

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
            ctx = self.in_flight.get((msg.get("job_id"), msg.get("run_lease")))
            if ctx is not None:
                ctx.cancel_flag()
                self.progress.fire("cancel flagged")
