"""The names the database knows (``sql.KNOWN_QUEUES``, ``sql.KNOWN_KINDS``,
``sql.KIND_FINISHED``): what the CLI checks a ``--queue`` or ``--kind`` argument against, with
its "did you mean" hint, before a command that would match nothing."""

from __future__ import annotations

from psycopg.rows import scalar_row

from awa_fast import sql
from awa_fast.repo import Repo


class NamesRepo(Repo):
    """Name statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction)."""

    async def queues(self) -> list[str]:
        """Every queue some job (live, finished or dead-lettered), settings row, worker,
        schedule or descriptor names, sorted."""
        return await self._all(scalar_row, sql.KNOWN_QUEUES)

    async def kinds(self) -> list[str]:
        """Every kind some live or dead-lettered job, worker, schedule or descriptor has,
        sorted (finished jobs are not scanned: see :meth:`kind_finished`)."""
        return await self._all(scalar_row, sql.KNOWN_KINDS)

    async def kind_finished(self, kind: str) -> bool:
        """Whether a finished job of ``kind`` exists (read until the first one: no index on
        kind)."""
        return bool(await self._value(sql.KIND_FINISHED, (kind,)))
