"""Periodic (cron) jobs: registration, storage in ``awa_fast.cron_jobs`` and leader evaluation.

Lifecycle:

1. ``AsyncClient.periodic(...)`` validates a schedule in memory (cron expression with croniter,
   timezone with :mod:`zoneinfo`, the missed-fire policy, and the args and insert options with
   :func:`awa_fast.requests.prepare`), so mistakes raise ``ValidationError`` (a ``ValueError``,
   as awa-pg) at registration.
2. ``AsyncClient.start()`` upserts the registered schedules (:func:`sync_schedules`). A schedule
   new to the database is never fired (``last_fire_at`` NULL) and, as in awa (``awa-worker``
   ``compute_fire_times``), its first evaluation enqueues the latest fire time in
   ``[created_at - 1 minute, now]``: a fire time of the minute it was registered in fires at once,
   an older one does not (no backfill before the schedule was known), and a schedule first
   evaluated late (no leader yet) gets one job for the latest fire time, whatever its policy. A
   re-registration with the same cron expression and timezone keeps ``last_fire_at`` (missed fires
   are then handled by the policy); a changed expression or timezone restarts from now (awa keeps
   the old position; a new expression catching up the old one's history is not wanted).
3. The maintenance leader (one per database) runs :func:`evaluate` every ``cron_interval_ms``
   (default 1000). Every schedule in the table is evaluated, whichever process registered it.
   A stored schedule that cannot be evaluated or fired (written by hand or by an older
   version) is skipped and warned about once, not every pass (see :func:`evaluate`).

Exactly once: a due schedule is fired in one transaction that locks its row
(``SELECT ... FOR UPDATE``), re-reads ``last_fire_at``, computes the due fire times after it,
inserts the job(s) and advances ``last_fire_at`` to the last fire time enqueued. A concurrent
evaluator (a second leader during a failover, a manual call) waits on the lock and then sees the
advanced ``last_fire_at``, so it finds nothing due. A crash before commit enqueues nothing and the
next evaluation retries the same fire times.

Missed fires of a schedule that has fired (all fire times in ``(last_fire_at, now]``, e.g.
after downtime; awa's ADR-007):

- ``"coalesce"`` (default): one job, for the latest due fire time.
- ``"catch_up"``: one job per due fire time, oldest first, at most :data:`CATCH_UP_BATCH` per
  evaluation (the rest follow on the next evaluations).

Each job's metadata carries ``awa:cron_name`` and ``awa:cron_fire_at`` (ISO 8601, UTC).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
import psycopg
from croniter import CroniterBadDateError, croniter

from awa_fast import bulk, enqueue
from awa_fast.errors import AwaError, ValidationError
from awa_fast.job import Job
from awa_fast.repo.cron import CronRepo
from awa_fast.requests import check_name, kind_for_type, prepare

log = logging.getLogger("awa_fast.periodic")

POLICIES = ("coalesce", "catch_up")
CATCH_UP_BATCH = 1000
# awa: a new schedule's first evaluation looks back this far before its created_at (seconds).
FIRST_FIRE_LOOKBACK_S = 60
DEFAULT_INTERVAL_MS = 1000
META_NAME = "awa:cron_name"
META_FIRE_AT = "awa:cron_fire_at"


@dataclasses.dataclass(frozen=True)
class PeriodicJob:
    """One validated schedule; ``args`` and ``metadata`` are JSON text."""

    name: str
    cron_expr: str
    timezone: str
    kind: str
    queue: str
    args: str
    priority: int
    max_attempts: int
    tags: list[str]
    metadata: str
    missed_fire_policy: str

    def params(self, initial: datetime) -> dict:
        return {**dataclasses.asdict(self), "initial": initial}


def check_cron(cron_expr: Any) -> str:
    """Validate a cron expression: five fields (minute hour day-of-month month day-of-week) or an
    ``@`` alias (``@hourly``, ``@daily``, ...). Returns it stripped.

    Raises:
        ValidationError: not a valid expression (the message quotes it).
    """
    if not isinstance(cron_expr, str):
        raise ValidationError(
            f"cron expression must be a str, got {type(cron_expr).__name__}", field="cron_expr"
        )
    expr = cron_expr.strip()
    if not expr.startswith("@") and len(expr.split()) != 5:
        raise ValidationError(
            f"invalid cron expression {cron_expr!r}: expected 5 fields "
            "(minute hour day-of-month month day-of-week) or an @alias",
            field="cron_expr",
        )
    try:
        croniter(expr)
    except (ValueError, KeyError, TypeError) as exc:  # CroniterError is a ValueError
        raise ValidationError(
            f"invalid cron expression {cron_expr!r}: {exc}", field="cron_expr"
        ) from exc
    if expr.lower() == "@reboot":
        raise ValidationError(
            f"invalid cron expression {cron_expr!r}: @reboot has no fire times", field="cron_expr"
        )
    try:  # "0 0 31 2 *" parses but never fires: start() would fail on it
        croniter(expr, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterBadDateError as exc:
        raise ValidationError(
            f"invalid cron expression {cron_expr!r}: it has no fire time (no month "
            "has that day-of-month)",
            field="cron_expr",
            limit="a day-of-month the month has",
        ) from exc
    return expr


def check_timezone(name: Any) -> ZoneInfo:
    """The :class:`~zoneinfo.ZoneInfo` named ``name`` (IANA name such as ``"Europe/Paris"``).

    Raises:
        ValidationError: unknown or malformed timezone name.
    """
    if not isinstance(name, str) or not name:
        raise ValidationError(
            f"timezone must be a non-empty IANA name, got {name!r}", field="timezone"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValidationError(f"unknown timezone {name!r}", field="timezone") from exc


def build(
    name: str,
    cron_expr: str,
    args_type: type,
    args: Any,
    *,
    timezone: str = "UTC",
    queue: str = "default",
    priority: int = 2,
    max_attempts: int = 25,
    tags: list[str] | None = None,
    metadata: dict | None = None,
    missed_fire_policy: str = "coalesce",
) -> PeriodicJob:
    """Validate one schedule (see ``AsyncClient.periodic``).

    Raises:
        ValidationError (a ValueError): bad name, cron expression, timezone, policy, args or
            insert option.
    """
    check_name(name, "name")  # the one name rule (stored text, shown as awa:cron_name)
    if not name.strip():
        raise ValidationError(
            f"periodic job name must not be blank, got {name!r}", field="name", limit="not blank"
        )
    expr = check_cron(cron_expr)
    check_timezone(timezone)
    if missed_fire_policy not in POLICIES:
        raise ValidationError(
            f"missed_fire_policy must be 'coalesce' or 'catch_up', got {missed_fire_policy!r}",
            field="missed_fire_policy",
        )
    if not isinstance(args_type, type):
        raise ValidationError(f"args_type must be a type, got {args_type!r}", field="args_type")
    if not isinstance(args, (dict, args_type)):
        raise ValidationError(
            f"args must be a {args_type.__name__} instance or a dict, got {type(args).__name__}",
            field="args",
        )
    p = prepare(
        args,
        kind=kind_for_type(args_type),
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        tags=tags,
        metadata=metadata,
    )
    return PeriodicJob(
        name,
        expr,
        timezone,
        p.kind,
        p.queue,
        p.args,
        p.priority,
        p.max_attempts,
        list(p.tags),
        p.metadata,
        missed_fire_policy,
    )


# -- fire times ---------------------------------------------------------------------------------


def latest_fire(cron_expr: str, tz: str, at: datetime) -> datetime:
    """The latest fire time ``<= at`` (UTC)."""
    local = at.astimezone(ZoneInfo(tz))
    prev = croniter(cron_expr, local).get_prev(datetime)  # strictly before ``at``
    nxt = croniter(cron_expr, prev).get_next(datetime)
    if nxt <= local:  # ``at`` is itself a fire time
        prev = nxt
    return prev.astimezone(UTC)


def next_fire(cron_expr: str, tz: str, after: datetime) -> datetime:
    """The first fire time strictly after ``after`` (UTC)."""
    local = after.astimezone(ZoneInfo(tz))
    return croniter(cron_expr, local).get_next(datetime).astimezone(UTC)


def first_window(created_at: datetime) -> datetime:
    """The start of a never-fired schedule's first window (awa: ``created_at`` - 1 minute)."""
    return created_at - timedelta(seconds=FIRST_FIRE_LOOKBACK_S)


