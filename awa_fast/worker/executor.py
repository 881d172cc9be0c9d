"""Runs one handler and maps what it did to an :class:`Outcome`; never writes to the database.

Mapping (awa's): ``None``/any value -> completed; ``RetryAfter`` -> retryable (exhausted on the
final attempt); ``Snooze`` -> scheduled, attempt not counted; ``Cancel`` -> cancelled;
``WaitForCallback`` -> waiting_external; ``TerminalError`` -> failed; any other exception ->
retryable with backoff, or failed once attempts are exhausted. Args that do not convert fail the
job terminally.

The mapping is total (issue 9, class 2): every text and value a handler produced is made
storable (:mod:`awa_fast.worker.storable`), a ``BaseException`` other than the runtime's own
cancellation (``KeyboardInterrupt``, ``SystemExit`` raised inside a handler) is an ordinary
failure of the attempt, and an error while mapping (a result whose attribute access, ``__eq__``
or ``__class__`` raises) fails the attempt terminally with that error.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import logging
import random
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from awa_fast import metrics as metrics_mod
from awa_fast import telemetry
from awa_fast.errors import TerminalError
from awa_fast.results import Cancel, RetryAfter, Snooze, WaitForCallback
from awa_fast.worker import storable
from awa_fast.worker.context import JobContext
from awa_fast.worker.registry import Handler

log = logging.getLogger("awa_fast.executor")

COMPLETED = "completed"
RETRY = "retryable"
SNOOZE = "snoozed"
CANCEL = "cancelled"
WAIT = "waiting_external"
FAIL = "failed"
ABANDON = "abandoned"  # deadline expired: nothing is written, rescue takes the attempt over
# (counted in Runtime.outcomes; never finalized)

MAX_BACKOFF_S = 86400.0
TRACE_LINES = 10

# A read-only view of the Prometheus counters (awa_fast.metrics), kept for existing readers.
metrics = metrics_mod.LegacyCounters()


@dataclasses.dataclass(slots=True, eq=False, repr=False)
class Outcome:
    """What an attempt ended with. ``delay`` is seconds; ``error`` the ``errors[]`` entry to
    append; ``reason`` the failure reason (``terminal_error``, ``exhausted``) for failures;
    ``follow_ups`` the sealed staged requests (completed only). (A dataclass for its
    declaration only: the generated ``__init__`` is the plain assignments, identity equality.)"""

    kind: str
    _: dataclasses.KW_ONLY
    delay: float | None = None
    error: dict | None = None
    reason: str | None = None
    follow_ups: list | None = None
    callback_id: str | None = None

    def __repr__(self) -> str:
        return f"Outcome({self.kind}, reason={self.reason})"


def backoff_seconds(attempt: int) -> float:
    """awa's backoff: ``2^attempt`` s plus up to 25 % jitter, capped at 24 h (seconds)."""
    base = 2.0 ** min(attempt, 32)
    return min(base + random.random() * base * 0.25, MAX_BACKOFF_S)


def format_error(exc: BaseException) -> str:
    """``"<Qualname>: <message>"`` and the traceback's last 10 lines (awa's shape). Never
    raises: an exception whose ``__str__``/``__repr__`` raises is described by its type."""
    head = f"{type(exc).__qualname__}: {storable.describe(exc)}"
    try:
        lines = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    except BaseException as err:
        lines = [f"(traceback unavailable: {type(err).__qualname__})"]
    if len(lines) > TRACE_LINES:
        cut = len(lines) - TRACE_LINES
        lines = [f"... ({cut} lines truncated, full trace in logs)"] + lines[-TRACE_LINES:]
    return head + "\n" + "\n".join(lines)


def error_entry(text: Any, attempt: int, terminal: bool = False) -> dict:
    """An ``errors[]`` entry; ``text`` is made storable (NUL, lone surrogates, size)."""
    entry = {"error": storable.text(text), "attempt": attempt, "at": datetime.now(UTC).isoformat()}
    if terminal:
        entry["terminal"] = True
    return entry


def failed(ctx: JobContext, text: str, *, terminal: bool) -> Outcome:
    """A failed attempt: terminal, or retryable unless attempts are exhausted."""
    if terminal:
        return Outcome(FAIL, error=error_entry(text, ctx.attempt, True), reason="terminal_error")
    if ctx.attempt >= ctx.max_attempts:
        return Outcome(FAIL, error=error_entry(text, ctx.attempt), reason="exhausted")
    return Outcome(RETRY, delay=backoff_seconds(ctx.attempt), error=error_entry(text, ctx.attempt))


def handler_error(ctx: JobContext, exc: BaseException) -> Outcome:
    """The outcome of a handler that raised ``exc`` (discarding its staged follow-ups). Never
    raises: an exception whose ``__class__`` lookup raises fails the attempt terminally."""
    try:
        terminal = isinstance(exc, TerminalError)  # reads exc.__class__, which may raise
    except BaseException:
        terminal = True
    return _discarding(ctx, failed(ctx, format_error(exc), terminal=terminal))


def map_result(ctx: JobContext, result: Any) -> Outcome:
    """Map a handler's return value (not an exception) to an outcome, applying ADR-046's
    sealing, poisoning and discard rules to the attempt's staging buffer. Never raises: a
    result that cannot be mapped fails the attempt terminally, naming the error."""
    try:
        return _map_result(ctx, result)
    except BaseException as exc:
        text = f"handler result could not be mapped: {format_error(exc)}"
        return _discarding(ctx, failed(ctx, text, terminal=True))


