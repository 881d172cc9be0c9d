"""The awa-fast exception tree, name-compatible with awa-pg's (`awa.AwaError` and subclasses).

Every error awa-fast raises on purpose derives from :class:`AwaError`.
"""

from __future__ import annotations

import dataclasses


class AwaError(Exception):
    """Base class of every awa-fast error."""


@dataclasses.dataclass(eq=False, repr=False)
class _Detailed(AwaError):
    """An error carrying keyword details: a subclass declares them once, as annotated fields
    of a keyword-only dataclass (each defaulting to ``None``; the exception's own equality
    and repr kept), and is raised as
    ``cls(message, *, <detail>=...)``; the message is the exception's text (``args``)."""

    message: dataclasses.InitVar[str]

    def __post_init__(self, message: str) -> None:
        super().__init__(message)


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class ValidationError(_Detailed, ValueError):
    """A request broke an insert rule before anything touched the database.

    Attributes:
        field: the offending field name (``"priority"``, ``"args"``, ``"tags[3]"``, ...).
        limit: the rule that was broken, as text (``"1..4"``, ``"<= 20 tags"``), or ``None``.
        size: for a size rule (``awa_fast.requests.MAX_FIELD_BYTES``), the offending size in
            bytes, else ``None``.
    """

    field: str | None = None
    limit: str | None = None
    size: int | None = None


class ValidationTypeError(ValidationError, TypeError):
    """A :class:`ValidationError` for a value of the wrong type (not a wrong value of the right
    type): also a ``TypeError``, the class awa raises for it (e.g. ``rate_limit="fast"``)."""


class SerializationError(ValidationError):
    """Args or metadata could not be converted to JSON."""


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class UniqueConflict(_Detailed):
    """An insert hit a unique key already held by another job (index ``idx_awa_fast_jobs_unique``).

    Attributes:
        constraint: the index name reported by Postgres.
        holder_id: the id of the job holding the key, when it was looked up (every retry path
            does: ``retry``, ``retry_from_dlq``, ``retry_external``, ``retry_failed``), else None.
        holder_state: that job's state (``"running"``, ``"completed"``, ...), else None.
    """

    constraint: str | None = None
    holder_id: int | None = None
    holder_state: str | None = None


class SchemaNotMigrated(AwaError):
    """The ``awa_fast`` schema is missing or older than this package; run ``awa-fast migrate``."""


class UnknownJobKind(AwaError):
    """No handler is registered for a job's kind."""


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class DatabaseError(_Detailed):
    """A database operation failed for a reason awa-fast does not map to a narrower error.

    Raised by every public call in place of the driver's exception (``awa_fast.db_errors``),
    chained to it (``__cause__``).

    Attributes:
        operation: the call that failed (``"insert"``, ``"transaction.commit"``, ...), or
            ``None`` where none was named.
        sqlstate: the server's SQLSTATE (``"25006"``, ...), or ``None`` (no answer from the
            server: a connection that failed or was lost, a pool timeout).
    """

    operation: str | None = None
    sqlstate: str | None = None


class DatabaseUnavailable(DatabaseError):
    """The database could not be reached, or the connection to it was lost mid-call (a
    refused or timed-out connect, a restart, a terminated backend, the network, a closed
    pool). A write cut off this way may or may not have committed."""


class ReadOnlyDatabase(DatabaseError):
    """The database refused a write because it is read-only (``default_transaction_read_only``,
    a hot standby, a read-only transaction; SQLSTATE 25006). Nothing was written."""


class DeadlockError(DatabaseError):
    """A write kept deadlocking with concurrent work after bounded retries (``awa_fast.bulk``);
    nothing of it was written, so the caller may retry it."""


class CallbackNotFound(AwaError):
    """No job waits on the given callback id (or the token is stale)."""


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class AttemptStillRunning(_Detailed):
    """An admin action would start a new attempt of a job while an earlier attempt of it is
    still running (``retry()`` of a job cancelled mid-run whose handler has not ended).

    Attributes:
        job_id: the job.
    """

    job_id: int | None = None


class JobNotFound(AwaError):
    """No job has the given id."""


class TerminalError(AwaError):
    """Raise from a handler to fail the job at once, without retries."""


class StagingError(TerminalError):
    """A follow-up could not be staged (ADR-046). The attempt is poisoned.

    Attributes:
        reason: ``"invalid"``, ``"too_many"``, ``"too_large"`` or ``"sealed"``.
        limit: 16 for ``too_many``, 65536 (bytes) for ``too_large``, else ``None``.
        field: for ``invalid``, the offending field as the original ``ValidationError``
            named it (``"priority"``, ``"args.value"``); for ``too_large``, the field past its
            own insert bound (``"args"``: ``awa_fast.requests.MAX_ARGS_BYTES``, ...) when that
            was the cause, else ``None``.

    Raised chained (``__cause__``) from the original error where there is one.
    """

    REASONS = ("invalid", "too_many", "too_large", "sealed")

    def __init__(
        self, message: str, *, reason: str, limit: int | None = None, field: str | None = None
    ):
        if reason not in self.REASONS:
            raise ValueError(f"unknown StagingError reason {reason!r}")
        super().__init__(message)
        self.reason = reason
        self.limit = limit
        self.field = field


class QueueMismatchWarning(UserWarning):
    """A job was inserted without ``queue=`` into ``default`` although the inserting client
    registered its kind's handler for another queue (awa-pg semantics: the insert's queue
    decides, so no worker of that queue sees it); likewise a follow-up a handler stages
    (``enqueue_on_completion``) without ``queue=``. Warned once per kind and client. Also
    warned by ``start()`` when its explicit queues leave out ``default`` while handlers are
    registered without ``queue=`` (their inserts go to ``default``; a misspelt queue name)."""


class Unsupported(ValidationError):
    """An awa-pg option or call that awa-fast does not implement yet: rejected, never ignored.

    Attributes:
        field: the keyword or method name (``"rate_limit"``, ``"queue_descriptor"``, ...).
    """

    def __init__(self, field: str, detail: str = ""):
        super().__init__(
            f"{field} is not implemented by awa-fast yet" + (f" ({detail})" if detail else ""),
            field=field,
        )


# awa 0.7 storage-transition errors. awa-fast has one storage engine and no transition, so it
# never raises these; they exist so that applications catching them keep working.
class StorageNotFinalized(AwaError):
    """awa: the queue-storage transition has not been finalized."""


class LiveRuntimesRequireExclusiveWindow(AwaError):
    """awa: a storage transition step needs no live runtimes."""


class RuntimeVersionFloorNotMet(AwaError):
    """awa: a live runtime is older than the storage transition requires."""


class ConfigError(ValidationError):
    """A worker configuration that cannot work, rejected at ``start()`` before anything runs.
    A :class:`ValidationError` (and so a ``ValueError``), as awa-pg raises for a bad setting.

    Attributes:
        field: the offending keyword or setting (``"heartbeat_interval_ms"``, ``"queues"``, ...).
        limit: the rule that was broken, as text, or ``None``.
    """

    field: str

    def __init__(self, message: str, *, field: str, limit: str | None = None):
        super().__init__(message, field=field, limit=limit)
