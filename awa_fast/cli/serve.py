"""``awa-fast serve``: the web dashboard (:mod:`awa_fast.web`)."""

from __future__ import annotations

import asyncio
import sys
import time

from awa_fast.cli.errors import CliError
from awa_fast.cli.output import PROG
from awa_fast.cli.session import Session, probe
from awa_fast.cli.table import Command, Common, arg


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
    asyncio.run(probe(url, need_schema=True, source=s.url_source, wait_s=reads.STARTUP_S))
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


SERVE = Command(
    "serve",
    cmd_serve,
    help="run the web dashboard",
    description="Serve the web dashboard: queues, jobs, lineage, DLQ, failure "
    "consequences, cron schedules, workers. Binding a non-loopback "
    "host needs a token (exit 2 otherwise). At startup it waits up to 30 s for the "
    "database to accept connections. See docs/dashboard.md.",
    epilog="exit status: 0 stopped by SIGINT/SIGTERM; 1 the database accepted no "
    "connection within 30 s of startup (one line on stderr says so), refused the login, "
    "or is not migrated; 2 usage error; 3 the server could not start (e.g. the port is "
    "taken; uvicorn says why).",
    common=Common(json=False),
    args=(
        arg(
            "--host",
            default="127.0.0.1",
            help="address to bind (default: 127.0.0.1; anything else needs a token)",
        ),
        arg("--port", type=int, default=8080, help="port to bind (default: 8080)"),
        arg("--read-only", action="store_true", help="hide admin actions and refuse them with 403"),
        arg(
            "--token",
            default=None,
            help="access token every request must carry (bearer header or login form; "
            "default: $AWA_FAST_SERVE_TOKEN)",
        ),
    ),
)
