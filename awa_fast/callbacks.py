"""External waits (ADR-021): the client-side callback operations.

A handler registers a callback (``job.register_callback``), hands its id to the outside world,
and either returns ``WaitForCallback(token)`` (the job parks in ``waiting_external``) or awaits
``job.wait_for_callback(token)`` (the handler stays alive). The outside world then calls one of
these, by callback id. ``resolve_callback`` evaluates the callback's CEL expressions
(``callback_expressions.py``) and applies the outcome in the same transaction.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from psycopg import errors as pg_errors

from awa_fast import callback_expressions, enqueue
from awa_fast.callback_token import check_timeout, parse_callback_id
from awa_fast.errors import AttemptStillRunning, CallbackNotFound, ValidationError
from awa_fast.job import Job
from awa_fast.repo.callbacks import CallbackRepo
from awa_fast.repo.consequences import LockedJob
from awa_fast.repo.jobs import JobRepo
from awa_fast.requests import MAX_PAYLOAD_BYTES, check_size, to_json
from awa_fast.results import outcome_is
from awa_fast.worker import storable

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from awa_fast.worker.consequences import Settler
    from awa_fast.worker.specs import SpecRunner


class CallbackDeps(Protocol):
    """What the callback operations need (``awa_fast.admin.callbacks.CallbackAdmin``): the pool,
    the registered follow-up specs (a completion inserts its Completed specs), the settler (a
    failure goes through the failure path) and the heartbeat staleness in ms (a retry waits for
    the last attempt to end)."""

    @property
    def specs(self) -> SpecRunner: ...

    @property
    def settler(self) -> Settler: ...

    async def pool(self) -> AsyncConnectionPool: ...

    def staleness_ms(self) -> int: ...


async def _locked(conn, callback_id: uuid.UUID) -> LockedJob:
    row = await CallbackRepo(conn).lock(callback_id)
    if row is None:
        raise CallbackNotFound(f"no job waits on callback {callback_id}")
    return row


def _found(job: Job | None, cid: uuid.UUID) -> Job:
    if job is None:
        raise CallbackNotFound(f"no job waits on callback {cid}")
    return job


@enqueue.maps_errors
async def complete_external(deps: CallbackDeps, callback_id: Any, payload: Any = None) -> Job:
    """Complete the job waiting on ``callback_id`` (``waiting_external``, or still ``running``:
    an early callback). Registered Completed specs fire in the same transaction; staged
    follow-ups of a still-running handler are discarded (its completion is then stale).

    When the job's unique mask holds ``completed`` and another job holds its key, the job is
    cancelled as a duplicate instead (returned so, its last error saying so), as a worker's
    own completion into a held key is.

    Raises:
        CallbackNotFound: no such callback (or it timed out and was rescued).
        ValidationError: ``callback_id`` is not a UUID.
    """
    cid = parse_callback_id(callback_id)
    pool = await deps.pool()
    async with pool.connection() as conn:
        async with conn.transaction():
            return await _complete_locked(deps, conn, await _locked(conn, cid))


async def _complete_locked(deps: CallbackDeps, conn, row: LockedJob) -> Job:
    """Complete the job of a row :func:`_locked` returned, in the caller's transaction."""
    job = Job.from_row(row)
    requests = deps.specs.requests(job.kind, "completed", job.args, job, job.id, job.metadata)
    repo = CallbackRepo(conn)
    done = await repo.complete(job.id)
    if done is None:
        # Another job holds the key this completion would hold: the job is a duplicate (no
        # follow-ups), as a worker's own completion into a held key is.
        return await repo.complete_as_duplicate(job.id)
    if requests:
        await enqueue.insert_follow_ups(conn, requests, job.kind, job.id)
    return done


