"""One worker child of the launcher (:mod:`awa_fast.supervisor`): a fresh interpreter that
loads the application's client, starts it, reports its state to the launcher over a pipe and
drains on SIGTERM/SIGINT; and the launcher's preflight (``--check``), which imports the
application once before any child starts. The exit statuses below are the protocol between the
two: the launcher restarts a child that crashed, never one whose configuration cannot run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from awa_fast import log_format as log_format_mod
from awa_fast.app_loader import (
    AppSpecError,
    debug_requested,
    exits_at_import,
    format_traceback,
    import_failure,
    load_client,
    one_line,
    start_config_error,
    start_options,
)
from awa_fast.errors import (
    DatabaseError,
    QueueMismatchWarning,
    ReadOnlyDatabase,
    SchemaNotMigrated,
    ValidationError,
)
from awa_fast.launcher_config import parse_queues_arg

if TYPE_CHECKING:
    from awa_fast.client import AsyncClient


# How long the preflight tries a database that is not up (refused, starting up) before the
# launcher gives up, once, without starting a child; and the pause between its tries.
PREFLIGHT_DATABASE_WAIT_S = 5.0
EXIT_BAD_APP = 78  # child: the module:client spec cannot be resolved (not retried)
EXIT_BAD_CONFIG = 77  # child: start() rejected the configuration or schema (not retried)
EXIT_IMPORT_FAILED = 76  # child: importing the application raised (not retried)
EXIT_NO_DATABASE = 69  # child: the database could not be reached within CONNECT_TIMEOUT_S
CONNECT_TIMEOUT_S = 10  # a child's first connection (unless the URL sets connect_timeout)
CHILD_REPORT_S = 0.25
PROBE_RETRY_S = 0.5
# libpq's texts of a server that answered but takes no connection yet (no SQLSTATE on connect)
_NOT_YET = ("starting up", "shutting down", "in recovery", "too many clients")
# The database URL a child gets from the launcher: in its environment, not its argv, where
# `ps` would show any local user the password.
CHILD_DATABASE_URL_ENV = "AWA_FAST_CHILD_DATABASE_URL"
# `awa-fast --schema s worker`: a child moves the application's client to schema s, whatever
# the client was built with (as --database-url overrides its URL).
CHILD_SCHEMA_ENV = "AWA_FAST_CHILD_SCHEMA"
# Prefixes the preflight's one result line on its stdout, which the application may write to.
PREFLIGHT_MARK = "awa-fast-preflight: "


def _child_logging(index: int, level: str, log_format: str = "text") -> None:
    pid = os.getpid()
    log_format_mod.configure(
        log_format,
        level,
        static={"child": index, "pid": pid},
        text_format=f"%(asctime)s [child {index} pid {pid}] %(levelname)s %(name)s: %(message)s",
    )


class _Reporter:
    def __init__(self, fd: int | None):
        self._file = os.fdopen(fd, "w", buffering=1) if fd is not None else None

    def send(self, **msg: Any) -> bool:
        """Send ``msg`` to the launcher; False when there is none to read it (any more)."""
        if self._file is None:
            return False
        try:
            self._file.write(json.dumps(msg) + "\n")
        except (OSError, ValueError):  # parent gone: keep working, stop reporting
            self._file = None
            return False
        return True


def _fatal(log: logging.Logger, reporter: _Reporter, message: str, exc: BaseException) -> None:
    """Report a fatal-at-start error (the child exits with a code the launcher does not
    restart) to the launcher, which prints it once; this child logs it only when no launcher
    reads its report, and logs the traceback with ``$AWA_FAST_DEBUG`` (``--traceback``)."""
    message = one_line(message)
    if not reporter.send(event="error", error=message):
        log.error("%s", message)
    if debug_requested():
        log.error("traceback of the error above:\n%s", format_traceback(exc))


def _runtime_status(client: AsyncClient) -> dict:
    rt = client.runtime
    if rt is None:
        return {"leader": False, "in_flight": 0}
    leader = bool(rt.maintenance is not None and rt.maintenance.is_leader)
    stats = rt.finalizer.stats if rt.finalizer is not None else {}
    return {
        "leader": leader,
        "in_flight": len(rt.in_flight),
        "outcomes": dict(rt.outcomes),
        "follow_ups_inserted": stats.get("follow_ups_inserted", 0),
        "follow_ups_skipped": stats.get("follow_ups_skipped", 0),
    }


async def _child_main(
    args: argparse.Namespace, reporter: _Reporter, stopped_early: list[int]
) -> int:
    log = logging.getLogger("awa_fast.worker")
    from awa_fast.worker import liveness

    # A child may end itself when a lease ends on a blocked loop: the launcher restarts it.
    liveness.EXIT_ON_BLOCKED_EXPIRY = True
    # Taken before the application imports: not for processes it starts.
    database_url = os.environ.pop(CHILD_DATABASE_URL_ENV, None)
    schema = os.environ.pop(CHILD_SCHEMA_ENV, None)
    try:
        client, module = load_client(args.app)
    except AppSpecError as exc:
        _fatal(log, reporter, str(exc), exc)
        return EXIT_BAD_APP
    except Exception as exc:
        # The preflight imported it in a running loop too, so this fails the same way each
        # time (or is flaky at import): restarting would only repeat it.
        _fatal(log, reporter, import_failure(args.app, exc), exc)
        return EXIT_IMPORT_FAILED
    if database_url:
        client.database_url = database_url
    if schema:
        client.schema = schema
    queues = parse_queues_arg(args.queues)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if stopped_early:  # stopped while importing the application: nothing started, nothing to drain
        log.info("stopped before starting (signal %s)", stopped_early[0])
        return 0
    try:
        await _reach_database(await client._resolved_url())
    except OSError as exc:
        # The preflight reached it: it went away since (restarted, as a crash is)
        _fatal(log, reporter, str(exc), exc)
        return EXIT_NO_DATABASE
    refused = await _start_client(client, module, queues, reporter, log)
    if refused is not None:
        return refused
    await _report_until_stopped(client, reporter, stop, log)
    return await _drain_client(client, args.drain_timeout, reporter, log)


async def _start_client(
    client: AsyncClient, module: Any, queues: Any, reporter: _Reporter, log: logging.Logger
) -> int | None:
    """``client.start()`` with the application's options: None once started, else the exit
    status of a configuration the child cannot run (not restarted)."""
    import psycopg  # the launcher itself imports no driver

    # The launcher's preflight showed start()'s QueueMismatchWarnings once: not once per child.
    warnings.filterwarnings(
        "ignore", message=r"start\(\) serves |periodic job ", category=QueueMismatchWarning
    )
    try:
        options = start_options(module)
        if queues is not None:  # --queues: this child deliberately works a subset of the queues
            options.setdefault("queue_subset", True)
        await client.start(queues, **options)
    except (ValidationError, SchemaNotMigrated) as exc:
        # ConfigError, or another of awa's ValidationErrors (a bad name, a schedule): the same
        # each time, so not restarted
        _fatal(log, reporter, f"cannot start: {exc}", exc)
        await client.close()
        return EXIT_BAD_CONFIG
    except DatabaseError as exc:
        # The role may not write (or lacks an object, or the server is a read-only standby):
        # a restart would fail the same way, so it is the configuration, not a crash.
        if not (
            isinstance(exc, ReadOnlyDatabase) or isinstance(exc.__cause__, psycopg.ProgrammingError)
        ):
            raise
        said = str(exc.__cause__ or exc)  # the server's own words
        _fatal(log, reporter, f"cannot start: the database refused it: {said}", exc)
        await client.close()
        return EXIT_BAD_CONFIG
    assert client.runtime is not None
    names = ",".join(f"{q.name}:{q.max_workers}" for q in client.runtime.queues)
    log.info("started (queues: %s)", names)
    reporter.send(event="ready", queues=names)
    return None


async def _report_until_stopped(
    client: AsyncClient, reporter: _Reporter, stop: asyncio.Event, log: logging.Logger
) -> None:
    """Send the launcher this child's status (at least once a second, and at once when its
    leadership changes) until a stop signal, or until the launcher is gone."""
    last: dict = {}
    last_sent = 0.0
    parent = os.getppid()
    while not stop.is_set():
        if os.getppid() != parent:
            log.warning("the launcher (pid %s) is gone; draining", parent)
            return
        status = _runtime_status(client)
        now = time.monotonic()
        if status.get("leader") != last.get("leader") or now - last_sent >= 1.0:
            reporter.send(event="status", **status)
            last, last_sent = status, now
        try:
            await asyncio.wait_for(stop.wait(), CHILD_REPORT_S)
        except TimeoutError:
            pass


async def _drain_client(
    client: AsyncClient, drain_timeout_s: float, reporter: _Reporter, log: logging.Logger
) -> int:
    """Drain (up to ``drain_timeout_s`` seconds) and close; a def handler's thread still
    running after it ends the process without it."""
    log.info("draining (timeout %g s)", drain_timeout_s)
    reporter.send(event="draining")
    runtime = client.runtime
    await client.shutdown(timeout_ms=int(drain_timeout_s * 1000))
    await client.close()
    lingering = runtime.lingering if runtime is not None else None
    left = lingering.running_job_ids() if lingering is not None else []
    if left:
        # A def handler's thread cannot be stopped, and the interpreter's exit would wait for
        # it past --drain-timeout (until the launcher's SIGKILL): end the process instead.
        log.warning(
            "%d def handler thread(s) still running after the drain: exiting without them; "
            "their attempts stay 'running' until heartbeat rescue takes them (after "
            "heartbeat_staleness_ms): job ids %s",
            len(left),
            ", ".join(map(str, left[:20])),
            extra={"left_running": len(left), "left_running_job_ids": left},
        )
        log.info("stopped")
        _exit_now(0)
    log.info("stopped")
    return 0


def _exit_now(code: int) -> None:
    """End the process at once with ``code``, skipping the interpreter's exit (which joins
    every handler thread), after flushing the logs."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


