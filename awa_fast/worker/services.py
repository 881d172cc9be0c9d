"""What the worker layer uses of the process that runs it: one :class:`Services` object, built by
``AsyncClient.start()`` and handed down to the runtime, the reconciler and (through the runtime)
every :class:`~awa_fast.worker.context.JobContext`; the narrow interfaces below are what each of
them may reach. Nothing under ``awa_fast/worker/`` imports or calls the client: it sees only
these (``tests/structure/test_layering.py`` checks the imports)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from awa_fast.schema_binding import DEFAULT, SchemaBinding

__all__ = ["AttemptRuntime", "AttemptServices", "ConnectionSource", "ReconcileServices", "Services"]

from awa_fast.worker.attempt_services import AttemptRuntime, AttemptServices, ConnectionSource

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from awa_fast.descriptors import Descriptor
    from awa_fast.periodic import PeriodicJob
    from awa_fast.producer import OffQueueWarner
    from awa_fast.worker.consequences import Settler
    from awa_fast.worker.registry import Registry
    from awa_fast.worker.specs import SpecRunner


class ReconcileServices(ConnectionSource, Protocol):
    """What the reconciler tick uses: connections, the ``verify_success`` hooks
    (``registry.verifiers``, kind -> callable) and the settler (settlement, corrections)."""

    @property
    def registry(self) -> Registry: ...

    @property
    def settler(self) -> Settler: ...


class Services:
    """The one services object of a started process (see the module docstring).

    Args:
        pool: ``async () -> AsyncConnectionPool``, the process's pool (opened on first call).
        database_url: ``() -> str``, the URL in use (resolved on first call: it may start the
            embedded server, so it is not read before the runtime starts).
        registry: handlers by kind, consequence declarations, ``verify_success`` hooks.
        pooler: the client's connection mode (``awa_fast.pooler``: ``None``, ``"session"``,
            ``"transaction"``): what session state the worker's connections may carry.
        listen_url: the direct URL of the LISTEN connection under ``pooler="transaction"``
            (``None``: no LISTEN there, the dispatchers poll).
        specs: registered follow-up specs (frozen by ``start()``).
        settler: settles failing jobs and corrections; its applier carries the consequence
            configuration (effect timeout, retry backoff) ``start()`` was given.
        periodic_jobs: name -> ``periodic.PeriodicJob``, upserted at start.
        queue_descriptors, kind_descriptors: name -> ``descriptors.Descriptor``, stored at
            start and refreshed with presence.
        off_queue: the client's ``QueueMismatchWarning`` for jobs given no queue, shared by its
            inserts and the follow-ups its handlers stage.
        schema: the schema every connection of the process is bound to (ADR 027): its
            connections come from ``pg_connection.connection_class(schema)``, its channels and
            leader key from the binding.
    """

    def __init__(
        self,
        *,
        pool: Callable[[], Awaitable[AsyncConnectionPool]],
        database_url: Callable[[], str],
        registry: Registry,
        pooler: str | None = None,
        listen_url: str | None = None,
        specs: SpecRunner,
        settler: Settler,
        periodic_jobs: dict[str, PeriodicJob] | None = None,
        queue_descriptors: dict[str, Descriptor] | None = None,
        kind_descriptors: dict[str, Descriptor] | None = None,
        off_queue: OffQueueWarner | None = None,
        schema: SchemaBinding = DEFAULT,
    ):
        self.off_queue = off_queue
        self.schema = schema
        self._pool = pool
        self._database_url = database_url
        self.pooler = pooler
        self.listen_url = listen_url
        self.registry = registry
        self.specs = specs
        self.settler = settler
        # The client's own mappings, not copies: what they hold is read when it is used.
        self.periodic_jobs: dict[str, PeriodicJob] = {} if periodic_jobs is None else periodic_jobs
        self.queue_descriptors: dict[str, Descriptor] = (
            {} if queue_descriptors is None else queue_descriptors
        )
        self.kind_descriptors: dict[str, Descriptor] = (
            {} if kind_descriptors is None else kind_descriptors
        )

    @property
    def database_url(self) -> str:
        return self._database_url()

    async def pool(self) -> AsyncConnectionPool:
        return await self._pool()
