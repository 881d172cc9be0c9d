"""External waits (ADR-021): the client-side callback operations.

A handler registers a callback (``job.register_callback``), hands its id to the outside world,
and either returns ``WaitForCallback(token)`` (the job parks in ``waiting_external``) or awaits
``job.wait_for_callback(token)`` (the handler stays alive). The outside world then calls one of
these, by callback id. CEL expressions (awa's ``filter`` / ``on_complete`` / ``transform``) are
not supported.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import orjson

from awa_fast import enqueue, sql
from awa_fast.errors import CallbackNotFound, ValidationError
from awa_fast.job import Job


class CallbackToken:
    """A registered callback: ``id`` (UUID string) and ``timeout_at`` (RFC 3339)."""

    __slots__ = ("id", "timeout_at")

    def __init__(self, callback_id: str, timeout_at: str | None = None):
        self.id = callback_id
        self.timeout_at = timeout_at

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"CallbackToken({self.id!r})"


def parse_callback_id(callback_id: Any) -> uuid.UUID:
    """Raises :class:`ValidationError` (field ``callback_id``) unless it is a UUID."""
    try:
        return uuid.UUID(str(getattr(callback_id, "id", callback_id)))
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValidationError(f"callback_id is not a UUID: {callback_id!r}",
                              field="callback_id", limit="UUID") from exc


def check_timeout(timeout_seconds: Any) -> float:
    """Raises ValueError for a negative or non-finite timeout (seconds)."""
    value = float(timeout_seconds)
    if not (value >= 0) or value == float("inf"):
        raise ValueError(f"timeout_seconds must be a finite number >= 0, got {timeout_seconds!r}")
    return value


async def _locked(conn, callback_id: uuid.UUID) -> tuple:
    cur = await conn.execute(sql.LOCK_BY_CALLBACK, (callback_id,))
    row = await cur.fetchone()
    if row is None:
        raise CallbackNotFound(f"no job waits on callback {callback_id}")
    return row


@enqueue.maps_errors
async def complete_external(client: Any, callback_id: Any, payload: Any = None) -> Job:
    """Complete the job waiting on ``callback_id`` (``waiting_external``, or still ``running``:
    an early callback). Registered Completed specs fire in the same transaction; staged
    follow-ups of a still-running handler are discarded (its completion is then stale).

    Raises:
        CallbackNotFound: no such callback (or it timed out and was rescued).
        ValidationError: ``callback_id`` is not a UUID.
    """
    cid = parse_callback_id(callback_id)
    pool = await client.pool()
    async with pool.connection() as conn:
        async with conn.transaction():
            row = await _locked(conn, cid)
            job = Job.from_row(row)
            requests = client.specs.requests(job.kind, "completed", job.args, job, job.id,
                                             job.metadata)
            cur = await conn.execute(sql.COMPLETE_EXTERNAL, (job.id,))
            done = Job.from_row(await cur.fetchone())
            if requests:
                await enqueue.insert_follow_ups(conn, requests, job.kind, job.id)
    return done


@enqueue.maps_errors
async def fail_external(client: Any, callback_id: Any, error: str) -> Job:
    """Fail the job waiting on ``callback_id`` through the failure path (its failure
    consequence, then failed / DLQ and exhausted specs; or ``consequence_pending``).

    Raises:
        CallbackNotFound, ValidationError: as :func:`complete_external`.
    """
    cid = parse_callback_id(callback_id)
    pool = await client.pool()
    async with pool.connection() as conn:
        async with conn.transaction():
            row = await _locked(conn, cid)
            entry = {"error": str(error), "attempt": row[6],
                     "at": datetime.now(timezone.utc).isoformat()}
            await client.settler.settle_failure(conn, row, reason="callback_failed",
                                                path="failure", error_entry=entry)
        cur = await conn.execute(sql.GET_JOB, (row[0],))
        found = await cur.fetchone()
    if found is None:  # moved to the DLQ
        return Job.from_row(row)
    return Job.from_row(found)


@enqueue.maps_errors
async def retry_external(client: Any, callback_id: Any) -> Job:
    """Send a parked job back to ``available`` with attempt 0.

    Raises:
        CallbackNotFound: no job parked in ``waiting_external`` on that callback.
    """
    return await _one(client, sql.RETRY_EXTERNAL, parse_callback_id(callback_id), notify=True)


@enqueue.maps_errors
async def resume_external(client: Any, callback_id: Any, payload: Any = None) -> Job:
    """Resume a handler blocked in ``job.wait_for_callback``: the job is ``running`` again and
    the payload becomes ``wait_for_callback``'s return value. The token is consumed.

    Raises:
        CallbackNotFound: no job parked on that callback.
    """
    cid = parse_callback_id(callback_id)
    data = orjson.dumps({"_awa_callback_result": payload}).decode()
    pool = await client.pool()
    async with pool.connection() as conn:
        cur = await conn.execute(sql.RESUME_EXTERNAL, (data, cid))
        row = await cur.fetchone()
    if row is None:
        raise CallbackNotFound(f"no job waits on callback {cid}")
    return Job.from_row(row)


@enqueue.maps_errors
async def heartbeat_callback(client: Any, callback_id: Any, timeout_seconds: float = 3600.0) -> Job:
    """Push the callback's timeout to now + ``timeout_seconds`` seconds."""
    cid = parse_callback_id(callback_id)
    timeout = check_timeout(timeout_seconds)
    pool = await client.pool()
    async with pool.connection() as conn:
        cur = await conn.execute(sql.HEARTBEAT_CALLBACK, (timeout, cid))
        row = await cur.fetchone()
    if row is None:
        raise CallbackNotFound(f"no job waits on callback {cid}")
    return Job.from_row(row)


async def _one(client: Any, query: str, cid: uuid.UUID, notify: bool = False) -> Job:
    pool = await client.pool()
    async with pool.connection() as conn:
        cur = await conn.execute(query, (cid,))
        row = await cur.fetchone()
        if row is None:
            raise CallbackNotFound(f"no job waits on callback {cid}")
        if notify:
            await conn.execute(sql.NOTIFY_QUEUE, (row[2],))
    return Job.from_row(row)
