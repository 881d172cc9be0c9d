"""Job rows as Python values: :class:`JobState` and :class:`Job` (awa-pg's read-only job shape)."""

from __future__ import annotations

import enum
from datetime import datetime


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
    "id", "kind", "queue", "args", "state", "priority", "attempt", "max_attempts", "run_at",
    "heartbeat_at", "deadline_at", "attempted_at", "finalized_at", "created_at", "errors",
    "metadata", "tags", "unique_key", "unique_states", "callback_id", "callback_timeout_at",
    "run_lease", "progress",
)


_N_FIELDS = len(JOB_FIELDS)


def _ts(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


class Job:
    """A job row. Timestamps are RFC 3339 strings (awa-pg's shape); ``args`` is the JSON dict
    (a handler's job carries the typed args instead); ``state`` is a :class:`JobState`."""

    __slots__ = JOB_FIELDS

    @classmethod
    def from_row(cls, row: tuple) -> "Job":
        """Build from a row selected with ``awa_fast.sql.JOB_COLUMNS`` (extra trailing columns
        are ignored)."""
        job = cls.__new__(cls)
        (job.id, job.kind, job.queue, job.args, state, job.priority, job.attempt,
         job.max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at,
         created_at, job.errors, job.metadata, job.tags, job.unique_key, job.unique_states,
         callback_id, callback_timeout_at, job.run_lease, job.progress) = row[:_N_FIELDS]
        job.state = JobState(state)
        job.run_at = _ts(run_at)
        job.heartbeat_at = _ts(heartbeat_at)
        job.deadline_at = _ts(deadline_at)
        job.attempted_at = _ts(attempted_at)
        job.finalized_at = _ts(finalized_at)
        job.created_at = _ts(created_at)
        job.callback_id = None if callback_id is None else str(callback_id)
        job.callback_timeout_at = _ts(callback_timeout_at)
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
