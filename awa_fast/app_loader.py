"""Resolve an application spec ``"package.module:attribute"`` to the client it names."""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
import traceback
from types import ModuleType
from typing import TYPE_CHECKING, Any

from awa_fast.errors import ConfigError

if TYPE_CHECKING:
    from awa_fast.client import AsyncClient


class AppSpecError(Exception):
    """A ``module:attribute`` spec that does not name an ``AsyncClient``."""


# What to do about a module that runs its program at import (the launcher and `check` say it).
MAIN_GUARD_HINT = (
    'Put it under `if __name__ == "__main__":` so that importing it only defines the client'
)


# Set to 1 (or give ``--traceback``) to see the whole traceback of an application's error next to
# its one-line report; the launcher passes it on to the processes it starts.
DEBUG_ENV = "AWA_FAST_DEBUG"
TRACEBACK_HINT = f"run with --traceback (or {DEBUG_ENV}=1) for the whole traceback"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# Where Python's own modules and installed packages live: frames there are not the application's.
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(path)
        for name in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(name))
    }
)


def debug_requested(flag: bool = False) -> bool:
    """Whether an application's error should come with its whole traceback: ``flag``
    (``--traceback``), or ``$AWA_FAST_DEBUG`` set to anything but empty, ``0``, ``false``,
    ``no`` or ``off``."""
    value = os.environ.get(DEBUG_ENV, "").strip().lower()
    return flag or value not in ("", "0", "false", "no", "off")


def one_line(text: str, limit: int = 600) -> str:
    """``text`` with its whitespace runs (newlines, tabs) collapsed to single spaces, cut to
    ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _not_ours(filename: str) -> bool:
    # neither awa_fast nor importlib's frozen frames (<frozen importlib._bootstrap>)
    return not filename.startswith("<frozen ") and not os.path.abspath(filename).startswith(
        _PACKAGE_DIR + os.sep
    )


def _in_application(filename: str) -> bool:
    path = os.path.abspath(filename)
    return _not_ours(filename) and not any(path.startswith(d + os.sep) for d in _LIBRARY_DIRS)


def error_site(exc: BaseException) -> str | None:
    """``file:line`` of the application code that raised ``exc``: the innermost frame of its
    traceback outside awa_fast, the standard library and installed packages (for a
    ``SyntaxError``, the offending line itself); else the innermost outside awa_fast and
    importlib (an application installed as a package); else the innermost; None without one."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    mine = [f for f in frames if _in_application(f.filename)]
    frame = (mine or [f for f in frames if _not_ours(f.filename)] or frames)[-1]
    return f"{frame.filename}:{frame.lineno}"


def describe_error(exc: BaseException) -> str:
    """``exc`` on one line: ``Type: message`` (awa-fast's own errors by their bare name)."""
    message = one_line(str(exc))
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


def import_failure(spec: str, exc: BaseException, *, traceback_hint: bool = True) -> str:
    """The one-line report of importing ``spec`` raising ``exc`` (an application error): what
    failed, the application's line that raised it, a hint where one is known, and (with
    ``traceback_hint``) how to see the traceback (:data:`TRACEBACK_HINT`)."""
    site = error_site(exc)
    where = f" (at {site})" if site else ""
    hint = ""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        hint = f"; is {exc.name!r} installed in this Python ({sys.executable})?"
    elif "cannot be called from a running event loop" in str(exc):
        hint = f"; does the module run its program at import? {MAIN_GUARD_HINT}"
    more = f"; {TRACEBACK_HINT}" if traceback_hint else ""
    return f"importing {spec} failed: {describe_error(exc)}{where}{hint}{more}"


def format_traceback(exc: BaseException) -> str:
    """The whole (chained) traceback of ``exc``, without a trailing newline."""
    return "".join(traceback.format_exception(exc)).rstrip()


def exits_at_import(spec: str, exc: SystemExit) -> str:
    """The message for importing ``spec`` raising ``SystemExit`` (the module called
    ``sys.exit()`` at import)."""
    return (
        f"importing {spec} called sys.exit({exc.code!r}): the module runs its program at "
        f"import. {MAIN_GUARD_HINT}"
    )


def load_client(spec: str) -> tuple[AsyncClient, ModuleType]:
    """Import ``module:attr`` (``attr`` may be dotted) and return ``(client, module)``.

    The module is imported with the clients' construction-time connect deferred
    (:func:`awa_fast.connections.deferred_reachability_check`): a client built at import on a URL
    that ``--database-url`` overrides, or that ``check`` never uses, does not connect.

    Raises:
        AppSpecError: malformed spec, module not found, missing attribute, or not an AsyncClient.
        Exception: whatever importing the module raised (an application error).
    """
    from awa_fast.client import AsyncClient
    from awa_fast.connections import deferred_reachability_check

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppSpecError(f"invalid application {spec!r}: expected 'module:client'")
    if os.getcwd() not in sys.path:  # as `python -m` would
        sys.path.insert(0, os.getcwd())
    try:
        with deferred_reachability_check():
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise AppSpecError(
                f"cannot import module {module_name!r}: {exc} (searched the "
                f"current directory {os.getcwd()}, then sys.path)"
            ) from exc
        raise
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppSpecError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, AsyncClient):
        name = type(obj).__name__
        article = "an" if name[:1].lower() in "aeiou" else "a"
        raise AppSpecError(f"{spec} is {article} {name}, not an awa_fast AsyncClient")
    return obj, module


def start_options(module: Any) -> dict:
    """The module's ``START_OPTIONS`` (keywords for ``client.start()``), or ``{}``.

    Raises:
        ConfigError: it gives ``queues``, which the launcher passes itself (``--queues``).
    """
    options = dict(getattr(module, "START_OPTIONS", None) or {})
    if "queues" in options:
        # start(queues, **options) got queues twice: a raw TypeError
        raise ConfigError(
            "START_OPTIONS may not give queues: awa-fast worker passes start() the queues of "
            "--queues name:max_workers,... (else the client's registered queues); remove "
            "'queues' from START_OPTIONS and give them with --queues",
            field="queues",
            limit="not in START_OPTIONS; use --queues",
        )
    return options


def start_config_error(
    client: AsyncClient, module: ModuleType, queues: list[tuple[str, int]] | None = None
) -> str | None:
    """What ``client.start(queues, **START_OPTIONS)`` would reject before touching the database
    (a ``ConfigError``, message prefixed by its field, or a bad keyword), else ``None``. Used by
    ``awa-fast check`` and by the launcher's preflight, so both refuse the same configurations.

    ``queues`` as ``awa-fast worker --queues`` gives them (the launcher then starts a queue
    subset, as its children do)."""
    try:
        options = start_options(module)
        if queues is not None:
            options.setdefault("queue_subset", True)
        client._start_config(queues, options)
    except (TypeError, ValueError) as exc:  # ConfigError is a ValueError
        field = getattr(exc, "field", None)
        return f"{field}: {exc}" if field else str(exc)
    return None