def due_fires(
    cron_expr: str,
    tz: str,
    policy: str,
    last: datetime | None,
    now: datetime,
    created_at: datetime | None = None,
    limit: int = CATCH_UP_BATCH,
) -> list[datetime]:
    """The fire times to enqueue now: those in ``(last, now]`` after the policy (coalesce: the
    latest one; catch_up: the oldest ``limit``). ``last=None`` means "never fired": the latest
    fire time in ``[created_at - 1 minute, now]``, if any, whatever the policy (awa's rule;
    without ``created_at``, the latest fire time <= now)."""
    latest = latest_fire(cron_expr, tz, now)
    if last is not None and latest <= last:
        return []
    if last is None:
        if created_at is not None and latest < first_window(created_at):
            return []
        return [latest]
    if policy != "catch_up":
        return [latest]
    out: list[datetime] = []
    it = croniter(cron_expr, last.astimezone(ZoneInfo(tz)))
    while len(out) < limit:
        t = it.get_next(datetime).astimezone(UTC)
        if t > now:
            break
        out.append(t)
    return out


# -- database -----------------------------------------------------------------------------------


async def sync_schedules(conn: psycopg.AsyncConnection, jobs: list[PeriodicJob]) -> None:
    """Upsert the registered schedules (in one transaction)."""
    if not jobs:
        return
    with enqueue.mapped_errors():  # a missing table -> SchemaNotMigrated
        async with conn.transaction():
            repo = CronRepo(conn)
            now = await repo.now()
            for job in jobs:
                initial = latest_fire(job.cron_expr, job.timezone, now)
                await repo.upsert(job.params(initial))


