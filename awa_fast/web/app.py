"""The dashboard's ASGI application: pages, admin actions and error pages (Starlette + Jinja2).

Admin actions are POST-only, CSRF-checked and refused with 403 under ``read_only``; they call the
same :class:`~awa_fast.client.AsyncClient` methods as the CLI. Bad input (an id that is not a
positive bigint, an unknown state, an over-long filter) gets a 400 page, an unknown id a 404 page,
an action on a job in the wrong state a 409 page, a database that cannot be reached (no
connection within ``reads.DB_WAIT_S``, or the connection lost) a 503 page, and so do a pool
whose every connection stayed busy and an action a read-only database refuses (saying so);
no page ever shows a traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from awa_fast import schema_binding
from awa_fast.client import AsyncClient
from awa_fast.connections import PoolBusy
from awa_fast.db_errors import SERVER_GONE
from awa_fast.errors import (
    AttemptStillRunning,
    DatabaseError,
    DatabaseUnavailable,
    ReadOnlyDatabase,
    UniqueConflict,
    ValidationError,
)
from awa_fast.job import JobState
from awa_fast.requests import check_name
from awa_fast.sql import dashboard as bounds
from awa_fast.web import reads as _reads
from awa_fast.web import security
from awa_fast.web.reads import CLIENT_CONNECTIONS, DB_WAIT_S, Reads, bounded

log = logging.getLogger("awa_fast.web")

HERE = Path(__file__).parent
STATES = tuple(str(s) for s in JobState)
MAX_ID = 2**63 - 1
_DIGITS = re.compile(r"[0-9]{1,19}")  # MAX_ID has 19 digits
RETRYABLE_STATES = ("failed", "cancelled", "waiting_external")
FINISHED_STATES = ("completed", "failed", "cancelled")


class _Client(AsyncClient):
    """The client the actions use: its pool waits for the database as the reads' does."""

    def _pool_options(self, url: str) -> dict[str, Any]:
        return bounded(url, super()._pool_options(url))


class StartupError(DatabaseUnavailable):
    """The dashboard's pools found no database connection within its startup bound
    (``reads.STARTUP_S``): the application does not start."""


class _LastConnectError(logging.Filter):
    """Keeps psycopg.pool's warnings (one per failed connect, several a second while a startup
    retries) off the log and the last one's first line as :attr:`last`."""

    last = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if str(record.msg).startswith("error connecting") and record.args:
            # "error connecting in %r: %s", (pool name, the connect's exception)
            self.last = str(record.args[-1]).splitlines()[0]  # type: ignore[index]
        return False


async def _open(reads: Reads, new_client: Callable[[], AsyncClient], timeout: float) -> AsyncClient:
    """Open the reads' pool and a client's (``new_client()``) within ``timeout`` seconds,
    starting new connects while the database refuses them (each pool alone gives up after one
    failed connect, see ``bounded``); returns the client.

    Raises:
        StartupError: no connection when ``timeout`` ran out (its message ends with the last
            connect error).
    """
    deadline = time.monotonic() + timeout
    errors = _LastConnectError()
    pool_log = logging.getLogger("psycopg.pool")
    pool_log.addFilter(errors)
    try:
        try:
            await reads.open(timeout)
        except PoolTimeout:
            raise StartupError(_no_database(timeout, errors.last)) from None
        while True:
            client = None
            try:
                # the database answered the reads: the client's check at construction (one
                # connect) and its pool's open (up to DB_WAIT_S) are short
                client = new_client()
                await client.pool()
                return client
            except DatabaseError as exc:
                if client is not None:
                    await client.close()
                if time.monotonic() >= deadline:
                    last = errors.last or str(exc).splitlines()[0]
                    raise StartupError(_no_database(timeout, last)) from None
    finally:
        pool_log.removeFilter(errors)


def _no_database(timeout: float, last: str) -> str:
    return (
        f"the database accepted no connection within {timeout:.0f} s of the dashboard's "
        f"startup (the last attempt: {last or 'no answer'})"
    )


