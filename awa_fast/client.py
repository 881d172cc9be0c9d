"""The async client :class:`AsyncClient` (producers, admin, workers); the blocking ``Client`` is in
``awa_fast/sync_client.py``.

The client is a facade: it owns the pool, inserts, registration and the runtime's start /
shutdown; each admin method is written out and calls the method of the same name on one area
object of :mod:`awa_fast.admin` (jobs, queues, health, DLQ, cron, consequences, callbacks,
storage, batch operations), which gets only the dependencies it uses.

Names, keywords and defaults follow awa-pg (``awa.AsyncClient`` / ``awa.Client``), so an
application moves over with ``import awa_fast as awa``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from psycopg_pool import AsyncConnectionPool

from awa_fast import (
    db_errors,
    descriptors,
    primary,
    schema,
    schema_binding,
    storage_options,
)
from awa_fast.admin.batches import BatchAdmin
from awa_fast.admin.callbacks import CallbackAdmin
from awa_fast.admin.consequences import ConsequenceAdmin
from awa_fast.admin.cron import CronAdmin
from awa_fast.admin.dlq import DlqAdmin
from awa_fast.admin.health import HealthAdmin
from awa_fast.admin.jobs import JobAdmin
from awa_fast.admin.queues import QueueAdmin
from awa_fast.admin.storage import StorageAdmin
from awa_fast.connection_config import connection_config
from awa_fast.connections import (
    Connections,
    check_reachable,
    close_pool_on_cancel,
    open_pool,
    pool_options,
    reachability_check_deferred,
)
from awa_fast.database_url import resolve_database_url
from awa_fast.descriptors import DescriptorFields
from awa_fast.errors import AwaError, DatabaseUnavailable, ValidationError
from awa_fast.producer import DEFAULT_QUEUE, OffQueueWarner, Producer
from awa_fast.requests import check_name, kind_for_type, optional_name
from awa_fast.twins import expose, variants
from awa_fast.worker.consequences import ConsequenceApplier, ConsequenceConfig, Settler
from awa_fast.worker.registry import Registry, check_task_options
from awa_fast.worker.services import Services
from awa_fast.worker.specs import SpecRunner

if TYPE_CHECKING:
    from awa_fast.worker.config import RuntimeConfig
    from awa_fast.worker.runtime import Runtime


# close(): the longest wait for a cancelled shutdown's release step (the finalizer's last flush
# is bounded by SHUTDOWN_GRACE_S, 10 s; the rest by seconds)
RELEASE_WAIT_S = 15.0


T = TypeVar("T")


def _register_follow_up(
    client: AsyncClient,
    outcome: str,
    trigger_args_type: type,
    fn: Callable[..., Any],
    *,
    kind: str | None = None,
) -> None:
    """What every ``on_<outcome>_enqueue`` method does (``SpecRunner.register``).

    Raises:
        ValidationError: ``kind`` breaks the name rule. TypeError: ``fn`` is not callable.
        RuntimeError: the runtime already started (specs are fixed at ``start()``).
    """
    client.specs.register(outcome, trigger_args_type, fn, kind=kind)


_on_enqueue = variants(_register_follow_up, "on_{}_enqueue")


@db_errors.boundary()
class AsyncClient:
    """Async client: insert jobs, administer them, and run workers.

    Args:
        database_url: a libpq connection string or URI; ``None`` (the default) resolves it as
            the CLI does (:func:`awa_fast.database_url.resolve_database_url`:
            ``$AWA_FAST_DATABASE_URL``, ``$DATABASE_URL``, else the embedded server), on first use.
        max_connections: the pool size (connections, not processes). The runtime also opens
            one dedicated LISTEN connection, one heartbeat connection and one leader-lock
            connection (docs/deployment.md, "Connection budget").
        pooler: which connection mode ``database_url`` is in (ADR 028,
            :mod:`awa_fast.pooler`): ``None`` (default) ``$AWA_FAST_POOLER`` if set (how the
            CLI and the dashboard are told), else direct to PostgreSQL; ``"session"``
            a pooler in session mode, ``"transaction"`` a pooler in transaction mode (no
            session state on its connections: no prepared statements, no ``SET``, no
            ``LISTEN``; leadership by a lease row).
        listen_url: with ``pooler="transaction"``, an optional direct URL for the runtime's
            one LISTEN connection (wake-ups within milliseconds, cancel requests to running
            handlers); without it the runtime polls every ``poll_interval_ms``. Rejected
            (``ConfigError``) with any other ``pooler``.
        schema: the PostgreSQL schema every awa-fast object of this client lives in (its jobs,
            workers, maintenance leader, wake-ups; ADR 027); ``None`` (the default):
            ``$AWA_FAST_SCHEMA`` if set, else ``"awa_fast"``. Lowercase letters, digits and
            ``_``, at most 56 characters. Clients of different schemas share a database and
            nothing else.

    Like awa-pg, a client given a URL connects once at construction to check that the
    database is reachable (one short-lived connection, closed at once, so a client built at
    import time in a launcher parent is still safe to fork); the pool opens on first use.
    Without a URL the check happens at first use (resolving may start the embedded server).
    A client built while ``awa-fast worker`` or ``awa-fast check`` imports the application does
    not connect at construction (``--database-url`` may override its URL; ``check`` touches no
    database): the worker children connect with the URL they use.
    Use as ``async with AsyncClient(url) as client``.

    Every coroutine method raises driver errors as the awa-fast error tree, never psycopg's
    (``awa_fast.db_errors``): ``UniqueConflict``, ``SchemaNotMigrated``, ``DeadlockError``,
    ``ReadOnlyDatabase`` (the database refuses writes), ``DatabaseUnavailable`` (no connection,
    or it was lost), else ``DatabaseError``; each names the call (``"insert: ..."``,
    ``.operation``) and is chained to the driver's exception (``__cause__``).

    Raises:
        DatabaseUnavailable: the given database cannot be reached (awa-pg's eager connect).
        ValidationError: ``max_connections`` < 1; a ``schema`` (or ``$AWA_FAST_SCHEMA``) that
            breaks the schema-name rule (naming the field).
        ConfigError: ``pooler`` not one of ``None``, ``"session"``, ``"transaction"``;
            ``listen_url`` given without ``pooler="transaction"``; a ``database_url`` or
            ``listen_url`` naming several hosts without ``target_session_attrs=read-write``
            (or ``primary``; :func:`awa_fast.primary.check_url`). At the pool's first open
            (and so at ``start()``): a pooler found behind ``database_url`` with ``pooler``
            unset, or under ``"transaction"`` a database default isolation other than READ
            COMMITTED (:func:`awa_fast.pooler.check_connection`).
    """

    def __init__(
        self,
        database_url: str | None = None,
        max_connections: int = 10,
        *,
        pooler: str | None = None,
        listen_url: str | None = None,
        schema: str | None = None,
    ):
        config = connection_config(
            database_url, max_connections, pooler=pooler, listen_url=listen_url, schema=schema
        )
        self.pooler = config.pooler
        self.listen_url = config.listen_url
        self._binding = config.schema
        self.explicit_database_url = config.database_url
        self._database_url: str | None = config.database_url
        self.max_connections = config.max_connections
        self._pool: AsyncConnectionPool | None = None
        self._pool_lock: asyncio.Lock | None = None
        self._pool_guard: asyncio.Task | None = None
        self._closes = 0  # close() calls so far: an open that outlived one closes its pool
        self.registry = Registry()
        self.specs = SpecRunner()
        self.consequences = ConsequenceApplier(self.registry)
        self.settler = Settler(self.consequences, self.specs)
        self._runtime: Runtime | None = None
        self._starting: asyncio.Event | None = None  # set when a start() in progress ends
        self._stopping: asyncio.Event | None = None  # set when a shutdown() in progress ends
        self._releasing: asyncio.Future | None = None  # the last runtime's release step
        self.periodic_jobs: dict = {}  # name -> awa_fast.periodic.PeriodicJob
        self._implicit_cron_queue: set[str] = set()  # schedules registered without queue=
        self.queue_descriptors: dict = {}  # queue -> awa_fast.descriptors.Descriptor
        self.kind_descriptors: dict = {}  # kind -> awa_fast.descriptors.Descriptor
        self._connections = Connections(lambda: self.pool())
        self._off_queue = OffQueueWarner(lambda: self.registry.off_default)
        self._components = self._wire_components()
        self._producer = self._component(Producer)
        self._storage = self._component(StorageAdmin)
        self._sync_twins: Any = None  # awa_fast.raw_client.SyncTwins, made by ``_raw``
        if self.explicit_database_url is not None and not reachability_check_deferred():
            check_reachable(self.explicit_database_url)

    def _wire_components(self) -> dict[type, Any]:
        """The producer and one object per admin area (awa_fast/admin/), each given only what
        it uses, by class (:meth:`_component`). What they take of the client is looked up at
        each call (late bound): a runtime started later, a schema moved to."""
        db = self._connections

        def staleness() -> int:
            return self.staleness_ms()

        parts = (
            Producer(db, self._off_queue),
            JobAdmin(db, staleness),
            QueueAdmin(db),
            HealthAdmin(db, lambda: self._runtime),
            CronAdmin(db),
            CallbackAdmin(db, lambda: self.specs, lambda: self.settler, staleness),
            ConsequenceAdmin(db, lambda: self.settler, lambda job_id: self.get_job(job_id)),
            DlqAdmin(db, staleness),
            StorageAdmin(
                db,
                self._migrate_schema,
                schema=lambda: self._binding,
                use_schema=self._use_schema,
                running=lambda: self._runtime is not None or self._starting is not None,
            ),
            BatchAdmin(db),
        )
        return {type(part): part for part in parts}

    # -- connections ----------------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        """The URL in use: the one given, else resolved (once) from the environment or the
        embedded server. Raises EmbeddedPostgresError if that server cannot start."""
        if self._database_url is None:
            self._database_url = resolve_database_url(None)
        return self._database_url

    @database_url.setter
    def database_url(self, value: str) -> None:
        self._database_url = self.explicit_database_url = value

    @property
    def schema(self) -> str:
        """The schema this client's objects live in (``"awa_fast"`` by default). Set it before
        the client's first use to move it (``awa-fast --schema s worker`` does, as
        ``--database-url`` sets :attr:`database_url`).

        Raises (on set):
            ValidationError: the name breaks the schema-name rule.
            AwaError: the pool is open or the runtime started (use
                ``install_queue_storage(schema=...)``, which moves an open client).
        """
        return self._binding.name

    @schema.setter
    def schema(self, name: str) -> None:
        binding = schema_binding.bind(name)
        if binding is self._binding:
            return
        if self._pool is not None or self._runtime is not None or self._starting is not None:
            raise AwaError(
                f"cannot move to schema {name!r}: this client is in use "
                "(install_queue_storage(schema=...) moves a client in use)"
            )
        self._binding = binding

    async def _use_schema(self, binding: schema_binding.SchemaBinding) -> None:
        """Move this client to ``binding``'s schema (awa's ``install_queue_storage(schema=)``
        and ``start(queue_storage_schema=)``): a pool bound to the previous one is closed, the
        next use opens one bound to the new one."""
        if binding is self._binding:
            return
        await self._producer.waker.flush()  # wake-ups owed in the previous schema
        self._binding = binding
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()
        if self._pool_guard is not None:
            self._pool_guard.cancel()
            self._pool_guard = None

    async def _resolved_url(self) -> str:
        if self._database_url is None:  # may start the embedded server: off the loop
            await asyncio.to_thread(lambda: self.database_url)
        return self.database_url

    async def pool(self) -> AsyncConnectionPool:
        """The open connection pool (opened on first call). Its sessions run their
        transactions at READ COMMITTED (``sql.SESSION_READ_COMMITTED``, migration 024; under
        ``pooler="transaction"`` the database's default, checked at open); SQL of your own on
        them must not undo that (``RESET ALL``, ``DISCARD ALL``, ``SET SESSION
        CHARACTERISTICS``) where the database's default is another level, or that connection's
        inserts of keyed jobs are refused. Under ``pooler="transaction"`` it must set nothing
        for the session at all (``SET LOCAL`` inside a transaction only).

        Raises:
            DatabaseUnavailable: the database could not be reached within 30 seconds, or
                close() ran while the pool was opening (the pool is closed again).
            ConfigError: the connection does not match ``pooler``
                (:func:`awa_fast.pooler.check_connection`); the pool is closed again.
        """
        if self._pool is not None:
            return self._pool
        url = await self._resolved_url()
        if self._pool_lock is None:
            self._pool_lock = asyncio.Lock()
        async with self._pool_lock:
            if self._pool is None:
                primary.check_url(url, "database_url")  # also one from the environment
                closes = self._closes
                pool = await open_pool(
                    url, self._pool_options(url), self.pooler, self.explicit_database_url
                )
                if self._closes != closes:
                    # close() ran while it opened (a bounded admin call's open goes on in the
                    # background): a pool kept now would outlive the client's close.
                    await pool.close()
                    raise DatabaseUnavailable(
                        "the client was closed while its pool was opening", operation="pool"
                    )
                self._pool = pool
                self._pool_guard = asyncio.get_running_loop().create_task(
                    close_pool_on_cancel(pool), name="awa-fast-pool-guard"
                )
        return self._pool

    def _pool_options(self, url: str) -> dict[str, Any]:
        """psycopg_pool options of the pool :meth:`pool` opens on ``url``; its ``timeout`` also
        bounds the first open. (The dashboard's client shortens the waits.)"""
        return pool_options(self.max_connections, self.pooler, self._binding)

    async def close(self) -> None:
        """Stop the runtime if it is running, send the inserts' pending wake-ups and close the
        pool."""
        if self._runtime is not None or self._stopping is not None or self._starting:
            await self.shutdown()  # (waits for a start or shutdown in progress)
        releasing, self._releasing = self._releasing, None
        if releasing is not None and not releasing.done():
            # a cancelled shutdown's release (connections, presence row) needs the pool
            with contextlib.suppress(Exception, TimeoutError):
                await asyncio.wait_for(asyncio.shield(releasing), RELEASE_WAIT_S)
        await self._producer.waker.flush()
        self._closes += 1
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        if self._pool_guard is not None:
            self._pool_guard.cancel()
            self._pool_guard = None
        if self._sync_twins is not None:
            await asyncio.to_thread(self._sync_twins.close)

    @property
    def _raw(self) -> Any:
        """The blocking ``<method>_sync`` twins (:class:`awa_fast.raw_client.SyncTwins`), under
        the attribute awa-pg's wrapper gives its native client; opened on first use."""
        if self._sync_twins is None:
            from awa_fast.raw_client import SyncTwins  # raw_client imports this module

            self._sync_twins = SyncTwins(self)
        return self._sync_twins

    async def __aenter__(self) -> AsyncClient:
        await self.pool()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def migrate(self) -> list[int]:
        """Create or upgrade this client's schema (``awa_fast`` by default; idempotent, safe
        concurrently); returns the versions applied now."""
        return await self._migrate_schema(self._binding)

    async def _migrate_schema(self, binding: schema_binding.SchemaBinding) -> list[int]:
        return await schema.migrate(await self._resolved_url(), binding)

    # -- producers ------------------------------------------------------------------------------

    insert = expose(Producer.insert)
    insert_many = expose(Producer.insert_many)
    insert_many_copy = expose(Producer.insert_many_copy)
    enqueue_many_copy = expose(Producer.enqueue_many_copy)
    transaction = expose(Producer.transaction)

    def _component(self, cls: type[T]) -> T:
        # the part behind an exposed method (awa_fast/twins.py): an admin area, the producer
        return self._components[cls]

    # -- admin: each method is the method of the same name of one area of awa_fast/admin/,
    # exposed as is (its docstring is the reference) on this client's instance of that area --

    # -- jobs (admin/jobs.py) ---------------------------------------------------------------------

    get_job = expose(JobAdmin.get_job)
    list_jobs = expose(JobAdmin.list_jobs)
    retry = expose(JobAdmin.retry)
    cancel = expose(JobAdmin.cancel)
    cancel_by_unique_key = expose(JobAdmin.cancel_by_unique_key)
    retry_failed = expose(JobAdmin.retry_failed)
    discard_failed = expose(JobAdmin.discard_failed)
    dump_job = expose(JobAdmin.dump_job)
    dump_run = expose(JobAdmin.dump_run)

    # -- queues (admin/queues.py) and health (admin/health.py) ------------------------------------

    queue_stats = expose(QueueAdmin.queue_stats)
    unhandled_kinds = expose(QueueAdmin.unhandled_kinds)
    pause_queue = expose(QueueAdmin.pause_queue)
    resume_queue = expose(QueueAdmin.resume_queue)
    drain_queue = expose(QueueAdmin.drain_queue)
    health_check = expose(HealthAdmin.health_check)

    # -- periodic (cron) jobs (admin/cron.py) -----------------------------------------------------

    list_cron_jobs = expose(CronAdmin.list_cron_jobs)
    delete_cron_job = expose(CronAdmin.delete_cron_job)

    # -- external callbacks, ADR-021 (admin/callbacks.py) -----------------------------------------

    complete_external = expose(CallbackAdmin.complete_external)
    fail_external = expose(CallbackAdmin.fail_external)
    retry_external = expose(CallbackAdmin.retry_external)
    resume_external = expose(CallbackAdmin.resume_external)
    heartbeat_callback = expose(CallbackAdmin.heartbeat_callback)
    resolve_callback = expose(CallbackAdmin.resolve_callback)

    # -- failure consequences (admin/consequences.py) ---------------------------------------------

    correct_to_failed = expose(ConsequenceAdmin.correct_to_failed)
    consequences_owed = expose(ConsequenceAdmin.consequences_owed)

    # -- dead-letter queue, ADR-020 (admin/dlq.py) ------------------------------------------------

    list_dlq = expose(DlqAdmin.list_dlq)
    get_dlq_job = expose(DlqAdmin.get_dlq_job)
    dlq_depth = expose(DlqAdmin.dlq_depth)
    dlq_depth_by_queue = expose(DlqAdmin.dlq_depth_by_queue)
    retry_from_dlq = expose(DlqAdmin.retry_from_dlq)
    bulk_retry_from_dlq = expose(DlqAdmin.bulk_retry_from_dlq)
    move_failed_to_dlq = expose(DlqAdmin.move_failed_to_dlq)
    bulk_move_failed_to_dlq = expose(DlqAdmin.bulk_move_failed_to_dlq)
    purge_dlq_job = expose(DlqAdmin.purge_dlq_job)
    purge_dlq = expose(DlqAdmin.purge_dlq)

    # -- storage, awa-pg's start-up calls (admin/storage.py) --------------------------------------

    flush_admin_metadata = expose(StorageAdmin.flush_admin_metadata)
    install_queue_storage = expose(StorageAdmin.install_queue_storage)
    prepare_queue_storage_schema = expose(StorageAdmin.prepare_queue_storage_schema)
    storage_status = expose(StorageAdmin.storage_status)

    # -- batch operations, awa's ADR-030 (admin/batches.py) ---------------------------------------

    preview_batch_operation = expose(BatchAdmin.preview_batch_operation)
    submit_batch_operation = expose(BatchAdmin.submit_batch_operation)
    preview_set_priority = expose(BatchAdmin.preview_set_priority)
    set_priority = expose(BatchAdmin.set_priority)
    preview_move_queue = expose(BatchAdmin.preview_move_queue)
    move_queue = expose(BatchAdmin.move_queue)
    list_batch_operations = expose(BatchAdmin.list_batch_operations)
    get_batch_operation = expose(BatchAdmin.get_batch_operation)
    cancel_batch_operation = expose(BatchAdmin.cancel_batch_operation)
    purge_batch_operations = expose(BatchAdmin.purge_batch_operations)

    # -- workers --------------------------------------------------------------------------------

    def staleness_ms(self) -> int:
        """How old (milliseconds) a heartbeat must be for its attempt to count as dead: this
        process's runtime setting, else the default rescue uses (90 s)."""
        from awa_fast.worker.maintenance import MaintenanceConfig

        runtime = self._runtime
        conf = runtime.maintenance_config if runtime is not None else MaintenanceConfig()
        return int(conf.heartbeat_staleness_ms)

    def failure_consequence(self, args_type_or_kind: Any, fn: Any) -> None:
        """Declare the failure consequence of a kind whose handler may live elsewhere (every
        process that can lead maintenance must know every kind's consequence).

        ``fn`` is an async callable taking one :class:`~awa_fast.JobFailure`; it must be
        repeat-safe: it may run more than once for one failure (a crash after the effect but
        before the commit), and a repeat must leave already-recovered business state alone --
        use ``failure.idempotency_key``. Or pass ``awa_fast.NO_FAILURE_CONSEQUENCE``.

        Raises:
            ValidationError: ``args_type_or_kind`` is neither a class nor a kind name
                (``requests.check_name``).
            TypeError: ``fn`` is neither callable nor NO_FAILURE_CONSEQUENCE.
        """
        if isinstance(args_type_or_kind, type):
            self.registry.declare_consequence(
                kind_for_type(args_type_or_kind), fn, args_type_or_kind
            )
        else:  # a kind: the name rule refuses anything else, naming "kind"
            self.registry.declare_consequence(args_type_or_kind, fn)

    def task(
        self, args_type: type, *, kind: str | None = None, queue: str | None = None, **options: Any
    ) -> Callable:
        """Decorator registering a handler for ``args_type`` (kind defaults to
        ``derive_kind(args_type.__name__)``). Works with or without a running event loop.
        ``queue`` (default ``"default"``): given explicitly, ``start()`` with explicit queues
        must include it (``ConfigError`` otherwise).

        ``async def`` handlers run on the loop; plain ``def`` handlers run in a thread pool.
        A later registration for the same kind replaces the earlier one.

        Raises:
            ValidationError: ``args_type`` is not a class (field ``args_type``), an option
                other than ``failure_consequence`` / ``verify_success`` (field: its name), or
                ``kind`` / ``queue`` breaks the name rule that insert and start() apply
                (``requests.check_name``: 1-200 characters, no NUL).
        """
        check_task_options(args_type, options)
        kind = kind_for_type(args_type) if kind is None else check_name(kind, "kind")
        optional_name(queue, "queue")

        def decorate(fn: Callable) -> Callable:
            self.registry.register(args_type, fn, kind=kind, queue=queue, **options)
            return fn

        return decorate

    def worker(
        self, args_type: type, *, kind: str | None = None, queue: str = "default", **options: Any
    ) -> Callable:
        """Deprecated alias of :meth:`task` (awa-pg deprecates it too): warns, then registers.

        Raises:
            DeprecationWarning: as a warning, every call.
        """
        warnings.warn(
            "client.worker() is deprecated, use client.task() instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.task(args_type, kind=kind, queue=queue, **options)

    # -- registered follow-up specs (ADR-029) ---------------------------------------------------

    on_completed_enqueue = _on_enqueue(
        "completed",
        """On completion of ``trigger_args_type`` jobs, insert ``fn(args, job)``'s result
        (args, ``EnqueueRequest`` or ``None`` to skip) in the same transaction. Kinds with such a
        spec complete through the per-job transaction. Register before ``start()``.""",
    )
    on_retried_enqueue = _on_enqueue(
        "retried", "Spec for a retryable failure: ``fn(args, job, error, attempt, next_run_at)``."
    )
    on_exhausted_enqueue = _on_enqueue(
        "exhausted", "Spec for a terminal failure or exhaustion: ``fn(args, job, error, attempt)``."
    )
    on_cancelled_enqueue = _on_enqueue(
        "cancelled", "Spec for a handler ``Cancel``: ``fn(args, job, reason)``."
    )
    on_waiting_for_callback_enqueue = _on_enqueue(
        "waiting_for_callback", "Spec for a returned ``WaitForCallback``: ``fn(args, job)``."
    )
    on_rescued_enqueue = _on_enqueue(
        "rescued",
        """Spec for a maintenance rescue: ``fn(args, job, reason)``; inserted best effort in a
        separate transaction *after* the rescue commits (ADR-029's atomicity matrix).""",
    )

    def periodic(
        self,
        name: str,
        cron_expr: str,
        args_type: type,
        args: Any,
        *,
        timezone: str = "UTC",
        queue: str = DEFAULT_QUEUE,
        priority: int = 2,
        max_attempts: int = 25,
        tags: list[str] | None = None,
        metadata: dict | None = None,
        missed_fire_policy: str = "coalesce",
    ) -> None:
        """Register a periodic job (before ``start()``): insert ``args`` (kind from
        ``args_type``) at each fire time of the 5-field ``cron_expr`` in ``timezone``.

        ``start()`` stores the schedule in ``awa_fast.cron_jobs``; the maintenance leader enqueues
        each fire time exactly once. A schedule new to the database fires, at its first
        evaluation, the latest fire time since one minute before it was stored (awa's rule: the
        current minute's slot fires at once, older ones are not backfilled). Missed fires after
        that (no leader running) become one job for the latest (``"coalesce"``) or one job each
        (``"catch_up"``). A later registration with the same name replaces the earlier one.

        Raises:
            ValidationError (a ValueError, as awa-pg): invalid cron expression, timezone,
                policy, args or insert option.
            RuntimeError: the runtime is already started.
        """
        from awa_fast import periodic

        if self._runtime is not None:
            raise RuntimeError("periodic() must be called before start()")
        implicit = queue is DEFAULT_QUEUE
        job = periodic.build(
            name,
            cron_expr,
            args_type,
            args,
            timezone=timezone,
            queue="default" if implicit else queue,
            priority=priority,
            max_attempts=max_attempts,
            tags=tags,
            metadata=metadata,
            missed_fire_policy=missed_fire_policy,
        )
        self.periodic_jobs[job.name] = job
        if implicit:  # start() warns if its kind is registered for another queue
            self._implicit_cron_queue.add(job.name)
        else:
            self._implicit_cron_queue.discard(job.name)

    def queue_descriptor(self, queue: str, **fields: Unpack[DescriptorFields]) -> None:
        """Describe ``queue`` for operators (awa's queue descriptor; before ``start()``, which
        stores it in ``awa_fast.queue_descriptors`` and keeps it fresh while running). The
        queue must be one ``start()`` runs. A later declaration for the queue replaces it.
        ``fields``: :class:`DescriptorFields` (keywords, each ``None`` by default).

        Raises:
            ValidationError: a field past awa's limits (``awa_fast.descriptors.build``).
            RuntimeError: the runtime is already started.
            TypeError: a keyword that is not a descriptor field.
        """
        self._describe("queue", queue, fields)

    def job_kind_descriptor(self, kind: str, **fields: Unpack[DescriptorFields]) -> None:
        """Describe job kind ``kind`` (as :meth:`queue_descriptor`; stored in
        ``awa_fast.job_kind_descriptors``).

        Raises:
            ValidationError, RuntimeError, TypeError: as :meth:`queue_descriptor`.
        """
        self._describe("kind", kind, fields)

    def _describe(self, what: str, name: str, fields: DescriptorFields) -> None:
        method = "queue_descriptor" if what == "queue" else "job_kind_descriptor"
        descriptors.check_fields(method, fields)  # as Python would, before anything else
        if self._runtime is not None:
            raise RuntimeError(f"{method}() must be called before start()")
        store = self.queue_descriptors if what == "queue" else self.kind_descriptors
        store[name] = descriptors.build(what, name, **fields)

    async def start(self, queues: Any = None, **options: Any) -> None:
        """Start claiming and running jobs in this process. The keywords (awa's
        ``poll_interval_ms``, ``heartbeat_interval_ms``, ...; ``consequence_timeout_ms`` /
        ``consequence_backoff_ms`` configure this client's settler) become one
        ``worker.config.RuntimeConfig``, validated before anything starts; its fields give
        each one's unit and default. ``queue_storage_schema="s"`` (awa's; ``"awa"`` is this client's own schema)
        creates or upgrades schema ``s``, then runs the client and its runtime there (ADR 033);
        a start that fails leaves the client where it was.

        Raises:
            ValueError: an invalid queue configuration or option.
            RuntimeError: already started, or a start() is in progress.
        """
        if self._runtime is not None or self._starting is not None:
            raise RuntimeError("runtime already started")
        if self._storage.installing:  # awa's rule
            raise AwaError(
                "cannot start the worker runtime while queue storage installation is in progress"
            )
        config = self._start_config(queues, options)
        runtime = self._runtime_of(config)
        # The client's own settings, set here: the runtime reads them, never changes them.
        self.consequences.config = config.consequences
        self.specs.frozen = True
        # Marked before the first await: a second start() meanwhile is refused, and a
        # shutdown() meanwhile waits for this one to end, then stops what it started.
        self._starting = asyncio.Event()
        previous = self._binding
        try:
            # queue_storage_schema: the client moves with its runtime (ADR 027), into a
            # schema created or upgraded first, as awa's runtime prepares its storage (ADR 033)
            if runtime.services.schema is not previous:
                await self._migrate_schema(runtime.services.schema)
            await self._use_schema(runtime.services.schema)
            await runtime.start()
            self._runtime = runtime
        except asyncio.CancelledError:
            # Cancelled part-way (a caller's wait_for): stop what already runs (its finalizer,
            # its presence row) instead of leaving it behind.
            with contextlib.suppress(Exception):
                await runtime.shutdown(0)
            raise
        finally:
            if self._runtime is not runtime:  # not started: the client stays where it was
                with contextlib.suppress(Exception):
                    await self._use_schema(previous)
            starting, self._starting = self._starting, None
            starting.set()

    def _runtime_for(self, queues: Any, options: dict) -> tuple[Runtime, ConsequenceConfig]:
        """The runtime ``start(queues, **options)`` would run and its settler's consequence
        configuration; changes nothing. Raises as :meth:`start`."""
        config = self._start_config(queues, options)
        return self._runtime_of(config), config.consequences

    def _start_config(self, queues: Any, options: dict) -> RuntimeConfig:
        """``start(queues, **options)`` validated and typed (``worker.config.runtime_config``),
        no runtime built (also ``awa-fast check``'s and the preflight's). Raises as :meth:`start`."""
        from awa_fast.worker.config import runtime_config

        config = runtime_config(
            self._services(), queues, options, consequences=self.consequences.config
        )
        self._warn_cron_off_queue()
        return config

    def _runtime_of(self, config: RuntimeConfig) -> Runtime:
        """The runtime of ``config`` over this client's services, in the schema its
        ``queue_storage_schema`` names ("awa", awa's default, is this client's own; start()
        moves the client there, ADR 027)."""
        from awa_fast.worker.runtime import Runtime

        binding = None
        name = config.storage.queue_storage_schema
        if name is not None and name != storage_options.AWA_DEFAULT_SCHEMA:
            binding = schema_binding.bind(name, "queue_storage_schema")
        return Runtime(self._services(binding), config)

    def _warn_cron_off_queue(self) -> None:
        from awa_fast import periodic

        # stacklevel: start() (its db_errors wrapper), _start_config, this, warn_off_queue
        periodic.warn_off_queue(
            self.periodic_jobs, self._implicit_cron_queue, self.registry.off_default, 6
        )

    def _services(self, binding: schema_binding.SchemaBinding | None = None) -> Services:
        """What the worker layer may use of this client (``worker/services.py``)."""
        return Services(
            pool=self.pool,
            database_url=lambda: self.database_url,
            pooler=self.pooler,
            listen_url=self.listen_url,
            registry=self.registry,
            specs=self.specs,
            settler=self.settler,
            periodic_jobs=self.periodic_jobs,
            queue_descriptors=self.queue_descriptors,
            kind_descriptors=self.kind_descriptors,
            off_queue=self._off_queue,
            schema=self._binding if binding is None else binding,
        )

    async def shutdown(self, timeout_ms: int = 2000) -> None:
        """Stop claiming, let in-flight handlers finish for up to ``timeout_ms`` milliseconds,
        release the rest back to ``available`` (nothing is lost; a ``def`` handler's attempt
        only once its thread has finished), flush the finalizer. Close the pool after this
        (:meth:`close` does both). Order: docs/architecture.md, "Shutdown". A shutdown during
        a :meth:`start` waits for it to end, then stops what it started; one during another
        shutdown (or a :meth:`close`) waits for that one to finish.

        Raises:
            ValidationError: ``timeout_ms`` is not a number (int or float; NaN is not), before
                anything is stopped. A negative one drains nothing (as 0).
        """
        if (
            isinstance(timeout_ms, bool)
            or not isinstance(timeout_ms, (int, float))
            or math.isnan(timeout_ms)
        ):
            raise ValidationError(
                f"shutdown timeout_ms must be a number of milliseconds, got {timeout_ms!r}",
                field="timeout_ms",
                limit="an int or float (>= 0; negative drains nothing)",
            )
        if self._starting is not None:
            await self._starting.wait()
        if self._stopping is not None:  # another shutdown() is draining: wait for it
            await self._stopping.wait()
            return
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            self._stopping = asyncio.Event()
            try:
                await runtime.shutdown(timeout_ms)
            finally:
                # a cancelled shutdown's release still runs: close() waits for it before the
                # pool goes
                self._releasing = runtime.released
                stopping, self._stopping = self._stopping, None
                stopping.set()

    @property
    def runtime(self):
        """The running worker runtime in this process, or ``None``."""
        return self._runtime
