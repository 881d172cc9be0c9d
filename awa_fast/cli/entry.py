"""The CLI's entry point: parse, run the command's handler (a coroutine in one event loop,
uvloop when available), and turn every error into its one line and exit status."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from awa_fast.cli.errors import CliError, UsageError
from awa_fast.cli.output import PROG, drop_stdout, print_error
from awa_fast.cli.parser import build_parser
from awa_fast.cli.session import Session

INTERRUPT_GRACE_S = 5.0  # after Ctrl-C: how long closing the connections may take


# global options that take a value
_GLOBAL_VALUED = ("--database-url", "--log-format", "--schema")


def bench_at(argv: Sequence[str]) -> int | None:
    """The index of the ``bench`` command in ``argv`` when it is the command (after any global
    options, abbreviated or not), else None."""
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "bench":
            return i
        elif arg.startswith("--") and len(arg) >= 3:
            skip = "=" not in arg and any(o.startswith(arg) for o in _GLOBAL_VALUED)
        else:
            return None
    return None


def json_requested(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for ``--json`` (or an abbreviation argparse accepts, or a
    ``--json=...`` argparse will refuse) before a ``--``, for what happens before the arguments
    are parsed: ``--version``, usage errors."""
    for arg in argv:
        if arg == "--":
            return False
        name = arg.split("=", 1)[0]
        if len(name) >= 3 and "--json".startswith(name):
            return True
    return False


def _exit_if_still_running(after_s: float) -> None:
    """Exit the process with 130 if it is still running ``after_s`` seconds from now."""

    def give_up() -> None:
        print(f"{PROG}: interrupted; the connections did not close in time", file=sys.stderr)
        os._exit(130)

    timer = threading.Timer(after_s, give_up)
    timer.daemon = True
    timer.start()


def _run_async(fn: Callable[[Session], Any], session: Session) -> int:
    async def runner() -> int:
        # Ctrl-C: the runner's handler cancels this task; what follows is bounded. The cancel
        # may not even reach it (psycopg_pool's connect task catches cancels and retries, and
        # the runner then waited for it forever), so the bound starts from the signal itself.
        runner_handler = signal.getsignal(signal.SIGINT)
        if callable(runner_handler):

            def on_sigint(signum, frame) -> None:
                _exit_if_still_running(INTERRUPT_GRACE_S)
                runner_handler(signum, frame)

            signal.signal(signal.SIGINT, on_sigint)
        try:
            return await fn(session)
        finally:
            await session.close()

    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        return asyncio.run(runner())
    return uvloop.run(runner())


def _usage_error(exc: UsageError, json_output: bool) -> int:
    """Report a usage error as argparse does (its usage line, then ``prog: error: message``),
    or with ``json_output`` as one JSON object; returns exit status 2."""
    if json_output:
        usage = exc.parser.format_usage().strip()
        print_error(exc.message, json_output=True, kind="UsageError", usage=usage)
    else:
        exc.parser.print_usage(sys.stderr)
        print(f"{exc.parser.prog}: error: {exc.message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); returns the exit status (see the
    module docstring). Errors are reported on stderr, not raised; a Ctrl-C returns 130."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # during the command, or before it (parsing the arguments)
        print(file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    import psycopg

    from awa_fast import db_errors
    from awa_fast.embedded import EmbeddedPostgresError
    from awa_fast.errors import AwaError

    # A terminal that cannot show a character (PYTHONIOENCODING=ascii, a C locale) gets an
    # escape for it instead of a UnicodeEncodeError traceback in the middle of the output.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    at = bench_at(argv)
    if at is not None:
        # Everything after 'bench' belongs to the suite's own parser (argparse's REMAINDER
        # would not pass leading options such as --help through).
        argv = [*argv[: at + 1], "--", *argv[at + 1 :]]
    json_output = json_requested(argv)  # the parse may fail before it reaches --json
    try:
        args = build_parser(json_output=json_output).parse_args(argv)
    except UsageError as exc:
        return _usage_error(exc, json_output)
    if args.log_format == "json":  # text: Python's default (warnings and errors, bare)
        from awa_fast import log_format

        log_format.configure("json", "warning")
    session = Session(args)

    def error(message: str, exc: BaseException) -> int:
        status = session.fail(message, kind=type(exc).__name__, log_format=args.log_format)
        if session.debug and not session.json:
            from awa_fast.app_loader import format_traceback

            print(format_traceback(exc), file=sys.stderr)
        return status

    func = args.func
    try:
        if getattr(args, "schema", None) is not None:
            # --schema: every client, connection, dashboard and worker child this command
            # makes uses that schema (schema_binding.resolve reads the variable)
            from awa_fast import schema_binding

            schema_binding.check_name(args.schema, "--schema")
            os.environ[schema_binding.ENV] = args.schema
        if asyncio.iscoroutinefunction(func):
            return _run_async(func, session)
        return func(session)
    except UsageError as exc:  # a check of the arguments that argparse could not make
        return _usage_error(exc, session.json)
    except (CliError, AwaError, EmbeddedPostgresError) as exc:
        return error(str(exc) or type(exc).__name__, exc)
    except UnicodeEncodeError as exc:
        # A byte that is not UTF-8 in an argument (argv keeps it as a lone surrogate) or a
        # "\ud800" in JSON: no text the database can store.
        return error(f"an argument is not valid UTF-8 text: {exc.object[:60]!r}", exc)
    except psycopg.Error as exc:  # a statement of the CLI's own: one line, as the client's
        msg = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, psycopg.OperationalError) and msg.startswith("connection failed"):
            return error(f"could not connect to the database: {msg}", exc)
        typed = db_errors.translate(exc, _command_name(func))
        return error(str(typed), typed)
    except BrokenPipeError:
        # stdout closed early (e.g. `| head`): exit quietly
        drop_stdout()
        return 1


def _command_name(func: Any) -> str:
    """The command a handler runs, as typed (``cmd_queue_pause`` -> ``"queue pause"``)."""
    return getattr(func, "__name__", "command").removeprefix("cmd_").replace("_", " ")
