"""Every code name the design docs put in backticks exists in the code.

Scans docs/architecture.md and docs/adr/*.md (fenced blocks excluded) for the name shapes that
can be checked without guessing, and asserts each resolves:

* a file path ending in ``.py`` / ``.pml`` / ``.pyx`` / ``.sql`` (``awa_fast/metrics.py``,
  ``worker/aging.py``, ``models/settlement.pml``): a tracked file whose path ends with it;
* ``sql.NAME`` / ``sql.dashboard.NAME``: an attribute of that ``awa_fast.sql`` module;
* ``module.name`` where ``module`` is an ``awa_fast`` module (``enqueue.insert_follow_ups``):
  an attribute of that module (``client``/``job`` are skipped: the docs use them as instances; ``awa_fast.x``
  too: it names a table of the SQL schema);
* ``Class.member`` (``Finalizer.finalize``, ``Runtime.shutdown(timeout_ms)``): a class defined
  in ``awa_fast`` with that attribute, or a ``self.member`` assigned in its methods;
* an upper-case name with an underscore (``OWE_FAILURE``, ``AWA_PG_BINDIR``), a class-like
  name (``OverflowPool``, ``AttemptStillRunning``), or a lower-case
  one (``insert_follow_ups``, ``heartbeat_staleness_ms``, ``consequence_pending``): the word
  occurs in the code (Python, Cython, SQL or model sources, tests), not only in the docs. A
  Prometheus counter may be named with the ``_total`` suffix its client adds; awa-pg's own
  table names (``FOREIGN``) are not ours to check.

Fenced blocks (diagrams, the data flow) are scanned too, for the shapes prose in them cannot
take by accident: file paths, ``sql.NAME`` and ``Class.member``.

The module tree of docs/architecture.md ("## Modules") is read as a tree: every entry is a
file or directory that exists at that place, and every module of the package (``awa_fast/**.py``
and the Cython sources ``_ext/*.pyx``) has an entry, so a new module cannot go undocumented.

No database and no network: modules are imported, nothing is started.
"""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "architecture.md", *sorted((ROOT / "docs" / "adr").glob("*.md"))]
CODE_SUFFIXES = {".py", ".pyx", ".pxd", ".sql", ".pml"}
CODE_DIRS = ("awa_fast", "_ext", "bench", "models", "tests")
FOREIGN = {"jobs_hot", "scheduled_jobs"}  # awa-pg's tables, named in ADR 001
# module names the docs also use for an instance, or (awa_fast) as the SQL schema
INSTANCE_NAMES = {"client", "job", "awa_fast"}

FILE = re.compile(r"^[\w./-]+\.(py|pml|pyx|sql)$")
SQL_NAME = re.compile(r"^sql\.(?:(\w+)\.)?([A-Z][A-Z0-9_]*)$")
MODULE_NAME = re.compile(r"^([a-z_][a-z0-9_]*)\.([A-Za-z_]\w*)(?:\(.*\))?$")
CLASS_MEMBER = re.compile(r"^([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)\.([A-Za-z_]\w*)(?:\(.*\))?$")
CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
CAMEL = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+$")
SNAKE = re.compile(r"^([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?:\(.*\))?$")


def _backticked() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
        for name in re.findall(r"`([^`\n]+)`", text):
            found.append((doc.name, name.strip()))
    return found


@cache
def _code_files() -> tuple[Path, ...]:
    return tuple(
        p
        for d in CODE_DIRS
        if (ROOT / d).is_dir()
        for p in (ROOT / d).rglob("*")
        if p.suffix in CODE_SUFFIXES
        and "__pycache__" not in p.parts
        and p.name != Path(__file__).name
    )


@cache
def _code_text() -> str:
    return "\n".join(p.read_text(errors="replace") for p in _code_files())


