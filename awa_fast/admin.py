"""Admin and dead-letter-queue operations of :class:`~awa_fast.client.AsyncClient` (awa-pg's names).

Dead-letter queue (ADR-020): a failed job of a queue with DLQ enabled (``{"name": "q",
"max_workers": 4, "dlq": True}`` in ``start()``, or ``start(dlq_enabled_by_default=True)``) is
moved from ``awa_fast.jobs`` to ``awa_fast.dlq`` with a reason and its last run lease; DLQ rows are
never claimed. They come back with :meth:`AdminMixin.retry_from_dlq` (same id, attempt 0) or go
away with :meth:`AdminMixin.purge_dlq` / the maintenance retention (``dlq_retention_days``,
default 30). Bulk operations without a filter need ``allow_all=True``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import UTC, datetime
from typing import Any

from awa_fast import _native, bulk, enqueue, sql
from awa_fast.errors import AttemptStillRunning, AwaError, JobNotFound, UniqueConflict, Unsupported
from awa_fast.job import JOB_FIELDS, Job

log = logging.getLogger("awa_fast.admin")

_N = len(JOB_FIELDS)


@dataclasses.dataclass(frozen=True)
class DlqEntry:
    """A dead-lettered job: its snapshot (``job.state`` is ``failed``), why and when it was
    dead-lettered, and the run lease of its last attempt."""

    job: Job
    reason: str
    dlq_at: datetime
    original_run_lease: int

    @classmethod
    def from_row(cls, row: tuple) -> DlqEntry:
        return cls(Job.from_row(row), row[_N], row[_N + 1], row[_N + 2])

    def to_dict(self) -> dict:
        """JSON-compatible: the job's fields plus ``dlq_reason``, ``dlq_at``,
        ``original_run_lease``."""
        out = self.job.to_dict()
        out.update(
            dlq_reason=self.reason,
            dlq_at=self.dlq_at.isoformat(),
            original_run_lease=self.original_run_lease,
        )
        return out


@dataclasses.dataclass(frozen=True)
class QueueHealth:
    """One queue this process works: attempts running here, its worker limit, and the
    ``available`` jobs waiting in the database."""

    queue: str
    in_flight: int
    max_workers: int
    available: int


@dataclasses.dataclass(frozen=True)
class HealthCheck:
    """``healthy`` = postgres reachable and, when this client runs a runtime, every dispatcher
    loop and the heartbeat loop alive and not shutting down, and -- on the maintenance leader --
    no leader loop dead. ``maintenance_loops`` maps each leader loop's name to its
    :class:`~awa_fast.worker.maintenance.LoopHealth` (``alive``, ``passes``, ``failures``,
    ``last_error``); it is empty on a non-leader. Without a runtime only postgres is checked
    (the loop fields are then ``False`` and ``queues`` is empty)."""

    healthy: bool
    postgres_connected: bool
    poll_loop_alive: bool
    heartbeat_alive: bool
    shutting_down: bool
    leader: bool
    queues: dict[str, QueueHealth]
    maintenance_loops: dict = dataclasses.field(default_factory=dict)


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

    def __iter__(self):
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)


def _when(value: Any, name: str) -> datetime | None:
    """A datetime or ISO 8601 string (naive = UTC) as an aware datetime."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{name}: not an ISO 8601 timestamp: {value!r}") from None
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime or ISO 8601 string, got {type(value).__name__}")
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _require_filter(op: str, allow_all: bool, **filters: Any) -> None:
    if not allow_all and all(v is None for v in filters.values()):
        names = ", ".join(filters)
        raise ValueError(f"{op} without a filter ({names}) affects every row: pass allow_all=True")


def _hexify(row: dict) -> dict:
    # to_jsonb renders bytea as "\\x..."; show keys as plain hex like Job.to_dict.
    for key in ("unique_key", "ordering_key"):
        value = row.get(key)
        if isinstance(value, str) and value.startswith("\\x"):
            row[key] = value[2:]
    return row


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False, default=str)


