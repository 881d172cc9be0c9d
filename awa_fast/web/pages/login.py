"""Signing in with the access token (``/login``) and out (``/logout``), and the page a request
without it gets."""

from __future__ import annotations

from starlette.requests import HTTPConnection, Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from awa_fast.web import security
from awa_fast.web.dashboard import dashboard, done


async def login(request: Request) -> Response:
    d = dashboard(request)
    if d.token is None:
        return RedirectResponse("/queues", status_code=303)
    if request.method == "GET":
        return d.render(request, "login.html", {"nav": None})
    form = await request.form()
    security.check_csrf(request, form.get("csrf"))
    if not security.token_matches(d.token, form.get("token")):
        return d.render(request, "login.html", {"nav": None, "wrong": True}, 401)
    request.session["authed"] = True
    return done(request, "signed in", "/queues")


async def logout(request: Request) -> Response:
    form = await request.form()
    security.check_csrf(request, form.get("csrf"))
    request.session.clear()
    return RedirectResponse("/login" if dashboard(request).token else "/queues", status_code=303)


async def denied(conn: HTTPConnection) -> Response:
    """The login page with 401, for a request without the token (``security.TokenAuth``)."""
    return dashboard(conn).render(conn, "login.html", {"nav": None, "denied": True}, 401)


ROUTES = [
    Route("/login", login, methods=["GET", "POST"]),
    Route("/logout", logout, methods=["POST"]),
]