@enqueue.maps_errors
async def fail_external(deps: CallbackDeps, callback_id: Any, error: str) -> Job:
    """Fail the job waiting on ``callback_id`` through the failure path: a kind with a failure
    consequence is first recorded ``consequence_pending`` (owed) and committed, then its effect
    runs and it settles in a second transaction (failed / DLQ and exhausted specs); if the
    effect fails it stays ``consequence_pending`` for the reconciler. Other kinds settle in
    one transaction.

    Raises:
        CallbackNotFound, ValidationError: as :func:`complete_external`.
    """
    cid = parse_callback_id(callback_id)
    pool = await deps.pool()
    async with pool.connection() as conn:
        async with conn.transaction():
            row = await _locked(conn, cid)
            owed = await _fail_locked(deps, conn, row, error)
        return await _after_failure(deps, conn, row, owed)


async def _fail_locked(
    deps: CallbackDeps, conn, row: LockedJob, error: str, expression: str | None = None
) -> bool:
    """Fail the job of a row :func:`_locked` returned, in the caller's transaction (awa's
    error entry; ``expression`` is the on_fail expression that matched, if any). Returns True
    when the failure was only recorded as owed: after COMMIT, :func:`_after_failure` applies
    it (``Settler.owe_or_settle``)."""
    entry = {
        "error": storable.text(error),
        "attempt": row.attempt,
        "at": datetime.now(UTC).isoformat(),
    }
    if expression is not None:
        entry["expression"] = expression
    # A running row's handler lives on (an early callback): its heartbeat stays as the "still
    # running" mark -- in jobs, through consequence_pending, or, if the job is dead-lettered,
    # in the DLQ entry -- so neither retry() nor retry_from_dlq() can overlap it. A parked row
    # keeps its own mark.
    return await deps.settler.owe_or_settle(
        conn,
        row,
        reason="callback_failed",
        path="failure",
        error_entry=entry,
        mark=row.heartbeat_at if row.state == "running" else None,
    )


async def _after_failure(deps: CallbackDeps, conn, row: LockedJob, owed: bool) -> Job:
    """After the failing transaction committed: apply an owed failure's effect and settle it
    (a second transaction on ``conn``; on error it stays owed for the reconciler), then
    return the job as committed (the locked row itself if it moved to the DLQ)."""
    if owed:
        await deps.settler.apply_owed(conn, row.id)
    found = await JobRepo(conn).get(row.id)
    return Job.from_row(row) if found is None else found


@enqueue.maps_errors
async def retry_external(deps: CallbackDeps, callback_id: Any) -> Job:
    """Send a parked job back to ``available`` with attempt 0.

    Raises:
        CallbackNotFound: no job parked in ``waiting_external`` on that callback.
        UniqueConflict: another live job holds its unique key (``holder_id`` names it).
        AttemptStillRunning: its handler is still waiting in ``wait_for_callback`` (nothing
            changes): cancel the job, or resume it, instead.
    """
    cid = parse_callback_id(callback_id)
    stale_ms = deps.staleness_ms()
    pool = await deps.pool()
    async with pool.connection() as conn:
        repo = CallbackRepo(conn)
        try:
            job = await repo.retry(cid, stale_ms)
        except pg_errors.UniqueViolation as exc:  # the new state would take a held key
            holder = await repo.job_id(cid)
            if holder is None:
                raise
            raise await enqueue.holder_conflict(conn, holder, "retry", exc) from exc
        if job is not None:
            await JobRepo(conn).wake(job.queue)
            return job
        live = await repo.still_running(cid, stale_ms)
    if live is not None:
        raise AttemptStillRunning(
            f"job {live.id}'s handler is still waiting for callback {cid}; cancel or "
            "resume it instead",
            job_id=live.id,
        )
    raise CallbackNotFound(f"no job waits on callback {cid}")


