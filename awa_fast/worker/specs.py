"""Registered follow-up specs per (kind, outcome) -- ADR-029's builders, in Python.

A spec is ``(trigger_args_type, fn)``; ``fn`` receives the trigger's typed args, the job, and the
outcome's details, and returns follow-up args, an :class:`~awa_fast.EnqueueRequest`, or ``None``
to skip. Specs run in Python *before* the finalization transaction opens (their requests are then
validated like staged ones); the inserts happen inside it:

=====================  ====================================  ===================================
outcome                ``fn`` arguments                      when the follow-up is inserted
=====================  ====================================  ===================================
completed              ``(args, job)``                       same transaction as the guarded
retried                ``(args, job, error, attempt,         state change (stale guard =>
                       next_run_at)``                        rollback => no follow-up)
exhausted              ``(args, job, error, attempt)``
cancelled              ``(args, job, reason)``
waiting_for_callback   ``(args, job)``
rescued                ``(args, job, reason)``               best effort, in a separate
                                                             transaction after the rescue commits
=====================  ====================================  ===================================

Rescue reasons: ``stale_heartbeat``, ``deadline_exceeded``, ``expired_callback``.

Exhausted specs fire however a job is exhausted: a final-attempt rescue (stale heartbeat,
deadline, callback timeout) of a kind with exhausted specs parks the job in
``consequence_pending`` and the reconciler settles it through the same settler as the worker
path, inserting the follow-ups in that settling transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from awa_fast.requests import Prepared, check_name, kind_for_type
from awa_fast.worker import executor as ex
from awa_fast.worker.follow_ups import build_request, trace_context
from awa_fast.worker.registry import args_decoder

log = logging.getLogger("awa_fast.specs")

OUTCOMES = ("completed", "retried", "exhausted", "cancelled", "waiting_for_callback", "rescued")
_FROM_OUTCOME = {
    ex.COMPLETED: "completed",
    ex.RETRY: "retried",
    ex.FAIL: "exhausted",
    ex.CANCEL: "cancelled",
    ex.WAIT: "waiting_for_callback",
}


class SpecRunner:
    """The registered specs of one client, keyed by ``(kind, outcome)``."""

    def __init__(self) -> None:
        self._specs: dict[tuple[str, str], list[tuple[Callable, Callable]]] = {}
        self.frozen = False

    def register(
        self, outcome: str, trigger_args_type: Any, fn: Callable, *, kind: str | None = None
    ) -> None:
        """Add a spec.

        Raises:
            ValueError: unknown ``outcome``; ``ValidationError`` (a ValueError): ``kind``
                breaks the name rule (``requests.check_name``).
            RuntimeError: the runtime already started (specs are fixed at ``start()``).
            TypeError: ``fn`` is not callable.
        """
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown spec outcome {outcome!r}; one of {', '.join(OUTCOMES)}")
        if self.frozen:
            raise RuntimeError("follow-up specs must be registered before start()")
        if not callable(fn):
            raise TypeError("a follow-up spec must be callable")
        kind = kind_for_type(trigger_args_type) if kind is None else check_name(kind, "kind")
        self._specs.setdefault((kind, outcome), []).append((args_decoder(trigger_args_type), fn))

    def has(self, kind: str, outcome: str) -> bool:
        return (kind, outcome) in self._specs

    def kinds(self, outcome: str) -> list[str]:
        """The kinds with at least one spec for ``outcome``."""
        return sorted(k for k, o in self._specs if o == outcome)

    def kinds_any(self) -> list[str]:
        """The kinds with at least one spec."""
        return sorted({k for k, _o in self._specs})

    def has_completed(self, kind: str) -> bool:
        return (kind, "completed") in self._specs

    def requests(
        self,
        kind: str,
        outcome: str,
        raw_args: dict,
        job: Any,
        job_id: int,
        metadata: dict | None,
        *extra: Any,
    ) -> list[Prepared]:
        """Build and validate the follow-ups of ``(kind, outcome)`` in registration order.

        Raises:
            Exception: whatever a spec function or validation raised (the caller's transaction
                then does not commit); a ``BaseException`` such as ``SystemExit`` raised by a
                spec comes as a ``RuntimeError`` naming it (it must not end the process).
        """
        specs = self._specs.get((kind, outcome))
        if not specs:
            return []
        trace = trace_context(metadata)
        out = []
        for decode, fn in specs:
            try:
                result = fn(decode(raw_args), job, *extra)
            except Exception:
                raise
            except BaseException as exc:
                # inside a spec is the spec's failure, not this process's: as for handlers
                raise RuntimeError(
                    f"the {outcome} follow-up spec of {kind!r} raised {type(exc).__name__}: {exc}"
                ) from exc
            if result is not None:
                out.append(build_request(result, {}, job_id, trace))
        return out

    def for_outcome(self, ctx: Any, outcome: Any) -> list[Prepared]:
        """The specs' follow-ups for a worker-driven outcome of attempt ``ctx``."""
        name = _FROM_OUTCOME.get(outcome.kind)
        if name is None or not self.has(ctx.kind, name):
            return []
        error = None if outcome.error is None else outcome.error.get("error")
        extra: tuple[Any, ...]
        if name == "retried":
            next_run = datetime.now(UTC) + timedelta(seconds=outcome.delay or 0)
            extra = (error, ctx.attempt, next_run)
        elif name == "exhausted":
            extra = (error, ctx.attempt)
        elif name == "cancelled":
            extra = ((error or "").removeprefix("cancelled: "),)
        else:
            extra = ()
        return self.requests(ctx.kind, name, ctx.raw_args, ctx, ctx.id, ctx.metadata, *extra)
