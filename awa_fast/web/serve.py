"""``awa-fast serve``: run the dashboard with uvicorn.

Binds 127.0.0.1:8080 by default. Binding any non-loopback host needs a token (``--token`` or
``$AWA_FAST_SERVE_TOKEN``); without one the command exits 2 before touching the database.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from awa_fast.web import security

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
# How long a stop waits for requests in flight before cancelling them; the pools close after.
STOP_TIMEOUT_S = 10
# ... and how long the whole stop may take before the process exits without the pools: a
# backstop for a stop that hangs anyway (libpq's blocking cancel once froze it behind a database
# that stopped answering; awa_fast.pg_connection now sends that cancel without blocking).
STOP_LIMIT_S = STOP_TIMEOUT_S + 10


def resolve_token(explicit: str | None) -> str | None:
    """``--token``, else ``$AWA_FAST_SERVE_TOKEN`` (an empty variable counts as unset)."""
    if explicit is not None:
        return explicit
    return os.environ.get(security.TOKEN_ENV) or None


def _exit_if_still_running(after_s: int) -> None:
    """End the process if it is still running ``after_s`` seconds from now: SIGALRM's default
    action, which needs no Python thread (works even if something holds the interpreter)."""
    logging.getLogger("uvicorn.error").info(
        "stopping (at most %d s; then the process ends without closing its connections)", after_s
    )
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(after_s)


def run(
    database_url: str,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    read_only: bool = False,
    token: str | None = None,
    startup_s: float | None = None,
) -> None:
    """Serve the dashboard of ``database_url`` on ``host:port`` until SIGINT or SIGTERM, then
    stop gracefully and return (requests in flight get up to ``STOP_TIMEOUT_S``; a stop that
    has not ended after ``STOP_LIMIT_S``, say behind a database that stopped answering, exits
    the process by SIGALRM). The startup waits up to ``startup_s`` (default
    ``reads.STARTUP_S``, 30 s) for the database to accept connections.

    Raises:
        ValueError: the bind rule refuses ``host`` without ``token`` (see
            :func:`awa_fast.web.security.check_bind`).
        awa_fast.web.app.StartupError: the database accepted no connection within the
            startup bound (uvicorn logs no traceback for it).
        SystemExit: 3 when the server cannot start otherwise, e.g. the port is taken (uvicorn
            says why).
    """
    import uvicorn

    from awa_fast.web.app import create_app

    reason = security.check_bind(host, token)
    if reason is not None:
        raise ValueError(reason)

    class GracefulServer(uvicorn.Server):
        # uvicorn re-raises a caught signal after its shutdown (SIGTERM: exit 143) and turns a
        # second Ctrl-C into a force exit that skips the lifespan shutdown, so the pools are
        # then closed while asyncio.run cancels everything (a logged traceback). Here every
        # SIGINT/SIGTERM asks for the same graceful stop; a repeat only says it is under way.
        def handle_exit(self, sig, frame) -> None:
            if self.should_exit:
                logging.getLogger("uvicorn.error").info("already stopping (graceful)")
            else:
                _exit_if_still_running(STOP_LIMIT_S)
            self.should_exit = True

    app = create_app(database_url, read_only=read_only, token=token, startup_s=startup_s)
    app.state.startup_error = None

    async def asgi(scope, receive, send):
        # A startup that found no database is reported by the caller on one line (the
        # StartupError raised below): uvicorn would log Starlette's traceback of it.
        async def quiet_send(message):
            if message["type"] == "lifespan.startup.failed" and app.state.startup_error:
                message = {**message, "message": ""}
            await send(message)

        await app(scope, receive, quiet_send if scope["type"] == "lifespan" else send)

    config = uvicorn.Config(
        asgi,
        host=host,
        port=port,
        log_level="info",
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=STOP_TIMEOUT_S,
    )
    server = GracefulServer(config)
    try:
        server.run()
    except SystemExit:  # uvicorn's own exit 3 after a failed lifespan startup
        if app.state.startup_error is not None:
            raise app.state.startup_error from None
        raise
    if not server.started:
        if app.state.startup_error is not None:
            raise app.state.startup_error
        sys.exit(3)  # as uvicorn.run: the server could not start
