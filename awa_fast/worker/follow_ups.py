"""The per-attempt staging buffer for handler-staged follow-up jobs (ADR-046).

A handler stages requests while it runs; each is converted to JSON, validated, hashed and counted
against the per-attempt limits at once (in ``_ext``). The buffer is sealed when the handler returns;
the finalizer inserts the sealed requests if and only if the attempt's own completion commits.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from awa_fast import _native, metrics
from awa_fast.errors import AwaError, StagingError, ValidationError
from awa_fast.requests import EnqueueRequest, InsertOpts, Prepared, prepare
from awa_fast.telemetry import TRACE_KEY

if TYPE_CHECKING:
    from awa_fast.producer import OffQueueWarner

log = logging.getLogger("awa_fast.follow_ups")

MAX_STAGED = 16  # ADR-046: at most 16 staged follow-ups per attempt
MAX_STAGED_BYTES = 65536  # ADR-046: at most 64 KiB of serialized requests per attempt
PROVENANCE_KEY = "awa:triggered_by"
_OPTION_NAMES = frozenset(InsertOpts.__struct_fields__)


def trace_context(metadata: dict | None) -> str | None:
    """The W3C ``traceparent`` carried in a job's metadata (``awa:traceparent`` or ``traceparent``)."""
    if not metadata:
        return None
    value = metadata.get(TRACE_KEY) or metadata.get("traceparent")
    return value if isinstance(value, str) else None


def build_request(args: Any, options: dict, trigger_id: int, trace: str | None) -> Prepared:
    """Validate one follow-up request (args or an :class:`EnqueueRequest` plus keyword options),
    stamping provenance (``awa:triggered_by``) and the trigger's trace context in its metadata.

    Raises:
        TypeError: an unknown option or non-dict metadata.
        ValidationError: the request breaks an insert rule.
    """
    unknown = set(options) - _OPTION_NAMES
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    if isinstance(args, EnqueueRequest):
        options = {**args.options, **options}
        args = args.args
    raw_metadata = options.get("metadata")
    if raw_metadata is not None and not isinstance(raw_metadata, dict):
        raise TypeError("metadata must be a dict or None")
    metadata = dict(raw_metadata or {})
    metadata[PROVENANCE_KEY] = trigger_id
    if trace is not None:
        metadata.setdefault(TRACE_KEY, trace)
    return prepare(args, **{**options, "metadata": metadata})


def _gives_queue(args: Any, options: dict) -> bool:
    return "queue" in options or (isinstance(args, EnqueueRequest) and "queue" in args.options)


class FollowUps:
    """A handle on one attempt's staging buffer; safe to keep past the handler call (it is then
    sealed and every call raises ``StagingError(reason="sealed")``).

    ADR-046 limits: at most 16 requests and 65536 bytes (kind + queue + args + metadata + tags +
    ordering key, UTF-8) per attempt, across ``wait_for_callback`` resumes.
    """

    __slots__ = ("job_id", "_trace", "_staged", "_budget", "_sealed", "poison", "_off_queue")

    def __init__(
        self, job_id: int, metadata: dict | None = None, off_queue: OffQueueWarner | None = None
    ):
        self.job_id = job_id
        self._off_queue = off_queue  # warns as insert() does for a kind registered off default
        self._trace = trace_context(metadata)
        self._staged: list[Prepared] = []
        self._budget = _native.StagingBudget(MAX_STAGED, MAX_STAGED_BYTES)
        self._sealed = False
        # The first staging error of this attempt: a completion after it fails terminally.
        self.poison: StagingError | None = None

    @property
    def staged(self) -> list[Prepared]:
        """The validated requests staged so far, in staging order."""
        return self._staged

    @property
    def sealed(self) -> bool:
        return self._sealed

    def enqueue_on_completion(self, args: Any, **options: Any) -> None:
        """Stage a follow-up, inserted if and only if this attempt's completion commits.

        ``args`` is job args or an :class:`EnqueueRequest`; keywords as ``insert`` (``kind``,
        ``queue``, ``priority``, ``max_attempts``, ``tags``, ``metadata``, ``run_at``,
        ``unique_opts`` -- ``{}`` means the defaults --, ``ordering_key``).

        Raises:
            StagingError: ``reason="invalid"`` (does not convert or breaks an insert rule;
                ``__cause__`` is the original error), ``"too_many"`` (limit 16), ``"too_large"``
                (limit 65536 bytes) or ``"sealed"`` (the handler already returned). Any but
                ``sealed`` poisons the attempt.

        Warns:
            QueueMismatchWarning: as ``insert()``, a kind registered off ``default`` staged
                without ``queue=`` (once per kind and client).
        """
        self.stage(args, options, stacklevel=2)

    def stage(self, args: Any, options: dict, *, stacklevel: int) -> None:
        """:meth:`enqueue_on_completion`; a warning points ``stacklevel`` frames up (as
        ``warnings.warn``'s, from the caller)."""
        if self._sealed:
            raise StagingError(
                "ADR-046: the attempt's staging buffer is sealed (the handler already returned)",
                reason="sealed",
            )
        try:
            prepared = self._prepare(args, options)
            self._budget.charge(prepared.size)
        except StagingError as exc:
            self.poison = self.poison or exc
            raise
        except (AwaError, TypeError, ValueError, OverflowError) as exc:
            if isinstance(exc, ValidationError) and exc.size is not None:
                # a field past its insert bound (awa_fast.requests.MAX_*_BYTES, all above the
                # attempt's budget): too large, as a request past the budget is
                err = StagingError(
                    f"ADR-046: at most {self._budget.max_bytes} bytes of staged follow-ups per "
                    f"attempt; follow-up could not be staged: {exc}",
                    reason="too_large",
                    limit=self._budget.max_bytes,
                    field=exc.field,
                )
            else:
                err = StagingError(
                    f"follow-up could not be staged: {exc}",
                    reason="invalid",
                    field=getattr(exc, "field", None),
                )
            self.poison = self.poison or err
            raise err from exc
        self._staged.append(prepared)
        if self._off_queue is not None and not _gives_queue(args, options):
            self._off_queue.warn((prepared,), stacklevel=stacklevel + 1, how="staged")

    def _prepare(self, args: Any, options: dict) -> Prepared:
        return build_request(args, options, self.job_id, self._trace)

    def seal(self) -> list[Prepared]:
        """Seal the buffer and return its requests (the finalizer owns them from now on)."""
        self._sealed = True
        return self._staged

    def discard(self, why: str, kind: str) -> None:
        """Seal and drop the buffer; ``why`` is the outcome that discarded it (logged at debug)."""
        self._sealed = True
        if self._staged:
            metrics.FOLLOW_UPS_DISCARDED.labels(why).inc(len(self._staged))
            log.debug(
                "discarded %d staged follow-up(s) of %s job %s on %s",
                len(self._staged),
                kind,
                self.job_id,
                why,
            )
            self._staged = []