def _lost(exc: psycopg.OperationalError) -> bool | None:
    """``None`` unless ``exc`` says the database cannot be reached: ``False`` when no connection
    came within the wait, ``True`` when the connection was lost mid-request (a restart, a
    terminated backend, the network)."""
    if isinstance(exc, PoolTimeout):
        return False
    state = exc.sqlstate
    if state is None or state.startswith("08") or state in SERVER_GONE:
        return True  # no SQLSTATE: libpq's own (the connection lost)
    return None


# -- rendering -------------------------------------------------------------------------------------


def _ts(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    seconds = (datetime.now(UTC) - value).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            text = f"{seconds / size:.0f}{unit}"
            break
    else:
        text = f"{seconds:.0f}s"
    return f"in {text}" if future else f"{text} ago"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=True)


def _error_parts(entry: Any) -> dict:
    """An ``errors`` entry as ``{attempt, at, head, trace, terminal, raw}`` for the template."""
    if not isinstance(entry, dict):
        return {"attempt": None, "at": None, "head": _pretty(entry), "trace": "", "terminal": False}
    text = str(entry.get("error", ""))
    head, _, trace = text.partition("\n")
    return {
        "attempt": entry.get("attempt"),
        "at": entry.get("at"),
        "head": head,
        "trace": trace,
        "terminal": bool(entry.get("terminal")),
    }


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.filters.update(ts=_ts, ago=_ago, pretty=_pretty)
    env.globals.update(
        states=STATES,
        bounds=bounds,
        retryable_states=RETRYABLE_STATES,
        finished_states=FINISHED_STATES,
    )
    return templates


# -- input -----------------------------------------------------------------------------------------


def _bad(message: str) -> HTTPException:
    return HTTPException(400, message)


def _positive_id(text: str | None, field: str) -> int | None:
    if text is None or text == "":
        return None
    # ASCII digits only (str.isdigit() accepts "²", which int() rejects); the length bound keeps
    # int() off strings past its digit limit.
    value = int(text) if _DIGITS.fullmatch(text) else 0
    if not 1 <= value <= MAX_ID:
        raise _bad(f"{field} must be an integer between 1 and {MAX_ID}, got {text[:40]!r}")
    return value


def _path_id(request: Request) -> int:
    return _positive_id(request.path_params["job_id"], "job id")  # type: ignore[return-value]


def _name(value: object, field: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):  # a multipart form may carry a file in any field
        raise _bad(f"{field} must be text, not a file upload")
    try:
        return check_name(value, field)
    except ValidationError as exc:
        raise _bad(str(exc)) from None


def _queue_field(form) -> str:
    queue = _name(form.get("queue"), "queue")
    if queue is None:
        raise _bad("the form names no queue")
    return queue


def _state(text: str | None) -> str | None:
    if text is None or text == "":
        return None
    if text not in STATES:
        raise _bad(f"state must be one of {', '.join(STATES)}; got {text[:40]!r}")
    return text


# -- application -----------------------------------------------------------------------------------