@cache
def _modules() -> dict[str, str]:
    """Short module name -> dotted name, for awa_fast's modules; a top-level module wins over
    a same-named one in a subpackage (``embedded`` is the awa_fast.embedded package, not cli/embedded.py)."""
    mods = {}
    found = []
    for p in (ROOT / "awa_fast").rglob("*.py"):
        rel = p.relative_to(ROOT).with_suffix("")
        found.append(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
    for parts in sorted(found, key=lambda parts: (len(parts), parts)):
        mods.setdefault(parts[-1], ".".join(parts))
    return mods


@cache
def _classes() -> dict[str, list[tuple[str, set[str]]]]:
    """Class name -> [(module, names assigned as ``self.x`` in its methods or annotated in
    its body)]."""
    classes: dict[str, list[tuple[str, set[str]]]] = {}
    for p in (ROOT / "awa_fast").rglob("*.py"):
        module = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                attrs = {
                    t.attr
                    for n in ast.walk(node)
                    for t in getattr(n, "targets", []) + [getattr(n, "target", None)]
                    if isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                }
                # dataclass / annotated fields without a default are not class attributes
                attrs |= {
                    n.target.id
                    for n in node.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                }
                classes.setdefault(node.name, []).append((module, attrs))
    return classes


def _has_file(name: str) -> bool:
    tracked = [
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob(Path(name).name)
        if ".git" not in p.parts and "__pycache__" not in p.parts
    ]
    return any(t == name or t.endswith("/" + name) for t in tracked)


def _fenced() -> list[tuple[str, str]]:
    """Names of the checkable shapes inside fenced blocks: paths, ``sql.NAME``,
    ``Class.member``."""
    found = []
    shapes = re.compile(
        r"(?<![\w./-])(?:[\w/-]+\.(?:py|pml|pyx)|sql\.(?:\w+\.)?[A-Z][A-Z0-9_]+"
        r"|[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*\.[a-z_]\w*)(?![\w/-])"
    )
    for doc in DOCS:
        for block in re.findall(r"^```.*?^```", doc.read_text(), flags=re.S | re.M):
            found += [(doc.name, name) for name in shapes.findall(block)]
    return found


TREE_ENTRY = re.compile(r"^( *)([\w.-]+(?:/|\.pyx?))(?: |$)")


def _module_tree() -> list[str]:
    """The paths the "## Modules" tree of docs/architecture.md lists: an entry is a line that
    starts (indented two spaces per level, at most 10) with a file or ``dir/``; a directory
    entry opens a level; longer indents are descriptions. ``templates/ static/`` style lines
    name plain directories."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```\n(.*?)^```", section, flags=re.S | re.M)
    assert block, "no fenced module tree under ## Modules"
    stack: list[tuple[int, str]] = []
    paths = []
    for line in block[1].splitlines():
        m = TREE_ENTRY.match(line)
        if not m or len(m[1]) > 10:
            continue
        indent, entry = len(m[1]), m[2]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "".join(d for _, d in stack) + entry
        paths.append(path)
        if entry.endswith("/"):
            stack.append((indent, entry))
    return paths


def _package_modules() -> set[str]:
    return {
        p.relative_to(ROOT).as_posix()
        for p in [*(ROOT / "awa_fast").rglob("*.py"), *(ROOT / "_ext").glob("*.pyx")]
        if "__pycache__" not in p.parts
    }


def _problem(name: str) -> str | None:
    """Why ``name`` does not resolve, or None (resolves, or not a checkable shape)."""
    if FILE.match(name):
        return None if _has_file(name) else "no such file"
    if m := SQL_NAME.match(name):
        module = importlib.import_module("awa_fast.sql" + (f".{m[1]}" if m[1] else ""))
        return None if hasattr(module, m[2]) else "no such SQL constant"
    if (m := MODULE_NAME.match(name)) and m[1] in _modules() and m[1] not in INSTANCE_NAMES:
        module = importlib.import_module(_modules()[m[1]])
        return None if hasattr(module, m[2]) else f"{_modules()[m[1]]} has no {m[2]}"
    if m := CLASS_MEMBER.match(name):
        defs = _classes().get(m[1])
        if not defs:
            return "no such class in awa_fast"
        for module, self_attrs in defs:
            cls = getattr(importlib.import_module(module), m[1], None)
            if m[2] in self_attrs or (cls is not None and hasattr(cls, m[2])):
                return None
        return f"class {m[1]} has no {m[2]}"
    if CONSTANT.match(name) or CAMEL.match(name):
        return None if re.search(rf"\b{name}\b", _code_text()) else "not in the code"
    if (m := SNAKE.match(name)) and m[1] not in FOREIGN:
        word = m[1].removesuffix("_total")
        return None if re.search(rf"\b{word}\b", _code_text()) else "not in the code"
    return None


def test_the_scan_finds_names_of_every_shape() -> None:
    names = {n for _, n in _backticked()}
    assert any(FILE.match(n) for n in names)
    assert any(SQL_NAME.match(n) for n in names)
    assert any(CLASS_MEMBER.match(n) for n in names)
    assert any(CONSTANT.match(n) for n in names)
    assert any(SNAKE.match(n) for n in names)


def test_a_missing_name_is_reported() -> None:
    assert _problem("Finalizer.finalize_with_retry") == "class Finalizer has no finalize_with_retry"
    assert _problem("NoSuchConfig.poll") == "no such class in awa_fast"
    assert _problem("sql.NO_SUCH_STATEMENT") == "no such SQL constant"
    assert _problem("worker/no_such_module.py") == "no such file"
    assert _problem("NO_SUCH_CONSTANT_ANYWHERE") == "not in the code"
    assert _problem("finalize_with_retry") == "not in the code"
    assert _problem("NoSuchConfig") == "not in the code"


def test_every_backticked_code_name_exists() -> None:
    problems = [
        f"{doc}: `{name}`: {problem}"
        for doc, name in sorted(set(_backticked()))
        if (problem := _problem(name)) is not None
    ]
    assert not problems, "\n".join(problems)


def test_fenced_blocks_name_only_code_that_exists() -> None:
    names = {n for _, n in _fenced()}
    assert any(SQL_NAME.match(n) for n in names) and any(FILE.match(n) for n in names)
    problems = [
        f"{doc}: `{name}` (in a fenced block): {problem}"
        for doc, name in sorted(set(_fenced()))
        if (problem := _problem(name)) is not None
    ]
    assert not problems, "\n".join(problems)


def test_the_module_tree_lists_what_exists() -> None:
    tree = _module_tree()
    missing = [p for p in tree if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md lists modules that do not exist: {missing}"


def test_every_module_has_a_line_in_the_module_tree() -> None:
    undocumented = sorted(_package_modules() - set(_module_tree()))
    assert not undocumented, (
        f"modules without a line under '## Modules' in docs/architecture.md: {undocumented}"
    )


def test_the_tree_reader_places_entries_under_their_directory() -> None:
    tree = _module_tree()
    assert "awa_fast/worker/finalizer.py" in tree
    assert "awa_fast/sql/fragments.py" in tree
    assert "awa_fast/admin/jobs.py" in tree
    assert "_ext/validate.pyx" in tree
    assert "awa_fast/client.py" in tree and "awa_fast/worker/client.py" not in tree
