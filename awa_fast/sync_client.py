"""The blocking :class:`Client` (awa-pg's sync ``awa.Client``) and :class:`SyncTransaction`.

Every producer/admin method of :class:`~awa_fast.client.AsyncClient` has a twin here with the
same name, declared once as ``name = blocking(AsyncClient.name)`` (:mod:`awa_fast.twins`, ADR
039): its static type has the async method's parameters and result, so mypy and IDEs see it, and
a missing twin is a missing attribute (no attribute forwarding), checked by
``tests/admin/test_client_surface.py``. Each twin runs the async method on a private event loop in a
daemon thread and blocks until it returns, and carries the async method's docstring
(arguments, errors). The methods without a twin are listed in :data:`ASYNC_ONLY`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from awa_fast.client import AsyncClient
from awa_fast.transaction import Transaction
from awa_fast.twins import blocking, parameters_of

R = TypeVar("R")

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

    @parameters_of(AsyncClient)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._async = AsyncClient(*args, **kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="awa-fast-client", daemon=True
        )
        self._thread.start()
        try:
            self._run(self._async.pool())
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

    @property
    def _target(self) -> AsyncClient:  # what the blocking twins call (awa_fast/twins.py)
        return self._async

    def _run(self, coro: Coroutine[Any, Any, R]) -> R:
        """Run ``coro`` on this client's loop thread and block until it returns."""
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

    # -- schema and storage ---------------------------------------------------------------

    migrate = blocking(AsyncClient.migrate)
    install_queue_storage = blocking(AsyncClient.install_queue_storage)
    prepare_queue_storage_schema = blocking(AsyncClient.prepare_queue_storage_schema)
    storage_status = blocking(AsyncClient.storage_status)
    flush_admin_metadata = blocking(AsyncClient.flush_admin_metadata)

    # -- producers ------------------------------------------------------------------------

    insert = blocking(AsyncClient.insert)
    insert_many = blocking(AsyncClient.insert_many)
    insert_many_copy = blocking(AsyncClient.insert_many_copy)
    enqueue_many_copy = blocking(AsyncClient.enqueue_many_copy)

    # -- jobs -----------------------------------------------------------------------------

    get_job = blocking(AsyncClient.get_job)
    list_jobs = blocking(AsyncClient.list_jobs)
    retry = blocking(AsyncClient.retry)
    cancel = blocking(AsyncClient.cancel)
    cancel_by_unique_key = blocking(AsyncClient.cancel_by_unique_key)
    retry_failed = blocking(AsyncClient.retry_failed)
    discard_failed = blocking(AsyncClient.discard_failed)
    correct_to_failed = blocking(AsyncClient.correct_to_failed)
    consequences_owed = blocking(AsyncClient.consequences_owed)
    dump_job = blocking(AsyncClient.dump_job)
    dump_run = blocking(AsyncClient.dump_run)

    # -- queues, cron, health -------------------------------------------------------------

    queue_stats = blocking(AsyncClient.queue_stats)
    unhandled_kinds = blocking(AsyncClient.unhandled_kinds)
    pause_queue = blocking(AsyncClient.pause_queue)
    resume_queue = blocking(AsyncClient.resume_queue)
    drain_queue = blocking(AsyncClient.drain_queue)
    list_cron_jobs = blocking(AsyncClient.list_cron_jobs)
    delete_cron_job = blocking(AsyncClient.delete_cron_job)
    health_check = blocking(AsyncClient.health_check)

    # -- external callbacks ---------------------------------------------------------------

    complete_external = blocking(AsyncClient.complete_external)
    fail_external = blocking(AsyncClient.fail_external)
    retry_external = blocking(AsyncClient.retry_external)
    resume_external = blocking(AsyncClient.resume_external)
    heartbeat_callback = blocking(AsyncClient.heartbeat_callback)
    resolve_callback = blocking(AsyncClient.resolve_callback)

    # -- batch operations -----------------------------------------------------------------

    preview_batch_operation = blocking(AsyncClient.preview_batch_operation)
    submit_batch_operation = blocking(AsyncClient.submit_batch_operation)
    preview_set_priority = blocking(AsyncClient.preview_set_priority)
    set_priority = blocking(AsyncClient.set_priority)
    preview_move_queue = blocking(AsyncClient.preview_move_queue)
    move_queue = blocking(AsyncClient.move_queue)
    list_batch_operations = blocking(AsyncClient.list_batch_operations)
    get_batch_operation = blocking(AsyncClient.get_batch_operation)
    cancel_batch_operation = blocking(AsyncClient.cancel_batch_operation)
    purge_batch_operations = blocking(AsyncClient.purge_batch_operations)

    # -- dead-letter queue ----------------------------------------------------------------

    list_dlq = blocking(AsyncClient.list_dlq)
    get_dlq_job = blocking(AsyncClient.get_dlq_job)
    dlq_depth = blocking(AsyncClient.dlq_depth)
    dlq_depth_by_queue = blocking(AsyncClient.dlq_depth_by_queue)
    retry_from_dlq = blocking(AsyncClient.retry_from_dlq)
    bulk_retry_from_dlq = blocking(AsyncClient.bulk_retry_from_dlq)
    move_failed_to_dlq = blocking(AsyncClient.move_failed_to_dlq)
    bulk_move_failed_to_dlq = blocking(AsyncClient.bulk_move_failed_to_dlq)
    purge_dlq_job = blocking(AsyncClient.purge_dlq_job)
    purge_dlq = blocking(AsyncClient.purge_dlq)

    def staleness_ms(self) -> int:
        """The heartbeat age (ms) at which an attempt counts as dead: the default rescue uses
        (this client runs no runtime; ``AsyncClient.staleness_ms``)."""
        return self._async.staleness_ms()

    def transaction(self) -> SyncTransaction:
        """Begin a transaction: ``with client.transaction() as tx``."""
        return SyncTransaction(self, self._run(self._async.transaction()))


class SyncTransaction:
    """Blocking twin of :class:`~awa_fast.transaction.Transaction` (same methods, each derived
    by :func:`~awa_fast.twins.blocking`); ``with client.transaction() as tx`` commits on a
    clean exit and rolls back on an error."""

    def __init__(self, client: Client, tx: Transaction):
        self._client = client
        self._tx = tx

    @property
    def _target(self) -> Transaction:
        return self._tx

    def _run(self, coro: Coroutine[Any, Any, R]) -> R:
        return self._client._run(coro)

    @property
    def connection(self):
        return self._tx.connection

    insert = blocking(Transaction.insert)
    insert_many = blocking(Transaction.insert_many)
    execute = blocking(Transaction.execute)
    fetch_all = blocking(Transaction.fetch_all)
    fetch_optional = blocking(Transaction.fetch_optional)
    fetch_one = blocking(Transaction.fetch_one)
    commit = blocking(Transaction.commit)
    rollback = blocking(Transaction.rollback)

    def __enter__(self) -> SyncTransaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._run(self._tx.__aexit__(exc_type, exc, tb))
