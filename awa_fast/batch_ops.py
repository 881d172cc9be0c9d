"""awa's durable batch operations (ADR-030): ``set_priority`` and ``move_queue`` over queued
jobs (``available`` / ``scheduled``), selected by awa's structured filter (``kind``,
``queue``, ``ids``, ``tag``, ``state``, ``created_at_gte``, ``created_at_lt``; intersected).

``preview`` counts the eligible rows and shows a sample (by id) without submitting. ``submit``
stores an operation (``pending``); the maintenance leader's runner (:func:`run_once`, a leader
task) then scans it (freezing the eligible job ids as items and ``total_matched``: state
``running``) and applies it in chunks, each chunk one transaction that changes the jobs still
eligible and accounts every item exactly once as processed, skipped (no longer eligible:
claimed, cancelled, moved) or errored (say a unique key taken in the destination queue;
``last_error`` names the job). Cancellation is cooperative, as awa's: a cancel makes a ``pending`` or active
operation ``cancelling`` and the runner finalizes it ``cancelled`` at its next step, before
another chunk (changed rows stay changed). Finalized operations are kept ``BATCH_RETENTION_DAYS`` (awa's 90)
and then deleted by the leader; :func:`purge` deletes them earlier.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal, TypedDict

import orjson

from awa_fast import bulk
from awa_fast.errors import ValidationError
from awa_fast.job import JobState
from awa_fast.repo.batch_ops import BatchRepo
from awa_fast.repo.jobs import JobRepo
from awa_fast.requests import check_name

KINDS = ("set_priority", "move_queue")
STATES = ("pending", "scanning", "running", "cancelling", "completed", "cancelled", "failed")

# awa's public types for these dicts (awa exports the same names).
BatchOperationKind = Literal["set_priority", "move_queue"]
BatchOperationState = Literal[
    "pending", "scanning", "running", "cancelling", "completed", "cancelled", "failed"
]


class BatchOperationFilter(TypedDict, total=False):
    kind: str
    queue: str
    ids: list[int]
    tag: str
    state: str
    created_at_gte: datetime | str
    created_at_lt: datetime | str


class BatchOperationPreview(TypedDict, total=False):
    total_matched: int
    sample: list[dict[str, Any]]


class BatchOperation(TypedDict, total=False):
    id: str
    op_kind: str
    filter: dict[str, Any]
    spec: dict[str, Any]
    state: str
    submitted_by: str | None
    submitted_at: str
    started_at: str | None
    finalized_at: str | None
    cursor: dict[str, Any] | None
    total_matched: int | None
    processed: int
    skipped: int
    errored: int
    last_error: str | None
    runner_instance: str | None
    retention_until: str | None
    updated_at: str


FILTER_FIELDS = ("kind", "queue", "ids", "tag", "state", "created_at_gte", "created_at_lt")
BATCH_RETENTION_DAYS = 90  # awa's default (AWA_BATCH_OP_RETENTION_DAYS)
CHUNK = 500  # rows per runner transaction
SAMPLE = 20  # rows a preview shows


def _retention_s() -> float:
    return BATCH_RETENTION_DAYS * 86400.0


def check_spec(op_kind: Any, spec: Any) -> dict:
    """Validate an operation: ``set_priority`` needs ``{"priority": 1-4}``; ``move_queue``
    needs ``{"queue": str}`` and may add ``"priority"``.

    Raises:
        ValidationError: unknown ``op_kind`` or a bad / unknown spec field (named).
    """
    if op_kind not in KINDS:
        raise ValidationError(
            f"op_kind must be one of {', '.join(KINDS)}, got {op_kind!r}", field="op_kind"
        )
    if not isinstance(spec, dict):
        raise ValidationError("spec must be a dict", field="spec")
    allowed = {"priority"} if op_kind == "set_priority" else {"queue", "priority"}
    unknown = set(spec) - allowed
    if unknown:
        raise ValidationError(
            f"{op_kind} spec has unknown field(s): {', '.join(sorted(unknown))}", field="spec"
        )
    if op_kind == "set_priority" and "priority" not in spec:
        raise ValidationError("set_priority needs spec['priority']", field="priority")
    if "priority" in spec:
        p = spec["priority"]
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 4:
            raise ValidationError(
                f"priority must be an int 1-4, got {p!r}", field="priority", limit="1-4"
            )
    if op_kind == "move_queue":
        check_name(spec.get("queue"), "queue")
    return dict(spec)


def check_filter(filter: Any) -> dict:
    """Validate awa's structured filter (``None`` = every eligible row).

    Raises:
        ValidationError: an unknown field, or a field of the wrong type (named).
    """
    if filter is None:
        return {}
    if not isinstance(filter, dict):
        raise ValidationError("filter must be a dict", field="filter")
    unknown = set(filter) - set(FILTER_FIELDS)
    if unknown:
        raise ValidationError(
            f"unknown filter field(s): {', '.join(sorted(unknown))} "
            f"(awa's are {', '.join(FILTER_FIELDS)})",
            field="filter",
        )
    out = {k: v for k, v in filter.items() if v is not None}
    for key in ("kind", "queue", "tag"):
        if key in out and not isinstance(out[key], str):
            raise ValidationError(f"filter {key} must be a str", field=key)
    if "state" in out:
        try:
            out["state"] = str(JobState(out["state"]))
        except ValueError:
            raise ValidationError(
                f"filter state is not a job state: {out['state']!r}", field="state"
            ) from None
    if "ids" in out:
        ids = out["ids"]
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise ValidationError("filter ids must be a list of int", field="ids")
    for key in ("created_at_gte", "created_at_lt"):
        if key in out:
            value = out[key]
            try:
                parsed = (
                    value
                    if isinstance(value, datetime)
                    else datetime.fromisoformat(str(value).replace("Z", "+00:00"))
                )
            except ValueError:
                raise ValidationError(
                    f"filter {key} is not a timestamp: {value!r}", field=key
                ) from None
            if parsed.tzinfo is None:
                raise ValidationError(f"filter {key} needs a time zone", field=key)
            out[key] = parsed.isoformat()
    return out


def _match_params(f: dict) -> dict:
    return {
        "f_kind": f.get("kind"),
        "f_queue": f.get("queue"),
        "f_ids": f.get("ids"),
        "f_tag": f.get("tag"),
        "f_state": f.get("state"),
        "f_gte": f.get("created_at_gte"),
        "f_lt": f.get("created_at_lt"),
    }


def _operation(row: dict) -> dict:
    """awa's ``BatchOperation`` dict (timestamps as RFC 3339 strings)."""
    out = dict(row)
    for key in ("submitted_at", "started_at", "finalized_at", "retention_until", "updated_at"):
        if out[key] is not None:
            out[key] = out[key].isoformat()
    return out


