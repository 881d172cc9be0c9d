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
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson
import psycopg
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from awa_fast import (
    callbacks,
    db_errors,
    pg_connection,
    primary,
    schema,
    schema_binding,
    sql,
    storage_options,
)
from awa_fast import pooler as pooler_mode
from awa_fast.admin.batches import BatchAdmin
from awa_fast.admin.callbacks import CallbackAdmin
from awa_fast.admin.consequences import ConsequenceAdmin
from awa_fast.admin.cron import CronAdmin
from awa_fast.admin.dlq import DlqAdmin, DlqEntry
from awa_fast.admin.health import HealthAdmin, HealthCheck
from awa_fast.admin.jobs import JobAdmin, RetryFailedResult
from awa_fast.admin.queues import QueueAdmin, QueueStat
from awa_fast.admin.storage import StorageAdmin
from awa_fast.batch_ops import (
    BatchOperation,
    BatchOperationFilter,
    BatchOperationKind,
    BatchOperationPreview,
)
from awa_fast.connection_config import connection_config
from awa_fast.connections import Connections, Pool
from awa_fast.database_url import resolve_database_url, url_source
from awa_fast.errors import AwaError, DatabaseUnavailable, ValidationError
from awa_fast.job import Job
from awa_fast.producer import DEFAULT_QUEUE, OffQueueWarner, Producer
from awa_fast.requests import check_name, kind_for_type, optional_name
from awa_fast.transaction import Transaction
from awa_fast.worker.consequences import ConsequenceApplier, ConsequenceConfig, Settler
from awa_fast.worker.registry import Registry
from awa_fast.worker.services import Services
from awa_fast.worker.specs import SpecRunner

if TYPE_CHECKING:
    from awa_fast.worker.config import RuntimeConfig
    from awa_fast.worker.runtime import Runtime


async def _configure(conn: psycopg.AsyncConnection) -> None:
    set_json_loads(orjson.loads, conn)
    await conn.execute(sql.SESSION_READ_COMMITTED)


async def _configure_pooled(conn: psycopg.AsyncConnection) -> None:
    # through a transaction pooler a session SET would stay on whichever server connection
    # ran it: the database's own default must be READ COMMITTED (pooler.check_connection)
    set_json_loads(orjson.loads, conn)


# close(): the longest wait for a cancelled shutdown's release step (the finalizer's last flush
# is bounded by SHUTDOWN_GRACE_S, 10 s; the rest by seconds)
RELEASE_WAIT_S = 15.0


# Set while awa-fast's own loaders import an application (``awa-fast worker``'s preflight and
# children, ``awa-fast check``: :func:`awa_fast.app_loader.load_client`): a client built at
# import skips its construction-time connect, so ``--database-url`` can override its URL before
# anything connects and ``check`` never touches the database. The launcher's children then
# connect (and fail with one line) with the URL they use. Ordinary library use keeps the check.
_defer_reachability_check = 0


@contextlib.contextmanager
def deferred_reachability_check() -> Iterator[None]:
    """Within it, ``AsyncClient(url)`` does not connect at construction (the application
    loaders of ``awa-fast worker`` and ``awa-fast check`` import the application in it)."""
    global _defer_reachability_check
    _defer_reachability_check += 1
    try:
        yield
    finally:
        _defer_reachability_check -= 1


def _check_reachable(url: str) -> None:
    """Connect once and close (awa-pg connects at construction). Raises DatabaseUnavailable."""
    try:
        psycopg.connect(url, connect_timeout=10, autocommit=True).close()
    except psycopg.Error as exc:
        raise DatabaseUnavailable(
            "could not connect to the database (the URL given to the client): "
            + " ".join(str(exc).split()),
            operation="AsyncClient()",
            sqlstate=exc.sqlstate,
        ) from exc


TASK_OPTIONS = ("kind", "queue", "failure_consequence", "verify_success")
# Options of insert() that are per job, not per handler.
_INSERT_ONLY = ("priority", "max_attempts", "tags", "metadata", "run_at", "unique_opts")


