"""Job rows as Python values: :class:`JobState` and :class:`Job` (awa-pg's read-only job shape)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any


class JobState(enum.StrEnum):
    """A job's state; ``str(state)`` is the lowercase name, as in awa.

    ``consequence_pending`` is awa-fast's: the job failed and its failure consequence has not
    been applied yet (never handed to a handler again; the reconciler settles it).
    """

    Scheduled = "scheduled"
    Available = "available"
    Running = "running"
    Completed = "completed"
    Retryable = "retryable"
    Failed = "failed"
    Cancelled = "cancelled"
    WaitingExternal = "waiting_external"
    ConsequencePending = "consequence_pending"


TERMINAL_STATES = frozenset({JobState.Completed, JobState.Failed, JobState.Cancelled})

# Column order of every statement that returns whole jobs (see awa_fast.sql.JOB_COLUMNS).
JOB_FIELDS = (
    "id",
    "kind",
    "queue",
    "args",
    "state",
    "priority",
    "attempt",
    "max_attempts",
    "run_at",
    "heartbeat_at",
    "deadline_at",
    "attempted_at",
    "finalized_at",
    "created_at",
    "errors",
    "metadata",
    "tags",
    "unique_key",
    "unique_states",
    "callback_id",
    "callback_timeout_at",
    "run_lease",
    "progress",
)


_N_FIELDS = len(JOB_FIELDS)


# The timestamp columns (the ``*_at`` fields), read as RFC 3339 strings.
_TIMESTAMPS = tuple(f for f in JOB_FIELDS if f.endswith("_at"))


def _timestamp_property(name: str) -> property:
    slot = "_" + name

    def get(self) -> str | None:
        value = getattr(self, slot)
        return None if value is None else value.isoformat()

    return property(get, doc=f"``{name}`` as an RFC 3339 string, or ``None``.")


class Job:
    """A job row. Timestamps are RFC 3339 strings (awa-pg's shape; converted when read, the
    aware datetime is kept in ``_<name>``); ``args`` is the JSON dict (a handler's job carries
    the typed args instead); ``state`` is a :class:`JobState`."""

    __slots__ = tuple(("_" + f) if f in _TIMESTAMPS else f for f in JOB_FIELDS)

    id: int
    kind: str
    queue: str
    args: Any  # the JSON dict (a handler's job: the typed args)
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    _run_at: datetime | None
    _heartbeat_at: datetime | None
    _deadline_at: datetime | None
    _attempted_at: datetime | None
    _finalized_at: datetime | None
    _created_at: datetime | None
    errors: list[Any]
    metadata: dict[str, Any]
    tags: list[str]
    unique_key: bytes | None
    unique_states: int | None
    callback_id: str | None
    _callback_timeout_at: datetime | None
    run_lease: int
    progress: Any  # the handler's last JSON progress, or None
    # the timestamps as RFC 3339 strings: read-only properties set below (_TIMESTAMPS)
    run_at: str | None
    heartbeat_at: str | None
    deadline_at: str | None
    attempted_at: str | None
    finalized_at: str | None
    created_at: str | None
    callback_timeout_at: str | None

    @classmethod
    def from_row(cls, row: tuple) -> Job:
        """Build from a row selected with ``awa_fast.sql.JOB_COLUMNS`` (extra trailing columns
        are ignored)."""
        job = cls.__new__(cls)
        (
            job.id,
            job.kind,
            job.queue,
            job.args,
            state,
            job.priority,
            job.attempt,
            job.max_attempts,
            job._run_at,
            job._heartbeat_at,
            job._deadline_at,
            job._attempted_at,
            job._finalized_at,
            job._created_at,
            job.errors,
            job.metadata,
            job.tags,
            job.unique_key,
            job.unique_states,
            callback_id,
            job._callback_timeout_at,
            job.run_lease,
            job.progress,
        ) = row[:_N_FIELDS]
        job.state = JobState(state)
        job.callback_id = None if callback_id is None else str(callback_id)
        return job

    @property
    def deadline(self) -> str | None:
        """The attempt's hard deadline (RFC 3339), or ``None``."""
        return self.deadline_at

    def to_dict(self) -> dict:
        """All fields as a JSON-compatible dict (``unique_key`` as hex)."""
        out = {name: getattr(self, name) for name in JOB_FIELDS}
        out["state"] = str(self.state)
        if self.unique_key is not None:
            out["unique_key"] = bytes(self.unique_key).hex()
        return out

    def __repr__(self) -> str:
        return f"<Job id={self.id} kind={self.kind!r} queue={self.queue!r} state={self.state}>"


for _name in _TIMESTAMPS:
    setattr(Job, _name, _timestamp_property(_name))