async def preview(conn: Any, op_kind: Any, spec: Any, filter: Any = None) -> dict:
    """awa's ``BatchOperationPreview``: ``total_matched`` eligible rows and a ``sample`` (the
    first :data:`SAMPLE` by id). Raises as :func:`check_spec` / :func:`check_filter`."""
    check_spec(op_kind, spec)
    f = check_filter(filter)
    rows = await BatchRepo(conn).preview(_match_params(f), SAMPLE)
    sample = [
        {"id": r.id, "kind": r.kind, "queue": r.queue, "state": r.state, "priority": r.priority}
        for r in rows
    ]
    total = next((r.total_matched for r in rows), 0)  # every row carries the count
    return {"total_matched": total, "sample": sample}


async def submit(
    conn: Any,
    op_kind: Any,
    spec: Any,
    filter: Any = None,
    submitted_by: str | None = None,
    allow_all: bool = False,
) -> dict:
    """Store a ``pending`` operation for the leader's runner; returns it.

    Raises:
        ValidationError: as :func:`check_spec` / :func:`check_filter`, or an empty filter
            without ``allow_all=True`` (it would touch every queued job).
    """
    spec = check_spec(op_kind, spec)
    f = check_filter(filter)
    if not f and not allow_all:
        raise ValidationError(
            f"{op_kind} requires a filter or allow_all=True (without a filter it affects "
            "every queued job)",
            field="filter",
        )
    if submitted_by is not None and not isinstance(submitted_by, str):
        raise ValidationError("submitted_by must be a str", field="submitted_by")
    row = await BatchRepo(conn).submit(
        op_kind, orjson.dumps(f).decode(), orjson.dumps(spec).decode(), submitted_by
    )
    if row is None:  # an INSERT ... RETURNING returns its row
        raise LookupError("the submitted batch operation returned no row")
    return _operation(row)


