"""Queue and job-kind descriptors' statements (``sql.descriptors``, migration 007)."""

from __future__ import annotations

from typing import Any

from awa_fast import sql
from awa_fast.repo import Repo


class DescriptorRepo(Repo):
    """Descriptor upserts on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction). ``params``: a descriptor's ``params(name)``."""

    async def upsert_queue(self, params: dict[str, Any]) -> None:
        """Store or refresh one queue's descriptor (``last_seen_at`` now)."""
        await self.conn.execute(sql.QUEUE_DESCRIPTOR_UPSERT, params)

    async def upsert_kind(self, params: dict[str, Any]) -> None:
        """Store or refresh one job kind's descriptor (``last_seen_at`` now)."""
        await self.conn.execute(sql.KIND_DESCRIPTOR_UPSERT, params)
