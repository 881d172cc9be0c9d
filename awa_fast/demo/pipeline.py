"""The demo's two stages: the job kinds, their args, their handlers and the client the worker
children load (``awa_fast.demo:client``); see :mod:`awa_fast.demo` for the pipeline."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import sysconfig
import warnings

import awa_fast as awa
from awa_fast.errors import TerminalError
from awa_fast.sql import demo as dsql

DEMO_QUEUE = "demo"
KIND_PARSE = "demo_parse_imports"
KIND_RESOLVE = "demo_resolve_module"
KINDS = (KIND_PARSE, KIND_RESOLVE)
MAX_STAGED = 16  # ADR-046
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}

# Parsing old or deliberately odd files warns (invalid escapes...): not the demo's business.
warnings.filterwarnings("ignore", category=SyntaxWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)


@dataclasses.dataclass
class ParseImports:
    """Stage A: parse ``path``; stage B jobs for its distinct imported modules from ``offset``."""

    path: str
    offset: int = 0


@dataclasses.dataclass
class ResolveModule:
    """Stage B: resolve the top-level module ``name``."""

    name: str


# The worker children load this client (``awa_fast.demo:client``); the launcher passes the
# database URL with --database-url.
client = awa.AsyncClient(max_connections=8)
START_OPTIONS = {"poll_interval_ms": 100, "leader_election_interval_ms": 1000}


# ---------------------------------------------------------------------------------------------
# the stages


def imported_modules(source: bytes, filename: str = "<unknown>") -> list[str]:
    """Sorted distinct top-level names of the absolute imports in ``source``.

    Raises:
        SyntaxError, ValueError: ``source`` does not parse (bad syntax, encoding, NUL bytes).
    """
    tree = ast.parse(source, filename=filename)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return sorted(names)


def file_modules(path: str) -> list[str]:
    """:func:`imported_modules` of the file ``path``.

    Raises:
        TerminalError: the file cannot be read or parsed (message names the file and error).
    """
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        raise TerminalError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        return imported_modules(source, path)
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise TerminalError(f"{path}: {type(exc).__name__}: {exc.msg}{where}") from exc
    except (ValueError, UnicodeError) as exc:
        raise TerminalError(f"{path}: {type(exc).__name__}: {exc}") from exc


def chunk(names: list[str], offset: int) -> tuple[list[str], int | None]:
    """The names an A attempt at ``offset`` stages, and the continuation's offset (or None):
    all the rest if they fit in 16 follow-ups, else 15 plus one continuation."""
    rest = names[offset:]
    if len(rest) <= MAX_STAGED:
        return rest, None
    return rest[: MAX_STAGED - 1], offset + MAX_STAGED - 1


@client.task(
    ParseImports, kind=KIND_PARSE, queue=DEMO_QUEUE, failure_consequence=awa.NO_FAILURE_CONSEQUENCE
)
def parse_imports(job) -> None:
    """Stage A (a ``def`` handler: parsing is CPU work, it runs in the thread pool)."""
    args = job.args
    names, next_offset = chunk(file_modules(args.path), args.offset)
    for name in names:
        job.enqueue_on_completion(
            ResolveModule(name), kind=KIND_RESOLVE, queue=DEMO_QUEUE, priority=1, unique_opts={}
        )
    if next_offset is not None:
        job.enqueue_on_completion(
            ParseImports(args.path, next_offset), kind=KIND_PARSE, queue=DEMO_QUEUE
        )


def resolve(name: str) -> tuple[bool, str | None, int | None]:
    """``(found, origin, size in bytes of the origin file or None)`` of top-level ``name``."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False, None, None
    if spec is None:
        return False, None, None
    origin = spec.origin
    size = None
    if origin and os.path.isfile(origin):
        size = os.path.getsize(origin)
    elif origin is None and spec.submodule_search_locations:
        origin = "namespace package"
    return True, origin, size


@client.task(
    ResolveModule,
    kind=KIND_RESOLVE,
    queue=DEMO_QUEUE,
    failure_consequence=awa.NO_FAILURE_CONSEQUENCE,
)
async def resolve_module(job) -> None:
    """Stage B: resolve the module and record the result (idempotent upsert)."""
    found, origin, size = resolve(job.args.name)
    pool = await client.pool()
    async with pool.connection() as conn:
        await conn.execute(dsql.UPSERT_RESULT, (job.args.name, found, origin, size))


def stdlib_files(limit: int | None = None) -> list[str]:
    """The ``.py`` files of this Python's standard library, sorted (``site-packages`` and
    ``__pycache__`` skipped), at most ``limit``."""
    return _walk(sysconfig.get_paths()["stdlib"])[:limit]


def _walk(root: str) -> list[str]:
    if os.path.isfile(root):
        return [os.path.abspath(root)]
    out: list[str] = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        out.extend(os.path.join(d, f) for f in files if f.endswith(".py"))
    return sorted(os.path.abspath(p) for p in out)