def parse_id(operation_id: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(operation_id))
    except ValueError:
        raise ValidationError(
            f"operation id is not a UUID: {operation_id!r}", field="operation_id"
        ) from None


async def get(conn: Any, operation_id: Any) -> dict | None:
    row = await BatchRepo(conn).get(parse_id(operation_id))
    return None if row is None else _operation(row)


async def list_all(conn: Any, state: str | None = None, limit: int = 100) -> list[dict]:
    if state is not None and state not in STATES:
        raise ValidationError(
            f"state must be one of {', '.join(STATES)}, got {state!r}", field="state"
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ValidationError(
            f"limit must be an int 1-1000, got {limit!r}", field="limit", limit="1-1000"
        )
    return [_operation(r) for r in await BatchRepo(conn).list_all(state, limit)]


async def cancel(conn: Any, operation_id: Any) -> dict | None:
    """Ask the runner to stop an operation (``cancelling``; the runner finalizes it
    ``cancelled`` at its next step, as awa's does); ``None`` when no unfinished operation has
    that id."""
    row = await BatchRepo(conn).cancel(parse_id(operation_id), _retention_s())
    return None if row is None else _operation(row)


async def purge(conn: Any, before: datetime, limit: int = 1000) -> int:
    """Delete up to ``limit`` finalized operations finalized before ``before``."""
    if not isinstance(before, datetime) or before.tzinfo is None:
        raise ValidationError("before must be a timezone-aware datetime", field="before")
    return await BatchRepo(conn).purge(before, limit)


async def run_once(conn: Any, runner: str) -> int:
    """One runner step of the leader, in the caller's (fenced) transaction: scan the oldest
    active operation, or apply one chunk of it, or finalize it. Returns the items accounted.
    (Expired finalized operations go in the leader's prune pass.)"""
    repo = BatchRepo(conn)
    row = await repo.next()
    if row is None:
        return 0
    op, f, spec = row.id, row.filter, row.spec
    if row.state == "cancelling":
        await repo.finalize(op, "cancelled", _retention_s())
        return 0
    if row.state == "pending":
        await repo.scan(op, _match_params(f), runner)
        return 0
    ids = await repo.pending_items(op, CHUNK)
    if not ids:
        await repo.finalize(op, "completed", _retention_s())
        return 0
    change = {"priority": spec.get("priority"), "queue": spec.get("queue")}
    done = await bulk.run_isolated(
        conn,
        what=f"batch operation {op}",
        bulk=lambda: repo.apply(ids, change),
        keys=ids,
        one=lambda job_id: repo.apply_one(job_id, change),
    )
    changed = [r.id for r in done.rows]
    errors = {str(k): f"{type(e).__name__}: {e}".strip()[:500] for k, e in done.failed.items()}
    await repo.items_done(op, ids, changed, list(done.failed), orjson.dumps(errors).decode())
    last_error = None
    if errors:
        job_id, text = next(reversed(errors.items()))
        last_error = f"job {job_id}: {text}"
    await repo.count(
        op,
        processed=len(changed),
        errored=len(errors),
        skipped=len(ids) - len(changed) - len(errors),
        last_error=last_error,
        last_id=ids[-1],
    )
    jobs = JobRepo(conn)
    for queue in {r.queue for r in done.rows if r.state == "available"}:
        await jobs.wake(queue)  # wake the destination's dispatchers
    return len(ids)
