"""Job admin (awa-pg's names): :class:`JobAdmin` -- read, retry, cancel, discard and dump jobs of
``awa_fast.jobs_all`` -- and :class:`RetryFailedResult`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from awa_fast import enqueue
from awa_fast.admin import paging
from awa_fast.admin.area import Area
from awa_fast.connections import Connections
from awa_fast.errors import AttemptStillRunning, AwaError, JobNotFound, UniqueConflict
from awa_fast.job import Job
from awa_fast.repo import isolated
from awa_fast.repo.dlq import DlqRepo
from awa_fast.repo.jobs import JobRepo
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


class JobAdmin(Area):
    """The job operations, exposed as ``AsyncClient``'s methods of the same names (ADR 041).

    Args:
        db: the connection source.
        staleness_ms: how old (ms) a heartbeat must be for its attempt to count as ended
            (``AsyncClient.staleness_ms``); a retry waits for the last attempt to end.
    """

    def __init__(self, db: Connections, staleness_ms: Callable[[], int]) -> None:
        super().__init__(db)
        self._staleness_ms = staleness_ms

    async def get_job(self, job_id: int) -> Job:
        """The job with this id. Raises :class:`JobNotFound` (an ``AwaError``) if there is none."""
        async with self._db.connection() as conn:
            job = await JobRepo(conn).get(job_id)
        if job is None:
            raise JobNotFound(f"job not found: {job_id}")
        return job

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
        async with self._db.connection() as conn:
            return await JobRepo(conn).newest(
                None if state is None else str(state), kind, queue, limit
            )

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
        stale_ms = self._staleness_ms()
        async with self._db.connection() as conn:
            jobs = JobRepo(conn)
            try:
                with enqueue.mapped_errors():
                    job = await jobs.retry(job_id, stale_ms)
            except UniqueConflict as exc:
                raise await enqueue.holder_conflict(conn, job_id, "retry", exc) from exc
            if job is not None:
                await jobs.wake(job.queue)
            else:
                running = await jobs.attempt_still_runs(job_id, stale_ms)
                if running is not None:
                    raise AttemptStillRunning(
                        f"job {job_id} left 'running' but its attempt's handler is still running "
                        f"(last heartbeat {running.isoformat()}); retry once it has ended",
                        job_id=job_id,
                    )
        return job

    async def cancel(self, job_id: int) -> Job | None:
        """Cancel a non-terminal job; a running attempt is told through ``job.is_cancelled()``.

        Returns the cancelled job, or ``None`` if it was already terminal, is
        ``consequence_pending`` (its failure is decided: the reconciler applies the owed
        consequence and settles it as failed), or does not exist.

        Raises:
            UniqueConflict: its mask holds ``cancelled`` and another job holds its key there
                (``holder_id`` names it; nothing changes).
        """
        async with self._db.connection() as conn:
            jobs = JobRepo(conn)
            try:
                async with conn.transaction():
                    row = await jobs.cancel(job_id)
                    if row is None:
                        return None
                    if row.old_state == "running":
                        await jobs.tell_cancelled(job_id, row.old_run_lease)
            except psycopg.errors.UniqueViolation as exc:
                raise await enqueue.holder_conflict(conn, job_id, "cancel", exc) from exc
        return row.job

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
        async with self._db.connection() as conn:
            found = await JobRepo(conn).live_with_unique_key(key)
        return None if found is None else await self.cancel(found)

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
        stale_ms = self._staleness_ms()
        async with self._db.connection() as conn:
            matched = await JobRepo(conn).failed_matching(kind, queue, stale_ms)
        params = {"kind": kind, "queue": queue, "stale_ms": stale_ms}
        jobs = await self._isolated(
            "retry_failed", isolated.RETRY_FAILED, params, wakes=lambda job: True
        )
        return RetryFailedResult(jobs, matched)

    async def discard_failed(self, kind: str) -> int:
        """Delete the ``failed`` jobs of ``kind`` (not those whose failure consequence is still
        owed); returns how many. A job whose delete fails alone is kept (logged).

        Raises:
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
            ValidationError: ``kind`` breaks the name rule (``requests.check_name``).
        """
        check_name(kind, "kind")
        params = {"kind": kind, "queue": None}
        return len(await self._isolated("discard_failed", isolated.DISCARD_FAILED, params))

    async def _row_json(self, job_id: int) -> tuple[dict, bool]:
        async with self._db.connection() as conn:
            row = await JobRepo(conn).dump(job_id)
            if row is not None:
                return _hexify(row), False
            row = await DlqRepo(conn).dump(job_id)
        if row is not None:
            return _hexify(row), True
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
