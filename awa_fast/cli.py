"""The ``awa-fast`` command line (also ``python -m awa_fast``), modelled on awa-pg's ``python -m awa``.

Every invocation runs at most one event loop (uvloop when available) and one
:class:`~awa_fast.client.AsyncClient`, closed before exit.

Exit status: 0 on success, 1 on an error (an ``AwaError``, a database or connection error, a job
that does not exist or is in the wrong state; for ``serve`` also a database that accepted no
connection within 30 s of its startup), 2 on a command-line usage error (argparse), 3 when
``serve``'s web server cannot start (the port taken), 130 on Ctrl-C (``worker`` and ``serve``
stop gracefully on Ctrl-C or SIGTERM and exit 0; 143 / 129 when SIGTERM / SIGHUP interrupts
``demo``; 142 when a stop of ``serve`` outlasts ``STOP_LIMIT_S``). With
``--json`` an error is one JSON object on one line of stderr, ``{"error": <message>, "type":
<error class>}``, with the same exit status. Without it an error is one line (``awa-fast: error:
<message>``); ``--traceback`` or ``AWA_FAST_DEBUG=1`` adds its whole traceback (for ``worker`` and
``check`` also of an application's own error at import).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, date, datetime
from datetime import time as dtime
from typing import TYPE_CHECKING, Any, NoReturn

from awa_fast import sql
from awa_fast.app_loader import DEBUG_ENV, debug_requested, one_line
from awa_fast.database_url import resolve_database_url, url_source
from awa_fast.requests import check_name

if TYPE_CHECKING:
    from awa_fast.client import AsyncClient

PROG = "awa-fast"
JOB_STATES = (
    "scheduled",
    "available",
    "running",
    "completed",
    "retryable",
    "failed",
    "cancelled",
    "waiting_external",
    "consequence_pending",
)
CONNECT_TIMEOUT_S = 10
INTERRUPT_GRACE_S = 5.0  # after Ctrl-C: how long closing the connections may take


class CliError(Exception):
    """An error reported as ``awa-fast: error: <message>`` with exit status 1."""


class UsageError(Exception):
    """A command-line usage error (exit status 2): what :func:`build_parser`'s parsers raise
    instead of printing and exiting, so that :func:`main` reports it in the requested format."""

    def __init__(self, message: str, parser: argparse.ArgumentParser):
        super().__init__(message)
        self.message = message
        self.parser = parser


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self)


# ---------------------------------------------------------------------------------------------
# output helpers


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Render ``rows`` as an aligned text table under ``headers`` (two spaces between columns).

    Columns whose values are all numbers (not booleans) are right-aligned; ``None`` shows as
    ``-``. Returns the table without a trailing newline.
    """
    cells = [[_cell(v) for v in row] for row in rows]
    ncol = len(headers)
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    numeric = [
        bool(rows)
        and all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in rows)
        for i in range(ncol)
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


def _short_time(value: str | None) -> str | None:
    """An RFC 3339 timestamp as ``YYYY-MM-DD HH:MM:SSZ`` (UTC), for tables."""
    if value is None:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return value
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC)
    return dt.strftime("%Y-%m-%d %H:%M:%SZ")


def _json_value(value: Any) -> Any:
    # Times as ISO 8601 (what Job.to_dict and the dashboard's JSON give), anything else as text.
    if isinstance(value, (datetime, date, dtime)):
        return value.isoformat()
    return str(value)


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False, default=_json_value))


def _print_error(
    message: str,
    *,
    json_output: bool,
    kind: str = "CliError",
    text: str | None = None,
    log_format: str = "text",
    **fields: Any,
) -> None:
    """Report an error on stderr: with ``json_output`` one JSON object on one line,
    ``{"error": message, "type": kind, **fields}``; else as a log object with ``log_format``
    ``"json"``; else ``text`` (default: ``awa-fast: error: <message>``)."""
    if json_output:
        obj = {"error": message, "type": kind, **fields}
        print(json.dumps(obj, ensure_ascii=False, default=str), file=sys.stderr)
    elif log_format == "json":  # errors are log objects too
        import logging

        logging.getLogger("awa_fast.cli").error(message)
    else:
        print(f"{PROG}: error: {message}" if text is None else text, file=sys.stderr)


def _report(s: Session, data: Any, text: str) -> int:
    """Print ``data`` as JSON with ``--json``, else ``text``; exit status 0."""
    if s.json:
        _print_json(data)
    else:
        print(text)
    return 0


# ---------------------------------------------------------------------------------------------
# database URL and client


# Connect failures in which the server answered but still takes no connection (libpq's text;
# the connect error has no SQLSTATE): a database coming up or going down, or full.
_NOT_YET = ("starting up", "shutting down", "in recovery", "too many clients")
# How long a probe that waits for the database pauses between its connects.
PROBE_RETRY_S = 0.5


def _refused_for_good(exc: Exception) -> bool:
    """Whether a connect failure came from a server that refuses this login for good (an
    unknown role or database, a wrong password, pg_hba): waiting does not help."""
    text = str(exc)
    return "FATAL:" in text and not any(reason in text for reason in _NOT_YET)


async def _probe(url: str, *, need_schema: bool, source: str = "", wait_s: float = 0.0) -> None:
    """Connect once (failing fast with the server's message instead of a pool timeout) and, if
    ``need_schema``, check that the ``awa_fast`` schema is there and current. With ``wait_s``,
    a database that cannot be reached (refused, unreachable, starting up) is tried again for up
    to that many seconds; a server that refuses the login fails at once."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from awa_fast import schema
    from awa_fast.pg_connection import connection_class
    from awa_fast.schema_binding import resolve

    bound = connection_class(resolve())  # --schema's (or $AWA_FAST_SCHEMA's)
    kwargs: dict[str, Any] = {"autocommit": True}
    try:
        if "connect_timeout" not in conninfo_to_dict(url):
            kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
    except psycopg.ProgrammingError as exc:
        raise CliError(f"invalid database URL: {one_line(str(exc))}") from exc
    deadline = time.monotonic() + wait_s
    while True:
        try:
            conn = await bound.connect(url, **kwargs)
            break
        except psycopg.OperationalError as exc:
            if time.monotonic() + PROBE_RETRY_S < deadline and not _refused_for_good(exc):
                await asyncio.sleep(PROBE_RETRY_S)  # no event says the database is back
                continue
            where = f" (the URL {source})" if source else ""
            # only when it did wait: a refusal for good (no such database, bad password) fails
            # at the first try
            tried = wait_s - max(0.0, deadline - time.monotonic())
            waited = f" (tried for {tried:.0f} s)" if wait_s and tried >= 1 else ""
            raise CliError(
                f"could not connect to the database{where}{waited}: {one_line(str(exc))}"
            ) from exc
    async with conn:
        if need_schema:  # missing, or older than this package (its reads would fail raw)
            await schema.check_current(conn)


async def _fetch(client, query: str, params: Any = None) -> list[tuple]:
    """The rows of one ``sql`` statement run on a connection of ``client``'s pool."""
    async with (await client.pool()).connection() as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()


class Session:
    """What a command handler gets: the parsed arguments and a lazily opened client."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.json: bool = bool(getattr(args, "json", False))
        # --traceback or $AWA_FAST_DEBUG: an error's whole traceback after its one line
        self.debug: bool = debug_requested(bool(getattr(args, "traceback", False)))
        self._url: str | None = None
        self._client: AsyncClient | None = None

    @property
    def database_url(self) -> str:
        if self._url is None:
            self._url = resolve_database_url(getattr(self.args, "database_url", None))
        return self._url

    @property
    def url_source(self) -> str:
        """Where :attr:`database_url` came from, for error messages."""
        return url_source(getattr(self.args, "database_url", None))

    async def client(self, *, need_schema: bool = True) -> AsyncClient:
        if self._client is None:
            from awa_fast.client import AsyncClient

            url = self.database_url
            await _probe(url, need_schema=need_schema, source=self.url_source)
            self._client = AsyncClient(url, max_connections=2)
        return self._client

    def fail(self, message: str, *, status: int = 1, **kw: Any) -> int:
        """Print an error (``--json``: as JSON, see :func:`_print_error` for ``kw``) and return
        ``status``, the exit status."""
        _print_error(message, json_output=self.json, **kw)
        return status

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()


# ---------------------------------------------------------------------------------------------
# commands


async def cmd_migrate(s: Session) -> int:
    from awa_fast import schema

    a = s.args
    # Each mode picks its own range: two of them together would leave one silently unused.
    ranged = [f for f, v in (("--from", a.from_version), ("--to", a.to)) if v is not None]
    if a.pending and (a.sql or a.version is not None or ranged):
        others = (["--sql"] if a.sql else []) + (["--version"] if a.version is not None else [])
        raise UsageError(
            f"--pending cannot be combined with {', '.join(others + ranged)}", a.migrate_parser
        )
    if a.version is not None and ranged:
        raise UsageError(f"--version cannot be combined with {', '.join(ranged)}", a.migrate_parser)
    if a.pending:
        # awa's --pending: the SQL of the migrations this database has not applied yet.
        client = await s.client(need_schema=False)
        done = 0
        if (await _fetch(client, sql.SCHEMA_PRESENT))[0][0]:
            done = (await _fetch(client, sql.SCHEMA_VERSION))[0][0] or 0
        return _print_migrations(s, done, schema.current_migration_version())
    if a.sql or a.version is not None or a.from_version is not None or a.to is not None:
        # SQL-printing modes (awa-pg's): no database needed.
        latest = schema.current_migration_version()
        if a.version is not None:
            if not 1 <= a.version <= latest:
                message = f"Version {a.version} is out of range. Valid versions: 1..{latest}"
                return s.fail(message, text=message)  # awa-pg's text, without our prefix
            return _print_migrations(s, a.version - 1, a.version)
        after = 0 if a.from_version is None else a.from_version
        upto = latest if a.to is None else a.to
        for flag, value in (("--from", a.from_version), ("--to", a.to)):
            if value is not None and not 0 <= value <= latest:
                raise UsageError(
                    f"{flag} {value} is out of range: valid versions are 0..{latest}",
                    a.migrate_parser,
                )
        if after > upto:
            raise UsageError(
                f"--from {after} is after --to {upto}: the range is --from < version <= --to",
                a.migrate_parser,
            )
        return _print_migrations(s, after, upto)
    client = await s.client(need_schema=False)
    applied = await client.migrate()
    rows = await _fetch(client, sql.SCHEMA_VERSION)
    version = rows[0][0] if rows else None
    names = {v: d for v, d, _ in schema.migrations()}
    if s.json:
        _print_json({"applied": applied, "version": version})
    elif applied:
        for v in applied:
            print(f"applied migration {v:03d}: {names.get(v, '')}".rstrip())
        print(f"schema up to date (version {version})")
    else:
        print(f"schema up to date (version {version})")
    return 0


JOB_COLUMNS = (
    "ID",
    "KIND",
    "QUEUE",
    "STATE",
    "PRIORITY",
    "ATTEMPT",
    "PROGRESS",
    "RUN_AT",
    "CREATED_AT",
)


def _progress(progress: dict | None, width: int = 30) -> str | None:
    """``set_progress``'s percent and message, e.g. ``40% parsing``; None without progress."""
    if not progress or progress.get("percent") is None:
        return None
    text = f"{progress['percent']}%"
    message = " ".join(str(progress.get("message") or "").split())
    if message:
        text += " " + (message if len(message) <= width else message[: width - 3] + "...")
    return text