async def _reach_database(url: str, *, wait_s: float = 0.0, need_schema: bool = False) -> None:
    """One connection within ``CONNECT_TIMEOUT_S`` (unless the URL sets ``connect_timeout``),
    so an unreachable database makes the child exit at once instead of waiting in the pool.
    With ``wait_s``, a server that cannot be reached or is not up yet is tried again every
    ``PROBE_RETRY_S`` for up to that many seconds (one that refuses the login fails at once);
    with ``need_schema``, the ``awa_fast`` schema must be there and current.

    Raises:
        OSError: the database cannot be reached (one line: where and why).
        SchemaNotMigrated: ``need_schema`` and the schema is missing or older.
    """
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from awa_fast import schema
    from awa_fast.pg_connection import Connection

    kwargs: dict[str, Any] = {}
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise OSError(f"invalid database URL: {one_line(str(exc))}") from None
    if "connect_timeout" not in info:
        kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
    started = time.monotonic()
    while True:
        try:
            conn = await Connection.connect(url, **kwargs)
            break
        except psycopg.OperationalError as exc:
            text = str(exc)
            # the server answered and refuses this login (no such role or database, a wrong
            # password, pg_hba): waiting does not help; "starting up" and the like may
            refused = "FATAL:" in text and not any(r in text for r in _NOT_YET)
            tried = time.monotonic() - started
            if not refused and tried + PROBE_RETRY_S < wait_s:
                await asyncio.sleep(PROBE_RETRY_S)  # nothing signals a database coming up
                continue
            where = f"{info.get('host', 'localhost')}:{info.get('port', 5432)}"
            waited = f" (tried for {tried:.0f} s)" if wait_s and tried >= 1 else ""
            raise OSError(
                f"cannot reach the database at {where}{waited}: {one_line(text)}"
            ) from None
    async with conn:
        if need_schema:
            await schema.check_current(conn)


