"""What an attempt asks the finalizer (:class:`FinalizeRequest`) and what it answers
(:class:`Finalized`); see :mod:`awa_fast.worker.finalizer`."""

from __future__ import annotations

import dataclasses
import enum

from awa_fast.requests import Prepared
from awa_fast.worker import executor as ex
from awa_fast.worker.context import JobContext

# The outcome of an unfinished attempt given back (shutdown, no handler).
RELEASED = "released"


@dataclasses.dataclass(frozen=True, slots=True)
class FinalizeRequest:
    """One attempt's outcome to make durable.

    Attributes:
        attempt: the attempt's :class:`JobContext` (its ``id`` and ``run_lease`` guard every
            write).
        outcome: what the attempt ended with (``executor.Outcome``).
        follow_ups: the sealed staged follow-ups (``Prepared``), inserted iff a completion
            commits; empty for any other outcome.
    """

    attempt: JobContext
    outcome: ex.Outcome
    follow_ups: tuple[Prepared, ...] = ()

    @classmethod
    def of(cls, attempt: JobContext, outcome: ex.Outcome) -> FinalizeRequest:
        """The request for a handler's outcome (its staged follow-ups count only on
        completion)."""
        staged = outcome.follow_ups if outcome.kind == ex.COMPLETED else None
        return cls(attempt, outcome, tuple(staged or ()))

    @classmethod
    def release(cls, attempt: JobContext) -> FinalizeRequest:
        """Give an unfinished attempt back (shutdown, no handler): available again, the
        attempt not counted."""
        return cls(attempt, ex.Outcome(RELEASED, delay=0.0))


class Finalized(enum.Enum):
    """What :meth:`Finalizer.submit` did with a request."""

    APPLIED = "applied"  # the outcome is durable
    STALE = "stale"  # the guard matched no row (rescued, cancelled, superseded): nothing changed
    PROMPT_FAILURE = "prompt_failure"  # the outcome failed for good; a failure was recorded