@enqueue.maps_errors
async def resume_external(deps: CallbackDeps, callback_id: Any, payload: Any = None) -> Job:
    """Resume a handler blocked in ``job.wait_for_callback``: the job is ``running`` again and
    the payload becomes ``wait_for_callback``'s return value. The token is consumed.

    Raises:
        CallbackNotFound: no job parked on that callback.
        ValidationError: ``payload`` is not JSON-serializable, holds a NUL character
            (PostgreSQL could not store it) or takes more than ``MAX_PAYLOAD_BYTES`` (1 MiB)
            of JSON, as args may (``field="payload"``); checked before anything is sent.
    """
    cid = parse_callback_id(callback_id)
    encoded = to_json({"_awa_callback_result": payload}, "payload")
    check_size("payload", len(encoded), MAX_PAYLOAD_BYTES)
    data = encoded.decode()
    pool = await deps.pool()
    async with pool.connection() as conn:
        return _found(await CallbackRepo(conn).resume(cid, data), cid)


@enqueue.maps_errors
async def heartbeat_callback(
    deps: CallbackDeps, callback_id: Any, timeout_seconds: float = 3600.0
) -> Job:
    """Push the callback's timeout to now + ``timeout_seconds`` seconds."""
    cid = parse_callback_id(callback_id)
    timeout = check_timeout(timeout_seconds)
    pool = await deps.pool()
    async with pool.connection() as conn:
        return _found(await CallbackRepo(conn).heartbeat(cid, timeout), cid)


class ResolveResult:
    """awa's ``ResolveResult``: ``outcome`` is ``"completed"``, ``"failed"`` or ``"ignored"``;
    ``job`` the job after the transition (``None`` when ignored); ``payload`` the payload a
    completion carried; ``reason`` why it was ignored."""

    __slots__ = ("outcome", "job", "payload", "reason")

    def __init__(
        self, outcome: str, job: Job | None = None, payload: Any = None, reason: str | None = None
    ):
        self.outcome, self.job, self.payload, self.reason = outcome, job, payload, reason

    is_completed = outcome_is("completed")
    is_failed = outcome_is("failed")
    is_ignored = outcome_is("ignored")

    def __repr__(self) -> str:
        return f"ResolveResult(outcome={self.outcome!r}, job={self.job!r}, reason={self.reason!r})"


@enqueue.maps_errors
async def resolve_callback(
    deps: CallbackDeps, callback_id: Any, payload: Any = None, default_action: str = "ignore"
) -> ResolveResult:
    """Resolve a callback with its CEL expressions (awa's order: ``filter`` false ignores the
    payload, ``on_fail`` true fails the job, ``on_complete`` true completes it with the
    ``transform``ed payload; see ``callback_expressions.py``), else by ``default_action``:
    ``"complete"`` (the payload returned in the result), ``"fail"`` (awa's error text) or
    ``"ignore"`` (no change). Lookup, evaluation and transition are one transaction under the
    job's row lock, so two concurrent resolves of one callback cannot both act. A failure of a
    kind with an effect is that transition recorded as owed; its effect and settlement follow
    in a second transaction, as for :func:`fail_external`.

    Raises:
        ValidationError: unknown ``default_action`` (awa's message) or malformed id.
        CallbackNotFound: no job waits on that callback.
    """
    if default_action not in ("complete", "fail", "ignore"):
        raise ValidationError(
            f"unknown default_action: {default_action} (expected 'complete', 'fail', or 'ignore')",
            field="default_action",
        )
    cid = parse_callback_id(callback_id)
    async with (await deps.pool()).connection() as conn:
        async with conn.transaction():
            row = await _locked(conn, cid)
            expressions = await CallbackRepo(conn).expressions(row.id, cid)
            decision = callback_expressions.decide(expressions, payload, default_action, row.id)
            if decision.action == "complete":
                job = await _complete_locked(deps, conn, row)
                return ResolveResult("completed", job, decision.payload)
            if decision.action == "fail":
                assert decision.error is not None  # a "fail" decision carries its error
                owed = await _fail_locked(deps, conn, row, decision.error, decision.expression)
            else:
                return ResolveResult("ignored", reason=decision.reason)
        return ResolveResult("failed", await _after_failure(deps, conn, row, owed))