async def fire_one(conn: psycopg.AsyncConnection, name: str) -> list[Job]:
    """Fire schedule ``name`` if due, exactly once: lock, re-check, insert, advance, commit.

    Returns the jobs inserted (empty when nothing was due or the schedule is gone).
    """
    async with conn.transaction():
        repo = CronRepo(conn)
        s = await repo.lock(name)
        if s is None:
            return []
        fires = due_fires(
            s.cron_expr, s.timezone, s.missed_fire_policy, s.last_fire_at, s.now, s.created_at
        )
        if not fires:
            return []
        args = _json(s.args)
        base_meta = _json(s.metadata)
        rows = [
            prepare(
                args,
                kind=s.kind,
                queue=s.queue,
                priority=s.priority,
                max_attempts=s.max_attempts,
                tags=list(s.tags or ()),
                metadata={**base_meta, META_NAME: s.name, META_FIRE_AT: fire.isoformat()},
            )
            for fire in fires
        ]
        jobs = await enqueue.insert_many(conn, rows)
        latest = fires[-1]
        await repo.advance(s.name, latest)
    log.debug("cron %s fired %d job(s), last fire %s", name, len(jobs), latest)
    return jobs


async def evaluate(conn: psycopg.AsyncConnection, problems: bulk.Recurring | None = None) -> int:
    """One evaluation pass over every schedule in the table; returns the jobs enqueued.

    A schedule whose stored expression or timezone no longer parses, or whose fire fails (say
    its insert is refused), is logged and skipped; the other schedules still fire.

    Such a schedule fails the same way every pass (every second on the leader): with
    ``problems`` (the leader keeps one across its passes) it is warned about once, and again
    only when its definition (any stored column but the fire times) or the error changes, or
    when it fails anew after a pass in which it did not fail (:class:`bulk.Recurring`);
    the repeats are logged at DEBUG. Without ``problems`` every failure is warned about. A
    database error that is not about the schedule's row (a lost connection, a lock wait)
    ends the pass and is raised, as before.
    """
    total = 0
    for c in await CronRepo(conn).scan():
        name, definition = c.name, c.definition
        try:
            # first fire time after the last one, or (never fired) at/after the first window
            after = c.last_fire_at
            if after is None:
                after = first_window(c.created_at) - timedelta(microseconds=1)
            if next_fire(c.cron_expr, c.timezone, after) > c.now:
                continue
            total += len(await fire_one(conn, name))
        except (ValueError, KeyError, ZoneInfoNotFoundError, AwaError) as exc:
            signature = (definition, *bulk.error_signature(exc))
            msg = "cron job %r cannot be evaluated: %s"
            bulk.warn_row(problems, log, name, signature, msg, name, exc)
        except psycopg.DatabaseError as exc:  # this schedule's fire failed (rolled back) ...
            if not bulk.is_row_error(exc):
                raise
            # ... and it must not keep the schedules after it from firing.
            signature = (definition, *bulk.error_signature(exc))
            msg = "cron job %r not fired this pass: %s"
            bulk.warn_row(problems, log, name, signature, msg, name, exc)
    if problems is not None:
        problems.pass_done()
    return total


