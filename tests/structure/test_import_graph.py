"""No import circle among awa_fast's modules (issue 30), checked on the source: a module's
imports at module level (``try`` and ``if`` bodies included, the type-only ones under
``if TYPE_CHECKING:`` too: a circle of types is a circle of meaning; not function-level imports,
which run after every module loaded) form a graph without a cycle. ``from awa_fast import sql`` is an edge to
``awa_fast.sql``; ``from awa_fast import AsyncClient`` one to the package ``awa_fast``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "awa_fast"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    statements: list[ast.stmt] = []
    for node in ast.parse(path.read_text()).body:
        statements.append(node)
        if isinstance(node, ast.Try):
            statements += node.body
        elif isinstance(node, ast.If):
            statements += node.body + node.orelse
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in statements:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in modules else base)
    return {m for m in out if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_of_awa_fast_imports_itself_through_others():
    modules = _modules()
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    assert len(graph) > 80 and graph["awa_fast.worker.context"]  # the graph is really read
    assert _cycles(graph) == []


def test_a_circle_is_found():  # the check itself can fail
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
