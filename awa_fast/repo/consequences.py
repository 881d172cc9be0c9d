"""The failure path's statements (``sql.consequences``, ``sql.dlq``): lock a failing job, record
its consequence owed, pending or applied, settle it, dead-letter it, correct a completed job,
and the savepoint around an effect (ADR-PFM-OPS-003, ADR 004)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal, NamedTuple

import orjson
import psycopg

from awa_fast import sql
from awa_fast.repo import Repo, named


class LockedJob(NamedTuple):
    """A job's row locked for settlement (``sql.JOB_COLUMNS`` then
    ``sql.CONSEQUENCE_COLUMNS``): ``LOCK_RUNNING``, ``LOCK_OWED``, ``LOCK_BY_CALLBACK``.
    ``Job.from_row`` reads its first fields. Times are ``datetime``; ``state`` the state's
    name."""

    id: int
    kind: str
    queue: str
    args: Any
    state: str
    priority: int
    attempt: int
    max_attempts: int
    run_at: datetime
    heartbeat_at: datetime | None
    deadline_at: datetime | None
    attempted_at: datetime | None
    finalized_at: datetime | None
    created_at: datetime
    errors: list[Any]
    metadata: dict[str, Any]
    tags: list[str]
    unique_key: bytes | None
    unique_states: int | None
    callback_id: uuid.UUID | None
    callback_timeout_at: datetime | None
    run_lease: int
    progress: Any
    consequence_reason: str | None
    consequence_path: str | None
    consequence_attempts: int


_LOCKED = named(LockedJob)


class Settlement(NamedTuple):
    """How a failing job settles: its consequence state (``"applied"``, ``"none"`` or
    ``None``), the failure's reason and path, and the "still running" mark a ``running`` row
    keeps (``None``: its handler returned)."""

    consequence: str | None
    reason: str
    path: str
    mark: datetime | None


class Owed(NamedTuple):
    """A job whose failure consequence is owed (``sql.CONSEQUENCES_OWED``): its state, the
    failure's reason and path, applications tried, the last one's error, when it is retried,
    and whether it is overdue (tried and failed, or due for over 60 s)."""

    id: int
    kind: str
    queue: str
    state: str
    reason: str | None
    path: str | None
    attempts: int
    error: str | None
    retry_at: datetime | None
    overdue: bool


_OWED = named(Owed)


def _json(entry: Any) -> str | None:
    """An error entry as the one-element JSON array the statements append, or None."""
    return None if entry is None else orjson.dumps([entry]).decode()


class ConsequenceRepo(Repo):
    """The failure path's statements on ``conn`` (a psycopg ``AsyncConnection``, in the
    caller's transaction: each method's writes commit with it)."""

    async def _locked(self, statement: str, params: Any) -> LockedJob | None:
        cur = self.conn.cursor(row_factory=_LOCKED)
        await cur.execute(statement, params)
        row: LockedJob | None = await cur.fetchone()
        return row

    async def lock_running(self, job_id: int, run_lease: int) -> LockedJob | None:
        """The job's row, locked, while attempt ``run_lease`` still runs; else ``None``."""
        return await self._locked(sql.LOCK_RUNNING, (job_id, run_lease))

    async def owed_due(self, limit: int) -> list[int]:
        """Up to ``limit`` ids of jobs whose owed consequence is due, the longest due first."""
        cur = await self.conn.execute(sql.OWED_DUE, (limit,))
        return [job_id for (job_id,) in await cur.fetchall()]

    async def owed(self, limit: int) -> list[Owed]:
        """Up to ``limit`` jobs whose consequence is owed, by id."""
        return await self._all(_OWED, sql.CONSEQUENCES_OWED, (limit,))

    async def lock_owed(self, job_id: int) -> LockedJob | None:
        """The job's row, locked, when its consequence is owed and due and no other
        transaction holds it (``SKIP LOCKED``); else ``None``."""
        return await self._locked(sql.LOCK_OWED, (job_id,))

    async def append_error(self, job_id: int, entry: dict | None, progress: str | None) -> None:
        """Append error ``entry`` (awa's shape: ``error``, ``attempt``, ``at``, ...) and store
        the handler's last ``progress`` (JSON text); nothing when both are ``None``."""
        if entry is None and progress is None:
            return
        await self.conn.execute(
            sql.APPEND_ERROR, {"id": job_id, "progress": progress, "error": _json(entry)}
        )

    async def owe_failure(self, job_id: int, reason: str, path: str, mark: datetime | None) -> None:
        """Record the failure as ``consequence_pending`` with its consequence owed, due now."""
        await self.conn.execute(
            sql.OWE_FAILURE, {"id": job_id, "reason": reason, "path": path, "mark": mark}
        )

    async def mark_pending(
        self,
        job_id: int,
        *,
        reason: str,
        path: str,
        error: str,
        mark: datetime | None,
        retry_in_s: float,
    ) -> None:
        """Leave the job ``consequence_pending`` (owed), retried by the reconciler in
        ``retry_in_s`` seconds, with ``error`` as the consequence's last error."""
        await self.conn.execute(
            sql.MARK_CONSEQUENCE_PENDING,
            {
                "id": job_id,
                "reason": reason,
                "path": path,
                "error": error,
                "mark": mark,
                "retry_in": retry_in_s,
            },
        )

    async def settle_failed(self, job_id: int, how: Settlement) -> bool:
        """Settle the job ``failed`` as ``how`` says, under a savepoint. False when another job
        holds the unique key the failed job would hold (the savepoint is rolled back, nothing
        written: :meth:`settle_failed_as_duplicate` settles it instead)."""
        try:
            async with self.conn.transaction():  # a savepoint: the effect's own writes stay
                await self.conn.execute(sql.SETTLE_FAILED, {"id": job_id, **how._asdict()})
        except psycopg.errors.UniqueViolation:
            return False
        return True

    async def settle_failed_as_duplicate(self, job_id: int, how: Settlement) -> None:
        """Settle the job ``cancelled`` as a duplicate of the job that holds its key."""
        await self.conn.execute(sql.SETTLE_FAILED_AS_DUPLICATE, {"id": job_id, **how._asdict()})

    async def dead_letter(self, job_id: int, reason: str) -> bool:
        """Move the failed job to the DLQ if its queue has DLQ enabled; True if it moved."""
        cur = await self.conn.execute(sql.DEAD_LETTER, (job_id, reason))
        row = await cur.fetchone()
        return bool(row is not None and row[0])

    async def defer_owed(self, job_id: int, error: str, base_s: float, cap_s: float) -> None:
        """Push the owed job's next reconciler try out by ``base_s`` * 2^attempts seconds (at
        most ``cap_s``), recording ``error``."""
        await self.conn.execute(
            sql.DEFER_OWED, {"id": job_id, "error": error, "base_s": base_s, "cap_s": cap_s}
        )

    async def correct_to_failed(
        self, job_id: int, *, owes: str | None, entry: dict, keep_key: bool
    ) -> Literal["corrected", "not_completed", "key_held"]:
        """A ``completed`` job becomes ``failed`` with error ``entry`` appended and
        consequence state ``owes`` (``"owed"``, ``"none"`` or ``None``), under a savepoint.
        ``keep_key`` False: its mask loses ``failed``, so it holds no key. Returns
        ``"not_completed"`` (nothing written) when the job is no longer completed, and
        ``"key_held"`` (rolled back) when it would hold a key another job holds."""
        params = {"id": job_id, "cstate": owes, "keep_key": keep_key, "error": _json(entry)}
        try:
            async with self.conn.transaction():
                cur = await self.conn.execute(sql.CORRECT_TO_FAILED, params)
                found = await cur.fetchone()
        except psycopg.errors.UniqueViolation:
            return "key_held"
        return "not_completed" if found is None else "corrected"

    async def mark_applied(self, job_id: int, path: str, state: str) -> None:
        """Record a settled job's consequence as ``state`` (``"applied"`` or ``"none"``)."""
        await self.conn.execute(
            sql.MARK_CONSEQUENCE_APPLIED, {"id": job_id, "path": path, "state": state}
        )

    async def effect_savepoint(self) -> None:
        """The savepoint an effect runs under (its writes commit with the settlement)."""
        await self.conn.execute(sql.EFFECT_SAVEPOINT)

    async def effect_failed(self) -> None:
        """Undo the effect's writes (back to :meth:`effect_savepoint`)."""
        await self.conn.execute(sql.EFFECT_ROLLBACK)

    async def effect_done(self) -> None:
        """Keep the effect's writes (release :meth:`effect_savepoint`)."""
        await self.conn.execute(sql.EFFECT_RELEASE)
