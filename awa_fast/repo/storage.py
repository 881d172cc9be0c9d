"""The storage calls' statements (``sql.runtime``): the schema's migration history and the
reset of its storage (``install_queue_storage(reset=True)``)."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from awa_fast import sql
from awa_fast.repo import Repo, named


class History(NamedTuple):
    """When the schema was first and last migrated, and its version (all ``None`` before its
    first migration)."""

    first_at: datetime | None
    last_at: datetime | None
    version: int | None


_HISTORY = named(History)


class StorageRepo(Repo):
    """Storage statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction)."""

    async def history(self) -> History:
        """The migration history's bounds (an aggregate: always one row)."""
        row = await self._one(_HISTORY, sql.STORAGE_HISTORY)
        return History(None, None, None) if row is None else row

    async def reset(self, migrate_lock_key: int) -> None:
        """Empty the schema's storage (``sql.RESET_TABLES``: jobs and what belongs to them)
        under the migration lock ``migrate_lock_key``; the caller's transaction makes it one
        change."""
        await self.conn.execute(sql.MIGRATE_LOCK, (migrate_lock_key,))
        cur = await self.conn.execute(sql.RESET_TABLES)
        tables = [name for (name,) in await cur.fetchall()]
        for statement in sql.reset_truncate(tables):
            await self.conn.execute(statement)
