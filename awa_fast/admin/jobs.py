"""Job admin (awa-pg's names): :class:`JobAdmin` -- read, retry, cancel, discard and dump jobs of
``awa_fast.jobs_all`` -- and :class:`RetryFailedResult`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import psycopg

from awa_fast import enqueue, sql
from awa_fast.admin import paging
from awa_fast.connections import Connections
from awa_fast.errors import AttemptStillRunning, AwaError, JobNotFound, UniqueConflict
from awa_fast.job import Job
from awa_fast.requests import check_name, optional_name


@dataclasses.dataclass(frozen=True)
class RetryFailedResult:
    """awa's ``RetryFailedResult``: ``jobs`` moved back to available, ``matched`` failed jobs the
    filter found (``matched - len(jobs)`` raced, hold a unique key now taken, or still owe a
    failure consequence), and ``pruned_failed_count``: always ``None`` -- awa-fast keeps no
    count of failed rows pruned past retention (awa also gives ``None`` when filtering by kind).
    Iterating it iterates ``jobs``."""

    jobs: list
    matched: int
    pruned_failed_count: int | None = None

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)


def pretty_json(obj: Any) -> str:
    """Indented JSON for the dump and status reports (non-JSON values as ``str``)."""
    return json.dumps(obj, indent=2, ensure_ascii=False, default=str)


def _hexify(row: dict) -> dict:
    # to_jsonb renders bytea as "\\x..."; show keys as plain hex like Job.to_dict.
    for key in ("unique_key", "ordering_key"):
        value = row.get(key)
        if isinstance(value, str) and value.startswith("\\x"):
            row[key] = value[2:]
    return row


def _max_error_attempt(errors: list) -> int:
    return max((e.get("attempt") or 0 for e in errors if isinstance(e, dict)), default=0)


class JobAdmin:
    """The job operations, exposed as ``AsyncClient``'s methods of the same names (ADR 041).

    Args:
        db: the connection source.
        staleness_ms: how old (ms) a heartbeat must be for its attempt to count as ended
            (``AsyncClient.staleness_ms``); a retry waits for the last attempt to end.
    """

    def __init__(self, db: Connections, staleness_ms: Callable[[], int]) -> None:
        self._db = db
        self._staleness_ms = staleness_ms

    async def get_job(self, job_id: int) -> Job:
        """The job with this id. Raises :class:`JobNotFound` (an ``AwaError``) if there is none."""
        rows = await self._db.fetch(sql.GET_JOB, (job_id,))
        if not rows:
            raise JobNotFound(f"job not found: {job_id}")
        return Job.from_row(rows[0])

    async def list_jobs(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        queue: str | None = None,
        limit: int = 100,
    ) -> list[Job]:
        """Jobs, newest first, filtered by state / kind / queue.

        Raises:
            ValidationError: ``limit`` is out of range (1..2**63-1).
        """
        limit = paging.positive(limit, "limit")
        rows = await self._db.fetch(
            sql.LIST_JOBS,
            {
                "state": None if state is None else str(state),
                "kind": kind,
                "queue": queue,
                "limit": limit,
            },
        )
        return [Job.from_row(r) for r in rows]

    async def retry(self, job_id: int) -> Job | None:
        """Make a failed, cancelled or waiting_external job available again with attempt 0.

        Returns the job, or ``None`` if it is in another state.

        A job cancelled (or failed externally, or parked by a handler still in
        ``wait_for_callback``) while its handler runs is retried only once that attempt is over
        (the worker acknowledged it, or the worker's heartbeat went stale): two attempts of one
        job never run at once (docs/architecture.md, "Cancel, then retry").

        Raises:
            UniqueConflict: another live job now holds its unique key (nothing changes); its
                ``holder_id`` names that job.
            AttemptStillRunning: the job's last attempt is still running (nothing changes);
                retry after it ends.
        """
        params = {"id": job_id, "stale_ms": self._staleness_ms()}
        async with (await self._db.pool()).connection() as conn:
            try:
                with enqueue.mapped_errors():
                    cur = await conn.execute(sql.RETRY_JOB, params)
                    row = await cur.fetchone()
            except UniqueConflict as exc:
                raise await enqueue.holder_conflict(conn, job_id, "retry", exc) from exc
            if row is not None:
                await conn.execute(sql.NOTIFY_QUEUE, (row[2],))
            else:
                cur = await conn.execute(sql.ATTEMPT_STILL_RUNS, params)
                running = await cur.fetchone()
                if running is not None:
                    raise AttemptStillRunning(
                        f"job {job_id} left 'running' but its attempt's handler is still running "
                        f"(last heartbeat {running[0].isoformat()}); retry once it has ended",
                        job_id=job_id,
                    )
        return None if row is None else Job.from_row(row)

    async def cancel(self, job_id: int) -> Job | None:
        """Cancel a non-terminal job; a running attempt is told through ``job.is_cancelled()``.

        Returns the cancelled job, or ``None`` if it was already terminal, is
        ``consequence_pending`` (its failure is decided: the reconciler applies the owed
        consequence and settles it as failed), or does not exist.

        Raises:
            UniqueConflict: its mask holds ``cancelled`` and another job holds its key there
                (``holder_id`` names it; nothing changes).
        """
        async with (await self._db.pool()).connection() as conn:
            try:
                async with conn.transaction():
                    cur = await conn.execute(sql.CANCEL_JOB, (job_id,))
                    row = await cur.fetchone()
                    if row is None:
                        return None
                    old_state, lease = row[0], row[1]
                    if old_state == "running":
                        payload = orjson.dumps({"job_id": job_id, "run_lease": lease}).decode()
                        await conn.execute(sql.NOTIFY_CANCEL, (payload,))
            except psycopg.errors.UniqueViolation as exc:
                raise await enqueue.holder_conflict(conn, job_id, "cancel", exc) from exc
        return Job.from_row(row[2:])

    async def cancel_by_unique_key(
        self,
        kind: str,
        *,
        queue: str | None = None,
        args: Any = None,
        period_bucket: int | None = None,
    ) -> Job | None:
        """Cancel the oldest non-terminal job whose unique key matches the given components
        (pass only those used at insert time). Returns it, or ``None``.

        Raises:
            ValidationError: ``kind`` or ``queue`` breaks the name rule
                (``requests.check_name``), or ``args`` do not serialize.
        """
        from awa_fast import _native
        from awa_fast.requests import args_to_builtins, to_json

        check_name(kind, "kind")
        optional_name(queue, "queue")
        args_json = (
            None
            if args is None
            else to_json(args_to_builtins(args), "args", exact=isinstance(args, dict))
        )
        key = _native.unique_key(
            kind, queue or "", args_json or b"", queue is not None, args is not None, period_bucket
        )
        rows = await self._db.fetch(sql.CANCEL_BY_UNIQUE_KEY, (key,))
        return await self.cancel(rows[0][0]) if rows else None

    async def retry_failed(
        self, *, kind: str | None = None, queue: str | None = None
    ) -> RetryFailedResult:
        """Make every ``failed`` job of ``kind`` or of ``queue`` (exactly one) available again
        with attempt 0; returns a :class:`RetryFailedResult`. A job whose failure consequence is
        still owed stays failed; so does a job whose unique key another live job now holds
        (logged, naming the holder), whose update fails alone for another reason, or whose
        last attempt's handler still runs (an early ``fail_external``).

        Raises:
            ValueError: neither or both of ``kind`` and ``queue`` (awa's message).
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        if (kind is None) == (queue is None):
            raise ValueError("Specify exactly one of kind or queue")
        optional_name(kind, "kind")
        optional_name(queue, "queue")
        params = {"kind": kind, "queue": queue, "stale_ms": self._staleness_ms()}
        matched = (await self._db.fetch(sql.FAILED_MATCHING, params))[0][0]
        rows = await self._db.run_isolated(
            "retry_failed",
            sql.RETRY_FAILED,
            sql.FAILED_IDS,
            sql.RETRY_FAILED_ONE,
            params,
            notify=lambda r: True,
        )
        return RetryFailedResult([Job.from_row(r) for r in rows], matched)

    async def discard_failed(self, kind: str) -> int:
        """Delete the ``failed`` jobs of ``kind`` (not those whose failure consequence is still
        owed); returns how many. A job whose delete fails alone is kept (logged).

        Raises:
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
            ValidationError: ``kind`` breaks the name rule (``requests.check_name``).
        """
        check_name(kind, "kind")
        rows = await self._db.run_isolated(
            "discard_failed",
            sql.DISCARD_FAILED,
            sql.SETTLED_FAILED_IDS,
            sql.DISCARD_FAILED_ONE,
            {"kind": kind, "queue": None},
        )
        return len(rows)

    async def _row_json(self, job_id: int) -> tuple[dict, bool]:
        rows = await self._db.fetch(sql.DUMP_JOB, (job_id,))
        if rows:
            return _hexify(rows[0][0]), False
        rows = await self._db.fetch(sql.DUMP_DLQ_JOB, (job_id,))
        if rows:
            return _hexify(rows[0][0]), True
        raise JobNotFound(f"job not found: {job_id}")

    async def dump_job(self, job_id: int) -> str:
        """Every column of the job as indented JSON (failure-consequence bookkeeping included).
        A dead-lettered job is dumped from the DLQ, with ``"in_dlq": true`` and its
        ``dlq_reason`` / ``dlq_at`` / ``original_run_lease``.

        Raises:
            JobNotFound: no such job in ``awa_fast.jobs_all`` nor the DLQ.
        """
        row, in_dlq = await self._row_json(job_id)
        row["in_dlq"] = in_dlq
        return pretty_json(row)

    async def dump_run(self, job_id: int, attempt: int | None = None) -> str:
        """One attempt of a job as indented JSON: the job, the attempt number, the ``errors``
        entry recorded for it (``null`` if it did not fail), progress, run lease and timestamps.
        ``attempt`` defaults to the latest.

        Raises:
            JobNotFound: no such job.
            AwaError: the job has no such attempt (or has never run).
        """
        row, in_dlq = await self._row_json(job_id)
        current = row["attempt"]
        if attempt is None:
            if current < 1:
                raise AwaError(f"job {job_id} has not run yet (attempt 0)")
            attempt = current
        elif not 1 <= attempt <= max(current, _max_error_attempt(row["errors"])):
            raise AwaError(f"job {job_id} has no attempt {attempt} (attempts so far: {current})")
        entries = [e for e in row["errors"] if isinstance(e, dict) and e.get("attempt") == attempt]
        latest = attempt == current
        run = {
            "job_id": job_id,
            "kind": row["kind"],
            "queue": row["queue"],
            "state": row["state"],
            "in_dlq": in_dlq,
            "attempt": attempt,
            "current_attempt": current,
            "max_attempts": row["max_attempts"],
            "latest": latest,
            "error": entries[-1] if entries else None,
            "errors": entries,
            # progress, lease and attempt timestamps describe the latest attempt only.
            "run_lease": row.get("original_run_lease", row["run_lease"])
            if in_dlq
            else row["run_lease"],
            "progress": row["progress"] if latest else None,
            "timestamps": {
                k: row[k]
                for k in (
                    "created_at",
                    "run_at",
                    "attempted_at",
                    "heartbeat_at",
                    "deadline_at",
                    "finalized_at",
                )
            }
            if latest
            else {"created_at": row["created_at"]},
            "job": row,
        }
        if in_dlq:
            run["dlq_reason"], run["dlq_at"] = row["dlq_reason"], row["dlq_at"]
        return pretty_json(run)