def check_task_options(args_type: Any, options: dict) -> None:
    """What ``task()`` checks before registering (a raw AttributeError / TypeError otherwise).

    Raises:
        ValidationError: naming ``args_type`` or the unknown option.
    """
    if not isinstance(args_type, type):
        hint = (
            f"; to name the kind, use task(dict, kind={args_type!r})"
            if isinstance(args_type, str)
            else ""
        )
        raise ValidationError(
            f"task() args_type must be a class (dict, a dataclass, a msgspec.Struct or a "
            f"pydantic model), got {type(args_type).__name__} {args_type!r}{hint}",
            field="args_type",
            limit="a class",
        )
    for key in options:
        if key in ("failure_consequence", "verify_success"):
            continue
        where = f"; {key} is set per job: insert(..., {key}=...)" if key in _INSERT_ONLY else ""
        raise ValidationError(
            f"task() got an unknown option {key!r}{where}; task() accepts "
            f"{', '.join(TASK_OPTIONS)}",
            field=key,
            limit=f"one of {', '.join(TASK_OPTIONS)}",
        )


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
        # Admin, one object per area (awa_fast/admin/), each given only what it uses. The
        # client's methods are looked up at each call (late bound), as the mixins did.
        self._connections = Connections(lambda: self.pool())
        self._off_queue = OffQueueWarner(lambda: self.registry.off_default)
        self._producer = Producer(self._connections, self._off_queue)

        def staleness() -> int:
            return self.staleness_ms()

        self._jobs = JobAdmin(self._connections, staleness)
        self._queues = QueueAdmin(self._connections)
        self._health = HealthAdmin(self._connections, lambda: self._runtime)
        self._cron = CronAdmin(self._connections)
        self._callbacks = CallbackAdmin(
            self._connections, lambda: self.specs, lambda: self.settler, staleness
        )
        self._consequences = ConsequenceAdmin(
            self._connections,
            lambda: self.settler,
            lambda job_id: self.get_job(job_id),
        )
        self._dlq = DlqAdmin(self._connections, staleness)
        self._storage = StorageAdmin(
            self._connections,
            self._migrate_schema,
            schema=lambda: self._binding,
            use_schema=self._use_schema,
            running=lambda: self._runtime is not None or self._starting is not None,
        )
        self._batches = BatchAdmin(self._connections)
        self._sync_twins: Any = None  # awa_fast.raw_client.SyncTwins, made by ``_raw``
        if self.explicit_database_url is not None and not _defer_reachability_check:
            _check_reachable(self.explicit_database_url)

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
            DatabaseUnavailable: the database could not be reached within 30 seconds.
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
                pool = Pool(url, open=False, **self._pool_options(url))
                try:
                    await pool.open(wait=True, timeout=pool.timeout)
                except PoolTimeout as exc:
                    await pool.close()
                    where = url_source(self.explicit_database_url)
                    raise DatabaseUnavailable(
                        f"could not connect to the database (the URL {where}): {exc}",
                        operation="pool",
                    ) from exc
                try:  # the mode matches the connection, before anything is written
                    async with pool.connection() as conn:
                        await pooler_mode.check_connection(conn, self.pooler)
                except BaseException:
                    await pool.close()
                    raise
                self._pool = pool
                self._pool_guard = asyncio.get_running_loop().create_task(
                    _close_pool_on_cancel(pool), name="awa-fast-pool-guard"
                )
        return self._pool

    def _pool_options(self, url: str) -> dict[str, Any]:
        """psycopg_pool options of the pool :meth:`pool` opens on ``url``; its ``timeout`` also
        bounds the first open. (The dashboard's client shortens the waits.)"""
        return dict(
            min_size=1,
            max_size=self.max_connections,
            kwargs={"autocommit": True, **pooler_mode.connect_options(self.pooler)},
            configure=(
                _configure if pooler_mode.session_state_allowed(self.pooler) else _configure_pooled
            ),
            timeout=30,
            # every statement on it in this client's schema (ADR 027)
            connection_class=pg_connection.connection_class(self._binding),
        )

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

    async def insert(
        self,
        args: Any,
        *,
        kind: str | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 2,
        max_attempts: int = 25,
        tags: list[str] | None = None,
        metadata: dict | None = None,
        run_at: Any = None,
        unique_opts: dict | None = None,
        ordering_key: bytes | str | None = None,
    ) -> Job:
        """Insert one job and return it.

        ``args`` is a dict (then ``kind`` is required), a dataclass, a ``msgspec.Struct`` or a
        pydantic model. A future ``run_at`` (datetime, naive = UTC, or ISO 8601 str) makes the job
        ``scheduled``. ``unique_opts`` is ``{by_queue, by_args, by_period, states}`` ({} = defaults).
        Without ``queue=`` the job goes to ``"default"``, as in awa-pg, even for a kind
        registered here with ``task(..., queue=X)``; that case warns once per kind
        (:class:`QueueMismatchWarning`). The job is committed when this returns; the NOTIFY
        that wakes its queue's dispatchers follows from a background task (ADR 018, as for
        every insert method here; ``close()`` waits for it).

        Raises:
            ValidationError: a field breaks an insert rule (nothing is written).
            UniqueConflict: another job holds the same unique key.
        """
        return await self._producer.insert(
            args,
            kind=kind,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            tags=tags,
            metadata=metadata,
            run_at=run_at,
            unique_opts=unique_opts,
            ordering_key=ordering_key,
        )

    async def insert_many(self, jobs: list, **opts: Any) -> list[Job]:
        """Insert many jobs in one statement with shared keyword options (all or none).

        Each element of ``jobs`` is args (as for :meth:`insert`) or an ``EnqueueRequest``.

        Raises:
            ValidationError: any element breaks a rule (no row of the batch is written).
            UniqueConflict: any element's unique key is held (no row is written).
            DeadlockError: kept deadlocking with concurrent writers after bounded retries
                (unique keys are taken in one global order, so only writers outside
                awa-fast's order can cause one; no row is written).
        """
        return await self._producer.insert_many(jobs, **opts)

    async def insert_many_copy(self, jobs: list, **opts: Any) -> list[Job]:
        """Bulk insert with COPY (for 10k+ rows); same arguments and errors as :meth:`insert_many`,
        plus awa's ``opts``: a list (one entry per job, ``None`` or a dict with ``queue`` and/or
        ``ordering_key``; an explicit ``ordering_key: None`` clears the batch's key) overriding
        those two options per job.

        Raises:
            ValidationError: also for an ``opts`` list of the wrong length, a non-dict entry or
                another key (awa's messages).
        """
        return await self._producer.insert_many_copy(jobs, **opts)

    async def enqueue_many_copy(self, jobs: list, **opts: Any) -> int:
        """Like :meth:`insert_many_copy` but returns only the number of jobs written (awa-pg's
        ``enqueue_many_copy``): no Job objects are built.

        Raises:
            Unsupported: ``queue_storage_queue_stripe_count`` other than awa's default 1
                (awa-fast has no queue-storage stripes).
        """
        return await self._producer.enqueue_many_copy(jobs, **opts)

    async def transaction(self) -> Transaction:
        """Begin a transaction: ``async with await client.transaction() as tx``."""
        return await self._producer.transaction()

    # -- admin: each method delegates to one area of awa_fast/admin/ ------------------------------

    async def _fetch(self, query: str, params: Any = None) -> list[tuple]:
        # One statement on a pooled connection (the CLI and the demo use it).
        return await self._connections.fetch(query, params)

    # -- jobs (admin/jobs.py) ---------------------------------------------------------------------

    async def get_job(self, job_id: int) -> Job:
        """The job with this id. Raises :class:`JobNotFound` (an ``AwaError``) if there is none."""
        return await self._jobs.get_job(job_id)

    async def list_jobs(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        queue: str | None = None,
        limit: int = 100,
    ) -> list[Job]:
        """Jobs, newest first, filtered by state / kind / queue."""
        return await self._jobs.list_jobs(state=state, kind=kind, queue=queue, limit=limit)

    async def retry(self, job_id: int) -> Job | None:
        """Make a failed, cancelled or waiting_external job available again with attempt 0.

        Returns the job, or ``None`` if it is in another state.

        A job cancelled (or failed externally, or parked by a handler still in
        ``wait_for_callback``) while its handler runs is retried only once that attempt is over
        (the worker acknowledged it, or the worker's heartbeat went stale): two attempts of one
        job never run at once (docs/architecture.md, "Cancel, then retry").

        Raises:
            UniqueConflict: another live job now holds its unique key (nothing changes); its
                ``holder_id`` names that job.
            AttemptStillRunning: the job's last attempt is still running (nothing changes);
                retry after it ends.
        """
        return await self._jobs.retry(job_id)

    def staleness_ms(self) -> int:
        """How old (milliseconds) a heartbeat must be for its attempt to count as dead: this
        process's runtime setting, else the default rescue uses (90 s)."""
        from awa_fast.worker.maintenance import MaintenanceConfig

        runtime = self._runtime
        conf = runtime.maintenance_config if runtime is not None else MaintenanceConfig()
        return int(conf.heartbeat_staleness_ms)

    async def cancel(self, job_id: int) -> Job | None:
        """Cancel a non-terminal job; a running attempt is told through ``job.is_cancelled()``.

        Returns the cancelled job, or ``None`` if it was already terminal, is
        ``consequence_pending`` (its failure is decided: the reconciler applies the owed
        consequence and settles it as failed), or does not exist.

        Raises:
            UniqueConflict: its mask holds ``cancelled`` and another job holds its key there
                (``holder_id`` names it; nothing changes).
        """
        return await self._jobs.cancel(job_id)

    async def cancel_by_unique_key(
        self,
        kind: str,
        *,
        queue: str | None = None,
        args: Any = None,
        period_bucket: int | None = None,
    ) -> Job | None:
        """Cancel the oldest non-terminal job whose unique key matches the given components
        (pass only those used at insert time). Returns it, or ``None``."""
        return await self._jobs.cancel_by_unique_key(
            kind, queue=queue, args=args, period_bucket=period_bucket
        )

    async def retry_failed(
        self, *, kind: str | None = None, queue: str | None = None
    ) -> RetryFailedResult:
        """Make every ``failed`` job of ``kind`` or of ``queue`` (exactly one) available again
        with attempt 0; returns a :class:`RetryFailedResult`. A job whose failure consequence is
        still owed stays failed; so does a job whose unique key another live job now holds
        (logged, naming the holder), whose update fails alone for another reason, or whose
        last attempt's handler still runs (an early ``fail_external``).

        Raises:
            ValueError: neither or both of ``kind`` and ``queue`` (awa's message).
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        return await self._jobs.retry_failed(kind=kind, queue=queue)

    async def discard_failed(self, kind: str) -> int:
        """Delete the ``failed`` jobs of ``kind`` (not those whose failure consequence is still
        owed); returns how many. A job whose delete fails alone is kept (logged).

        Raises:
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        return await self._jobs.discard_failed(kind)

    async def dump_job(self, job_id: int) -> str:
        """Every column of the job as indented JSON (failure-consequence bookkeeping included).
        A dead-lettered job is dumped from the DLQ, with ``"in_dlq": true`` and its
        ``dlq_reason`` / ``dlq_at`` / ``original_run_lease``.

        Raises:
            JobNotFound: no such job in ``awa_fast.jobs_all`` nor the DLQ.
        """
        return await self._jobs.dump_job(job_id)

    async def dump_run(self, job_id: int, attempt: int | None = None) -> str:
        """One attempt of a job as indented JSON: the job, the attempt number, the ``errors``
        entry recorded for it (``null`` if it did not fail), progress, run lease and timestamps.
        ``attempt`` defaults to the latest.

        Raises:
            JobNotFound: no such job.
            AwaError: the job has no such attempt (or has never run).
        """
        return await self._jobs.dump_run(job_id, attempt)

    # -- queues (admin/queues.py) and health (admin/health.py) ------------------------------------

    async def queue_stats(self) -> list[QueueStat]:
        """Per-queue counts (see :class:`QueueStat`).

        Raises:
            DatabaseError: no connection to the database within ``ADMIN_POOL_WAIT_S`` seconds
                (3; :mod:`awa_fast.connections`), e.g. postgres is down.
        """
        return await self._queues.queue_stats()

    async def unhandled_kinds(self) -> list[dict]:
        """Available jobs no live worker handles, per queue and kind:
        ``[{"queue", "kind", "available"}]`` (a live worker is a started runtime whose presence
        row in ``awa_fast.workers`` has not expired)."""
        return await self._queues.unhandled_kinds()

    async def pause_queue(self, queue: str, paused_by: str | None = None) -> None:
        """Stop claims from ``queue`` (running jobs finish)."""
        return await self._queues.pause_queue(queue, paused_by)

    async def resume_queue(self, queue: str) -> None:
        """Allow claims from ``queue`` again and wake its workers."""
        return await self._queues.resume_queue(queue)

    async def drain_queue(self, queue: str) -> int:
        """Cancel every job of ``queue`` that is waiting (``available``, ``scheduled``,
        ``retryable``, and parked in ``waiting_external``, as awa-pg does); running attempts are
        left alone. Returns how many. A job whose
        cancel fails alone (e.g. its mask holds ``cancelled`` and another cancelled job holds
        its key) is left waiting (logged).

        Raises:
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        return await self._queues.drain_queue(queue)

    async def health_check(self) -> HealthCheck:
        """Postgres reachability plus, when this client runs a runtime, its loops, leadership
        and per-queue load (see :class:`HealthCheck`). With postgres down it answers
        ``postgres_connected=False`` after at most ``ADMIN_POOL_WAIT_S`` seconds (3) waiting
        for a connection, not the pool's 30 s."""
        return await self._health.health_check()

    # -- periodic (cron) jobs (admin/cron.py) -----------------------------------------------------

    async def list_cron_jobs(self) -> list[dict]:
        """Every stored periodic schedule as a dict: the ``awa_fast.cron_jobs`` columns
        (``last_fire_at`` = the scheduled fire time last enqueued, also as awa's
        ``last_enqueued_at``) plus ``next_fire_at``; timestamps are ISO 8601 strings."""
        return await self._cron.list_cron_jobs()

    async def delete_cron_job(self, name: str) -> bool:
        """Delete a stored schedule; ``True`` if it existed. A process that still registers it
        upserts it again at its next ``start()``."""
        return await self._cron.delete_cron_job(name)

    # -- external callbacks, ADR-021 (admin/callbacks.py) -----------------------------------------

    async def complete_external(self, callback_id: Any, payload: Any = None) -> Job:
        """Complete the job waiting on ``callback_id`` (see ``awa_fast.callbacks``).

        Raises:
            CallbackNotFound: unknown or expired callback id.
            ValidationError: malformed callback id.
        """
        return await self._callbacks.complete_external(callback_id, payload)

    async def fail_external(self, callback_id: Any, error: str) -> Job:
        """Fail the job waiting on ``callback_id`` through the failure path (its failure
        consequence first). Raises as :meth:`complete_external`."""
        return await self._callbacks.fail_external(callback_id, error)

    async def retry_external(self, callback_id: Any) -> Job:
        """Send the parked job back to available with attempt 0. Raises as
        :meth:`complete_external`."""
        return await self._callbacks.retry_external(callback_id)

    async def resume_external(self, callback_id: Any, payload: Any = None) -> Job:
        """Resume a handler blocked in ``wait_for_callback`` with ``payload``. Raises as
        :meth:`complete_external`."""
        return await self._callbacks.resume_external(callback_id, payload)

    async def heartbeat_callback(self, callback_id: Any, timeout_seconds: float = 3600.0) -> Job:
        """Extend the callback's timeout to now + ``timeout_seconds`` seconds."""
        return await self._callbacks.heartbeat_callback(callback_id, timeout_seconds)

    async def resolve_callback(
        self, callback_id: Any, payload: Any = None, default_action: str = "ignore"
    ) -> callbacks.ResolveResult:
        """Resolve the callback with the CEL expressions its handler registered (``filter``,
        ``on_fail``, ``on_complete`` + ``transform``, in awa's order), falling back to
        ``default_action`` (``"complete"``, ``"fail"``, ``"ignore"``); returns a
        :class:`~awa_fast.callbacks.ResolveResult`.

        Raises:
            CallbackNotFound: unknown callback id. ValidationError: malformed id or action.
        """
        return await self._callbacks.resolve_callback(callback_id, payload, default_action)

    # -- failure consequences (admin/consequences.py) ---------------------------------------------

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

    async def correct_to_failed(self, job_id: int, *, error: str) -> Job:
        """Correct an apparent success: a ``completed`` job becomes ``failed`` (``error``
        appended) and, in the same transaction, its failure consequence is recorded as owed;
        it is applied right after (when this process knows the kind's consequence) and
        retried by the reconciler until it succeeds.

        Raises:
            JobNotFound: no job with that id.
            AwaError: the job is not ``completed``.
        """
        return await self._consequences.correct_to_failed(job_id, error=error)

    async def consequences_owed(self, limit: int = 100) -> list[dict]:
        """Jobs whose failure consequence is owed (pending failures and corrections), with
        ``overdue`` true once an application failed or it waited over 60 s."""
        return await self._consequences.consequences_owed(limit)

    # -- dead-letter queue, ADR-020 (admin/dlq.py) ------------------------------------------------

    async def list_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        before_id: int | None = None,
        before_dlq_at: datetime | str | None = None,
        limit: int = 100,
    ) -> list[DlqEntry]:
        """Dead-lettered jobs, newest first (``dlq_at``, then id). ``before_id`` /
        ``before_dlq_at`` page backwards (strictly older)."""
        return await self._dlq.list_dlq(
            kind=kind,
            queue=queue,
            tag=tag,
            before_id=before_id,
            before_dlq_at=before_dlq_at,
            limit=limit,
        )

    async def get_dlq_job(self, job_id: int) -> DlqEntry | None:
        """The DLQ entry of job ``job_id``, or ``None``."""
        return await self._dlq.get_dlq_job(job_id)

    async def dlq_depth(self, *, queue: str | None = None) -> int:
        """Number of dead-lettered jobs (of ``queue``, or in all)."""
        return await self._dlq.dlq_depth(queue=queue)

    async def dlq_depth_by_queue(self) -> dict[str, int]:
        """``{queue: dead-lettered jobs}`` for every queue with at least one."""
        return await self._dlq.dlq_depth_by_queue()

    async def retry_from_dlq(
        self,
        job_id: int,
        *,
        run_at: datetime | str | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> Job | None:
        """Move a dead-lettered job back to ``awa_fast.jobs`` under the same id: attempt 0,
        run lease kept (never reused, so a zombie attempt stays stale), errors kept, ``available`` (``scheduled`` for a future ``run_at``), with
        optional ``priority`` / ``queue`` overrides. Returns the job, or ``None`` if job
        ``job_id`` is not in the DLQ.

        Raises:
            UniqueConflict: a live job holds its unique key; nothing changes (the DLQ row stays).
            ValidationError: an override breaks a rule (e.g. priority outside 1..4).
            AttemptStillRunning: the handler of the job's last attempt is still running (an
                early ``fail_external`` dead-lettered it; docs/architecture.md, "No two
                executions of one job overlap"); nothing changes, retry once it has ended.
        """
        return await self._dlq.retry_from_dlq(job_id, run_at=run_at, priority=priority, queue=queue)

    async def bulk_retry_from_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        allow_all: bool = False,
    ) -> int:
        """Retry every matching DLQ entry (as :meth:`retry_from_dlq`); returns how many.
        Entries whose unique key is held by a live job are skipped and stay in the DLQ (logged
        with the holder); so does an entry whose re-insert fails for another reason, and one
        whose last attempt's handler is still running (retry it once it has ended).

        Raises:
            ValueError: no filter and not ``allow_all``.
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        return await self._dlq.bulk_retry_from_dlq(
            kind=kind, queue=queue, tag=tag, allow_all=allow_all
        )

    async def move_failed_to_dlq(self, job_id: int, reason: str = "manual") -> bool:
        """Move a ``failed`` job to the DLQ (whatever its queue's DLQ setting). ``False`` if
        the job is not failed (or its failure consequence is still owed)."""
        return await self._dlq.move_failed_to_dlq(job_id, reason)

    async def bulk_move_failed_to_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        reason: str = "manual",
        allow_all: bool = False,
    ) -> int:
        """Move every matching ``failed`` job to the DLQ; returns how many.

        A job whose move fails alone (say a trigger refuses it) stays failed (logged).

        Raises:
            ValueError: no filter and not ``allow_all``.
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        return await self._dlq.bulk_move_failed_to_dlq(
            kind=kind, queue=queue, reason=reason, allow_all=allow_all
        )

    async def purge_dlq_job(self, job_id: int) -> bool:
        """Delete one DLQ entry; ``True`` if it existed."""
        return await self._dlq.purge_dlq_job(job_id)

    async def purge_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        before_id: int | None = None,
        before_dlq_at: datetime | str | None = None,
        allow_all: bool = False,
    ) -> int:
        """Delete matching DLQ entries; returns how many. An entry whose delete fails alone is
        kept (logged).

        Raises:
            ValueError: no filter and not ``allow_all``.
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        return await self._dlq.purge_dlq(
            kind=kind,
            queue=queue,
            tag=tag,
            before_id=before_id,
            before_dlq_at=before_dlq_at,
            allow_all=allow_all,
        )

    # -- storage, awa-pg's start-up calls (admin/storage.py) --------------------------------------

    async def flush_admin_metadata(self) -> None:
        """awa recomputes cached admin counters here; awa-fast caches none (``queue_stats()``
        counts the jobs table when called), so there is nothing to flush."""
        return await self._storage.flush_admin_metadata()

    async def install_queue_storage(
        self,
        *,
        schema: str = "awa",
        queue_slot_count: int = 16,
        lease_slot_count: int = 8,
        reset: bool = False,
    ) -> None:
        """awa installs and activates its queue-storage engine here. awa-fast has one engine,
        always active, in this client's schema: this applies its migrations (idempotent), and
        with ``reset=True`` then deletes every job and what belongs to jobs, as awa's reset
        (``StorageAdmin.install_queue_storage``; docs/compat.md). ``schema``: awa's default
        ``"awa"`` is this client's schema; another name creates (or upgrades) that schema and
        moves this client to it (ADR 027). The slot counts size awa's partition rings:
        accepted (> 0), without effect here (logged at INFO).

        Raises:
            AwaError: this client's worker runtime is running or starting (awa's rule), or
                another install of this client is in progress.
            ValidationError: a ``schema`` that breaks the schema-name rule.
            ConfigError: a slot count that is not an int > 0, ``reset`` not a bool.
        """
        return await self._storage.install_queue_storage(
            schema=schema,
            queue_slot_count=queue_slot_count,
            lease_slot_count=lease_slot_count,
            reset=reset,
        )

    async def prepare_queue_storage_schema(
        self, *, schema: str = "awa", queue_slot_count: int = 16, lease_slot_count: int = 8
    ) -> None:
        """As :meth:`install_queue_storage` without ``reset``: awa materializes its
        queue-storage schema here without activating it; so does this: the migrations of
        ``schema`` (``"awa"``: this client's) are applied, and the client stays where it is
        (``start(queue_storage_schema=...)`` or ``install_queue_storage`` moves it).

        Raises:
            ValidationError, ConfigError: as :meth:`install_queue_storage`.
        """
        return await self._storage.prepare_queue_storage_schema(
            schema=schema, queue_slot_count=queue_slot_count, lease_slot_count=lease_slot_count
        )

    async def storage_status(self) -> str:
        """awa's storage-status report (pretty JSON, same keys) for awa-fast's one engine:
        ``current_engine`` = ``active_engine`` = ``"awa_fast"``, state ``"active"``, never a
        transition (both ``can_*`` false, with the reason as the blocker), timestamps from the
        schema's migration history, ``details`` with the schema and migration versions."""
        return await self._storage.storage_status()

    # -- batch operations, awa's ADR-030 (admin/batches.py) ---------------------------------------

    async def preview_batch_operation(
        self, op_kind: BatchOperationKind, *, spec: dict, filter: BatchOperationFilter | None = None
    ) -> BatchOperationPreview:
        """Count and sample the queued jobs an operation would change (no submission)."""
        return await self._batches.preview_batch_operation(op_kind, spec=spec, filter=filter)

    async def submit_batch_operation(
        self,
        op_kind: BatchOperationKind,
        *,
        spec: dict,
        filter: BatchOperationFilter | None = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> BatchOperation:
        """Submit an operation for the maintenance leader to run; returns it (``pending``).
        ``submitted_by`` defaults to the database session user."""
        return await self._batches.submit_batch_operation(
            op_kind, spec=spec, filter=filter, submitted_by=submitted_by, allow_all=allow_all
        )

    async def preview_set_priority(self, priority: int, *, filter: dict | None = None) -> dict:
        return await self._batches.preview_set_priority(priority, filter=filter)

    async def set_priority(
        self,
        priority: int,
        *,
        filter: dict | None = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> dict:
        """Submit ``set_priority`` (1-4) over the matched available / scheduled jobs."""
        return await self._batches.set_priority(
            priority, filter=filter, submitted_by=submitted_by, allow_all=allow_all
        )

    async def preview_move_queue(
        self, queue: str, *, priority: int | None = None, filter: dict | None = None
    ) -> dict:
        return await self._batches.preview_move_queue(queue, priority=priority, filter=filter)

    async def move_queue(
        self,
        queue: str,
        *,
        priority: int | None = None,
        filter: dict | None = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> dict:
        """Submit ``move_queue`` (optionally with a new priority) over the matched jobs."""
        return await self._batches.move_queue(
            queue, priority=priority, filter=filter, submitted_by=submitted_by, allow_all=allow_all
        )

    async def list_batch_operations(
        self, *, state: str | None = None, limit: int = 100
    ) -> list[dict]:
        """Operations, newest first (``state`` filters)."""
        return await self._batches.list_batch_operations(state=state, limit=limit)

    async def get_batch_operation(self, operation_id: str) -> dict:
        return await self._batches.get_batch_operation(operation_id)

    async def cancel_batch_operation(self, operation_id: str) -> dict:
        """Cancel a pending operation, or ask the runner to stop an active one."""
        return await self._batches.cancel_batch_operation(operation_id)

    async def purge_batch_operations(self, before: datetime, *, limit: int = 1000) -> int:
        """Delete finalized operations finalized before ``before``; returns how many."""
        return await self._batches.purge_batch_operations(before, limit=limit)

    # -- workers --------------------------------------------------------------------------------

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

    def on_completed_enqueue(
        self, trigger_args_type: type, fn: Callable, *, kind: str | None = None
    ) -> None:
        """On completion of ``trigger_args_type`` jobs, insert ``fn(args, job)``'s result
        (args, ``EnqueueRequest`` or ``None`` to skip) in the same transaction. Kinds with such a
        spec complete through the per-job transaction. Register before ``start()``."""
        self.specs.register("completed", trigger_args_type, fn, kind=kind)

    def on_retried_enqueue(
        self, trigger_args_type: type, fn: Callable, *, kind: str | None = None
    ) -> None:
        """Spec for a retryable failure: ``fn(args, job, error, attempt, next_run_at)``."""
        self.specs.register("retried", trigger_args_type, fn, kind=kind)

    def on_exhausted_enqueue(
        self, trigger_args_type: type, fn: Callable, *, kind: str | None = None
    ) -> None:
        """Spec for a terminal failure or exhaustion: ``fn(args, job, error, attempt)``."""
        self.specs.register("exhausted", trigger_args_type, fn, kind=kind)

    def on_cancelled_enqueue(
        self, trigger_args_type: type, fn: Callable, *, kind: str | None = None
    ) -> None:
        """Spec for a handler ``Cancel``: ``fn(args, job, reason)``."""
        self.specs.register("cancelled", trigger_args_type, fn, kind=kind)

    def on_waiting_for_callback_enqueue(
        self, trigger_args_type: type, fn: Callable, *, kind: str | None = None
    ) -> None:
        """Spec for a returned ``WaitForCallback``: ``fn(args, job)``."""
        self.specs.register("waiting_for_callback", trigger_args_type, fn, kind=kind)

    def on_rescued_enqueue(
        self, trigger_args_type: type, fn: Callable, *, kind: str | None = None
    ) -> None:
        """Spec for a maintenance rescue: ``fn(args, job, reason)``; inserted best effort in a
        separate transaction *after* the rescue commits (ADR-029's atomicity matrix)."""
        self.specs.register("rescued", trigger_args_type, fn, kind=kind)

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

    def queue_descriptor(
        self,
        queue: str,
        *,
        display_name: str | None = None,
        description: str | None = None,
        owner: str | None = None,
        docs_url: str | None = None,
        tags: list[str] | None = None,
        extra: dict | None = None,
    ) -> None:
        """Describe ``queue`` for operators (awa's queue descriptor; before ``start()``, which
        stores it in ``awa_fast.queue_descriptors`` and keeps it fresh while running). The
        queue must be one ``start()`` runs. A later declaration for the queue replaces it.

        Raises:
            ValidationError: a field past awa's limits (``awa_fast.descriptors.build``).
            RuntimeError: the runtime is already started.
        """
        from awa_fast import descriptors

        if self._runtime is not None:
            raise RuntimeError("queue_descriptor() must be called before start()")
        self.queue_descriptors[queue] = descriptors.build(
            "queue",
            queue,
            display_name=display_name,
            description=description,
            owner=owner,
            docs_url=docs_url,
            tags=tags,
            extra=extra,
        )

    def job_kind_descriptor(
        self,
        kind: str,
        *,
        display_name: str | None = None,
        description: str | None = None,
        owner: str | None = None,
        docs_url: str | None = None,
        tags: list[str] | None = None,
        extra: dict | None = None,
    ) -> None:
        """Describe job kind ``kind`` (as :meth:`queue_descriptor`; stored in
        ``awa_fast.job_kind_descriptors``).

        Raises:
            ValidationError, RuntimeError: as :meth:`queue_descriptor`.
        """
        from awa_fast import descriptors

        if self._runtime is not None:
            raise RuntimeError("job_kind_descriptor() must be called before start()")
        self.kind_descriptors[kind] = descriptors.build(
            "kind",
            kind,
            display_name=display_name,
            description=description,
            owner=owner,
            docs_url=docs_url,
            tags=tags,
            extra=extra,
        )

    async def start(self, queues: Any = None, **options: Any) -> None:
        """Start claiming and running jobs in this process (see ``worker.runtime.Runtime``
        for the keywords: awa's ``poll_interval_ms``, ``heartbeat_interval_ms``, ...;
        ``consequence_timeout_ms`` / ``consequence_backoff_ms`` configure this client's settler;
        the keywords become one ``worker.config.RuntimeConfig``, validated before anything
        starts). ``queue_storage_schema="s"`` (awa's; ``"awa"`` is this client's own schema)
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
        """The runtime ``start(queues, **options)`` would run, over this client's services,
        and the consequence configuration it gives the settler; changes nothing.

        Raises:
            ConfigError, ValidationError, TypeError: as :meth:`start`.
        """
        config = self._start_config(queues, options)
        return self._runtime_of(config), config.consequences

    def _start_config(self, queues: Any, options: dict) -> RuntimeConfig:
        """``start(queues, **options)`` validated and typed (``worker.config.runtime_config``),
        without building a runtime: also what ``awa-fast check`` and the launcher's preflight
        validate with.

        Raises:
            ConfigError, ValidationError, TypeError: as :meth:`start`.
        """
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
        """``QueueMismatchWarning`` for each schedule registered without ``queue=`` whose kind
        this client registered for another queue: its fires go to ``default`` (awa-pg's
        ``periodic(queue="default")``), where that kind's workers do not look."""
        from awa_fast.errors import QueueMismatchWarning

        for name in sorted(self._implicit_cron_queue):
            job = self.periodic_jobs.get(name)
            queue = self.registry.off_default.get(job.kind) if job is not None else None
            if job is not None and queue is not None:
                warnings.warn(
                    QueueMismatchWarning(
                        f"periodic job {name!r} of kind {job.kind!r} was registered without "
                        f"queue=, so it fires into 'default' (awa-pg semantics), but the kind "
                        f"is registered for queue {queue!r} on this client; pass "
                        f"queue={queue!r} to periodic() or work 'default' too"
                    ),
                    stacklevel=5,  # start() (its db_errors wrapper), _start_config, this
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


async def _close_pool_on_cancel(pool: AsyncConnectionPool) -> None:
    """Close ``pool`` when this task is cancelled, as ``asyncio.run()`` does to every task at exit.

    psycopg_pool's async workers and scheduler catch ``CancelledError`` (a connect cancelled
    mid-way logs "error connecting in 'pool-1': " and is retried), so a pool left open when
    ``main()`` returns without :meth:`AsyncClient.close` keeps ``asyncio.run()`` waiting
    forever. Closing queues a stop for each of them, which they do honour.
    """
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        try:
            await pool.close()
        except asyncio.CancelledError:
            pass  # a worker that ended cancelled fails close()'s gather; its stop is queued
        raise


# The blocking client lives in its own module; importable from here as before.
