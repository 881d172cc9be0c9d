"""``awa-fast serve``: run the dashboard with uvicorn.

Binds 127.0.0.1:8080 by default. Binding any non-loopback host needs a token (``--token`` or
``$AWA_FAST_SERVE_TOKEN``); without one the command exits 2 before touching the database.
"""

from __future__ import annotations

import os

from awa_fast.web import security

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def resolve_token(explicit: str | None) -> str | None:
    """``--token``, else ``$AWA_FAST_SERVE_TOKEN`` (an empty variable counts as unset)."""
    if explicit is not None:
        return explicit
    return os.environ.get(security.TOKEN_ENV) or None


def run(
    database_url: str,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    read_only: bool = False,
    token: str | None = None,
) -> None:
    """Serve the dashboard of ``database_url`` on ``host:port`` until interrupted.

    Raises:
        ValueError: the bind rule refuses ``host`` without ``token`` (see
            :func:`awa_fast.web.security.check_bind`).
    """
    import uvicorn

    from awa_fast.web.app import create_app

    reason = security.check_bind(host, token)
    if reason is not None:
        raise ValueError(reason)
    app = create_app(database_url, read_only=read_only, token=token)
    uvicorn.run(
        app, host=host, port=port, log_level="info", proxy_headers=False, server_header=False
    )