def create_app(
    database_url: str,
    *,
    read_only: bool = False,
    token: str | None = None,
    startup_s: float | None = None,
    schema: str | None = None,
) -> Starlette:
    """The dashboard for the awa-fast database at ``database_url`` (a libpq URL/DSN).

    Args:
        read_only: hide admin actions and refuse their POSTs with 403.
        token: when set, every request needs it (``Authorization: Bearer``, or the login form,
            which marks the signed session cookie). ``None``: no authentication; only loopback
            ``Host`` headers are then accepted (DNS-rebinding guard).
        startup_s: how long the application's startup waits for the database to accept
            connections (default ``reads.STARTUP_S``, 30 s); then the startup fails with
            :class:`StartupError` (also kept as ``app.state.startup_error``).
        schema: the awa-fast schema it shows and acts on (default: ``$AWA_FAST_SCHEMA``, else
            ``awa_fast``; ADR 027).

    Raises:
        ValidationError: ``schema`` breaks the schema-name rule.

    The bind rule (a token off loopback) is enforced by the caller, see
    :func:`awa_fast.web.security.check_bind`. Connections open on application startup.
    """
    templates = _templates()
    state: dict[str, Any] = {}
    binding = schema_binding.resolve(schema)

    def client() -> AsyncClient:
        return state["client"]

    def reads() -> Reads:
        return state["reads"]

    def render(
        request: HTTPConnection, name: str, context: dict | None = None, status: int = 200
    ) -> Response:
        ctx = {
            "read_only": read_only,
            "auth": token is not None,
            "csrf": security.csrf_token(request),
            "flash": request.session.pop("flash", None),
            **(context or {}),
        }
        return templates.TemplateResponse(request, name, ctx, status_code=status)  # type: ignore[arg-type]

    def error_page(request: HTTPConnection, status: int, message: str) -> Response:
        return render(request, "error.html", {"status": status, "message": message}, status)

    def done(request: Request, message: str, url: str) -> Response:
        request.session["flash"] = message
        return RedirectResponse(url, status_code=303)

    async def action_form(request: Request):
        if read_only:
            raise security.AccessError(403, "the dashboard runs --read-only: actions are disabled")
        form = await request.form()
        security.check_csrf(request, form.get("csrf"))
        return form

    # -- pages -----------------------------------------------------------------------------------

    async def home(request: Request) -> Response:
        return RedirectResponse("/queues", status_code=303)

    async def queues(request: Request) -> Response:
        rows = await reads().queues(await client().dlq_depth_by_queue())
        return render(request, "queues.html", {"nav": "queues", "queues": rows})

    async def jobs(request: Request) -> Response:
        p = request.query_params
        filters = {
            "queue": _name(p.get("queue"), "queue"),
            "kind": _name(p.get("kind"), "kind"),
            "state": _state(p.get("state")),
        }
        before = _positive_id(p.get("before"), "before")
        page = await reads().jobs(**filters, before=before)
        return render(request, "jobs.html", {"nav": "jobs", "page": page, "filters": filters})

    async def job(request: Request) -> Response:
        job_id = _path_id(request)
        row = await reads().job(job_id)
        if row is None:
            raise HTTPException(
                404, f"no job {job_id} (neither in awa_fast.jobs_all nor in the DLQ)"
            )
        trigger, trigger_id, children = await reads().lineage(row)
        errors = [_error_parts(e) for e in (row.get("errors") or [])]
        return render(
            request,
            "job.html",
            {
                "nav": "jobs",
                "job": row,
                "errors": errors,
                "trigger": trigger,
                "trigger_id": trigger_id,
                "children": children,
            },
        )

    async def dlq(request: Request) -> Response:
        p = request.query_params
        filters = {"queue": _name(p.get("queue"), "queue"), "kind": _name(p.get("kind"), "kind")}
        before = _positive_id(p.get("before"), "before")
        page = await reads().dlq(**filters, before=before)
        return render(
            request,
            "dlq.html",
            {
                "nav": "dlq",
                "page": page,
                "filters": filters,
                "depth": await client().dlq_depth_by_queue(),
            },
        )

    async def consequences(request: Request) -> Response:
        return render(
            request, "consequences.html", {"nav": "consequences", **await reads().consequences()}
        )

    async def cron(request: Request) -> Response:
        return render(
            request, "cron.html", {"nav": "cron", "schedules": await client().list_cron_jobs()}
        )

    async def workers(request: Request) -> Response:
        return render(request, "workers.html", {"nav": "workers", **await reads().workers()})

    # -- actions ---------------------------------------------------------------------------------

    async def job_retry(request: Request) -> Response:
        job_id = _path_id(request)
        await action_form(request)
        retried = await client().retry(job_id)  # UniqueConflict: the 409 handler
        if retried is None:
            return await _wrong_state(
                request,
                job_id,
                "retried",
                "only failed, cancelled or waiting_external jobs whose consequence is not owed",
            )
        return done(
            request, f"job {job_id} retried: available again with attempt 0", f"/jobs/{job_id}"
        )

    async def job_cancel(request: Request) -> Response:
        job_id = _path_id(request)
        await action_form(request)
        if await client().cancel(job_id) is None:
            return await _wrong_state(request, job_id, "cancelled", "only unfinished jobs")
        return done(request, f"job {job_id} cancelled", f"/jobs/{job_id}")

    async def _wrong_state(request: Request, job_id: int, verb: str, rule: str) -> Response:
        row = await reads().job(job_id)
        if row is None:
            return error_page(request, 404, f"no job {job_id}")
        where = "in the DLQ" if row["in_dlq"] else f"{row['state']}"
        return error_page(request, 409, f"job {job_id} is {where}: not {verb} ({rule} can be)")

    # The queue travels in the form, not the path: a queue name may contain "/".
    async def queue_pause(request: Request) -> Response:
        queue = _queue_field(await action_form(request))
        await client().pause_queue(queue, paused_by="dashboard")
        return done(request, f"queue {queue} paused", "/queues")

    async def queue_resume(request: Request) -> Response:
        queue = _queue_field(await action_form(request))
        await client().resume_queue(queue)
        return done(request, f"queue {queue} resumed", "/queues")

    async def dlq_retry(request: Request) -> Response:
        job_id = _path_id(request)
        await action_form(request)
        retried = await client().retry_from_dlq(job_id)  # UniqueConflict: the 409 handler
        if retried is None:
            return error_page(request, 404, f"job {job_id} is not in the DLQ")
        return done(
            request,
            f"job {job_id} moved from the DLQ back to queue {retried.queue}",
            f"/jobs/{job_id}",
        )

    async def dlq_purge(request: Request) -> Response:
        job_id = _path_id(request)
        await action_form(request)
        if not await client().purge_dlq_job(job_id):
            return error_page(request, 404, f"job {job_id} is not in the DLQ")
        return done(request, f"DLQ entry {job_id} purged", "/dlq")

    async def dlq_purge_matching(request: Request) -> Response:
        form = await action_form(request)
        queue = _name(form.get("queue"), "queue")
        kind = _name(form.get("kind"), "kind")
        if queue is None and kind is None:
            raise _bad(
                "purging the DLQ needs a queue or kind filter (the dashboard never "
                "purges the whole DLQ)"
            )
        n = await client().purge_dlq(queue=queue, kind=kind)
        return done(request, f"purged {n} DLQ entries", "/dlq")

    # -- login -----------------------------------------------------------------------------------

    async def login(request: Request) -> Response:
        if token is None:
            return RedirectResponse("/queues", status_code=303)
        if request.method == "GET":
            return render(request, "login.html", {"nav": None})
        form = await request.form()
        security.check_csrf(request, form.get("csrf"))
        if not security.token_matches(token, form.get("token")):
            return render(request, "login.html", {"nav": None, "wrong": True}, 401)
        request.session["authed"] = True
        return done(request, "signed in", "/queues")

    async def logout(request: Request) -> Response:
        form = await request.form()
        security.check_csrf(request, form.get("csrf"))
        request.session.clear()
        return RedirectResponse("/login" if token else "/queues", status_code=303)

    async def denied(conn: HTTPConnection) -> Response:
        return render(conn, "login.html", {"nav": None, "denied": True}, 401)

    # -- errors ----------------------------------------------------------------------------------

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_page(request, exc.status_code, str(exc.detail))

    async def access_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, security.AccessError)
        return error_page(request, exc.status, str(exc))

    async def conflict(request: Request, exc: Exception) -> Response:
        return error_page(request, 409, str(exc))  # nothing changed (UniqueConflict's promise)

    async def db_timeout(request: Request, exc: Exception) -> Response:
        log.warning("dashboard query cancelled on %s: %s", request.url.path, exc)
        return error_page(request, 503, "the database did not answer in time; try again")

    async def db_unreachable(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, psycopg.OperationalError)
        if isinstance(exc, PoolBusy):  # the database is up: slow pages hold every connection
            log.warning("dashboard: every database connection is busy on %s", request.url.path)
            return error_page(
                request,
                503,
                f"Every database connection is busy (slow pages hold them; none came free "
                f"within {DB_WAIT_S:g} s). Try again in a moment.",
            )
        lost = _lost(exc)
        if lost is None:
            raise exc  # any other database error: the 500 of server_error
        log.warning("dashboard: the database is unreachable on %s: %s", request.url.path, exc)
        why = "the connection to it was lost" if lost else f"no connection within {DB_WAIT_S:g} s"
        message = (
            f"The database is unreachable ({why}). The dashboard reconnects by itself once it "
            "is back: try again."
        )
        if lost and request.method == "POST":
            message += " An action cut off this way may or may not have been applied."
        return error_page(request, 503, message)

    async def db_error(request: Request, exc: Exception) -> Response:
        # An action's client call: the driver's error is its cause (awa_fast.db_errors).
        assert isinstance(exc, DatabaseError)
        cause = exc.__cause__
        if isinstance(exc, ReadOnlyDatabase):
            log.warning("dashboard: the database refused a write on %s: %s", request.url.path, exc)
            return error_page(
                request,
                503,
                "The database is read-only (a standby, or default_transaction_read_only): "
                "the action was refused and nothing changed.",
            )
        if isinstance(cause, psycopg.errors.QueryCanceled):
            return await db_timeout(request, cause)
        if isinstance(cause, psycopg.OperationalError) and (
            isinstance(cause, PoolBusy) or _lost(cause) is not None
        ):
            return await db_unreachable(request, cause)
        if isinstance(exc, DatabaseUnavailable):
            log.warning("dashboard: the database is unreachable on %s: %s", request.url.path, exc)
            return error_page(
                request,
                503,
                "The database is unreachable. The dashboard reconnects by itself "
                "once it is back: try again.",
            )
        return await server_error(request, exc)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("dashboard error on %s %s", request.method, request.url.path)
        return Response(
            "internal error (logged by the server)", status_code=500, media_type="text/plain"
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        state["reads"] = Reads(database_url, binding=binding)
        state["client"] = None
        try:
            # the client's pool now: a first open failing later (database down) closes the
            # pool, waiting on its connects, and the next page builds another
            wait_s = _reads.STARTUP_S if startup_s is None else startup_s
            try:
                state["client"] = await _open(
                    state["reads"],
                    lambda: _Client(
                        database_url, max_connections=CLIENT_CONNECTIONS, schema=binding.name
                    ),
                    wait_s,
                )
            except StartupError as exc:
                app.state.startup_error = exc  # awa-fast serve reports it on one line
                raise
            yield
        finally:
            await state["reads"].close()
            if state["client"] is not None:
                await state["client"].close()

    routes = [
        Route("/", home),
        Route("/queues", queues),
        Route("/queues/pause", queue_pause, methods=["POST"]),
        Route("/queues/resume", queue_resume, methods=["POST"]),
        Route("/jobs", jobs),
        Route("/jobs/{job_id}", job),
        Route("/jobs/{job_id}/retry", job_retry, methods=["POST"]),
        Route("/jobs/{job_id}/cancel", job_cancel, methods=["POST"]),
        Route("/dlq", dlq),
        Route("/dlq/purge", dlq_purge_matching, methods=["POST"]),
        Route("/dlq/{job_id}/retry", dlq_retry, methods=["POST"]),
        Route("/dlq/{job_id}/purge", dlq_purge, methods=["POST"]),
        Route("/consequences", consequences),
        Route("/cron", cron),
        Route("/workers", workers),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    middleware = []
    if token is None:
        middleware.append(Middleware(security.LoopbackHostGuard))
    middleware += [
        # Fresh secret per process: a restart signs everyone out (sessions hold only the CSRF
        # token and the login mark).
        Middleware(
            SessionMiddleware,
            secret_key=secrets.token_urlsafe(32),
            session_cookie="awa_fast_dashboard",
            same_site="strict",
            max_age=12 * 3600,
        ),
        Middleware(security.TokenAuth, token=token, on_denied=denied),
    ]
    return Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={
            HTTPException: http_error,
            security.AccessError: access_error,
            UniqueConflict: conflict,
            AttemptStillRunning: conflict,
            psycopg.errors.QueryCanceled: db_timeout,
            psycopg.OperationalError: db_unreachable,  # PoolTimeout is one
            DatabaseError: db_error,
            Exception: server_error,
        },
    )
