"""What every page, action and error page of the dashboard shares: its settings, the
connections its startup opened, and how a page is rendered. One :class:`Dashboard` per
application, reached from a request as ``dashboard(request)``."""

from __future__ import annotations

from typing import Any

from starlette.requests import HTTPConnection, Request
from starlette.responses import RedirectResponse, Response

from awa_fast.client import AsyncClient
from awa_fast.web import security
from awa_fast.web.inputs import path_id
from awa_fast.web.reads import Reads
from awa_fast.web.rendering import templates


class Dashboard:
    """The settings of one dashboard application and the connections its startup opened.

    Args:
        read_only: hide admin actions and refuse their POSTs (403).
        token: the access token every request needs, or None (no authentication).
    """

    def __init__(self, *, read_only: bool, token: str | None):
        self.read_only = read_only
        self.token = token
        self.templates = templates()
        # set by the application's startup (awa_fast.web.startup.lifespan), None before it
        self.reads_: Reads | None = None
        self.client_: AsyncClient | None = None

    @property
    def client(self) -> AsyncClient:
        """The client the actions (and the DLQ and cron reads) use."""
        assert self.client_ is not None, "the dashboard's startup has not run"
        return self.client_

    @property
    def reads(self) -> Reads:
        """The bounded page reads (their own pool)."""
        assert self.reads_ is not None, "the dashboard's startup has not run"
        return self.reads_

    def render(
        self, request: HTTPConnection, name: str, context: dict | None = None, status: int = 200
    ) -> Response:
        """The template ``name`` with ``context`` and what every page shows (read-only mode,
        login state, the CSRF token, a flash message), as a response with ``status``."""
        ctx = {
            "read_only": self.read_only,
            "auth": self.token is not None,
            "csrf": security.csrf_token(request),
            "flash": request.session.pop("flash", None),
            **(context or {}),
        }
        return self.templates.TemplateResponse(request, name, ctx, status_code=status)  # type: ignore[arg-type]

    def error_page(self, request: HTTPConnection, status: int, message: str) -> Response:
        """The error page: ``message`` with ``status``, never a traceback."""
        return self.render(request, "error.html", {"status": status, "message": message}, status)

    async def action_form(self, request: Request) -> Any:
        """An action's form, after the read-only and CSRF checks.

        Raises:
            security.AccessError: 403 in read-only mode, or a missing or wrong CSRF token.
        """
        if self.read_only:
            raise security.AccessError(403, "the dashboard runs --read-only: actions are disabled")
        form = await request.form()
        security.check_csrf(request, form.get("csrf"))
        return form


def done(request: Request, message: str, url: str) -> Response:
    """After an action: ``message`` as the next page's flash, a 303 redirect to ``url``."""
    request.session["flash"] = message
    return RedirectResponse(url, status_code=303)


def dashboard(conn: HTTPConnection) -> Dashboard:
    """The :class:`Dashboard` of the application serving ``conn``."""
    return conn.app.state.dashboard


async def job_action(request: Request) -> tuple[Dashboard, int]:
    """An action on one job (``/…/{job_id}/…``, POST): the :class:`Dashboard` and the job id,
    after the id (a 400 unless an id) and the action checks (:meth:`Dashboard.action_form`)."""
    d = dashboard(request)
    job_id = path_id(request)
    await d.action_form(request)
    return d, job_id
