"""``awa-fast worker``: run an application's handlers in N worker processes (the launcher,
:class:`~awa_fast.supervisor.Supervisor`)."""

from __future__ import annotations

import os

from awa_fast.cli.options import WORKER_DB_HELP, port, positive_float, positive_int
from awa_fast.cli.session import Session
from awa_fast.cli.table import Command, Common, arg


def cmd_worker(s: Session) -> int:
    from awa_fast.launcher_child import CHILD_SCHEMA_ENV
    from awa_fast.launcher_config import launcher_config
    from awa_fast.supervisor import Supervisor

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


PROCESSES = arg(
    "--processes",
    type=positive_int,
    default=None,
    metavar="N",
    help=f"worker processes (default: one per core, {os.cpu_count() or 1} here)",
)

WORKER = Command(
    "worker",
    cmd_worker,
    help="run an application's workers in N processes (the launcher)",
    description="Run the registered handlers of an application's AsyncClient "
    "in worker processes\n(one per core by default). APP is "
    "module:attribute, e.g. myapp.jobs:client; the module may\n"
    "define START_OPTIONS, a dict of keywords for client.start() "
    "(poll_interval_ms, ...;\nnot queues: give them with --queues).\nEach child runs uvloop and "
    "opens its own connections. The launcher restarts a crashed child\n"
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
    raw=True,
    common=Common(db_help=WORKER_DB_HELP, json=False),
    args=(
        arg("app", metavar="APP", help="module:client, an awa_fast.AsyncClient"),
        PROCESSES,
        arg(
            "--queues",
            metavar="NAME:N,...",
            help="queues and max workers per process, e.g. default:10,emails:4 "
            "(default: the client's registered queues, 10 workers each)",
        ),
        arg(
            "--drain-timeout",
            type=positive_float,
            default=10.0,
            metavar="SECONDS",
            help="on SIGTERM/SIGINT, let in-flight jobs finish for up to this long (default: "
            "10); a def handler still running then is left for heartbeat rescue",
        ),
        arg(
            "--status-interval",
            type=positive_float,
            default=10.0,
            metavar="SECONDS",
            help="print a status line per child this often (default: 10)",
        ),
        arg(
            "--log-level",
            default="info",
            choices=("debug", "info", "warning", "error"),
            help="log level of the worker processes (default: info)",
        ),
        arg(
            "--metrics-port",
            type=port,
            default=None,
            metavar="PORT",
            help="serve Prometheus metrics of all children, aggregated, at "
            "http://HOST:PORT/metrics (default: none)",
        ),
        arg(
            "--metrics-host",
            default=None,
            metavar="HOST",
            help="address of the metrics endpoint (default: 127.0.0.1)",
        ),
    ),
)