class AdminMixin:
    """Admin and DLQ methods of :class:`~awa_fast.client.AsyncClient` (``self`` is the client)."""

    # -- dead-letter queue ----------------------------------------------------------------------

    async def list_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        before_id: int | None = None,
        before_dlq_at: datetime | str | None = None,
        limit: int = 100,
    ) -> list[DlqEntry]:
        """Dead-lettered jobs, newest first (``dlq_at``, then id). ``before_id`` /
        ``before_dlq_at`` page backwards (strictly older)."""
        rows = await self._fetch(
            sql.DLQ_LIST,
            {
                "kind": kind,
                "queue": queue,
                "tag": tag,
                "before_id": before_id,
                "before_dlq_at": _when(before_dlq_at, "before_dlq_at"),
                "limit": limit,
            },
        )
        return [DlqEntry.from_row(r) for r in rows]

    async def get_dlq_job(self, job_id: int) -> DlqEntry | None:
        """The DLQ entry of job ``job_id``, or ``None``."""
        rows = await self._fetch(sql.DLQ_GET, (job_id,))
        return DlqEntry.from_row(rows[0]) if rows else None

    async def dlq_depth(self, *, queue: str | None = None) -> int:
        """Number of dead-lettered jobs (of ``queue``, or in all)."""
        return (await self._fetch(sql.DLQ_DEPTH, {"queue": queue}))[0][0]

    async def dlq_depth_by_queue(self) -> dict[str, int]:
        """``{queue: dead-lettered jobs}`` for every queue with at least one."""
        return {q: n for q, n in await self._fetch(sql.DLQ_DEPTH_BY_QUEUE)}

    async def retry_from_dlq(
        self,
        job_id: int,
        *,
        run_at: datetime | str | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> Job | None:
        """Move a dead-lettered job back to ``awa_fast.jobs`` under the same id: attempt 0,
        run lease kept (never reused, so a zombie attempt stays stale), errors kept, ``available`` (``scheduled`` for a future ``run_at``), with
        optional ``priority`` / ``queue`` overrides. Returns the job, or ``None`` if job
        ``job_id`` is not in the DLQ.

        Raises:
            UniqueConflict: a live job holds its unique key; nothing changes (the DLQ row stays).
            ValidationError: an override breaks a rule (e.g. priority outside 1..4).
            AttemptStillRunning: the handler of the job's last attempt is still running (an
                early ``fail_external`` dead-lettered it; docs/architecture.md, "No two
                executions of one job overlap"); nothing changes, retry once it has ended.
        """
        # Overrides obey the insert rules (validated in _ext, with placeholders for the rest).
        _native.validate_insert(
            "kind",
            "default" if queue is None else queue,
            2 if priority is None else priority,
            1,
            None,
        )
        params = {
            "id": job_id,
            "run_at": _when(run_at, "run_at"),
            "priority": priority,
            "to_queue": queue,
            "stale_ms": self.staleness_ms(),
        }
        async with (await self.pool()).connection() as conn:
            try:
                with enqueue.mapped_errors():
                    async with conn.transaction():
                        cur = await conn.execute(sql.DLQ_RETRY, params)
                        row = await cur.fetchone()
                        if row is not None and str(row[4]) == "available":
                            await conn.execute(sql.NOTIFY_QUEUE, (row[2],))
            except UniqueConflict as exc:
                raise await enqueue.holder_conflict(
                    conn, job_id, "retry DLQ", exc, "the job stays in the DLQ (nothing changed)"
                ) from exc
            if row is None:
                cur = await conn.execute(sql.DLQ_ATTEMPT_STILL_RUNS, params)
                running = await cur.fetchone()
                if running is not None:
                    raise AttemptStillRunning(
                        f"job {job_id} is in the DLQ but its last attempt's handler is still "
                        f"running (last heartbeat {running[0].isoformat()}); retry once it has "
                        "ended",
                        job_id=job_id,
                    )
        return None if row is None else Job.from_row(row)

    async def bulk_retry_from_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        allow_all: bool = False,
    ) -> int:
        """Retry every matching DLQ entry (as :meth:`retry_from_dlq`); returns how many.
        Entries whose unique key is held by a live job are skipped and stay in the DLQ (logged
        with the holder); so does an entry whose re-insert fails for another reason, and one
        whose last attempt's handler is still running (retry it once it has ended).

        Raises:
            ValueError: no filter and not ``allow_all``.
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        _require_filter("bulk_retry_from_dlq", allow_all, kind=kind, queue=queue, tag=tag)
        params = {
            "kind": kind,
            "queue": queue,
            "tag": tag,
            "before_id": None,
            "before_dlq_at": None,
            "run_at": None,
            "priority": None,
            "to_queue": None,
            "stale_ms": self.staleness_ms(),
        }
        rows = await self._isolated_admin(
            "DLQ bulk retry",
            sql.DLQ_RETRY_BULK,
            sql.DLQ_MATCHING_IDS,
            sql.DLQ_RETRY_ONE,
            params,
            notify=lambda r: str(r[4]) == "available",
        )
        return len(rows)

    async def _isolated_admin(
        self, what: str, bulk_sql: str, ids_sql: str, one_sql: str, params: dict, notify=None
    ) -> list[tuple]:
        # One transaction: the bulk statement, or row by row (bulk.run_isolated) where a row
        # fails alone (left unchanged, logged; a unique collision names the holder). Queues that
        # got available rows are woken. A deadlock retries the whole transaction (bounded).
        async def once() -> list[tuple]:
            async with (await self.pool()).connection() as conn:

                async def fetch(query: str, extra: dict | None = None) -> list[tuple]:
                    cur = await conn.execute(query, {**params, **(extra or {})})
                    return await cur.fetchall() if cur.description else []

                async def ids() -> list[int]:
                    return [r[0] for r in await fetch(ids_sql)]

                async def held(job_id: int, exc: Exception) -> None:
                    conflict = await enqueue.holder_conflict(conn, job_id, what, exc)
                    log.warning("%s: %s", what, conflict)

                async with conn.transaction():
                    done = await bulk.run_isolated(
                        conn,
                        what=what,
                        bulk=lambda: fetch(bulk_sql),
                        keys=ids,
                        one=lambda job_id: fetch(one_sql, {"id": job_id}),
                        on_conflict=held,
                    )
                    if notify is not None:
                        for q in sorted({r[2] for r in done.rows if notify(r)}):
                            await conn.execute(sql.NOTIFY_QUEUE, (q,))
                return done.rows

        return await bulk.retry_deadlocks(once, what=what)

    async def move_failed_to_dlq(self, job_id: int, reason: str = "manual") -> bool:
        """Move a ``failed`` job to the DLQ (whatever its queue's DLQ setting). ``False`` if
        the job is not failed (or its failure consequence is still owed)."""
        async with (await self.pool()).connection() as conn:
            cur = await conn.execute(
                sql.DLQ_MOVE_ONE, {"id": job_id, "reason": reason, "kind": None, "queue": None}
            )
            return cur.rowcount > 0

    async def bulk_move_failed_to_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        reason: str = "manual",
        allow_all: bool = False,
    ) -> int:
        """Move every matching ``failed`` job to the DLQ; returns how many.

        A job whose move fails alone (say a trigger refuses it) stays failed (logged).

        Raises:
            ValueError: no filter and not ``allow_all``.
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        _require_filter("bulk_move_failed_to_dlq", allow_all, kind=kind, queue=queue)
        rows = await self._isolated_admin(
            "move to the DLQ",
            sql.DLQ_MOVE_BULK,
            sql.SETTLED_FAILED_IDS,
            sql.DLQ_MOVE_ONE,
            {"kind": kind, "queue": queue, "reason": reason},
        )
        return len(rows)

    async def purge_dlq_job(self, job_id: int) -> bool:
        """Delete one DLQ entry; ``True`` if it existed."""
        async with (await self.pool()).connection() as conn:
            cur = await conn.execute(sql.DLQ_PURGE_ONE, (job_id,))
            return cur.rowcount > 0

    async def purge_dlq(
        self,
        *,
        kind: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        before_id: int | None = None,
        before_dlq_at: datetime | str | None = None,
        allow_all: bool = False,
    ) -> int:
        """Delete matching DLQ entries; returns how many. An entry whose delete fails alone is
        kept (logged).

        Raises:
            ValueError: no filter and not ``allow_all``.
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        _require_filter(
            "purge_dlq",
            allow_all,
            kind=kind,
            queue=queue,
            tag=tag,
            before_id=before_id,
            before_dlq_at=before_dlq_at,
        )
        rows = await self._isolated_admin(
            "DLQ purge",
            sql.DLQ_PURGE,
            sql.DLQ_MATCHING_IDS,
            sql.DLQ_PURGE_MATCHING_ONE,
            {
                "kind": kind,
                "queue": queue,
                "tag": tag,
                "before_id": before_id,
                "before_dlq_at": _when(before_dlq_at, "before_dlq_at"),
            },
        )
        return len(rows)

    # -- failed jobs ----------------------------------------------------------------------------

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
        params = {"kind": kind, "queue": queue, "stale_ms": self.staleness_ms()}
        matched = (await self._fetch(sql.FAILED_MATCHING, params))[0][0]
        rows = await self._isolated_admin(
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
        """
        rows = await self._isolated_admin(
            "discard_failed",
            sql.DISCARD_FAILED,
            sql.SETTLED_FAILED_IDS,
            sql.DISCARD_FAILED_ONE,
            {"kind": kind, "queue": None},
        )
        return len(rows)

    async def drain_queue(self, queue: str) -> int:
        """Cancel every job of ``queue`` that is waiting (``available``, ``scheduled``,
        ``retryable``, and parked in ``waiting_external``, as awa-pg does); running attempts are
        left alone. Returns how many. A job whose
        cancel fails alone (e.g. its mask holds ``cancelled`` and another cancelled job holds
        its key) is left waiting (logged).

        Raises:
            DeadlockError: kept deadlocking with concurrent writers (nothing changed).
        """
        rows = await self._isolated_admin(
            "drain_queue", sql.DRAIN_QUEUE, sql.DRAINABLE_IDS, sql.DRAIN_ONE, {"queue": queue}
        )
        return len(rows)

    # -- inspection -----------------------------------------------------------------------------

    async def _row_json(self, job_id: int) -> tuple[dict, bool]:
        rows = await self._fetch(sql.DUMP_JOB, (job_id,))
        if rows:
            return _hexify(rows[0][0]), False
        rows = await self._fetch(sql.DUMP_DLQ_JOB, (job_id,))
        if rows:
            return _hexify(rows[0][0]), True
        raise JobNotFound(f"job not found: {job_id}")

    async def dump_job(self, job_id: int) -> str:
        """Every column of the job as indented JSON (failure-consequence bookkeeping included).
        A dead-lettered job is dumped from the DLQ, with ``"in_dlq": true`` and its
        ``dlq_reason`` / ``dlq_at`` / ``original_run_lease``.

        Raises:
            JobNotFound: no such job in ``awa_fast.jobs`` nor the DLQ.
        """
        row, in_dlq = await self._row_json(job_id)
        row["in_dlq"] = in_dlq
        return _dumps(row)

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
        return _dumps(run)

    async def health_check(self) -> HealthCheck:
        """Postgres reachability plus, when this client runs a runtime, its loops, leadership
        and per-queue load (see :class:`HealthCheck`)."""
        available: dict[str, int] = {}
        runtime = self.runtime
        names = list(runtime.dispatchers) if runtime is not None else []
        try:
            rows = await self._fetch(sql.HEALTH_AVAILABLE, (names,))
            available = dict(rows)
            connected = True
        except Exception as exc:  # any failure to reach postgres means "not connected"
            log.warning("health check: postgres unreachable: %s", exc)
            connected = False
        if runtime is None:
            return HealthCheck(connected, connected, False, False, False, False, {})
        tasks = {t.get_name(): t for t in getattr(runtime, "_tasks", [])}
        dispatch = [t for n, t in tasks.items() if n.startswith("awa-dispatch-")]
        poll_alive = bool(dispatch) and all(not t.done() for t in dispatch)
        hb = tasks.get("awa-heartbeat")
        heartbeat_alive = hb is not None and not hb.done()
        shutting_down = any(getattr(d, "_stopping", False) for d in runtime.dispatchers.values())
        leader = bool(runtime.maintenance is not None and runtime.maintenance.is_leader)
        running: dict[str, int] = {}
        for ctx in list(runtime.in_flight.values()):
            running[ctx.queue] = running.get(ctx.queue, 0) + 1
        queues = {
            name: QueueHealth(name, running.get(name, 0), d.max_workers, available.get(name, 0))
            for name, d in runtime.dispatchers.items()
        }
        loops = runtime.maintenance.loop_health() if runtime.maintenance is not None else {}
        healthy = (
            connected
            and poll_alive
            and heartbeat_alive
            and not shutting_down
            and all(h.alive for h in loops.values())
        )
        return HealthCheck(
            healthy, connected, poll_alive, heartbeat_alive, shutting_down, leader, queues, loops
        )

    # -- storage (awa-pg's start-up calls, answered for awa-fast's one engine) -----------------

    async def flush_admin_metadata(self) -> None:
        """awa recomputes cached admin counters here; awa-fast caches none (``queue_stats()``
        counts the jobs table when called), so there is nothing to flush."""
        await self.pool()

    async def install_queue_storage(
        self,
        *,
        schema: str = "awa",
        queue_slot_count: int = 16,
        lease_slot_count: int = 8,
        reset: bool = False,
    ) -> None:
        """awa installs and activates its queue-storage engine here. awa-fast has one engine,
        the ``awa_fast`` schema, always active: this applies its migrations (idempotent).

        Raises:
            Unsupported: a non-default ``schema``, slot count, or ``reset=True`` (awa-fast's
                schema and layout are fixed; it never drops jobs to reset storage).
        """
        _storage_defaults(
            schema=schema,
            queue_slot_count=queue_slot_count,
            lease_slot_count=lease_slot_count,
            reset=reset,
        )
        await self.migrate()

    async def prepare_queue_storage_schema(
        self, *, schema: str = "awa", queue_slot_count: int = 16, lease_slot_count: int = 8
    ) -> None:
        """As :meth:`install_queue_storage` (awa-fast has no separate prepare step)."""
        _storage_defaults(
            schema=schema,
            queue_slot_count=queue_slot_count,
            lease_slot_count=lease_slot_count,
            reset=False,
        )
        await self.migrate()

    async def storage_status(self) -> str:
        """awa's storage-status report (pretty JSON, same keys) for awa-fast's one engine:
        ``current_engine`` = ``active_engine`` = ``"awa_fast"``, state ``"active"``, never a
        transition (both ``can_*`` false, with the reason as the blocker), timestamps from the
        schema's migration history, ``details`` with the schema and migration versions."""
        rows = await self._fetch(sql.STORAGE_HISTORY)
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
        return _dumps(report)


def _max_error_attempt(errors: list) -> int:
    return max((e.get("attempt") or 0 for e in errors if isinstance(e, dict)), default=0)


def _storage_defaults(**given: Any) -> None:
    defaults = {"schema": "awa", "queue_slot_count": 16, "lease_slot_count": 8, "reset": False}
    for key, value in given.items():
        if value != defaults[key]:
            raise Unsupported(
                key, "awa-fast has one storage engine with a fixed schema (awa_fast) and layout"
            )