def _job_row(job) -> list:
    return [
        job.id,
        job.kind,
        job.queue,
        str(job.state),
        job.priority,
        f"{job.attempt}/{job.max_attempts}",
        _progress(job.progress),
        _short_time(job.run_at),
        _short_time(job.created_at),
    ]


async def cmd_job_list(s: Session) -> int:
    client = await s.client()
    a = s.args
    jobs = await client.list_jobs(state=a.state, kind=a.kind, queue=a.queue, limit=a.limit)
    if s.json:
        _print_json([j.to_dict() for j in jobs])
    elif jobs:
        print(format_table(JOB_COLUMNS, [_job_row(j) for j in jobs]))
    else:
        print("no jobs")
    return 0


async def cmd_job_dump(s: Session) -> int:
    client = await s.client()
    job = await client.get_job(s.args.id)
    _print_json(job.to_dict())
    return 0


async def _state_of(client, job_id: int) -> str:
    return str((await client.get_job(job_id)).state)  # raises JobNotFound


async def cmd_job_retry(s: Session) -> int:
    client = await s.client()
    job = await client.retry(s.args.id)
    if job is None:
        state = await _state_of(client, s.args.id)
        raise CliError(
            f"job {s.args.id} is {state}; only failed, cancelled or waiting_external "
            "jobs can be retried"
        )
    return _report(s, job.to_dict(), f"job {job.id} retried (now {job.state}, queue {job.queue})")


async def cmd_job_cancel(s: Session) -> int:
    client = await s.client()
    job = await client.cancel(s.args.id)
    if job is None:
        state = await _state_of(client, s.args.id)
        raise CliError(
            f"job {s.args.id} is already {state}; only non-terminal jobs can be cancelled"
        )
    return _report(s, job.to_dict(), f"job {job.id} cancelled")


STAT_COLUMNS = (
    ("QUEUE", "queue"),
    ("QUEUED", "total_queued"),
    ("SCHEDULED", "scheduled"),
    ("AVAILABLE", "available"),
    ("RETRYABLE", "retryable"),
    ("RUNNING", "running"),
    ("FAILED", "failed"),
    ("WAITING_EXT", "waiting_external"),
    ("CONSEQ_PENDING", "consequence_pending"),
    ("OWED", "consequences_owed"),
    ("OVERDUE", "consequences_overdue"),
    ("DONE_1H", "completed_last_hour"),
    ("LAG_S", "lag_seconds"),
    ("UNHANDLED", "unhandled"),
    ("PAUSED", "paused"),
)


async def cmd_queue_stats(s: Session) -> int:
    client = await s.client()
    stats = await client.queue_stats()
    unhandled = await client.unhandled_kinds() if any(st.unhandled for st in stats) else []
    if s.json:
        _print_json([dataclasses.asdict(st) for st in stats])
    elif stats:
        print(
            format_table(
                [h for h, _ in STAT_COLUMNS],
                [[getattr(st, f) for _, f in STAT_COLUMNS] for st in stats],
            )
        )
        if unhandled:
            print(
                "UNHANDLED: available jobs no live worker serves (none works their queue with "
                "a handler for their kind; they wait):"
            )
            for u in unhandled:
                print(f"  queue {u['queue']}: {u['available']} job(s) of kind {u['kind']}")
    else:
        print("no queues")
    return 0


def _unknown_name(what: str, name: str, names: list[str], by: str, suffix: str = "") -> CliError:
    """The error for a ``what`` (``"queue"``, ``"kind"``) named ``name`` that nothing knows
    of (``by`` says what was looked at), with the closest of ``names`` (difflib) or the known
    ones as a hint."""
    import difflib

    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if close:
        hint = f"; did you mean {' or '.join(repr(n) for n in close)}?"
    elif names:
        hint = f"; known {what}s: {', '.join(names[:10])}{', ...' if len(names) > 10 else ''}"
    else:
        hint = f"; no {what} is known yet"
    return CliError(f"no {what} named {name!r} ({by}){hint}{suffix}")


async def _known_queue(client, queue: str, *, create_flag: str | None = None) -> None:
    """Raise :class:`CliError` unless ``queue`` is a queue something knows of
    (``sql.KNOWN_QUEUES``: jobs, its settings row, a worker, a schedule, a descriptor), with the
    closest known names as a hint; ``create_flag`` names the option that allows a new name.
    The library's calls stay permissive, as awa-pg's (docs/adr/026)."""
    queue.encode()  # not UTF-8 (a lone surrogate from argv): the UnicodeEncodeError's message
    check_name(queue, "queue")  # a name no queue can have: the rule, not a "did you mean"
    names = [row[0] for row in await _fetch(client, sql.KNOWN_QUEUES)]
    if queue not in names:
        by = "no job, worker, schedule or setting names it"
        create = f" ({create_flag} uses a new name)" if create_flag else ""
        raise _unknown_name("queue", queue, names, by, create)


async def _known_kind(client, kind: str) -> None:
    """Raise :class:`CliError` unless some job (live, finished or dead-lettered), worker,
    schedule or descriptor has ``kind``, with the closest known kinds as a hint."""
    kind.encode()  # as _known_queue
    check_name(kind, "kind")
    names = [row[0] for row in await _fetch(client, sql.KNOWN_KINDS)]
    if kind not in names and not (await _fetch(client, sql.KIND_FINISHED, (kind,)))[0][0]:
        raise _unknown_name("kind", kind, names, "no job, worker or schedule has it")


async def cmd_queue_pause(s: Session) -> int:
    client = await s.client()
    if not s.args.create:  # a typo would be stored, and listed from then on
        await _known_queue(client, s.args.queue, create_flag="--create")
    await client.pause_queue(s.args.queue, s.args.by)
    if s.json:
        _print_json({"queue": s.args.queue, "paused": True, "paused_by": s.args.by})
    else:
        by = f" by {s.args.by}" if s.args.by else ""
        print(f"queue {s.args.queue} paused{by}")
    return 0


async def cmd_queue_resume(s: Session) -> int:
    client = await s.client()
    await _known_queue(client, s.args.queue)
    await client.resume_queue(s.args.queue)
    return _report(s, {"queue": s.args.queue, "paused": False}, f"queue {s.args.queue} resumed")


# ---------------------------------------------------------------------------------------------
# admin: failed jobs, runs, draining


async def cmd_job_dump_run(s: Session) -> int:
    client = await s.client()
    print(await client.dump_run(s.args.id, s.args.attempt))
    return 0


RETRY_FAILED_SHOWN = 20  # rows listed by `job retry-failed` (the count covers all)


async def cmd_job_retry_failed(s: Session) -> int:
    if bool(s.args.kind) == bool(s.args.queue):
        # awa-pg's message and exit status, before any connection
        message = "Specify exactly one of --kind or --queue"
        return s.fail(message, text=message)
    client = await s.client()
    if s.args.queue is not None:
        await _known_queue(client, s.args.queue)
    else:
        await _known_kind(client, s.args.kind)
    result = await client.retry_failed(kind=s.args.kind, queue=s.args.queue)
    jobs = result.jobs
    what = f"kind {s.args.kind}" if s.args.kind else f"queue {s.args.queue}"
    if s.json:
        _print_json([j.to_dict() for j in jobs])
    else:
        skipped = result.matched - len(jobs)
        print(
            f"retried {len(jobs)} failed job(s) of {what}"
            + (
                f" (matched {result.matched}; {skipped} raced, hold a taken unique key or "
                "still owe a failure consequence)"
                if skipped > 0
                else ""
            )
        )
        shown = jobs[:RETRY_FAILED_SHOWN]
        if shown:
            print(format_table(JOB_COLUMNS, [_job_row(j) for j in shown]))
        if len(jobs) > len(shown):
            flag = f"--kind {s.args.kind}" if s.args.kind else f"--queue {s.args.queue}"
            print(
                f"... and {len(jobs) - len(shown)} more (awa-fast job list {flag} "
                "--state available)"
            )
    return 0


