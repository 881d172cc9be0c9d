"""Access rules of the dashboard: the bind/token rule, token authentication and CSRF tokens.

* Bind rule: a loopback host needs no token; any other host needs one (``--token`` or
  ``$AWA_FAST_SERVE_TOKEN``), else ``awa-fast serve`` exits 2 (:func:`check_bind`).
* With a token every request but ``/login`` and ``/static`` needs it: ``Authorization: Bearer
  <token>``, or the signed session cookie set by the login form (:class:`TokenAuth`).
* Every POST carries the session's CSRF token in the form field ``csrf`` (:func:`check_csrf`);
  the session lives in a cookie signed with itsdangerous by Starlette's ``SessionMiddleware``.
"""

from __future__ import annotations

import ipaddress
import secrets
import urllib.parse

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN_ENV = "AWA_FAST_SERVE_TOKEN"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class AccessError(Exception):
    """A request that must be refused; ``status`` is the HTTP status (401 or 403)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def is_loopback(host: str) -> bool:
    """``True`` for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str | None:
    """The host of a ``Host`` header value (port and IPv6 brackets removed), ``None`` if
    malformed."""
    try:
        split = urllib.parse.urlsplit("//" + header)
        split.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return None
    if split.netloc != header or split.username is not None or split.password is not None:
        return None  # a path, query, fragment or userinfo is no Host header
    return split.hostname


class LoopbackHostGuard:
    """ASGI middleware serving only requests whose ``Host`` is loopback by :func:`is_loopback`
    (so every loopback address the bind rule lets serve without a token is reachable); other
    hosts get 400. A name that resolves to loopback is refused: that is DNS rebinding."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = host_of(Headers(scope=scope).get("host", ""))
            if host is None or not is_loopback(host):
                response = PlainTextResponse("Invalid host header", status_code=400)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def check_bind(host: str, token: str | None) -> str | None:
    """The reason binding ``host`` without ``token`` is refused, or ``None`` when allowed."""
    if token is not None and not token.strip():
        return "the dashboard token must not be empty"
    if token is None and not is_loopback(host):
        return (
            f"binding the dashboard to {host} (not loopback) requires a token: pass "
            f"--token TOKEN or set ${TOKEN_ENV}"
        )
    return None


def csrf_token(conn: HTTPConnection) -> str:
    """The session's CSRF token (created on first use)."""
    token = conn.session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        conn.session["csrf"] = token
    return token


def check_csrf(conn: HTTPConnection, submitted: object) -> None:
    """Raises :class:`AccessError` (403) unless ``submitted`` is the session's CSRF token."""
    expected = conn.session.get("csrf")
    if not (
        isinstance(expected, str)
        and isinstance(submitted, str)
        and secrets.compare_digest(expected.encode(), submitted.encode())
    ):
        raise AccessError(403, "missing or wrong CSRF token: reload the page and try again")


def token_matches(token: str, offered: object) -> bool:
    return isinstance(offered, str) and secrets.compare_digest(token.encode(), offered.encode())


def bearer_matches(token: str, offered: bytes) -> bool:
    """``True`` if the raw bytes of a bearer header are ``token`` in UTF-8 (what curl, requests
    and browsers send) or in latin-1 (how Starlette decodes headers); constant time."""
    expected = token.encode()
    utf8 = secrets.compare_digest(expected, offered)
    latin1 = secrets.compare_digest(expected, offered.decode("latin-1").encode())
    return utf8 | latin1  # both compared: no early exit


class TokenAuth:
    """ASGI middleware (inside ``SessionMiddleware``): with a token configured, a request
    without the bearer header or an authenticated session gets ``on_denied``'s response."""

    def __init__(self, app: ASGIApp, token: str | None, on_denied):
        self.app = app
        self.token = token
        self.on_denied = on_denied

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (
            self.token is None
            or scope["type"] != "http"
            or path == "/login"
            or path.startswith("/static/")
        ):
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        # Starlette's str headers are latin-1 decoded: back to the bytes the client sent.
        header = conn.headers.get("authorization", "").encode("latin-1")
        bearer = header[7:] if header[:7].lower() == b"bearer " else None
        if (bearer is not None and bearer_matches(self.token, bearer)) or conn.session.get(
            "authed"
        ) is True:
            await self.app(scope, receive, send)
            return
        response = await self.on_denied(conn)
        await response(scope, receive, send)