def _check_app(app: str, queues: str | None) -> int:
    """The launcher's preflight (``--check``): import the application once, inside a running
    event loop as the children do (a module that calls ``asyncio.run`` at import fails here, not
    in every child), check that ``start()`` would accept its ``START_OPTIONS`` and ``queues``,
    reach the database when a URL is known here (the launcher's ``--database-url``, the
    client's, the environment's; the embedded server is the launcher's to start), and print
    ``{"explicit_url": bool}``. A bad spec prints its message on stderr and exits
    EXIT_BAD_APP; an import that raises prints one line (the traceback too with
    ``$AWA_FAST_DEBUG``) and exits 1; a configuration ``start()`` would reject, or a schema
    that is missing or old, prints why and exits EXIT_BAD_CONFIG; a database that cannot be
    reached within ``PREFLIGHT_DATABASE_WAIT_S`` prints why and exits EXIT_NO_DATABASE."""
    from awa_fast.database_url import from_environment

    # Taken before the application imports, as in a child.
    launcher_url = os.environ.pop(CHILD_DATABASE_URL_ENV, None)

    async def load() -> tuple[Any, Any]:
        return load_client(app)

    try:
        client, module = _event_loop_runner()(load())
    except AppSpecError as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_APP
    except SystemExit as exc:  # the module ends its program at import
        print(exits_at_import(app, exc), file=sys.stderr)
        return 1
    except Exception as exc:
        print(import_failure(app, exc), file=sys.stderr)
        if debug_requested():
            print(format_traceback(exc), file=sys.stderr)
        return 1
    # What start() would warn about (QueueMismatchWarning), recorded here and shown once by the
    # launcher; the children do not repeat it (_child_main). The warning filters apply
    # (PYTHONWARNINGS=ignore silences it).
    with warnings.catch_warnings(record=True) as caught:
        error = start_config_error(client, module, parse_queues_arg(queues))
    if error is not None:
        print(f"start() would reject this configuration: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    # Once here rather than in every child, each restarted: a database that cannot be reached
    # is reported once and no child starts.
    url = launcher_url or client.explicit_database_url or from_environment()
    if url:
        try:
            _event_loop_runner()(
                _reach_database(url, wait_s=PREFLIGHT_DATABASE_WAIT_S, need_schema=True)
            )
        except OSError as exc:
            print(exc, file=sys.stderr)
            return EXIT_NO_DATABASE
        except SchemaNotMigrated as exc:
            print(f"cannot start: {exc}", file=sys.stderr)
            return EXIT_BAD_CONFIG
    shown = [
        f"{w.category.__name__}: {w.message}"
        for w in caught
        if issubclass(w.category, QueueMismatchWarning)
    ]
    # On a line of its own (an application may have written to stdout without a newline), to
    # the real stdout (it may have pointed sys.stdout elsewhere).
    result = json.dumps(
        {"explicit_url": client.explicit_database_url is not None, "warnings": shown}
    )
    print(f"\n{PREFLIGHT_MARK}{result}", file=sys.__stdout__, flush=True)
    return 0


def _event_loop_runner() -> Callable:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        return asyncio.run
    return uvloop.run


def child_entry(argv: list[str], stopped_early: list[int] | None = None) -> int:
    """Entry point of one worker child (``python -m awa_fast.supervisor --child ...``).
    ``stopped_early``: the stop signals received before this was called (``_CHILD_BOOT``
    records them from its first line); later ones until the event loop's handlers are in
    place are added to it."""
    p = argparse.ArgumentParser(prog="awa-fast-worker-child")
    p.add_argument("--child", action="store_true")
    p.add_argument("--check", action="store_true")
    p.add_argument("--app", required=True)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--queues")
    p.add_argument("--drain-timeout", type=float, default=10.0)
    p.add_argument("--status-fd", type=int)
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-format", default="text", choices=log_format_mod.FORMATS)
    args = p.parse_args(argv)
    if args.check:
        return _check_app(args.app, args.queues)
    # A drain asked for while the application still imports (before the loop's handlers):
    # recorded, and the child exits 0 without starting, as a drain would.
    early = stopped_early
    if early is None:  # not started through _CHILD_BOOT, which records them from its first line
        early = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: early.append(signum))
    _child_logging(args.index, args.log_level, args.log_format)
    reporter = _Reporter(args.status_fd)
    runner = _event_loop_runner()
    try:
        return runner(_child_main(args, reporter, early))
    except KeyboardInterrupt:
        return 130
    except Exception:
        logging.getLogger("awa_fast.worker").exception("worker child failed")
        return 1
