"""Storage admin: :class:`StorageAdmin`, awa-pg's storage calls (install / prepare queue
storage, status, admin-metadata flush) answered for awa-fast's one engine, the ``awa_fast``
schema."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from awa_fast import sql
from awa_fast.admin.jobs import pretty_json
from awa_fast.connections import Connections
from awa_fast.errors import Unsupported


def _storage_defaults(**given: Any) -> None:
    defaults = {"schema": "awa", "queue_slot_count": 16, "lease_slot_count": 8, "reset": False}
    for key, value in given.items():
        if value != defaults[key]:
            raise Unsupported(
                key, "awa-fast has one storage engine with a fixed schema (awa_fast) and layout"
            )


class StorageAdmin:
    """The storage calls behind ``AsyncClient``'s (their docstrings are the reference).

    Args:
        db: the connection source.
        migrate: applies the schema's migrations (``AsyncClient.migrate``).
    """

    def __init__(self, db: Connections, migrate: Callable[[], Awaitable[list[int]]]) -> None:
        self._db = db
        self._migrate = migrate

    async def flush_admin_metadata(self) -> None:
        """Nothing is cached to flush; opens the pool (raises as it does)."""
        await self._db.pool()

    async def install_queue_storage(
        self,
        *,
        schema: str = "awa",
        queue_slot_count: int = 16,
        lease_slot_count: int = 8,
        reset: bool = False,
    ) -> None:
        """Apply the migrations (idempotent).

        Raises:
            Unsupported: a non-default ``schema``, slot count, or ``reset=True``.
        """
        _storage_defaults(
            schema=schema,
            queue_slot_count=queue_slot_count,
            lease_slot_count=lease_slot_count,
            reset=reset,
        )
        await self._migrate()

    async def prepare_queue_storage_schema(
        self, *, schema: str = "awa", queue_slot_count: int = 16, lease_slot_count: int = 8
    ) -> None:
        """As :meth:`install_queue_storage`."""
        _storage_defaults(
            schema=schema,
            queue_slot_count=queue_slot_count,
            lease_slot_count=lease_slot_count,
            reset=False,
        )
        await self._migrate()

    async def storage_status(self) -> str:
        """awa's storage-status report (pretty JSON) for the one engine."""
        rows = await self._db.fetch(sql.STORAGE_HISTORY)
        first, last, applied = rows[0] if rows else (None, None, None)
        first, last = (None if t is None else t.isoformat() for t in (first, last))
        why = ["awa-fast has one storage engine (awa_fast schema); there is no transition"]
        from awa_fast.schema import current_migration_version

        report = {
            "current_engine": "awa_fast",
            "active_engine": "awa_fast",
            "prepared_engine": None,
            "state": "active" if applied else "not_migrated",
            "transition_epoch": 0,
            "details": {
                "schema": "awa_fast",
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
