"""Test helpers (awa-pg's ``awa.testing``): :class:`AwaTestClient`, :class:`HandlerJob`,
:class:`WorkResult`, and the registration check for failure consequences."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import orjson

from awa_fast import db_errors
from awa_fast.job import Job
from awa_fast.repo.hand import HandRepo
from awa_fast.results import outcome_is
from awa_fast.worker import executor as ex
from awa_fast.worker.context import JobContext
from awa_fast.worker.executor import execute as run_handler
from awa_fast.worker.finalize_request import Finalized, FinalizeRequest
from awa_fast.worker.finalizer import Finalizer
from awa_fast.worker.follow_ups import FollowUps
from awa_fast.worker.registry import args_decoder

_OUTCOME_NAMES = {
    ex.COMPLETED: "completed",
    ex.RETRY: "retryable",
    ex.SNOOZE: "snoozed",
    ex.CANCEL: "cancelled",
    ex.FAIL: "failed",
    ex.WAIT: "waiting_external",
}


class _NoJob:
    """Falsy sentinel: no job was available."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NoJob"


NoJob = _NoJob()


@dataclasses.dataclass
class JobRow:
    """awa's ``testing.JobRow``: a job row as plain data (``args`` is the stored JSON dict,
    ``state`` the state name)."""

    id: int
    kind: str
    queue: str
    args: dict
    attempt: int
    max_attempts: int
    priority: int
    tags: list
    state: str | None = None

    @classmethod
    def from_row(cls, row: dict) -> JobRow:
        """From a mapping with the column names (extra keys are ignored)."""
        return cls(
            id=row["id"],
            kind=row["kind"],
            queue=row["queue"],
            args=row["args"],
            attempt=row["attempt"],
            max_attempts=row["max_attempts"],
            priority=row["priority"],
            tags=list(row.get("tags") or []),
            state=None if row.get("state") is None else str(row["state"]),
        )


@dataclasses.dataclass
class WorkResult:
    """What :meth:`AwaTestClient.work_one` did. ``job`` is a :class:`JobRow` read after the
    outcome was applied (its final state), or ``NoJob``. ``outcome`` is one of ``completed,
    retryable, failed, cancelled, snoozed, waiting_external, no_job``. ``error`` follows awa:
    ``str(exception)`` for a raised error, the reason for ``Cancel``, else ``None`` (a failure
    with no exception -- args conversion, poisoning -- gives the first line of its ``errors``
    entry). ``applied`` is False when the guarded transition was stale (the job was rescued or
    cancelled meanwhile)."""

    job: Any
    outcome: str
    error: str | None = None
    applied: bool = True

    is_completed = outcome_is("completed")
    is_failed = outcome_is("failed")
    is_retryable = outcome_is("retryable")
    is_cancelled = outcome_is("cancelled")
    is_snoozed = outcome_is("snoozed")
    is_waiting_external = outcome_is("waiting_external")
    is_no_job = outcome_is("no_job")


@db_errors.boundary("testing.")
class AwaTestClient:
    """Drives jobs one at a time with the runtime's semantics, for tests. Its methods raise
    driver errors as the awa-fast error tree (``awa_fast.db_errors``), as the client's do.

    Args:
        client: an :class:`~awa_fast.AsyncClient`.
    """

    def __init__(self, client: Any):
        self.client = client

    async def insert(self, args: Any, **opts: Any) -> Job:
        return await self.client.insert(args, **opts)

    async def migrate(self) -> list[int]:
        return await self.client.migrate()

    async def clean(self) -> None:
        """Delete every job and queue setting (TRUNCATE)."""
        pool = await self.client.pool()
        async with pool.connection() as conn:
            await HandRepo(conn).clean()

    async def work_one(
        self, args_type: Any, handler: Callable, *, kind: str | None = None, queue: str = "default"
    ) -> WorkResult:
        """Claim one available job of ``kind`` (default: derived from ``args_type``) in
        ``queue`` -- bumping its run lease --, run ``handler`` and apply the outcome with the
        runtime's statements (an inline ``Finalizer``): staged follow-ups are inserted with the
        completion, poisoning applies, and they are discarded otherwise; an outcome that cannot
        be written is recorded as a prompt failure (``applied`` is then False).
        """
        from awa_fast.requests import kind_for_type
        from awa_fast.worker.registry import Registry

        kind = kind or kind_for_type(args_type)
        pool = await self.client.pool()
        async with pool.connection() as conn:
            row = await HandRepo(conn).claim(queue, kind)
        if row is None:
            return WorkResult(NoJob, "no_job")
        ctx = JobContext(row, None)
        raised: list[BaseException] = []
        handler_rec = Registry().register(
            args_type, _recording(handler, raised), kind=kind, queue=queue
        )
        finalizer = Finalizer.inline(
            self.client.pool,
            specs=getattr(self.client, "specs", None),
            settler=getattr(self.client, "settler", None),
        )
        outcome = await run_handler(handler_rec, ctx)  # the worker's executor, as a claim's
        applied = await finalizer.submit(FinalizeRequest.of(ctx, outcome)) is Finalized.APPLIED
        async with pool.connection() as conn:
            final = await HandRepo(conn).job_row(ctx.id)
        job = JobRow.from_row(final) if final is not None else NoJob  # None: moved to the DLQ
        return WorkResult(job, _OUTCOME_NAMES[outcome.kind], _error_text(outcome, raised), applied)