async def cmd_job_discard(s: Session) -> int:
    client = await s.client()
    await _known_kind(client, s.args.kind)  # a typo would discard nothing, silently
    n = await client.discard_failed(s.args.kind)
    return _report(
        s,
        {"kind": s.args.kind, "discarded": n},
        f"discarded {n} failed job(s) of kind {s.args.kind}",
    )


async def cmd_queue_drain(s: Session) -> int:
    client = await s.client()
    await _known_queue(client, s.args.queue)
    n = await client.drain_queue(s.args.queue)
    return _report(
        s,
        {"queue": s.args.queue, "drained": n},
        f"drained queue {s.args.queue}: {n} waiting job(s) cancelled",
    )


# ---------------------------------------------------------------------------------------------
# dead-letter queue


def _last_error(errors: list, width: int = 60) -> str | None:
    if not errors:
        return None
    last = errors[-1]
    text = str(last.get("error", last) if isinstance(last, dict) else last)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


DLQ_COLUMNS = ("ID", "KIND", "QUEUE", "ATTEMPT", "REASON", "DLQ_AT", "LAST_ERROR")


def _dlq_filters(a: argparse.Namespace) -> dict:
    out = {"kind": a.kind, "queue": a.queue, "tag": a.tag}
    if hasattr(a, "before_id"):
        out.update(before_id=a.before_id, before_dlq_at=a.before_dlq_at)
    return out


async def cmd_dlq_list(s: Session) -> int:
    client = await s.client()
    entries = await client.list_dlq(**_dlq_filters(s.args), limit=s.args.limit)
    if s.json:
        _print_json([e.to_dict() for e in entries])
    elif entries:
        print(
            format_table(
                DLQ_COLUMNS,
                [
                    [
                        e.job.id,
                        e.job.kind,
                        e.job.queue,
                        f"{e.job.attempt}/{e.job.max_attempts}",
                        e.reason,
                        _short_time(e.dlq_at.isoformat()),
                        _last_error(e.job.errors),
                    ]
                    for e in entries
                ],
            )
        )
    else:
        print(
            "DLQ is empty" if not any(_dlq_filters(s.args).values()) else "no matching DLQ entries"
        )
    return 0


async def cmd_dlq_depth(s: Session) -> int:
    client = await s.client()
    if s.args.queue is not None:
        n = await client.dlq_depth(queue=s.args.queue)
        if s.json:
            _print_json({"queue": s.args.queue, "depth": n})
        else:
            print(n)
        return 0
    by_queue = await client.dlq_depth_by_queue()
    total = sum(by_queue.values())
    if s.json:
        _print_json({"total": total, "by_queue": by_queue})
    elif by_queue:
        print(format_table(("QUEUE", "DEPTH"), [[q, n] for q, n in by_queue.items()]))
        print(f"total: {total}")
    else:
        print("DLQ is empty")
    return 0


async def cmd_dlq_retry(s: Session) -> int:
    client = await s.client()
    job = await client.retry_from_dlq(s.args.id)  # UniqueConflict: exit 1 with its message
    if job is None:
        raise CliError(f"job {s.args.id} is not in the DLQ")
    return _report(
        s, job.to_dict(), f"job {job.id} retried from the DLQ (now {job.state}, queue {job.queue})"
    )


def _check_all_or_filter(s: Session, filters: dict) -> None:
    given = any(v is not None for v in filters.values())
    if s.args.all and given:
        s.args.parser.error("--all cannot be combined with a filter")
    if not s.args.all and not given:
        s.args.parser.error("give at least one filter, or --all for every DLQ entry")


async def cmd_dlq_retry_all(s: Session) -> int:
    filters = _dlq_filters(s.args)
    _check_all_or_filter(s, filters)
    client = await s.client()
    if filters["queue"] is not None:  # a typo would match nothing, silently
        await _known_queue(client, filters["queue"])
    if filters["kind"] is not None:
        await _known_kind(client, filters["kind"])
    n = await client.bulk_retry_from_dlq(**filters, allow_all=s.args.all)
    return _report(s, {"retried": n}, f"retried {n} job(s) from the DLQ")


async def cmd_dlq_purge(s: Session) -> int:
    filters = _dlq_filters(s.args)
    _check_all_or_filter(s, filters)
    client = await s.client()
    if filters["queue"] is not None:  # a typo would match nothing, silently
        await _known_queue(client, filters["queue"])
    if filters["kind"] is not None:
        await _known_kind(client, filters["kind"])
    n = await client.purge_dlq(**filters, allow_all=s.args.all)
    return _report(s, {"purged": n}, f"purged {n} DLQ entr{'y' if n == 1 else 'ies'}")


# ---------------------------------------------------------------------------------------------
# periodic (cron) jobs


CRON_COLUMNS = (
    ("NAME", "name"),
    ("CRON", "cron_expr"),
    ("TIMEZONE", "timezone"),
    ("KIND", "kind"),
    ("QUEUE", "queue"),
    ("POLICY", "missed_fire_policy"),
    ("LAST_FIRE", "last_fire_at"),
    ("NEXT_FIRE", "next_fire_at"),
)


async def cmd_storage_status(s: Session) -> int:
    # awa's `storage status`: the report of AsyncClient.storage_status(), a JSON object
    client = await s.client()
    report = json.loads(await client.storage_status())
    if s.json:
        _print_json(report)
    else:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


async def cmd_cron_list(s: Session) -> int:
    client = await s.client()
    jobs = await client.list_cron_jobs()
    if s.json:
        _print_json(jobs)
    elif jobs:
        times = {"last_fire_at", "next_fire_at"}
        print(
            format_table(
                [h for h, _ in CRON_COLUMNS],
                [
                    [_short_time(j.get(f)) if f in times else j.get(f) for _, f in CRON_COLUMNS]
                    for j in jobs
                ],
            )
        )
    else:
        print("no cron jobs")
    return 0


async def cmd_cron_remove(s: Session) -> int:
    client = await s.client()
    if not await client.delete_cron_job(s.args.name):
        raise CliError(f"no cron job named {s.args.name!r}")
    return _report(s, {"name": s.args.name, "removed": True}, f"cron job {s.args.name} removed")


# batch operations (awa's batch-ops)


BATCH_COLUMNS = (
    ("ID", "id"),
    ("KIND", "op_kind"),
    ("STATE", "state"),
    ("MATCHED", "total_matched"),
    ("PROCESSED", "processed"),
    ("SKIPPED", "skipped"),
    ("ERRORED", "errored"),
    ("SUBMITTED", "submitted_at"),
    ("BY", "submitted_by"),
)


