"""Storage admin: :class:`StorageAdmin`, awa-pg's storage calls (install / prepare queue
storage, status, admin-metadata flush) answered for awa-fast's one engine, in the client's
schema (``awa_fast`` by default; ADR 027)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from awa_fast.admin.area import Area
from awa_fast.admin.jobs import pretty_json
from awa_fast.connections import Connections
from awa_fast.errors import AwaError, ConfigError
from awa_fast.repo.storage import StorageRepo
from awa_fast.schema import current_migration_version
from awa_fast.schema_binding import SchemaBinding, bind

log = logging.getLogger("awa_fast.storage")

# awa 0.7's install/prepare defaults (awa-python client.py DEFAULT_QUEUE_STORAGE_*).
_DEFAULT_SCHEMA = "awa"
_SLOT_COUNTS = {"queue_slot_count": 16, "lease_slot_count": 8}


def _storage_arguments(
    call: str, schema_name: Any, current: SchemaBinding, **slot_counts: Any
) -> SchemaBinding:
    """awa's arguments of install / prepare, checked before anything changes; returns the
    schema they name: awa's default ``"awa"`` is the client's own (``current``), another name
    that schema. The slot counts size awa's partition rings, which awa-fast does not have:
    validated as awa does (> 0), logged at INFO (naming ``call``) when not awa's default,
    otherwise without effect (docs/compat.md).

    Raises:
        ValidationError: ``schema`` breaks the schema-name rule (``schema_binding``).
        ConfigError: a slot count that is not an int > 0.
    """
    binding = current if schema_name == _DEFAULT_SCHEMA else bind(schema_name, "schema")
    for key, value in slot_counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key} must be > 0, got {value!r}", field=key, limit="> 0")
        if value != _SLOT_COUNTS[key]:
            log.info(
                "%s: %s=%r has no effect in awa-fast: it has no rotating "
                "queue/lease partitions (live jobs are one hot table, finished jobs go to "
                "fixed-period slices)",
                call,
                key,
                value,
            )
    return binding


class StorageAdmin(Area):
    """awa-pg's storage calls, exposed as ``AsyncClient``'s methods of the same names (ADR 041).

    Args:
        db: the connection source (bound to the client's schema).
        migrate: applies a schema's migrations (``AsyncClient._migrate_schema``).
        schema: ``() -> SchemaBinding``, the client's schema now.
        use_schema: moves the client to a schema (its pool rebound).
        running: whether the client's worker runtime is running or starting (awa refuses an
            install then).
    """

    def __init__(
        self,
        db: Connections,
        migrate: Callable[[SchemaBinding], Awaitable[list[int]]],
        *,
        schema: Callable[[], SchemaBinding],
        use_schema: Callable[[SchemaBinding], Awaitable[None]],
        running: Callable[[], bool] = lambda: False,
    ) -> None:
        super().__init__(db)
        self._migrate = migrate
        self._schema = schema
        self._use_schema = use_schema
        self._running = running
        self.installing = False  # an install is in progress: start() is refused (awa's rule)

    async def flush_admin_metadata(self) -> None:
        """awa recomputes cached admin counters here; awa-fast caches none (``queue_stats()``
        counts the jobs table when called), so there is nothing to flush. Opens the pool (raises as
        it does).
        """
        await self._db.pool()

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
        with ``reset=True`` then empties its storage, as awa's reset (which drops and recreates
        its queue-storage schema) does: every job, finished or not, DLQ entry, schedule, queue
        setting, descriptor and batch operation is deleted, in one transaction under the migration
        lock (``sql.RESET_TABLES``; docs/compat.md). The migration history, the leader row and the
        live processes' presence rows stay, and ids are never reused. ``schema``: awa's default
        ``"awa"`` is this client's schema; another name creates (or upgrades) that schema and
        moves this client to it (ADR 027). The slot counts size awa's partition rings:
        accepted (> 0), without effect here (logged at INFO).

        Raises:
            AwaError: this client's worker runtime is running or starting (awa's rule), or
                another install of this client is in progress.
            ValidationError: a ``schema`` that breaks the schema-name rule.
            ConfigError: a slot count that is not an int > 0, ``reset`` not a bool.
        """
        if self._running():
            raise AwaError("cannot install queue storage while the worker runtime is running")
        if self.installing:
            raise AwaError("queue storage installation is already in progress")
        self.installing = True
        try:
            await self._install(schema, queue_slot_count, lease_slot_count, reset)
        finally:
            self.installing = False

    async def _install(
        self, schema: str, queue_slot_count: int, lease_slot_count: int, reset: bool
    ) -> None:
        binding = _storage_arguments(
            "install_queue_storage",
            schema,
            self._schema(),
            queue_slot_count=queue_slot_count,
            lease_slot_count=lease_slot_count,
        )
        if not isinstance(reset, bool):
            raise ConfigError(f"reset must be a bool, got {reset!r}", field="reset", limit="bool")
        await self._migrate(binding)
        await self._use_schema(binding)
        if reset:
            async with self._db.connection() as conn, conn.transaction():
                await StorageRepo(conn).reset(binding.migrate_lock_key)

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
        binding = _storage_arguments(
            "prepare_queue_storage_schema",
            schema,
            self._schema(),
            queue_slot_count=queue_slot_count,
            lease_slot_count=lease_slot_count,
        )
        await self._migrate(binding)

    async def storage_status(self) -> str:
        """awa's storage-status report (pretty JSON, same keys) for awa-fast's one engine:
        ``current_engine`` = ``active_engine`` = ``"awa_fast"``, state ``"active"``, never a
        transition (both ``can_*`` false, with the reason as the blocker), timestamps from the
        schema's migration history, ``details`` with the schema and migration versions.
        """
        async with self._db.connection() as conn:
            history = await StorageRepo(conn).history()
        applied = history.version
        first, last = (
            None if t is None else t.isoformat() for t in (history.first_at, history.last_at)
        )
        name = self._schema().name
        why = [f"awa-fast has one storage engine ({name} schema); there is no transition"]

        report = {
            "current_engine": "awa_fast",
            "active_engine": "awa_fast",
            "prepared_engine": None,
            "state": "active" if applied else "not_migrated",
            "transition_epoch": 0,
            "details": {
                "schema": name,
                "migration_version": applied,
                "package_migration_version": current_migration_version(),
            },
            "entered_at": first,
            "updated_at": last,
            "finalized_at": first,
            "canonical_live_backlog": 0,
            "prepared_queue_storage_schema": None,
            "prepared_schema_ready": False,
            "live_runtime_capability_counts": {},
            "can_enter_mixed_transition": False,
            "enter_mixed_transition_blockers": why,
            "can_finalize": False,
            "finalize_blockers": why,
        }
        return pretty_json(report)