def _map_result(ctx: JobContext, result: Any) -> Outcome:
    fu = ctx.staged_follow_ups
    if isinstance(result, RetryAfter):
        delay = RetryAfter(result.seconds).seconds  # re-validated: .seconds may be replaced
        if ctx.attempt >= ctx.max_attempts:
            outcome = Outcome(
                FAIL,
                reason="exhausted",
                error=error_entry(f"RetryAfter({delay}) on the final attempt", ctx.attempt),
            )
        else:
            outcome = Outcome(RETRY, delay=delay)
    elif isinstance(result, Snooze):
        outcome = Outcome(SNOOZE, delay=Snooze(result.seconds).seconds)
    elif isinstance(result, Cancel):
        outcome = Outcome(
            CANCEL, error=error_entry(f"cancelled: {storable.describe(result.reason)}", ctx.attempt)
        )
    elif isinstance(result, WaitForCallback):
        if fu is not None and fu.staged:
            metrics_mod.WAIT_FOR_CALLBACK_DISCARDS.inc()
            log.warning(
                "job %s (%s) returned WaitForCallback: discarding %d staged follow-up(s)",
                ctx.id,
                ctx.kind,
                len(fu.staged),
            )
        if ctx.callback_id is None or ctx.callback_id != str(result.callback_id):
            outcome = failed(ctx, "WaitForCallback without a registered callback", terminal=True)
        else:
            outcome = Outcome(WAIT, callback_id=result.callback_id)
    elif fu is not None and fu.poison is not None:
        # ADR-046: a swallowed staging error still fails the attempt terminally.
        outcome = failed(ctx, format_error(fu.poison), terminal=True)
    else:
        return Outcome(COMPLETED, follow_ups=fu.seal() if fu is not None else None)
    if fu is not None:
        fu.discard(outcome.kind, ctx.kind)
    return outcome


async def execute(handler: Handler, ctx: JobContext, thread_pool: Any = None) -> Outcome:
    """Run ``handler`` for ``ctx`` and map the result.

    ``def`` handlers run in ``thread_pool`` (an executor) so they never block the loop.
    Raises ``asyncio.CancelledError`` when the runtime cancels the attempt (deadline expired,
    shutdown gave up waiting); the caller decides what that means.
    """
    try:
        ctx.args = handler.decode(ctx.raw_args)
    except Exception as exc:  # a conversion error is deterministic: no retry helps
        text = f"args conversion failed: {format_error(exc)}"
        return _discarding(ctx, failed(ctx, text, terminal=True))
    measured = telemetry.metrics_on()
    started = time.perf_counter() if measured else 0.0
    span = (
        telemetry.handler_span(ctx.kind, ctx.queue, ctx.id, ctx.attempt, ctx.metadata)
        if telemetry.tracing_imported()
        else None
    )
    if span is None:
        outcome = await _outcome(handler, ctx, thread_pool, False)
    else:
        with span:  # the producer's trace (awa:traceparent) is the handler's context
            outcome = await _outcome(handler, ctx, thread_pool, True)
            span.outcome(outcome.kind, outcome.error)
    if measured:
        telemetry.record_attempt(ctx.kind, ctx.queue, outcome.kind, time.perf_counter() - started)
    return outcome


async def _outcome(handler: Handler, ctx: JobContext, thread_pool: Any, traced: bool) -> Outcome:
    try:
        # The attempt's deadline is enforced by the runtime's deadline sweeper, which cancels
        # this task (cheaper than a timer per job); see Attempts.sweep_deadlines.
        result = await _call(handler, ctx, thread_pool, traced)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        log.debug("job %s (%s) attempt %s raised", ctx.id, ctx.kind, ctx.attempt, exc_info=True)
        return handler_error(ctx, exc)
    if type(result) is _Raised:  # a def handler's exception (type(): __class__ may raise)
        return handler_error(ctx, result.exc)
    return map_result(ctx, result)


async def _call(handler: Handler, ctx: JobContext, thread_pool: Any, traced: bool) -> Any:
    if handler.is_async:
        return await handler.fn(ctx)
    # A traced def handler runs in a copy of this context: the span is current in its thread.
    call: Callable[[], Any] = (
        functools.partial(contextvars.copy_context().run, handler.fn, ctx)
        if traced
        else functools.partial(handler.fn, ctx)
    )
    boxed = functools.partial(_boxed, call)
    if thread_pool is None:
        result = await asyncio.get_running_loop().run_in_executor(None, boxed)
    else:
        # The thread's own future is kept on the attempt: the runtime must know whether the
        # thread still runs before it gives the attempt back (see Runtime._run).
        ctx.thread = thread_pool.submit(boxed)
        result = await asyncio.wrap_future(ctx.thread)
    if type(result) is _Raised:
        return result
    try:
        awaitable = inspect.isawaitable(result)  # reads __class__, which may raise
    except BaseException:
        awaitable = False  # map_result fails such a result terminally, as for an async handler
    if awaitable:  # a plain callable that returns a coroutine (lambda, wrapper)
        result = await result
    return result


class _Raised:
    """What a ``def`` handler raised, carried out of its thread as a value: a ``StopIteration``
    or ``GeneratorExit`` set on the thread's future never reaches the awaiting task (asyncio
    cannot raise them into a future), which left the attempt unfinalized."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _boxed(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except BaseException as exc:  # every exception of the handler, re-raised on the loop side
        return _Raised(exc)


def _discarding(ctx: JobContext, outcome: Outcome) -> Outcome:
    fu = ctx.staged_follow_ups
    if fu is not None:
        fu.discard(outcome.kind, ctx.kind)
    return outcome
