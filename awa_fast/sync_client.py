"""The blocking :class:`Client` (awa-pg's sync ``awa.Client``) and :class:`SyncTransaction`.

Every producer/admin method of :class:`~awa_fast.client.AsyncClient` has a twin here with the
same name and parameters, written out (no attribute forwarding, so a missing twin is a visible
gap, checked by ``tests/compat/test_sync_client.py``). Each twin runs the async method on a
private event loop in a daemon thread and blocks until it returns, and carries the async
method's docstring (arguments, errors). The methods without a twin are listed in
:data:`ASYNC_ONLY`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
import weakref
from datetime import datetime
from typing import Any

from awa_fast.batch_ops import BatchOperationFilter, BatchOperationKind
from awa_fast.client import DEFAULT_QUEUE, AsyncClient
from awa_fast.transaction import Transaction

# AsyncClient methods with no blocking twin: worker lifecycle and registration (as in awa-pg,
# whose sync Client has no task/start/shutdown/periodic), plus the pool itself (it belongs to the
# private loop; use ``Client.async_client`` from that loop's thread, or a connection of your own).
ASYNC_ONLY = frozenset(
    {
        "pool",
        "task",
        "worker",
        "start",
        "shutdown",
        "periodic",
        "failure_consequence",
        "on_completed_enqueue",
        "on_retried_enqueue",
        "on_exhausted_enqueue",
        "on_cancelled_enqueue",
        "on_waiting_for_callback_enqueue",
        "on_rescued_enqueue",
        "queue_descriptor",
        "job_kind_descriptor",
    }
)


# Clients not closed yet: closed at interpreter exit, while their loop thread (a daemon) still
# runs; else the exit destroyed the pool's pending tasks, each printing "Task was destroyed but
# it is pending!".
_OPEN: weakref.WeakSet[Client] = weakref.WeakSet()
CLOSE_AT_EXIT_S = 5.0  # bound of that close (a database that does not answer)


@atexit.register
def _close_open_clients() -> None:
    for client in list(_OPEN):
        if client._pid != os.getpid():
            continue  # a forked child's copy: its loop thread lives in the parent only
        with contextlib.suppress(Exception):
            client._close(timeout=CLOSE_AT_EXIT_S)


class Client:
    """Blocking client: ``Client(database_url=None, max_connections=10, *, pooler=None,
    listen_url=None, schema=None)``, usable as ``with`` (the arguments as for
    :class:`AsyncClient`, ``None`` resolved as the CLI does). One not closed is closed at
    interpreter exit (within 5 s).

    Raises (construction):
        DatabaseError: the database cannot be reached (awa-pg connects eagerly too).
        ConfigError: ``pooler`` / ``listen_url`` as :class:`AsyncClient` refuses them, or the
            connection does not match ``pooler`` (its pool opens here).
        ValidationError: as :class:`AsyncClient`.
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
        self._async = AsyncClient(
            database_url, max_connections, pooler=pooler, listen_url=listen_url, schema=schema
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="awa-fast-client", daemon=True
        )
        self._thread.start()
        try:
            self._call(self._async.pool())
        except BaseException:
            self._stop_loop()
            raise
        self._pid = os.getpid()
        _OPEN.add(self)

    @property
    def schema(self) -> str:
        """The schema this client's objects live in (``AsyncClient.schema``)."""
        return self._async.schema

    @property
    def async_client(self) -> AsyncClient:
        """The :class:`AsyncClient` this client drives."""
        return self._async

    def _call(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def close(self) -> None:
        """Send pending insert wake-ups, close the pool and stop the private loop (idempotent)."""
        self._close(timeout=None)

    def _close(self, timeout: float | None) -> None:
        _OPEN.discard(self)
        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._async.close(), self._loop).result(timeout)
            finally:
                self._stop_loop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- schema and storage ------------------------------------------------------------------

    def migrate(self) -> list[int]:
        return self._call(self._async.migrate())

    def install_queue_storage(
        self,
        *,
        schema: str = "awa",
        queue_slot_count: int = 16,
        lease_slot_count: int = 8,
        reset: bool = False,
    ) -> None:
        return self._call(
            self._async.install_queue_storage(
                schema=schema,
                queue_slot_count=queue_slot_count,
                lease_slot_count=lease_slot_count,
                reset=reset,
            )
        )

    def prepare_queue_storage_schema(
        self, *, schema: str = "awa", queue_slot_count: int = 16, lease_slot_count: int = 8
    ) -> None:
        return self._call(
            self._async.prepare_queue_storage_schema(
                schema=schema, queue_slot_count=queue_slot_count, lease_slot_count=lease_slot_count
            )
        )

    def storage_status(self) -> str:
        return self._call(self._async.storage_status())

    def flush_admin_metadata(self) -> None:
        return self._call(self._async.flush_admin_metadata())

    # -- producers ---------------------------------------------------------------------------

    def insert(
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
    ):
        return self._call(
            self._async.insert(
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
        )

    def insert_many(self, jobs: list, **opts: Any):
        return self._call(self._async.insert_many(jobs, **opts))

    def insert_many_copy(self, jobs: list, **opts: Any):
        return self._call(self._async.insert_many_copy(jobs, **opts))

    def enqueue_many_copy(self, jobs: list, **opts: Any) -> int:
        return self._call(self._async.enqueue_many_copy(jobs, **opts))

    def transaction(self) -> SyncTransaction:
        """Begin a transaction: ``with client.transaction() as tx``."""
        return SyncTransaction(self, self._call(self._async.transaction()))

    # -- jobs --------------------------------------------------------------------------------

    def get_job(self, job_id: int):
        return self._call(self._async.get_job(job_id))

    def list_jobs(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        queue: str | None = None,
        limit: int = 100,
    ):
        return self._call(self._async.list_jobs(state=state, kind=kind, queue=queue, limit=limit))

    def retry(self, job_id: int):
        return self._call(self._async.retry(job_id))

    def staleness_ms(self) -> int:
        return self._async.staleness_ms()  # no runtime here: the default rescue threshold

    def cancel(self, job_id: int):
        return self._call(self._async.cancel(job_id))

    def cancel_by_unique_key(
        self,
        kind: str,
        *,
        queue: str | None = None,
        args: Any = None,
        period_bucket: int | None = None,
    ):
        return self._call(
            self._async.cancel_by_unique_key(
                kind, queue=queue, args=args, period_bucket=period_bucket
            )
        )

    def retry_failed(self, *, kind: str | None = None, queue: str | None = None):
        return self._call(self._async.retry_failed(kind=kind, queue=queue))

    def discard_failed(self, kind: str) -> int:
        return self._call(self._async.discard_failed(kind))

    def correct_to_failed(self, job_id: int, *, error: str):
        return self._call(self._async.correct_to_failed(job_id, error=error))

    def consequences_owed(self, limit: int = 100) -> list[dict]:
        return self._call(self._async.consequences_owed(limit))

    def dump_job(self, job_id: int) -> str:
        return self._call(self._async.dump_job(job_id))

    def dump_run(self, job_id: int, attempt: int | None = None) -> str:
        return self._call(self._async.dump_run(job_id, attempt))

    # -- queues, cron, health ----------------------------------------------------------------

    def queue_stats(self):
        return self._call(self._async.queue_stats())

    def unhandled_kinds(self) -> list[dict]:
        return self._call(self._async.unhandled_kinds())

    def pause_queue(self, queue: str, paused_by: str | None = None) -> None:
        return self._call(self._async.pause_queue(queue, paused_by))

    def resume_queue(self, queue: str) -> None:
        return self._call(self._async.resume_queue(queue))

    def drain_queue(self, queue: str) -> int:
        return self._call(self._async.drain_queue(queue))

    def list_cron_jobs(self) -> list[dict]:
        return self._call(self._async.list_cron_jobs())

    def delete_cron_job(self, name: str) -> bool:
        return self._call(self._async.delete_cron_job(name))

    def health_check(self):
        return self._call(self._async.health_check())

    # -- external callbacks ------------------------------------------------------------------

    def complete_external(self, callback_id: Any, payload: Any = None):
        return self._call(self._async.complete_external(callback_id, payload))

    def fail_external(self, callback_id: Any, error: str):
        return self._call(self._async.fail_external(callback_id, error))

    def retry_external(self, callback_id: Any):
        return self._call(self._async.retry_external(callback_id))

    def resume_external(self, callback_id: Any, payload: Any = None):
        return self._call(self._async.resume_external(callback_id, payload))

    def heartbeat_callback(self, callback_id: Any, timeout_seconds: float = 3600.0):
        return self._call(self._async.heartbeat_callback(callback_id, timeout_seconds))

    def resolve_callback(
        self, callback_id: Any, payload: Any = None, default_action: str = "ignore"
    ):
        return self._call(self._async.resolve_callback(callback_id, payload, default_action))

    # -- batch operations (awa_fast/batch_ops.py) --------------------------------------------

    def preview_batch_operation(
        self,
        op_kind: BatchOperationKind,
        *,
        spec: dict,
        filter: BatchOperationFilter | None = None,
    ):
        return self._call(self._async.preview_batch_operation(op_kind, spec=spec, filter=filter))

    def submit_batch_operation(
        self,
        op_kind: BatchOperationKind,
        *,
        spec: dict,
        filter: BatchOperationFilter | None = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ):
        return self._call(
            self._async.submit_batch_operation(
                op_kind, spec=spec, filter=filter, submitted_by=submitted_by, allow_all=allow_all
            )
        )

    def preview_set_priority(self, priority: int, *, filter: dict | None = None):
        return self._call(self._async.preview_set_priority(priority, filter=filter))

    def set_priority(
        self,
        priority: int,
        *,
        filter: dict | None = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ):
        return self._call(
            self._async.set_priority(
                priority, filter=filter, submitted_by=submitted_by, allow_all=allow_all
            )
        )

    def preview_move_queue(
        self, queue: str, *, priority: int | None = None, filter: dict | None = None
    ):
        return self._call(self._async.preview_move_queue(queue, priority=priority, filter=filter))

    def move_queue(
        self,
        queue: str,
        *,
        priority: int | None = None,
        filter: dict | None = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ):
        return self._call(
            self._async.move_queue(
                queue,
                priority=priority,
                filter=filter,
                submitted_by=submitted_by,
                allow_all=allow_all,
            )
        )

    def list_batch_operations(self, *, state: str | None = None, limit: int = 100):
        return self._call(self._async.list_batch_operations(state=state, limit=limit))

    def get_batch_operation(self, operation_id: str):
        return self._call(self._async.get_batch_operation(operation_id))

    def cancel_batch_operation(self, operation_id: str):
        return self._call(self._async.cancel_batch_operation(operation_id))

    def purge_batch_operations(self, before: datetime, *, limit: int = 1000):
        return self._call(self._async.purge_batch_operations(before, limit=limit))

    # -- dead-letter queue -------------------------------------------------------------------

    def list_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        before_id: int | None = None,
        before_dlq_at: datetime | str | None = None,
        limit: int = 100,
    ):
        return self._call(
            self._async.list_dlq(
                kind=kind,
                queue=queue,
                tag=tag,
                before_id=before_id,
                before_dlq_at=before_dlq_at,
                limit=limit,
            )
        )

    def get_dlq_job(self, job_id: int):
        return self._call(self._async.get_dlq_job(job_id))

    def dlq_depth(self, *, queue: str | None = None) -> int:
        return self._call(self._async.dlq_depth(queue=queue))

    def dlq_depth_by_queue(self) -> dict[str, int]:
        return self._call(self._async.dlq_depth_by_queue())

    def retry_from_dlq(
        self,
        job_id: int,
        *,
        run_at: datetime | str | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ):
        return self._call(
            self._async.retry_from_dlq(job_id, run_at=run_at, priority=priority, queue=queue)
        )

    def bulk_retry_from_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        allow_all: bool = False,
    ) -> int:
        return self._call(
            self._async.bulk_retry_from_dlq(kind=kind, queue=queue, tag=tag, allow_all=allow_all)
        )

    def move_failed_to_dlq(self, job_id: int, reason: str = "manual") -> bool:
        return self._call(self._async.move_failed_to_dlq(job_id, reason))

    def bulk_move_failed_to_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        reason: str = "manual",
        allow_all: bool = False,
    ) -> int:
        return self._call(
            self._async.bulk_move_failed_to_dlq(
                kind=kind, queue=queue, reason=reason, allow_all=allow_all
            )
        )

    def purge_dlq_job(self, job_id: int) -> bool:
        return self._call(self._async.purge_dlq_job(job_id))

    def purge_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        before_id: int | None = None,
        before_dlq_at: datetime | str | None = None,
        allow_all: bool = False,
    ) -> int:
        return self._call(
            self._async.purge_dlq(
                kind=kind,
                queue=queue,
                tag=tag,
                before_id=before_id,
                before_dlq_at=before_dlq_at,
                allow_all=allow_all,
            )
        )