def _recording(handler: Callable, raised: list) -> Callable:
    """``handler``, recording what it raises (awa's ``WorkResult.error`` is ``str(exc)``)."""
    if inspect.iscoroutinefunction(handler):

        @functools.wraps(handler)
        async def run(job):
            try:
                return await handler(job)
            except BaseException as exc:
                raised.append(exc)
                raise
    else:

        @functools.wraps(handler)
        def run(job):
            try:
                return handler(job)
            except BaseException as exc:
                raised.append(exc)
                raise

    return run


def _error_text(outcome: Any, raised: list) -> str | None:
    if raised:
        return str(raised[-1])
    if outcome.kind == ex.CANCEL:
        return outcome.error["error"].removeprefix("cancelled: ")
    if outcome.kind == ex.FAIL and outcome.error is not None:
        return outcome.error["error"].splitlines()[0]
    return None


@dataclasses.dataclass
class HandlerJob:
    """A stand-in for the job a handler receives, for unit tests without a database.

    ``enqueue_on_completion`` applies ADR-046's validation and limits and records each request in
    ``staged`` as ``{"kind", "queue", "args" (JSON-compatible dict), "priority", "max_attempts",
    "tags", "metadata", "run_at", "unique_key", "unique_states", "ordering_key"}``.
    """

    args: Any
    id: int = 0
    attempt: int = 1
    max_attempts: int = 25
    queue: str = "default"
    priority: int = 2
    deadline: Any = None
    metadata: dict = dataclasses.field(default_factory=dict)
    tags: list = dataclasses.field(default_factory=list)
    kind: str | None = None
    staged: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self._follow_ups = FollowUps(self.id, self.metadata)

    def is_cancelled(self) -> bool:
        return False

    def follow_ups(self) -> FollowUps:
        return self._follow_ups

    def enqueue_on_completion(self, args: Any, **options: Any) -> None:
        """Stage a follow-up (validated as the runtime does) and record it in ``staged``.

        Raises:
            StagingError: as ``JobContext.enqueue_on_completion``.
        """
        before = len(self._follow_ups.staged)
        self._follow_ups.enqueue_on_completion(args, **options)
        for p in self._follow_ups.staged[before:]:
            self.staged.append(
                {
                    "kind": p.kind,
                    "queue": p.queue,
                    "args": orjson.loads(p.args),
                    "priority": p.priority,
                    "max_attempts": p.max_attempts,
                    "tags": p.tags,
                    "metadata": orjson.loads(p.metadata),
                    "run_at": p.run_at,
                    "unique_key": p.unique_key,
                    "unique_states": p.unique_states,
                    "ordering_key": p.ordering_key,
                }
            )


def decode_args(args_type: Any, raw: dict) -> Any:
    """Convert a JSON dict to ``args_type`` exactly as the runtime does."""
    return args_decoder(args_type)(raw)


class UndeclaredFailureConsequences(AssertionError):
    """Registered kinds without a failure-consequence declaration (``.kinds``)."""

    def __init__(self, kinds: list[str]):
        super().__init__(
            "kinds without a failure consequence declaration (pass failure_consequence=fn or "
            "awa_fast.NO_FAILURE_CONSEQUENCE): " + ", ".join(kinds)
        )
        self.kinds = kinds


def undeclared_failure_consequences(client: Any) -> list[str]:
    """Every registered kind with neither a consequence nor an explicit no-effect declaration."""
    return client.registry.undeclared_kinds()


def assert_failure_consequences_declared(client: Any) -> None:
    """Registration check (ADR-PFM-OPS-003): every registered kind declares a failure
    consequence or ``NO_FAILURE_CONSEQUENCE``.

    Raises:
        UndeclaredFailureConsequences: listing every undeclared kind.
    """
    kinds = undeclared_failure_consequences(client)
    if kinds:
        raise UndeclaredFailureConsequences(kinds)