def _json_arg(value: str | None, name: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError as exc:
        raise CliError(f"--{name} is not JSON: {exc}") from None


def _operation_text(op: dict) -> str:
    return (
        f"batch operation {op['id']} ({op['op_kind']}): {op['state']}, matched "
        f"{op['total_matched'] if op['total_matched'] is not None else '-'}, processed "
        f"{op['processed']}, skipped {op['skipped']}, errored {op['errored']}"
        + (f"; last error: {op['last_error']}" if op["last_error"] else "")
    )


async def cmd_batch_list(s: Session) -> int:
    ops = await (await s.client()).list_batch_operations(state=s.args.state, limit=s.args.limit)
    if s.json:
        _print_json(ops)
    elif ops:
        print(
            format_table(
                [h for h, _ in BATCH_COLUMNS],
                [
                    [_short_time(o[f]) if f == "submitted_at" else o[f] for _, f in BATCH_COLUMNS]
                    for o in ops
                ],
            )
        )
    else:
        print("no batch operations")
    return 0


async def cmd_batch_get(s: Session) -> int:
    op = await (await s.client()).get_batch_operation(s.args.id)
    return _report(s, op, _operation_text(op))


async def cmd_batch_preview(s: Session) -> int:
    found = await (await s.client()).preview_batch_operation(
        s.args.op_kind,
        spec=_json_arg(s.args.spec, "spec"),
        filter=_json_arg(s.args.filter, "filter"),
    )
    return _report(
        s,
        found,
        f"{found['total_matched']} queued job(s) match; first ids: "
        f"{', '.join(str(r['id']) for r in found['sample']) or '-'}",
    )


async def cmd_batch_submit(s: Session) -> int:
    flt = _json_arg(s.args.filter, "filter")
    if not flt and not s.args.all:  # the library's own error names its allow_all=True
        s.args.parser.error("give --filter, or --all for every queued job")
    op = await (await s.client()).submit_batch_operation(
        s.args.op_kind,
        spec=_json_arg(s.args.spec, "spec"),
        filter=flt,
        submitted_by=s.args.submitted_by,
        allow_all=s.args.all,
    )
    return _report(
        s,
        op,
        f"submitted batch operation {op['id']} ({op['op_kind']}); the maintenance leader runs it",
    )


async def cmd_batch_cancel(s: Session) -> int:
    op = await (await s.client()).cancel_batch_operation(s.args.id)
    return _report(s, op, _operation_text(op))


async def cmd_batch_purge(s: Session) -> int:
    try:
        before = datetime.fromisoformat(s.args.before.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(f"--before is not an ISO 8601 time: {s.args.before!r}") from None
    if before.tzinfo is None:
        before = before.replace(tzinfo=UTC)
    n = await (await s.client()).purge_batch_operations(before, limit=s.args.limit)
    return _report(s, {"purged": n}, f"purged {n} finalized batch operation(s)")


def cmd_embedded_stop(s: Session) -> int:
    from awa_fast import embedded

    stopped = embedded.stop_persistent()
    data_dir = str(embedded.default_data_dir())
    if s.json:
        _print_json({"stopped": stopped, "data_dir": data_dir})
    elif stopped:
        print(f"stopped embedded PostgreSQL at {data_dir}")
    else:
        print(f"embedded PostgreSQL at {data_dir} was not running")
    return 0


def cmd_embedded_url(s: Session) -> int:
    from awa_fast import embedded

    url = embedded.ensure_running()
    return _report(s, {"url": url, "data_dir": str(embedded.default_data_dir())}, url)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Within it, what is written to stdout (``sys.stdout`` and file descriptor 1, so a C
    extension or a process started meanwhile too) goes to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def cmd_check(s: Session) -> int:
    from awa_fast import storage_options
    from awa_fast.app_loader import (
        AppSpecError,
        exits_at_import,
        format_traceback,
        import_failure,
        load_client,
        start_config_error,
        start_options,
    )

    try:
        # Under --json stdout is the JSON object only: what the application writes there while
        # it imports goes to stderr.
        with _stdout_to_stderr() if s.json else contextlib.nullcontext():
            client, module = load_client(s.args.app)
    except AppSpecError as exc:  # a usage error, as `awa-fast worker` reports it
        return s.fail(str(exc), status=2, kind="AppSpecError", text=f"{PROG} check: error: {exc}")
    except SystemExit as exc:  # the module ends its program at import: nothing was checked
        message = exits_at_import(s.args.app, exc)
        return s.fail(message, kind="SystemExit", text=f"{PROG} check: error: {message}")
    except Exception as exc:  # the application's own import raised
        # One line (what, where, how to see more); the traceback only when asked for.
        message = import_failure(s.args.app, exc)
        trace = format_traceback(exc)
        text = f"{PROG} check: error: {message}"
        return s.fail(
            import_failure(s.args.app, exc, traceback_hint=False),  # --json: "traceback" has it
            kind=type(exc).__name__,
            text=f"{text}\n{trace}" if s.debug else text,
            traceback=trace,
        )
    kinds = client.registry.undeclared_kinds()
    off_default = dict(sorted(client.registry.off_default.items()))
    import warnings

    from awa_fast.errors import QueueMismatchWarning

    # What start() would warn about, as lines of the report (Python's warning display points
    # at this module's line, two lines each); the warning filters apply.
    with warnings.catch_warnings(record=True) as caught:
        config_error = start_config_error(client, module)
    mismatches = [str(w.message) for w in caught if issubclass(w.category, QueueMismatchWarning)]
    for w in caught:
        if not issubclass(w.category, QueueMismatchWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    try:
        given = start_options(module)
    except ValueError:  # already reported as the config error
        given = {}
    # awa storage options START_OPTIONS gives that tune a mechanism awa-fast does not have
    no_effect = [
        {"option": o.name, "value": given[o.name], "reason": o.here}
        for o in storage_options.inapplicable_given(given)
    ]
    if s.json:
        _print_json(
            {
                "undeclared": kinds,
                "registered": sorted(client.registry.handlers),
                "registered_off_default": off_default,
                "config_error": config_error,
                "warnings": mismatches,
                "no_effect_options": no_effect,
            }
        )
        return 1 if kinds or config_error else 0
    for message in mismatches:
        print(f"warning: {message}")
    n = len(client.registry.handlers)
    if config_error:
        print(f"start() would reject this configuration: {config_error}")
    else:
        with_options = ", START_OPTIONS included" if getattr(module, "START_OPTIONS", None) else ""
        print(
            f"start() would accept this configuration ({n} registered "
            f"{'kind' if n == 1 else 'kinds'}{with_options})"
        )
    if no_effect:
        print("START_OPTIONS accepted with no effect in awa-fast (awa storage options):")
        for item in no_effect:
            print(f"  {item['option']}={item['value']!r}: {item['reason']}")
    if kinds:
        print(
            "kinds without a failure consequence declaration "
            "(failure_consequence=fn or awa_fast.NO_FAILURE_CONSEQUENCE):"
        )
        for kind in kinds:
            print(f"  {kind}")
    else:
        print(
            "no kinds are registered"
            if n == 0
            else "the registered kind declares a failure consequence"
            if n == 1
            else f"all {n} registered kinds declare a failure consequence"
        )
    if off_default:
        print(
            "note: kinds registered for a queue other than 'default': insert them with that "
            "queue=,\nelse they go to 'default' (awa-pg semantics), which a worker of the "
            "registered queues does not work:"
        )
        for kind, queue in off_default.items():
            print(f"  {kind} -> queue {queue}")
    return 1 if kinds or config_error else 0


async def cmd_consequences(s: Session) -> int:
    client = await s.client()
    rows = await client.consequences_owed(limit=s.args.limit)
    if s.json:
        _print_json(rows)
        return 0
    if not rows:
        print("no failure consequence is owed")
        return 0
    print(
        format_table(
            ["id", "kind", "queue", "state", "reason", "path", "attempts", "overdue", "error"],
            [
                [
                    r["id"],
                    r["kind"],
                    r["queue"],
                    r["state"],
                    r["reason"],
                    r["path"],
                    r["attempts"],
                    "yes" if r["overdue"] else "no",
                    (r["error"] or "")[:60],
                ]
                for r in rows
            ],
        )
    )
    return 0


def _names_database_url(arg: str) -> bool:
    # --database-url, --database-url=..., or an abbreviation the suite's parser takes for it
    name = arg.split("=", 1)[0]
    return name.startswith("--da") and "--database-url".startswith(name)


def cmd_bench(s: Session) -> int:
    from pathlib import Path

    if s.json:  # the suite's options follow 'bench'; a --json before it would go unread
        s.args.parser.error("--json does not apply to bench (its results are JSONL: --out)")
    if s.args.log_format != "text":  # the suite prints its own report lines, not log records
        s.args.parser.error("--log-format does not apply to bench (its report is plain text)")

    root = Path(__file__).resolve().parent.parent
    if not (root / "bench" / "runner.py").is_file():
        raise CliError(
            "the benchmark suite ships with the source checkout: run `awa-fast bench` "
            "from an editable install (pip install -e .) of the repository"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from bench.runner import main as bench_main

    bench_args = list(s.args.bench_args)
    if bench_args[:1] == ["--"]:
        bench_args = bench_args[1:]
    url = s.args.database_url
    if url is not None:  # given before 'bench': the suite's own --database-url
        if any(_names_database_url(a) for a in bench_args):
            s.args.parser.error("--database-url is given both before and after 'bench'")
        bench_args = ["--database-url", url, *bench_args]
    return bench_main(bench_args, prog=f"{PROG} bench")


def cmd_demo(s: Session) -> int:
    from awa_fast.demo import run_demo

    return run_demo(
        getattr(s.args, "database_url", None),
        processes=s.args.processes,
        limit=s.args.limit,
        extra_paths=s.args.extra_path or [],
        timeout=s.args.timeout,
        json_output=s.json,
    )


def cmd_worker(s: Session) -> int:
    from awa_fast.launcher_config import launcher_config
    from awa_fast.supervisor import CHILD_SCHEMA_ENV, Supervisor

    a = s.args
    if s.json:  # it prints status and log lines, no data
        a.parser.error(
            "--json does not apply to worker (its status lines are log lines: --log-format json)"
        )
    # --database-url overrides the client's URL; a client built without one resolves it like
    # every command (the launcher does that once, before starting children).
    try:
        config = launcher_config(
            a.app,
            a.processes,
            queues=a.queues,
            drain_timeout=a.drain_timeout,
            database_url=getattr(a, "database_url", None),
            status_interval=a.status_interval,
            log_level=a.log_level,
            log_format=a.log_format,
            metrics_port=a.metrics_port,
            metrics_host=a.metrics_host,
            # --schema overrides the client's schema in the children too
            extra_env=({CHILD_SCHEMA_ENV: a.schema} if getattr(a, "schema", None) else None),
            debug=s.debug,
        )
    except ValueError as exc:  # a bad --queues or --metrics-* value (ConfigError): a usage error
        a.parser.error(str(exc))
    return Supervisor(config).run()


# ---------------------------------------------------------------------------------------------
# parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer: {text!r}") from None
    if not 1 <= value <= 2**63 - 1:  # ids and limits are bigint in the database
        raise argparse.ArgumentTypeError(f"must be in 1..{2**63 - 1}, got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not 0 < value < math.inf:  # NaN and inf too: a drain of `inf` s overflowed at SIGTERM
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _iso_time(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid ISO 8601 timestamp: {text!r}") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


TRACEBACK_HELP = (
    f"after an error's one line, print its whole traceback (also: {DEBUG_ENV}=1); for "
    "worker and check also of the application's own errors (an import that raises)"
)
LOG_FORMATS = ("text", "json")  # awa_fast.log_format.FORMATS (not imported: --help stays light)
LOG_FORMAT_HELP = (
    "logs as text lines (default) or one JSON object per line (ts, level, logger, "
    "message, extra fields such as kind, job_id, attempt); for worker: the "
    "children's logs and the launcher's status lines"
)
DB_HELP = (
    "PostgreSQL URL (default: $AWA_FAST_DATABASE_URL, $DATABASE_URL, else the embedded server)"
)
SCHEMA_HELP = (
    "the schema of the awa-fast objects to use (default: $AWA_FAST_SCHEMA, else awa_fast); "
    "each schema of a database is its own queue system"
)
WORKER_DB_HELP = (
    "PostgreSQL URL, overriding the client's (default: the URL the client was built "
    "with, else $AWA_FAST_DATABASE_URL, $DATABASE_URL, else the embedded server)"
)


def _common(with_db: bool = True, db_help: str = DB_HELP, with_json: bool = True) -> _Parser:
    """Options accepted both before and after a subcommand (SUPPRESS keeps the global value).
    ``with_json=False``: a command that prints no data (its help does not offer ``--json``; one
    given before the command is refused by the command)."""
    p = _Parser(add_help=False)
    g = p.add_argument_group("common options")
    if with_json:
        g.add_argument(
            "--json",
            action="store_true",
            default=argparse.SUPPRESS,
            help="print machine-readable JSON instead of tables/text",
        )
    g.add_argument(
        "--log-format", choices=LOG_FORMATS, default=argparse.SUPPRESS, help=LOG_FORMAT_HELP
    )
    if with_db:
        g.add_argument("--database-url", metavar="URL", default=argparse.SUPPRESS, help=db_help)
        g.add_argument("--schema", metavar="NAME", default=argparse.SUPPRESS, help=SCHEMA_HELP)
    g.add_argument(
        "--traceback", action="store_true", default=argparse.SUPPRESS, help=TRACEBACK_HELP
    )
    return p


DESCRIPTION = """\
awa-fast: the Awa job queue CLI for awa-fast, administering a job queue stored in PostgreSQL.

Database: --database-url URL, else $AWA_FAST_DATABASE_URL, else $DATABASE_URL, else a
persistent embedded PostgreSQL (started on first use; see `awa-fast embedded`)."""

EPILOG = """\
exit status: 0 success, 1 error (database/connection error, unknown job, wrong state),
2 usage error, 130 Ctrl-C (worker and serve stop gracefully on Ctrl-C or SIGTERM and exit 0;
demo: 143 after SIGTERM, 129 after SIGHUP; serve: 3 when the web server cannot start, 142 when a
stop outlasts its 20 s limit). With --json an error is
one JSON object on stderr: {"error": MESSAGE, "type": ERROR_CLASS} (usage errors: type
UsageError, and "usage"); else one line, and with --traceback (or AWA_FAST_DEBUG=1) the whole
traceback after it.

examples:
  awa-fast migrate
  awa-fast job list --state failed --limit 20
  awa-fast job dump 42
  awa-fast job retry-failed --kind send_email
  awa-fast --json queue stats
  awa-fast dlq list --queue billing
  awa-fast dlq retry-all --kind send_email
  awa-fast demo
  awa-fast worker myapp.jobs:client --processes 4 --queues default:10,emails:4"""


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("awa-fast")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: ``awa-fast X.Y.Z``, or ``{"version": "X.Y.Z"}`` when the parser was built
    for JSON output."""

    def __init__(self, option_strings, dest, json_output: bool = False, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.json_output = json_output

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            if self.json_output:
                _print_json({"version": _version()})
            else:
                print(f"{PROG} {_version()}")
            sys.stdout.flush()
        except OSError:  # a closed pipe, a full disk: quietly, as a command's output
            _drop_stdout()
            parser.exit(1)
        parser.exit()


# global options that take a value
_GLOBAL_VALUED = ("--database-url", "--log-format", "--schema")


def _bench_at(argv: Sequence[str]) -> int | None:
    """The index of the ``bench`` command in ``argv`` when it is the command (after any global
    options, abbreviated or not), else None."""
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "bench":
            return i
        elif arg.startswith("--") and len(arg) >= 3:
            skip = "=" not in arg and any(o.startswith(arg) for o in _GLOBAL_VALUED)
        else:
            return None
    return None


def _json_requested(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for ``--json`` (or an abbreviation argparse accepts, or a
    ``--json=...`` argparse will refuse) before a ``--``, for what happens before the arguments
    are parsed: ``--version``, usage errors."""
    for arg in argv:
        if arg == "--":
            return False
        name = arg.split("=", 1)[0]
        if len(name) >= 3 and "--json".startswith(name):
            return True
    return False


def build_parser(*, json_output: bool = False) -> argparse.ArgumentParser:
    """The argparse parser of the whole CLI (each command's handler in ``func``).

    Args:
        json_output: ``--version`` prints ``{"version": ...}`` (give :func:`_json_requested`).

    Its ``parse_args`` raises :class:`UsageError` where argparse would print a usage error and
    exit 2 (``--help`` and ``--version`` still print and exit 0).
    """
    common = _common()
    common_nodb = _common(with_db=False)
    raw = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=raw)
    parser.add_argument("--database-url", metavar="URL", default=None, help=DB_HELP)
    parser.add_argument("--schema", metavar="NAME", default=None, help=SCHEMA_HELP)
    parser.add_argument(
        "--json",
        action="store_true",
        default=False,
        help="print machine-readable JSON instead of tables/text",
    )
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text", help=LOG_FORMAT_HELP)
    parser.add_argument("--traceback", action="store_true", default=False, help=TRACEBACK_HELP)
    parser.add_argument(
        "--version",
        action=_VersionAction,
        json_output=json_output,
        help="print the version and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, title="commands")

    # migrate
    p = sub.add_parser(
        "migrate",
        parents=[common],
        formatter_class=raw,
        help="create or upgrade the awa_fast schema (or --schema's)",
        description="Apply every missing awa_fast schema migration (idempotent, "
        "safe to run concurrently).\nPrints the versions applied, or "
        "'schema up to date (version N)';\n"
        '--json: {"applied": [...], "version": N}. --sql, --version, --from/--to and '
        "--pending\nprint SQL instead, "
        "each migration a transaction that also records its version as the runner\n"
        "does, to apply by hand in order (awa-fast migrate --to N | psql -v ON_ERROR_STOP=1);\n"
        '--json: {"from": A, "to": B, "migrations": [{"version", "description",\n'
        '"sql"}, ...]}, the migrations A < version <= B.',
    )
    p.add_argument(
        "--sql",
        action="store_true",
        help="print the SQL of all migrations instead of applying them (needs no database)",
    )
    p.add_argument(
        "--version",
        type=int,
        metavar="N",
        help="print the SQL of migration N only (needs no database; exit 1 if out of range)",
    )
    p.add_argument(
        "--from",
        type=int,
        dest="from_version",
        metavar="N",
        help="print the SQL of migrations after N (exclusive; 0..latest; needs no database)",
    )
    p.add_argument(
        "--to",
        type=int,
        metavar="N",
        help="print the SQL of migrations up to N (inclusive; --from..latest; needs no database)",
    )
    p.add_argument(
        "--pending",
        action="store_true",
        help="print the SQL of the migrations this database has not applied",
    )
    p.set_defaults(func=cmd_migrate, migrate_parser=p)

    # job
    job = sub.add_parser(
        "job",
        help="inspect and manage jobs (list, dump, dump-run, retry, cancel, retry-failed, discard)",
        description="Inspect and manage jobs: list, dump, dump-run, retry, "
        "cancel, retry-failed, discard.",
    )
    jsub = job.add_subparsers(
        dest="job_command", metavar="SUBCOMMAND", required=True, title="subcommands"
    )
    p = jsub.add_parser(
        "list",
        parents=[common],
        help="list jobs, newest first",
        description="List jobs, newest first, optionally filtered.",
    )
    p.add_argument("--state", choices=JOB_STATES, help="only jobs in this state")
    p.add_argument("--kind", help="only jobs of this kind")
    p.add_argument("--queue", help="only jobs in this queue")
    p.add_argument(
        "--limit", type=_positive_int, default=50, metavar="N", help="at most N jobs (default: 50)"
    )
    p.set_defaults(func=cmd_job_list)
    p = jsub.add_parser(
        "dump",
        parents=[common],
        help="print one job as JSON",
        description="Print every field of one job as JSON (exit 1 if no such job).",
    )
    p.add_argument("id", type=_positive_int, metavar="ID", help="job id")
    p.set_defaults(func=cmd_job_dump)
    p = jsub.add_parser(
        "retry",
        parents=[common],
        help="make a failed/cancelled/waiting_external job available again",
        description="Make a failed, cancelled or waiting_external job available "
        "again with attempt 0.\nExit 1 if the job does not exist or "
        "is in another state.",
    )
    p.add_argument("id", type=_positive_int, metavar="ID", help="job id")
    p.set_defaults(func=cmd_job_retry)
    p = jsub.add_parser(
        "cancel",
        parents=[common],
        help="cancel a job that has not finished",
        description="Cancel a non-terminal job (a running attempt is told to "
        "stop).\nExit 1 if the job does not exist or is already "
        "completed, failed or cancelled.",
    )
    p.add_argument("id", type=_positive_int, metavar="ID", help="job id")
    p.set_defaults(func=cmd_job_cancel)
    p = jsub.add_parser(
        "dump-run",
        parents=[common],
        help="print one attempt of a job as JSON",
        description="Print one attempt (run) of a job as JSON: the attempt "
        "number, the error recorded for it, progress, run lease, "
        "timestamps and the whole job.\nDead-lettered jobs are read "
        "from the DLQ. Exit 1 if no such job or attempt.",
    )
    p.add_argument("id", type=_positive_int, metavar="ID", help="job id")
    p.add_argument(
        "--attempt", type=_positive_int, metavar="N", help="attempt number (default: the latest)"
    )
    p.set_defaults(func=cmd_job_dump_run)
    p = jsub.add_parser(
        "retry-failed",
        parents=[common],
        help="make every failed job of a kind or queue available again",
        description="Make every failed job of one kind or one queue available "
        "again with attempt 0 (give exactly one of --kind, --queue)."
        "\nJobs whose unique key is now held by another live job are "
        f"skipped and stay failed. Prints the count and the first "
        f"{RETRY_FAILED_SHOWN} jobs (--json: all of them).",
    )
    # awa-pg checks "exactly one" itself (exit 1), not through argparse (exit 2).
    p.add_argument("--kind", help="retry the failed jobs of this kind")
    p.add_argument("--queue", help="retry the failed jobs in this queue")
    p.set_defaults(func=cmd_job_retry_failed)
    p = jsub.add_parser(
        "discard",
        parents=[common],
        help="delete the failed jobs of a kind",
        description="Delete every failed job of one kind (jobs whose failure "
        "consequence is still owed are kept). Prints how many.",
    )
    p.add_argument("--kind", required=True, help="job kind")
    p.set_defaults(func=cmd_job_discard)

    # queue
    queue = sub.add_parser(
        "queue",
        help="queue statistics, pausing and draining (stats, pause, resume, drain)",
        description="Queue statistics, pausing and draining: stats, pause, resume, drain.",
    )
    qsub = queue.add_subparsers(
        dest="queue_command", metavar="SUBCOMMAND", required=True, title="subcommands"
    )
    p = qsub.add_parser(
        "stats",
        parents=[common],
        help="per-queue job counts",
        description="Per-queue job counts by state, completions in the last "
        "hour, lag (age in seconds of the oldest available job) and "
        "whether the queue is paused.",
    )
    p.set_defaults(func=cmd_queue_stats)
    # awa-pg's hidden top-level alias of `queue stats`
    sub.add_parser("queue-stats", parents=[common]).set_defaults(func=cmd_queue_stats)
    sub._choices_actions = [c for c in sub._choices_actions if c.dest != "queue-stats"]
    p = qsub.add_parser(
        "pause",
        parents=[common],
        help="stop workers claiming from a queue",
        description="Pause a queue: workers stop claiming its jobs (running jobs finish). "
        "A name no job, worker, schedule or setting knows of is an error (exit 1, with the "
        "closest known names) unless --create is given.",
    )
    p.add_argument("queue", metavar="QUEUE", help="queue name")
    p.add_argument("--by", metavar="WHO", help="who paused it (recorded in queue_meta.paused_by)")
    p.add_argument(
        "--create",
        action="store_true",
        help="pause a queue nothing knows of yet (else an unknown name is an error)",
    )
    p.set_defaults(func=cmd_queue_pause)
    p = qsub.add_parser(
        "resume",
        parents=[common],
        help="let workers claim from a queue again",
        description="Resume a paused queue and wake its workers (exit 1 for a queue nothing "
        "knows of).",
    )
    p.add_argument("queue", metavar="QUEUE", help="queue name")
    p.set_defaults(func=cmd_queue_resume)
    p = qsub.add_parser(
        "drain",
        parents=[common],
        help="cancel every waiting job of a queue",
        description="Drain a queue: cancel every job waiting to run (available, "
        "scheduled, retryable). Running and waiting_external jobs "
        "are left alone. Prints how many were cancelled. Exit 1 for a queue nothing knows of.",
    )
    p.add_argument("queue", metavar="QUEUE", help="queue name")
    p.set_defaults(func=cmd_queue_drain)

    # dlq
    dlq = sub.add_parser(
        "dlq",
        help="dead-letter queue (list, depth, retry, retry-all, purge)",
        description="Dead-letter queue: failed jobs of queues with DLQ enabled "
        "(or moved there by an admin), never claimed.\nSubcommands: "
        "list, depth, retry, retry-all, purge.",
    )
    dsub = dlq.add_subparsers(
        dest="dlq_command", metavar="SUBCOMMAND", required=True, title="subcommands"
    )

    def dlq_filters(p: argparse.ArgumentParser, *, paging: bool) -> None:
        p.add_argument("--kind", help="only entries of this kind")
        p.add_argument("--queue", help="only entries from this queue")
        p.add_argument("--tag", help="only entries carrying this tag")
        if paging:
            p.add_argument(
                "--before-id",
                type=_positive_int,
                metavar="N",
                help="only entries with a job id below N",
            )
            p.add_argument(
                "--before-dlq-at",
                type=_iso_time,
                metavar="ISO",
                help="only entries dead-lettered before this ISO 8601 time (naive = UTC)",
            )

    p = dsub.add_parser(
        "list",
        parents=[common],
        help="list DLQ entries, newest first",
        description="List dead-lettered jobs, newest first, with the reason, "
        "when, and the last error.",
    )
    dlq_filters(p, paging=True)
    p.add_argument(
        "--limit",
        type=_positive_int,
        default=50,
        metavar="N",
        help="at most N entries (default: 50)",
    )
    p.set_defaults(func=cmd_dlq_list)
    p = dsub.add_parser(
        "depth",
        parents=[common],
        help="number of DLQ entries (per queue)",
        description="Number of dead-lettered jobs: per queue with a total, or "
        "for one --queue (prints just the number).",
    )
    p.add_argument("--queue", help="only this queue")
    p.set_defaults(func=cmd_dlq_depth)
    p = dsub.add_parser(
        "retry",
        parents=[common],
        help="re-enqueue one DLQ entry",
        description="Move one dead-lettered job back to the job table under the "
        "same id, available with attempt 0 (errors kept).\nExit 1 if "
        "it is not in the DLQ, or if a live job holds its unique key "
        "(nothing changes).",
    )
    p.add_argument("id", type=_positive_int, metavar="ID", help="job id")
    p.set_defaults(func=cmd_dlq_retry)
    p = dsub.add_parser(
        "retry-all",
        parents=[common],
        help="re-enqueue matching DLQ entries",
        description="Re-enqueue every matching DLQ entry (as `dlq retry`). Give "
        "at least one filter, or --all.\nEntries whose unique key is "
        "held by a live job are skipped. Prints how many were retried.",
    )
    dlq_filters(p, paging=False)
    p.add_argument("--all", action="store_true", help="every DLQ entry (no filter)")
    p.set_defaults(func=cmd_dlq_retry_all, parser=p)
    p = dsub.add_parser(
        "purge",
        parents=[common],
        help="delete matching DLQ entries",
        description="Delete matching DLQ entries for good. Give at least one "
        "filter, or --all. Prints how many were deleted.",
    )
    dlq_filters(p, paging=True)
    p.add_argument("--all", action="store_true", help="every DLQ entry (no filter)")
    p.set_defaults(func=cmd_dlq_purge, parser=p)

    # cron
    cron = sub.add_parser(
        "cron",
        help="periodic (cron) schedules (list, remove)",
        description="Periodic (cron) schedules stored in the database: list, remove.",
    )
    csub = cron.add_subparsers(
        dest="cron_command", metavar="SUBCOMMAND", required=True, title="subcommands"
    )
    p = csub.add_parser(
        "list",
        parents=[common],
        help="list the stored schedules",
        description="List every stored periodic schedule with its cron "
        "expression, timezone, kind, queue, missed-fire policy, last "
        "and next fire time.",
    )
    p.set_defaults(func=cmd_cron_list)
    p = csub.add_parser(
        "remove",
        parents=[common],
        help="delete a stored schedule",
        description="Delete a stored periodic schedule (exit 1 if there is none "
        "by that name).\nA process that still registers it stores it "
        "again at its next start().",
    )
    p.add_argument("name", metavar="NAME", help="schedule name")
    p.set_defaults(func=cmd_cron_remove)

    # storage (awa's storage-transition admin: one engine here, so status only)
    storage = sub.add_parser(
        "storage",
        help="storage engine status (status)",
        description="The storage engine's state, in awa's storage-transition report shape.",
    )
    ssub = storage.add_subparsers(
        dest="storage_command", metavar="SUBCOMMAND", required=True, title="subcommands"
    )
    p = ssub.add_parser(
        "status",
        parents=[common],
        help="print the storage status report (JSON)",
        description="Print AsyncClient.storage_status() as JSON: current_engine and "
        "active_engine are awa_fast, state active; awa-fast has one engine, so no "
        "transition is possible (see docs/compat.md).",
    )
    p.set_defaults(func=cmd_storage_status)

    # batch operations
    batch = sub.add_parser(
        "batch-ops",
        help="durable batch operations (list, get, preview, submit, cancel, purge)",
        description="awa's durable batch operations (set_priority, "
        "move_queue) over queued jobs, run by the maintenance "
        "leader.",
    )
    bsub = batch.add_subparsers(
        dest="batch_command", metavar="SUBCOMMAND", required=True, title="subcommands"
    )
    p = bsub.add_parser("list", parents=[common], help="list operations, newest first")
    p.add_argument("--state", help="only operations in this state")
    p.add_argument("--limit", type=_positive_int, default=100, help="most rows (default 100)")
    p.set_defaults(func=cmd_batch_list)
    for name, func, text in (
        ("get", cmd_batch_get, "show one operation"),
        ("cancel", cmd_batch_cancel, "cancel an operation (cooperative)"),
    ):
        p = bsub.add_parser(name, parents=[common], help=text)
        p.add_argument("id", metavar="ID", help="operation id (UUID)")
        p.set_defaults(func=func)
    for name, func, text in (
        ("preview", cmd_batch_preview, "count and sample matching jobs"),
        ("submit", cmd_batch_submit, "submit an operation"),
    ):
        p = bsub.add_parser(
            name,
            parents=[common],
            help=text,
            description=f"{text.capitalize()}, e.g. --op-kind set_priority "
            '--filter \'{"queue": "default"}\' --spec '
            "'{\"priority\": 1}'.",
        )
        p.add_argument("--op-kind", required=True, choices=("set_priority", "move_queue"))
        p.add_argument(
            "--spec", required=True, help='JSON: {"priority": 1-4} or {"queue": Q[, "priority": P]}'
        )
        p.add_argument(
            "--filter", help="JSON: kind, queue, ids, tag, state, created_at_gte, created_at_lt"
        )
        if name == "submit":
            p.add_argument(
                "--submitted-by", help="recorded as the submitter (default: the database user)"
            )
            p.add_argument(
                "--all", action="store_true", help="allow an empty filter (every queued job)"
            )
        p.set_defaults(func=func, parser=p)
    p = bsub.add_parser("purge", parents=[common], help="delete finalized operations")
    p.add_argument("--before", required=True, help="finalized before this ISO 8601 time")
    p.add_argument("--limit", type=_positive_int, default=1000, help="most rows (default 1000)")
    p.set_defaults(func=cmd_batch_purge)

    # embedded
    emb = sub.add_parser(
        "embedded",
        help="manage the persistent embedded PostgreSQL (stop, url)",
        description="Manage the persistent embedded PostgreSQL used when no "
        "database URL is configured (data directory: $AWA_PG_DATA, "
        "else $XDG_DATA_HOME/awa-fast/pg18 (~/.local/share/awa-fast/pg18), or "
        "/var/lib/awa-fast/pg18 as root).",
    )
    esub = emb.add_subparsers(
        dest="embedded_command", metavar="SUBCOMMAND", required=True, title="subcommands"
    )
    p = esub.add_parser(
        "stop",
        parents=[common_nodb],
        help="stop the embedded server",
        description="Stop the persistent embedded PostgreSQL if it is running.",
    )
    p.set_defaults(func=cmd_embedded_stop)
    p = esub.add_parser(
        "url",
        parents=[common_nodb],
        help="print the embedded server's URL (starting it if needed)",
        description="Start the persistent embedded PostgreSQL if needed and "
        "print its connection URL.",
    )
    p.set_defaults(func=cmd_embedded_url)

    # benchmarks
    p = sub.add_parser(
        "bench",
        help="run the benchmark suite (bench/; a source checkout, pip install -e .)",
        description="Run the end-to-end benchmark suite in bench/ (from a source "
        "checkout). Arguments after 'bench' go to the suite: see "
        "`awa-fast bench --help`, e.g. --compare --plot.",
        add_help=False,
    )
    p.add_argument(
        "bench_args",
        nargs=argparse.REMAINDER,
        metavar="ARGS",
        help="arguments for the suite (--compare, --scenarios, --jobs, --plot, ...)",
    )
    p.set_defaults(func=cmd_bench, parser=p)

    # failure consequences
    p = sub.add_parser(
        "check",
        parents=[common_nodb],
        help="check an application without starting it: failure consequences, "
        "start() configuration, queues",
        description="Import APP (module:client) without starting it or touching "
        "the database, and report: every registered kind without a "
        "failure-consequence declaration; the error that "
        "client.start(**START_OPTIONS) would raise (a ConfigError: no "
        "handlers, a handler's queue not started, heartbeat settings, a "
        "name insert would reject; a TypeError: an unknown option); and, as a note, the "
        "kinds registered for a queue other than 'default' and what start() would warn "
        "about (QueueMismatchWarning: 'warning:' lines; --json: \"warnings\") (an insert "
        "without queue= puts them in 'default', which the registered "
        "queues' workers do not work). Exit 0 when all is well, 1 when "
        "a kind is undeclared, start() would fail or importing APP "
        "raises, 2 when APP names no module or no AsyncClient.",
    )
    p.add_argument("app", metavar="APP", help="the application, as package.module:client")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser(
        "consequences",
        parents=[common],
        help="list jobs whose failure consequence is owed (pending or overdue)",
        description="List jobs whose failure consequence is still owed: failures "
        "waiting in consequence_pending and corrected jobs; 'overdue' "
        "means an application already failed or it waited > 60 s.",
    )
    p.add_argument(
        "--limit",
        type=_positive_int,
        default=100,
        metavar="N",
        help="most rows to show (default: 100)",
    )
    p.set_defaults(func=cmd_consequences)

    # serve
    p = sub.add_parser(
        "serve",
        parents=[_common(with_json=False)],
        help="run the web dashboard",
        description="Serve the web dashboard: queues, jobs, lineage, DLQ, failure "
        "consequences, cron schedules, workers. Binding a non-loopback "
        "host needs a token (exit 2 otherwise). At startup it waits up to 30 s for the "
        "database to accept connections. See docs/dashboard.md.",
        epilog="exit status: 0 stopped by SIGINT/SIGTERM; 1 the database accepted no "
        "connection within 30 s of startup (one line on stderr says so), refused the login, "
        "or is not migrated; 2 usage error; 3 the server could not start (e.g. the port is "
        "taken; uvicorn says why).",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default: 127.0.0.1; anything else needs a token)",
    )
    p.add_argument("--port", type=int, default=8080, help="port to bind (default: 8080)")
    p.add_argument(
        "--read-only", action="store_true", help="hide admin actions and refuse them with 403"
    )
    p.add_argument(
        "--token",
        default=None,
        help="access token every request must carry (bearer header or login form; "
        "default: $AWA_FAST_SERVE_TOKEN)",
    )
    p.set_defaults(func=cmd_serve)

    # worker
    p = sub.add_parser(
        "worker",
        parents=[_common(db_help=WORKER_DB_HELP, with_json=False)],
        formatter_class=raw,
        help="run an application's workers in N processes (the launcher)",
        description="Run the registered handlers of an application's AsyncClient "
        "in worker processes\n(one per core by default). APP is "
        "module:attribute, e.g. myapp.jobs:client; the module may\n"
        "define START_OPTIONS, a dict of keywords for client.start() "
        "(poll_interval_ms, ...;\nnot queues: give them with --queues).\nEach child runs uvloop and opens "
        "its own connections. The launcher restarts a crashed child\n"
        "(backoff 0.5 s doubling to 10 s) and exits 1 if a child dies "
        "more than 5 times within\n60 s. SIGTERM/SIGINT/SIGHUP drain "
        "gracefully: stop claiming, finish in-flight jobs up to\n"
        "--drain-timeout, flush; exit 0 (a def handler still running then is left\n'running' "
        "for heartbeat rescue). A second signal kills the children (exit 1; their attempts\n"
        "stay running until heartbeat rescue). One status line per child "
        "event on stdout; child logs\non stderr as [child N pid P] "
        "(--log-format json: JSON objects). APP is imported once "
        "before\nany child starts, in a running event loop as in the children: "
        "exit 2 if its module\ncannot be found or it names no "
        "AsyncClient, 1 if importing it raises or start() would reject\n"
        "its START_OPTIONS (ConfigError, as `awa-fast check` reports), or if the database "
        "cannot be\nreached (tried for 5 s) or is not migrated: one line each, the "
        "traceback with --traceback;\na child "
        "whose import raises all the same stops the launcher (exit 1, "
        "no restart).\nDatabase: --database-url, else "
        "the URL the client was built with, else\n"
        "$AWA_FAST_DATABASE_URL, $DATABASE_URL, else the embedded server.",
    )
    p.add_argument("app", metavar="APP", help="module:client, an awa_fast.AsyncClient")
    p.add_argument(
        "--processes",
        type=_positive_int,
        default=None,
        metavar="N",
        help=f"worker processes (default: one per core, {os.cpu_count() or 1} here)",
    )
    p.add_argument(
        "--queues",
        metavar="NAME:N,...",
        help="queues and max workers per process, e.g. default:10,emails:4 "
        "(default: the client's registered queues, 10 workers each)",
    )
    p.add_argument(
        "--drain-timeout",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, let in-flight jobs finish for up to this long (default: 10); "
        "a def handler still running then is left for heartbeat rescue",
    )
    p.add_argument(
        "--status-interval",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="print a status line per child this often (default: 10)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log level of the worker processes (default: info)",
    )
    p.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics of all children, aggregated, at "
        "http://HOST:PORT/metrics (default: none)",
    )
    p.add_argument(
        "--metrics-host",
        default=None,
        metavar="HOST",
        help="address of the metrics endpoint (default: 127.0.0.1)",
    )
    p.set_defaults(func=cmd_worker, parser=p)

    # demo
    p = sub.add_parser(
        "demo",
        parents=[common],
        formatter_class=raw,
        help="import-graph pipeline over this Python's standard library",
        description="Run the built-in demo: a two-stage pipeline over the "
        "standard library of the running Python.\nStage A "
        "(demo_parse_imports), one job per .py file, parses its "
        "imports and stages one\nstage-B job (demo_resolve_module) "
        "per imported top-level module with default unique\noptions, "
        "so each distinct module gets exactly one B. Stage B resolves "
        "the module\n(found or not, file size). Workers run in "
        "--processes worker processes (the launcher).\nPrints files, "
        "failures, distinct modules, B jobs inserted vs skipped as "
        "duplicates,\nwall time and jobs/s, and checks the B count "
        "against a direct computation (exit 1 on\nmismatch). Rows of "
        "a previous demo run are deleted first.\nCtrl-C (or SIGTERM, SIGHUP) "
        "drains the workers, deletes the demo's unfinished jobs, prints "
        "a summary\nand exits 130 (143 after SIGTERM, 129 after SIGHUP).\nWithout a "
        "database URL it uses the embedded "
        "server and says so first (data directory,\nserver account; "
        "it keeps running: `awa-fast embedded stop`).",
    )
    p.add_argument(
        "--processes",
        type=_positive_int,
        default=None,
        metavar="N",
        help=f"worker processes (default: one per core, {os.cpu_count() or 1} here)",
    )
    p.add_argument(
        "--limit",
        type=_positive_int,
        default=None,
        metavar="N",
        help="only the first N standard-library files (sorted by path)",
    )
    p.add_argument(
        "--extra-path",
        action="append",
        metavar="PATH",
        help="also process this .py file, or the .py files under this directory (repeatable)",
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        metavar="SECONDS",
        help="give up if the pipeline has not finished after this long: stop the workers, "
        "remove the unfinished jobs, exit 1 (default: 600)",
    )
    p.set_defaults(func=cmd_demo)
    return parser


# ---------------------------------------------------------------------------------------------
# entry point


def _exit_if_still_running(after_s: float) -> None:
    """Exit the process with 130 if it is still running ``after_s`` seconds from now."""

    def give_up() -> None:
        print(f"{PROG}: interrupted; the connections did not close in time", file=sys.stderr)
        os._exit(130)

    timer = threading.Timer(after_s, give_up)
    timer.daemon = True
    timer.start()


def _run_async(fn: Callable[[Session], Any], session: Session) -> int:
    async def runner() -> int:
        # Ctrl-C: the runner's handler cancels this task; what follows is bounded. The cancel
        # may not even reach it (psycopg_pool's connect task catches cancels and retries, and
        # the runner then waited for it forever), so the bound starts from the signal itself.
        runner_handler = signal.getsignal(signal.SIGINT)
        if callable(runner_handler):

            def on_sigint(signum, frame) -> None:
                _exit_if_still_running(INTERRUPT_GRACE_S)
                runner_handler(signum, frame)

            signal.signal(signal.SIGINT, on_sigint)
        try:
            return await fn(session)
        finally:
            await session.close()

    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        return asyncio.run(runner())
    return uvloop.run(runner())


def cmd_serve(s: Session) -> int:
    """Run the web dashboard (awa_fast.web); a non-loopback host without a token exits 2."""
    try:
        from awa_fast.web import security, serve
    except ImportError as exc:
        # a core dependency: missing only from a broken or partial install
        raise CliError(
            f"awa-fast serve cannot import its web stack ({exc}): reinstall awa-fast "
            f"(`pip install .` in a checkout, `pip install awa-fast` otherwise)"
        ) from exc
    token = serve.resolve_token(s.args.token)
    reason = security.check_bind(s.args.host, token)
    if not 0 <= s.args.port <= 65535:
        reason = f"--port must be 0..65535, got {s.args.port}"
    if s.json:
        reason = "--json does not apply to serve (it prints no data)"
    if reason is not None:
        return s.fail(reason, status=2, kind="UsageError", text=f"{PROG} serve: error: {reason}")
    url = s.database_url
    from awa_fast.web import reads

    # one startup bound for the probe and the pools: a database still coming up is waited for
    deadline = time.monotonic() + reads.STARTUP_S
    asyncio.run(_probe(url, need_schema=True, source=s.url_source, wait_s=reads.STARTUP_S))
    print(
        f"{PROG}: serving the dashboard{' read-only' if s.args.read_only else ''}"
        f"{', token required' if token else ''} (uvicorn prints the address)",
        file=sys.stderr,
    )
    serve.run(
        url,
        host=s.args.host,
        port=s.args.port,
        read_only=s.args.read_only,
        token=token,
        startup_s=max(1.0, deadline - time.monotonic()),
    )
    return 0


def _print_migrations(s: Session, after: int, upto: int) -> int:
    """Print the SQL of migrations ``after < version <= upto``: awa-pg's format, or with
    ``--json`` ``{"from": after, "to": upto, "migrations": [{"version", "description", "sql"}]}``."""
    from awa_fast import schema

    # Each migration as a transaction that also keeps the runner's bookkeeping (its lock, the
    # schema_version table, the version's record), so the printed SQL can be applied by hand.
    from awa_fast.schema_binding import resolve

    found = schema.migration_scripts(after, upto, resolve())
    if s.json:
        _print_json(
            {
                "from": after,
                "to": upto,
                "migrations": [
                    {"version": v, "description": d, "sql": text} for v, d, text in found
                ],
            }
        )
        return 0
    if after >= upto:
        print(f"No migrations in range ({after}, {upto}].", file=sys.stderr)
        return 0
    for version, description, text in found:
        print(f"-- Migration V{version}: {description}\n{text}\n")
    return 0


def _usage_error(exc: UsageError, json_output: bool) -> int:
    """Report a usage error as argparse does (its usage line, then ``prog: error: message``),
    or with ``json_output`` as one JSON object; returns exit status 2."""
    if json_output:
        usage = exc.parser.format_usage().strip()
        _print_error(exc.message, json_output=True, kind="UsageError", usage=usage)
    else:
        exc.parser.print_usage(sys.stderr)
        print(f"{exc.parser.prog}: error: {exc.message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); returns the exit status (see the
    module docstring). Errors are reported on stderr, not raised; a Ctrl-C returns 130."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # during the command, or before it (parsing the arguments)
        print(file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    import psycopg

    from awa_fast import db_errors
    from awa_fast.embedded import EmbeddedPostgresError
    from awa_fast.errors import AwaError

    # A terminal that cannot show a character (PYTHONIOENCODING=ascii, a C locale) gets an
    # escape for it instead of a UnicodeEncodeError traceback in the middle of the output.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    at = _bench_at(argv)
    if at is not None:
        # Everything after 'bench' belongs to the suite's own parser (argparse's REMAINDER
        # would not pass leading options such as --help through).
        argv = [*argv[: at + 1], "--", *argv[at + 1 :]]
    json_output = _json_requested(argv)  # the parse may fail before it reaches --json
    try:
        args = build_parser(json_output=json_output).parse_args(argv)
    except UsageError as exc:
        return _usage_error(exc, json_output)
    if args.log_format == "json":  # text: Python's default (warnings and errors, bare)
        from awa_fast import log_format

        log_format.configure("json", "warning")
    session = Session(args)

    def error(message: str, exc: BaseException) -> int:
        status = session.fail(message, kind=type(exc).__name__, log_format=args.log_format)
        if session.debug and not session.json:
            from awa_fast.app_loader import format_traceback

            print(format_traceback(exc), file=sys.stderr)
        return status

    func = args.func
    try:
        if getattr(args, "schema", None) is not None:
            # --schema: every client, connection, dashboard and worker child this command
            # makes uses that schema (schema_binding.resolve reads the variable)
            from awa_fast import schema_binding

            schema_binding.check_name(args.schema, "--schema")
            os.environ[schema_binding.ENV] = args.schema
        if asyncio.iscoroutinefunction(func):
            return _run_async(func, session)
        return func(session)
    except UsageError as exc:  # a check of the arguments that argparse could not make
        return _usage_error(exc, session.json)
    except (CliError, AwaError, EmbeddedPostgresError) as exc:
        return error(str(exc) or type(exc).__name__, exc)
    except UnicodeEncodeError as exc:
        # A byte that is not UTF-8 in an argument (argv keeps it as a lone surrogate) or a
        # "\ud800" in JSON: no text the database can store.
        return error(f"an argument is not valid UTF-8 text: {exc.object[:60]!r}", exc)
    except psycopg.Error as exc:  # a statement of the CLI's own: one line, as the client's
        msg = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, psycopg.OperationalError) and msg.startswith("connection failed"):
            return error(f"could not connect to the database: {msg}", exc)
        typed = db_errors.translate(exc, _command_name(func))
        return error(str(typed), typed)
    except BrokenPipeError:
        # stdout closed early (e.g. `| head`): exit quietly
        _drop_stdout()
        return 1


def _command_name(func: Any) -> str:
    """The command a handler runs, as typed (``cmd_queue_pause`` -> ``"queue pause"``)."""
    return getattr(func, "__name__", "command").removeprefix("cmd_").replace("_", " ")


def _drop_stdout() -> None:
    """Point stdout at /dev/null: it failed (a closed pipe, a full disk), and the interpreter's
    flush at exit would fail again with a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
