"""The verify pass's statements (``sql.consequences``, migration 020, ADR 019): the leader's
verifier kinds, the list of completions awaiting ``verify_success``, and its verdicts."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from awa_fast import sql
from awa_fast.repo import Repo, named


class KindChanges(NamedTuple):
    """What making the verifier kinds equal to a registry changed: kinds ``added`` (listed
    from the slices now), kinds ``dropped``, and whether a change is ``unsettled`` (older
    transactions may still list or miss a completion)."""

    added: list[str]
    dropped: list[str]
    unsettled: bool


class Due(NamedTuple):
    """A completion awaiting verification."""

    job_id: int
    finalized_at: datetime


class SettledKind(NamedTuple):
    """A kind whose change every older transaction has left behind (``adding`` or
    ``dropping``), locked."""

    kind: str
    state: str


_CHANGES, _DUE, _SETTLED = named(KindChanges), named(Due), named(SettledKind)


class VerifyRepo(Repo):
    """Verify-pass statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's, often
    fenced, transaction). ``window_s``: how far back completions are verified, seconds."""

    async def sync_kinds(self, kinds: list[str], window_s: float) -> KindChanges:
        """Make the verifier kinds ``kinds`` (a lacking, dropped or narrower one is adding;
        one no longer there is dropping).

        Raises:
            LookupError: the statement returned no row (it always returns one: a bug).
        """
        cur = self.conn.cursor(row_factory=_CHANGES)
        await cur.execute(sql.SYNC_VERIFIER_KINDS, {"kinds": kinds, "window_s": window_s})
        row: KindChanges | None = await cur.fetchone()
        if row is None:
            raise LookupError("SYNC_VERIFIER_KINDS returned no row")
        return row

    async def list_from_slices(self, kinds: list[str], window_s: float) -> None:
        """List the window's unverified completions of ``kinds`` from the slices."""
        await self.conn.execute(sql.LIST_DUE_FROM_SLICES, {"kinds": kinds, "window_s": window_s})

    async def forget_kinds(self, kinds: list[str]) -> None:
        """Drop the listings of ``kinds``."""
        await self.conn.execute(sql.FORGET_DUE_OF_KINDS, {"kinds": kinds})

    async def expire(self, window_s: float) -> None:
        """Drop listings older than the window."""
        await self.conn.execute(sql.EXPIRE_DUE, {"window_s": window_s})

    async def mark_changes(self) -> None:
        """Stamp each unsettled change with the point older transactions must pass."""
        await self.conn.execute(sql.MARK_KIND_CHANGES)

    async def settled_changes(self) -> list[SettledKind]:
        """The changes every older transaction has now left behind, locked, by kind."""
        cur = self.conn.cursor(row_factory=_SETTLED)
        await cur.execute(sql.SETTLED_KIND_CHANGES)
        rows: list[SettledKind] = await cur.fetchall()
        return rows

    async def activate(self, kinds: list[str]) -> None:
        await self.conn.execute(sql.ACTIVATE_KINDS, {"kinds": kinds})

    async def drop(self, kinds: list[str]) -> None:
        await self.conn.execute(sql.DROP_KINDS, {"kinds": kinds})

    async def due(self, kinds: list[str], window_s: float, limit: int) -> list[Due]:
        """Up to ``limit`` listed completions of ``kinds`` due for a try, lowest id first."""
        cur = self.conn.cursor(row_factory=_DUE)
        params = {"kinds": kinds, "window_s": window_s, "limit": limit}
        await cur.execute(sql.VERIFY_DUE, params)
        rows: list[Due] = await cur.fetchall()
        return rows

    async def jobs(self, ids: list[int]) -> list[tuple[Any, ...]]:
        """The jobs of ``ids`` still completed and unverified in the slices, by id, as
        ``sql.JOB_COLUMNS`` rows (``ConsequenceApplier.snapshot`` makes their ``Job``)."""
        cur = await self.conn.execute(sql.DUE_JOBS, {"ids": ids})
        return list(await cur.fetchall())

    async def forget(self, gone: list[Due]) -> None:
        """Drop these listings (their jobs are no longer completed and unverified)."""
        params = {"ids": [g.job_id for g in gone], "finalized": [g.finalized_at for g in gone]}
        await self.conn.execute(sql.FORGET_DUE, params)

    async def defer(self, job_id: int) -> None:
        """Try the job's hook again after a back-off (1, 2, 4 ... 60 s)."""
        await self.conn.execute(sql.DEFER_DUE, {"id": job_id})

    async def lock_unverified(self, job_id: int) -> bool:
        """Lock the job if it is still completed and unverified (``SKIP LOCKED``)."""
        cur = await self.conn.execute(sql.LOCK_UNVERIFIED, (job_id,))
        return await cur.fetchone() is not None

    async def mark_verified(self, job_id: int) -> None:
        """Record the job verified and drop its listing."""
        await self.conn.execute(sql.MARK_VERIFIED, ([job_id],))
