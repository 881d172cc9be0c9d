"""The statements of a running attempt and of its liveness (``sql.finalize``,
``sql.callbacks``): heartbeats and their DLQ marks, the progress flush, the end of an attempt
whose row had left ``running``, a callback's registration and the parked wait.

:class:`AttemptRepo` runs them on an ``AsyncConnection`` (the runtime, the heartbeat, a
handler's context); :class:`BlockingAttemptRepo` on a blocking ``Connection`` (the lingering
thread, a ``def`` handler's flush on the runtime's own loop). The heartbeat batch returns its
rows as the driver's tuples: it is beaten every interval for every attempt, and a named row
per attempt would cost the hot path for nothing (the two columns are ``(id, run_lease)``, the
attempt's key)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, NamedTuple

from awa_fast import sql
from awa_fast.repo import Repo, named


class Registered(NamedTuple):
    """A callback registered for a running attempt."""

    callback_id: uuid.UUID
    callback_timeout_at: datetime


class Parked(NamedTuple):
    """Where a job parked in ``wait_for_callback`` stands: ``payload`` is what
    ``resume_external`` delivered (``None`` while it waits)."""

    state: str
    run_lease: int
    callback_id: uuid.UUID | None
    payload: Any


_REGISTERED = named(Registered)
_PARKED = named(Parked)


def _ended(job_id: int, run_lease: int) -> dict[str, int]:
    return {"id": job_id, "lease": run_lease}


class AttemptRepo(Repo):
    """Attempt statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction). ``run_lease``: the attempt's lease (every write is guarded by it)."""

    __slots__ = ()

    async def read_committed(self) -> None:
        """Run the session's transactions at READ COMMITTED (a dedicated connection that moves
        finished rows; migration 024)."""
        await self.conn.execute(sql.SESSION_READ_COMMITTED)

    async def beat(
        self, ids: list[int], leases: list[int], progress: list[str | None]
    ) -> list[tuple[int, int]]:
        """Beat the attempts (``ids[i]``, ``leases[i]``), writing ``progress[i]`` (JSON text, or
        ``None``) with each; the ``(id, run_lease)`` of those beaten (rows another statement
        holds are skipped)."""
        cur = await self.conn.execute(sql.HEARTBEAT, (ids, leases, progress))
        rows: list[tuple[int, int]] = await cur.fetchall()
        return rows

    async def beat_dlq_marks(self, ids: list[int], leases: list[int]) -> None:
        """Keep fresh the marks of attempts whose job was dead-lettered while they run."""
        await self.conn.execute(sql.HEARTBEAT_DLQ_MARKS, (ids, leases))

    async def ack_ended(self, job_id: int, run_lease: int) -> None:
        """Clear the "still running" mark of an attempt whose handler is done."""
        await self.conn.execute(sql.ACK_ATTEMPT_ENDED, _ended(job_id, run_lease))

    async def flush_progress(self, progress: str, job_id: int, run_lease: int) -> None:
        """Write ``progress`` (JSON text) to the running attempt (nothing if it is not)."""
        await self.conn.execute(sql.FLUSH_PROGRESS, (progress, job_id, run_lease))

    async def register_callback(
        self, job_id: int, run_lease: int, timeout_s: float, expressions: Any
    ) -> Registered | None:
        """Give the running attempt a new callback id timing out in ``timeout_s`` seconds, with
        its CEL ``expressions`` (a ``Jsonb``, or ``None``); ``None`` if it no longer runs."""
        params = {"timeout": timeout_s, "exprs": expressions, "id": job_id, "lease": run_lease}
        return await self._one(_REGISTERED, sql.REGISTER_CALLBACK, params)

    async def park(self, job_id: int, run_lease: int, callback_id: str) -> bool:
        """Park the running attempt in ``waiting_external`` on ``callback_id``; False if it no
        longer runs this attempt on that callback.

        Raises:
            psycopg.errors.UniqueViolation: ``waiting_external`` would take a unique key
                another job holds (:meth:`cancel_duplicate_parking`).
        """
        cur = await self.conn.execute(sql.PARK_FOR_CALLBACK, (job_id, run_lease, callback_id))
        return bool(cur.rowcount)

    async def cancel_duplicate_parking(self, job_id: int, run_lease: int) -> None:
        """Cancel the attempt's job as a duplicate of the job holding its unique key."""
        await self.conn.execute(sql.CANCEL_DUPLICATE_PARKING, (job_id, run_lease))

    async def parked(self, job_id: int) -> Parked | None:
        """Where the parked job stands (``None``: it is gone)."""
        return await self._one(_PARKED, sql.POLL_CALLBACK_WAIT, (job_id,))


class BlockingAttemptRepo:
    """The same statements on a blocking psycopg ``Connection`` (a thread of its own)."""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def read_committed(self) -> None:
        """See :meth:`AttemptRepo.read_committed`."""
        self.conn.execute(sql.SESSION_READ_COMMITTED)

    def beat(self, ids: list[int], leases: list[int]) -> None:
        """Beat the attempts (no progress) and their DLQ marks."""
        self.conn.execute(sql.HEARTBEAT, (ids, leases, [None] * len(ids)))
        self.conn.execute(sql.HEARTBEAT_DLQ_MARKS, (ids, leases))

    def keep_presence(self, instance: str, ttl_ms: float) -> None:
        """Keep ``instance``'s presence row for ``ttl_ms`` ms more (``sql.WORKER_KEEP``)."""
        self.conn.execute(sql.WORKER_KEEP, (ttl_ms, instance))

    def gone(self, instance: str) -> None:
        """Remove ``instance``'s presence row."""
        self.conn.execute(sql.WORKER_GONE, (instance,))

    def give_back(self, job_id: int, run_lease: int, progress: str | None) -> bool:
        """Hand the running attempt back to ``available``, uncounted, with its last
        ``progress`` (JSON text, or ``None``); False if it no longer runs."""
        params = {
            "state": "available",
            "attempt_delta": -1,
            "delay": 0.0,
            "error": None,
            "progress": progress,
            **_ended(job_id, run_lease),
        }
        return self.conn.execute(sql.TRANSITION, params).rowcount > 0

    def ack_ended(self, job_id: int, run_lease: int) -> None:
        """See :meth:`AttemptRepo.ack_ended`."""
        self.conn.execute(sql.ACK_ATTEMPT_ENDED, _ended(job_id, run_lease))

    def wake(self, queues: list[str]) -> None:
        """NOTIFY ``queues``' workers (``sql.WAKE_QUEUES``; after the commit, ADR 018)."""
        self.conn.execute(sql.WAKE_QUEUES, (queues,))

    def flush_progress(self, progress: str, job_id: int, run_lease: int) -> None:
        """See :meth:`AttemptRepo.flush_progress`."""
        self.conn.execute(sql.FLUSH_PROGRESS, (progress, job_id, run_lease))
