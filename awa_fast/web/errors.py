"""The dashboard's error pages: which exception gets which status and message. Bad input is
a 400, an unknown id a 404, an action on a job in the wrong state (or a unique key taken) a 409,
a database that cannot be reached, a pool whose connections all stayed busy and an action a
read-only database refuses a 503; anything else a plain 500 (logged), never a traceback."""

from __future__ import annotations

import logging

import psycopg
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from awa_fast.connections import PoolBusy
from awa_fast.db_errors import SERVER_GONE
from awa_fast.errors import (
    AttemptStillRunning,
    DatabaseError,
    DatabaseUnavailable,
    ReadOnlyDatabase,
    UniqueConflict,
)
from awa_fast.web import security
from awa_fast.web.dashboard import dashboard
from awa_fast.web.reads import DB_WAIT_S

log = logging.getLogger("awa_fast.web")


def lost(exc: psycopg.OperationalError) -> bool | None:
    """``None`` unless ``exc`` says the database cannot be reached: ``False`` when no connection
    came within the wait, ``True`` when the connection was lost mid-request (a restart, a
    terminated backend, the network)."""
    if isinstance(exc, PoolTimeout):
        return False
    state = exc.sqlstate
    if state is None or state.startswith("08") or state in SERVER_GONE:
        return True  # no SQLSTATE: libpq's own (the connection lost)
    return None


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return dashboard(request).error_page(request, exc.status_code, str(exc.detail))


async def access_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, security.AccessError)
    return dashboard(request).error_page(request, exc.status, str(exc))


async def conflict(request: Request, exc: Exception) -> Response:
    # nothing changed (UniqueConflict's promise)
    return dashboard(request).error_page(request, 409, str(exc))


async def db_timeout(request: Request, exc: Exception) -> Response:
    log.warning("dashboard query cancelled on %s: %s", request.url.path, exc)
    return dashboard(request).error_page(
        request, 503, "the database did not answer in time; try again"
    )


async def db_unreachable(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, psycopg.OperationalError)
    d = dashboard(request)
    if isinstance(exc, PoolBusy):  # the database is up: slow pages hold every connection
        log.warning("dashboard: every database connection is busy on %s", request.url.path)
        return d.error_page(
            request,
            503,
            f"Every database connection is busy (slow pages hold them; none came free "
            f"within {DB_WAIT_S:g} s). Try again in a moment.",
        )
    gone = lost(exc)
    if gone is None:
        raise exc  # any other database error: the 500 of server_error
    why = "the connection to it was lost" if gone else f"no connection within {DB_WAIT_S:g} s"
    message = (
        f"The database is unreachable ({why}). The dashboard reconnects by itself once it "
        "is back: try again."
    )
    if gone and request.method == "POST":
        message += " An action cut off this way may or may not have been applied."
    return _unavailable(request, exc, "is unreachable", message)


async def db_error(request: Request, exc: Exception) -> Response:
    # An action's client call: the driver's error is its cause (awa_fast.db_errors).
    assert isinstance(exc, DatabaseError)
    cause = exc.__cause__
    if isinstance(exc, ReadOnlyDatabase):
        return _unavailable(
            request,
            exc,
            "refused a write",
            "The database is read-only (a standby, or default_transaction_read_only): "
            "the action was refused and nothing changed.",
        )
    if isinstance(cause, psycopg.errors.QueryCanceled):
        return await db_timeout(request, cause)
    if isinstance(cause, psycopg.OperationalError) and (
        isinstance(cause, PoolBusy) or lost(cause) is not None
    ):
        return await db_unreachable(request, cause)
    if isinstance(exc, DatabaseUnavailable):
        return _unavailable(
            request,
            exc,
            "is unreachable",
            "The database is unreachable. The dashboard reconnects by itself "
            "once it is back: try again.",
        )
    return await server_error(request, exc)


def _unavailable(request: Request, exc: Exception, what: str, message: str) -> Response:
    """The 503 page of a database that cannot serve the request (``message`` for the user),
    logged as ``the database <what>`` with the path and the error."""
    log.warning("dashboard: the database %s on %s: %s", what, request.url.path, exc)
    return dashboard(request).error_page(request, 503, message)


async def server_error(request: Request, exc: Exception) -> Response:
    log.exception("dashboard error on %s %s", request.method, request.url.path)
    return Response(
        "internal error (logged by the server)", status_code=500, media_type="text/plain"
    )


HANDLERS = {
    HTTPException: http_error,
    security.AccessError: access_error,
    UniqueConflict: conflict,
    AttemptStillRunning: conflict,
    psycopg.errors.QueryCanceled: db_timeout,
    psycopg.OperationalError: db_unreachable,  # PoolTimeout is one
    DatabaseError: db_error,
    Exception: server_error,
}
