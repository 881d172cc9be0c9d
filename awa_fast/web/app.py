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

import secrets

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from awa_fast import schema_binding
from awa_fast.web import security
from awa_fast.web.dashboard import Dashboard
from awa_fast.web.errors import HANDLERS
from awa_fast.web.pages import dlq, jobs, login, queues, status
from awa_fast.web.rendering import HERE
from awa_fast.web.startup import StartupError, lifespan

__all__ = ["StartupError", "create_app"]

# Every page, in the order of the navigation; each module's actions next to its page.
PAGES = (queues, jobs, dlq, status, login)


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
    binding = schema_binding.resolve(schema)
    routes: list[BaseRoute] = [route for page in PAGES for route in page.ROUTES]
    routes.append(Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"))
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
        Middleware(security.TokenAuth, token=token, on_denied=login.denied),
    ]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan(database_url, binding, startup_s),
        exception_handlers=HANDLERS,
    )
    app.state.dashboard = Dashboard(read_only=read_only, token=token)
    return app
