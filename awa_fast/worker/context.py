"""The job object a handler receives: awa's read-only job fields plus the attempt's tools
(cancellation flag, progress, staged follow-ups, callbacks)."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg
from psycopg.types.json import Jsonb

from awa_fast import db_errors
from awa_fast import pooler as pooler_mode
from awa_fast.callback_expressions import compile_expressions
from awa_fast.callback_token import CallbackToken, check_timeout
from awa_fast.errors import AwaError, ValidationError
from awa_fast.job import JobState
from awa_fast.pg_connection import sync_connection_class
from awa_fast.repo.attempts import AttemptRepo, BlockingAttemptRepo
from awa_fast.worker import storable
from awa_fast.worker.attempt_services import AttemptRuntime
from awa_fast.worker.follow_ups import FollowUps


def _ts(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


class JobContext:
    """One running attempt of a job, as handed to its handler.

    Fields (read-only by convention): ``id, kind, queue, state, priority, attempt, max_attempts,
    tags, args`` (typed), ``metadata, errors, run_at, deadline, created_at`` (RFC 3339 strings),
    ``progress`` (the live progress buffer or ``None``).
    """

    __slots__ = (
        "lease_lost",
        "claimed_mono",
        "beaten_mono",
        "id",
        "kind",
        "queue",
        "raw_args",
        "args",
        "priority",
        "attempt",
        "max_attempts",
        "_run_at",
        "_deadline",
        "_created_at",
        "_errors",
        "_metadata",
        "tags",
        "run_lease",
        "progress",
        "_progress_gen",
        "_progress_acked",
        "_cancelled",
        "_follow_ups",
        "runtime",
        "callback_id",
        "waiting",
        "deadline_expired",
        "returned",
        "thread",
        "__weakref__",
    )

    def __init__(self, row: tuple, runtime: AttemptRuntime | None = None):
        (
            self.id,
            self.kind,
            self.queue,
            self.raw_args,
            self.priority,
            self.attempt,
            self.max_attempts,
            self._run_at,
            self._deadline,
            self._created_at,
            self._errors,
            self._metadata,
            self.tags,
            self.run_lease,
            self.progress,
        ) = row
        self.args = self.raw_args
        self._progress_gen = 0
        self._progress_acked = 0
        self._cancelled = False
        self._follow_ups: FollowUps | None = None
        self.runtime = runtime
        self.callback_id: str | None = None
        self.waiting = False  # in wait_for_callback: the deadline does not run
        self.deadline_expired = False  # set by the runtime's deadline sweeper
        self.lease_lost = False  # set when no beat committed for a lease (worker/liveness.py)
        self.claimed_mono = 0.0  # time.monotonic() when the runtime started it
        self.beaten_mono = 0.0  # time.monotonic() send time of the last beat that beat it
        self.returned = False  # the handler returned: never cancel it any more
        # A ``def`` handler's concurrent.futures.Future (its thread may outlive a cancel).
        self.thread: Any = None

    # -- awa's read-only fields -----------------------------------------------------------------

    @property
    def errors(self) -> list:
        """Earlier attempts' ``errors[]`` entries (decoded on first read)."""
        if isinstance(self._errors, str):
            self._errors = orjson.loads(self._errors)
        return self._errors

    @property
    def metadata(self) -> dict:
        """The job's metadata (decoded on first read)."""
        if isinstance(self._metadata, str):
            self._metadata = orjson.loads(self._metadata)
        return self._metadata

    @property
    def state(self) -> JobState:
        return JobState.Running

    @property
    def run_at(self) -> str | None:
        return _ts(self._run_at)

    @property
    def deadline(self) -> str | None:
        return _ts(self._deadline)

    @property
    def deadline_at(self) -> datetime | None:
        """The attempt's hard deadline as an aware datetime (``None`` when disabled)."""
        return self._deadline

    @property
    def created_at(self) -> str | None:
        return _ts(self._created_at)

    # -- cancellation ---------------------------------------------------------------------------

    def is_cancelled(self) -> bool:
        """True once an admin cancelled this job or the runtime is shutting down."""
        return self._cancelled

    def cancel_flag(self) -> None:
        self._cancelled = True

    # -- progress (ADR-014) ---------------------------------------------------------------------

    def _in_dispatch(self, what: str) -> None:
        # awa-pg raises RuntimeError for progress calls outside dispatch; after the handler
        # returned, what it recorded would be dropped without a word.
        if self.returned:
            raise RuntimeError(
                f"{what}: job {self.id}'s handler has returned; its progress was written with "
                "its outcome and can no longer change"
            )

    def set_progress(self, percent: int, message: str | None = None) -> None:
        """Record progress in memory; the runtime writes it within about half a second
        (``heartbeat.PROGRESS_FLUSH_S``, batched), or now with :meth:`flush_progress`, and with
        the final transition. ``percent`` is clamped to 100. A rejected call changes nothing.

        Raises:
            RuntimeError: the handler has returned (awa-pg: outside dispatch).
            OverflowError: ``percent`` is below 0 or above 255 (awa's u8 rule).
            ValidationError: ``message`` holds a NUL character or a lone surrogate
                (``field="progress.message"``), or the progress would exceed 64 KiB as JSON
                (``storable.MAX_PROGRESS_BYTES``): PostgreSQL could not store it.
        """
        self._in_dispatch("set_progress")
        percent = int(percent)
        if percent < 0 or percent > 255:
            raise OverflowError("percent must be between 0 and 255")
        progress = dict(self.progress or {})
        progress["percent"] = min(percent, 100)
        if message is None:
            progress.pop("message", None)
        else:
            progress["message"] = str(message)
            storable.check_progress(progress["message"], "progress.message")
        storable.check_progress(progress, "progress")
        self.progress = progress
        self._progress_gen += 1

    def update_metadata(self, updates: dict) -> None:
        """Shallow-merge ``updates`` into ``progress["metadata"]``. A rejected call changes
        nothing.

        Raises:
            RuntimeError: the handler has returned (awa-pg: outside dispatch).
            ValueError: ``updates`` is not a dict.
            ValidationError: ``updates`` is not JSON-serializable (``SerializationError``),
                holds a NUL character or a lone surrogate (``field="metadata"``), or the
                progress would exceed 64 KiB as JSON (``storable.MAX_PROGRESS_BYTES``).
        """
        self._in_dispatch("update_metadata")
        if not isinstance(updates, dict):
            raise ValueError("update_metadata expects a dict")
        storable.check_progress(updates, "metadata")
        progress = dict(self.progress or {})
        merged = dict(progress.get("metadata") or {})
        merged.update(copy.deepcopy(updates))
        progress["metadata"] = merged
        storable.check_progress(progress, "progress")
        self.progress = progress
        self._progress_gen += 1

    def progress_snapshot(self) -> tuple[int, str] | None:
        """``(generation, json)`` of unflushed progress, or ``None`` when all is flushed. The
        JSON is always storable, even if a handler wrote into :attr:`progress` directly."""
        if self._progress_gen == self._progress_acked or self.progress is None:
            return None
        return self._progress_gen, storable.json_text(self.progress)

    def progress_acked(self, generation: int) -> None:
        self._progress_acked = max(self._progress_acked, generation)

    @db_errors.maps("job.flush_progress")
    async def flush_progress(self) -> None:
        """Write pending progress now, guarded by this attempt's run lease (a rescued or
        cancelled attempt is silently ignored).

        Raises:
            RuntimeError: the handler has returned (awa-pg: outside dispatch).
        """
        self._in_dispatch("flush_progress")
        snap = self.progress_snapshot()
        if snap is None or self.runtime is None:
            return
        generation, text = snap
        pool = await self.runtime.services.pool()
        async with pool.connection() as conn:
            await AttemptRepo(conn).flush_progress(text, self.id, self.run_lease)
        self.progress_acked(generation)

    @db_errors.maps("job.flush_progress_sync")
    def flush_progress_sync(self) -> None:
        """Blocking :meth:`flush_progress`: for ``def`` handlers in the thread pool, and also
        safe from an ``async def`` handler (awa-pg allows both).

        Raises:
            RuntimeError: the handler has returned (awa-pg: outside dispatch).
        """
        self._in_dispatch("flush_progress_sync")
        if self.runtime is None or self.runtime.loop is None:
            return
        loop = self.runtime.loop
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if not on_loop:
            asyncio.run_coroutine_threadsafe(self.flush_progress(), loop).result()
            return
        # On the runtime's own loop, waiting for it would deadlock: write on a short-lived
        # blocking connection instead (the loop stalls one round trip, as awa-pg's call does).
        snap = self.progress_snapshot()
        if snap is None:
            return
        services = self.runtime.services
        connect = sync_connection_class(services.schema).connect
        with connect(
            services.database_url, autocommit=True, **pooler_mode.connect_options(services.pooler)
        ) as conn:
            generation, text = snap
            BlockingAttemptRepo(conn).flush_progress(text, self.id, self.run_lease)
        self.progress_acked(generation)

    # -- staged follow-ups (ADR-046) ------------------------------------------------------------

    def follow_ups(self) -> FollowUps:
        """This attempt's staging handle; keep it to stage from code that outlives the call."""
        if self._follow_ups is None:
            off_queue = None if self.runtime is None else self.runtime.services.off_queue
            self._follow_ups = FollowUps(self.id, self.metadata, off_queue)
        return self._follow_ups

    def enqueue_on_completion(self, args: Any, **options: Any) -> None:
        """Stage a follow-up job (see :meth:`FollowUps.enqueue_on_completion`)."""
        self.follow_ups().stage(args, options, stacklevel=2)

    @property
    def staged_follow_ups(self) -> FollowUps | None:
        return self._follow_ups

    # -- external waits (ADR-021) ---------------------------------------------------------------

    @db_errors.maps("job.register_callback")
    async def register_callback(
        self,
        timeout_seconds: float = 3600,
        filter: Any = None,
        on_complete: Any = None,
        on_fail: Any = None,
        transform: Any = None,
    ) -> CallbackToken:
        """Register a callback for this attempt (guarded by its run lease) before handing the
        id to the outside world; the callback times out after ``timeout_seconds`` seconds.

        Raises:
            ValueError: negative or non-finite ``timeout_seconds``.
            ValidationError: the attempt is no longer running (rescued, cancelled, completed
                externally), or a CEL expression (``filter``, ``on_complete``, ``on_fail``,
                ``transform``: strings over ``payload``, evaluated by ``resolve_callback``)
                does not compile (``field`` names it).
        """
        timeout = check_timeout(timeout_seconds)
        expressions = compile_expressions(filter, on_complete, on_fail, transform)
        stored = None if expressions is None else Jsonb(expressions)
        pool = await self._runtime().services.pool()
        async with pool.connection() as conn:
            row = await AttemptRepo(conn).register_callback(
                self.id, self.run_lease, timeout, stored
            )
        if row is None:
            raise ValidationError(
                f"job {self.id} is not running under this attempt", field="job", limit="running"
            )
        self.callback_id = str(row.callback_id)
        return CallbackToken(self.callback_id, row.callback_timeout_at.isoformat())

    @db_errors.maps("job.wait_for_callback")
    async def wait_for_callback(self, token: Any) -> Any:
        """Park the job in ``waiting_external`` and wait (this handler stays alive, its staged
        follow-ups too) until ``resume_external`` delivers a payload, which is returned.

        Raises:
            ValidationError: ``token`` is not this attempt's current callback (stale token).
            AwaError: the job left the wait another way (completed or failed externally,
                cancelled, rescued on timeout), or parking would take a unique key another job
                holds (the job is then cancelled as a duplicate).
        """
        callback_id = str(getattr(token, "id", token))
        if callback_id != self.callback_id:
            raise ValidationError(
                "stale callback token: register a new callback first",
                field="token",
                limit="the current callback",
            )
        runtime = self._runtime()
        pool = await runtime.services.pool()
        async with pool.connection() as conn:
            repo = AttemptRepo(conn)
            try:
                parked = await repo.park(self.id, self.run_lease, callback_id)
            except psycopg.errors.UniqueViolation:
                # waiting_external would take a key another job holds: cancelled as a
                # duplicate, as a WaitForCallback result into a held key is.
                await repo.cancel_duplicate_parking(self.id, self.run_lease)
                raise AwaError(
                    f"job {self.id} could not park: another job holds its unique key "
                    "in waiting_external; cancelled as a duplicate"
                ) from None
        if not parked:
            raise AwaError(f"job {self.id} could not park: it is no longer running this attempt")
        # The wait does not count against the attempt's deadline: the rest of it resumes after.
        remaining = None if self._deadline is None else self._deadline - datetime.now(UTC)
        self.waiting = True
        progress = getattr(runtime, "progress", None)
        if progress is not None:  # the runtime's signal (worker/observe.py): parked
            progress.fire("parked")
        try:
            while True:
                async with pool.connection() as conn:
                    row = await AttemptRepo(conn).parked(self.id)
                state, lease, current, payload = row if row else (None, None, None, None)
                if state == "running" and lease == self.run_lease and current is None:
                    self.callback_id = None
                    return payload
                if state != "waiting_external" or lease != self.run_lease:
                    raise AwaError(
                        f"job {self.id} left waiting_external ({state}) without being resumed"
                    )
                await asyncio.sleep(runtime.callback_poll_interval_s)
        finally:
            self.waiting = False
            if remaining is not None:
                self._deadline = datetime.now(UTC) + remaining

    def _runtime(self) -> AttemptRuntime:
        """The runtime running this attempt.

        Raises:
            AwaError: the context runs outside a runtime (``AwaTestClient.work_one``), which
                has no callbacks to wait on.
        """
        if self.runtime is None:
            raise AwaError(f"job {self.id}: external waits need a running worker runtime")
        return self.runtime

    def __repr__(self) -> str:
        return f"<JobContext id={self.id} kind={self.kind!r} attempt={self.attempt}>"