async def list_schedules(conn: psycopg.AsyncConnection) -> list[dict]:
    """Every stored schedule as a dict (timestamps as ISO 8601 strings; ``next_fire_at``
    computed; ``last_enqueued_at`` is awa's name for ``last_fire_at``)."""
    out = []
    for d in await CronRepo(conn).list_all():
        d["args"], d["metadata"], d["tags"] = (
            _json(d["args"]),
            _json(d["metadata"]),
            list(d["tags"]),
        )
        try:
            base = d["last_fire_at"] or datetime.now(UTC)
            d["next_fire_at"] = next_fire(d["cron_expr"], d["timezone"], base).isoformat()
        except (ValueError, KeyError, ZoneInfoNotFoundError):
            d["next_fire_at"] = None
        for key in ("last_fire_at", "created_at", "updated_at"):
            d[key] = None if d[key] is None else d[key].isoformat()
        d["last_enqueued_at"] = d["last_fire_at"]
        out.append(d)
    return out


async def delete_schedule(conn: psycopg.AsyncConnection, name: str) -> bool:
    return await CronRepo(conn).delete(name)


def _json(value: Any) -> Any:
    if isinstance(value, (str, bytes)):
        return orjson.loads(value)
    return value


def warn_off_queue(
    jobs: dict[str, PeriodicJob], implicit: set[str], off_default: dict[str, str], stacklevel: int
) -> None:
    """``QueueMismatchWarning`` for each schedule of ``jobs`` registered without ``queue=``
    (named in ``implicit``) whose kind the client registered for another queue
    (``off_default``: kind -> queue): its fires go to ``default`` (awa-pg's
    ``periodic(queue="default")``), where that kind's workers do not look."""
    from awa_fast.errors import QueueMismatchWarning

    for name in sorted(implicit):
        job = jobs.get(name)
        queue = off_default.get(job.kind) if job is not None else None
        if job is not None and queue is not None:
            warnings.warn(
                QueueMismatchWarning(
                    f"periodic job {name!r} of kind {job.kind!r} was registered without "
                    f"queue=, so it fires into 'default' (awa-pg semantics), but the kind "
                    f"is registered for queue {queue!r} on this client; pass "
                    f"queue={queue!r} to periodic() or work 'default' too"
                ),
                stacklevel=stacklevel,
            )