def _docstrings_from_async() -> None:
    """Give each written-out twin without a docstring of its own the async method's (the
    behaviour, arguments and errors are the async method's)."""
    for name, fn in vars(Client).items():
        twin = getattr(AsyncClient, name, None)
        if callable(fn) and not name.startswith("_") and fn.__doc__ is None and twin is not None:
            fn.__doc__ = twin.__doc__


_docstrings_from_async()


class SyncTransaction:
    """Blocking twin of :class:`~awa_fast.transaction.Transaction` (same methods, written out);
    ``with client.transaction() as tx`` commits on a clean exit and rolls back on an error."""

    def __init__(self, client: Client, tx: Transaction):
        self._client = client
        self._tx = tx

    @property
    def connection(self):
        return self._tx.connection

    def insert(self, args: Any, **opts: Any):
        return self._client._call(self._tx.insert(args, **opts))

    def insert_many(self, jobs: list, **opts: Any):
        return self._client._call(self._tx.insert_many(jobs, **opts))

    def execute(self, query: str, *args: Any) -> int:
        return self._client._call(self._tx.execute(query, *args))

    def fetch_all(self, query: str, *args: Any) -> list[dict]:
        return self._client._call(self._tx.fetch_all(query, *args))

    def fetch_optional(self, query: str, *args: Any) -> dict | None:
        return self._client._call(self._tx.fetch_optional(query, *args))

    def fetch_one(self, query: str, *args: Any) -> dict:
        return self._client._call(self._tx.fetch_one(query, *args))

    def commit(self) -> None:
        return self._client._call(self._tx.commit())

    def rollback(self) -> None:
        return self._client._call(self._tx.rollback())

    def __enter__(self) -> SyncTransaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._client._call(self._tx.__aexit__(exc_type, exc, tb))
