"""The layering rule, checked on the source (no database): nothing under ``awa_fast/worker/``
imports the layers above it (the client, its admin and sync twin, testing, the CLI, the
launcher and its application loader, the demo, the dashboard) or takes a ``client``
parameter; it sees the client's services only through ``worker/services.py``. And ``cli/``
does not import ``awa_fast.testing``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "awa_fast"
WORKER = sorted((PACKAGE / "worker").rglob("*.py"))  # its subpackages (maintenance/) too
# The layers above awa_fast/worker/: a module there importing one of these reaches back up.
ABOVE = (
    "awa_fast.client",
    "awa_fast.admin",
    "awa_fast.sync_client",
    "awa_fast.raw_client",
    "awa_fast.testing",
    "awa_fast.cli",
    "awa_fast.app_loader",
    "awa_fast.supervisor",
    "awa_fast.demo",
    "awa_fast.web",
)


def _package_of(path: Path) -> str:
    """The package a relative import in ``path`` resolves against (``awa_fast.worker`` for
    ``worker/x.py``, ``awa_fast.worker.maintenance`` for ``worker/maintenance/x.py``)."""
    if path.is_relative_to(PACKAGE):
        return ".".join(path.parent.relative_to(PACKAGE.parent).parts)
    return "awa_fast.worker"  # a sample module outside the tree (test_the_check_flags_...)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, at any depth (function-level imports included), as
    absolute names: ``from awa_fast import client`` counts as ``awa_fast.client``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _package_of(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against awa_fast.worker
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _reaches_up(name: str) -> bool:
    return any(name == above or name.startswith(above + ".") for above in ABOVE)


def test_the_worker_modules_exist():
    assert len(WORKER) > 10 and (PACKAGE / "worker" / "services.py") in WORKER
    assert PACKAGE / "worker" / "maintenance" / "scheduler.py" in WORKER


def _worker_id(path: Path) -> str:
    return str(path.relative_to(PACKAGE / "worker"))


@pytest.mark.parametrize("path", WORKER, ids=_worker_id)
def test_worker_module_imports_nothing_above_it(path):
    bad = [f"line {line}: {name}" for line, name in _imports(path) if _reaches_up(name)]
    assert not bad, f"awa_fast/worker/{_worker_id(path)} imports a layer above it: {bad}"


@pytest.mark.parametrize("path", WORKER, ids=_worker_id)
def test_worker_module_has_no_client_parameter(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            params = a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p]
            bad += [f"line {node.lineno}" for p in params if p.arg == "client"]
    assert not bad, f"awa_fast/worker/{_worker_id(path)}: a parameter named 'client' at {bad}"


def test_the_check_flags_what_it_should(tmp_path):
    # The checks themselves: a module that reaches up is caught, in every import form.
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from awa_fast import client\n"
        "def f():\n"
        "    import awa_fast.testing\n"
        "    from ..cli import main\n"
    )
    names = [n for _, n in _imports(sample) if _reaches_up(n)]
    assert names == ["awa_fast.client", "awa_fast.testing", "awa_fast.cli", "awa_fast.cli.main"]


def test_cli_does_not_import_testing():
    names = [n for path in sorted((PACKAGE / "cli").glob("*.py")) for _, n in _imports(path)]
    assert not [n for n in names if n == "awa_fast.testing" or n.startswith("awa_fast.testing.")]


# The whole table of docs/architecture.md ("Layers"), beyond the worker layer.
ENTRY = (
    "awa_fast.__main__",
    "awa_fast.cli",
    "awa_fast.supervisor",
    "awa_fast.app_loader",
    "awa_fast.web",
    "awa_fast.demo",
    "awa_fast.testing",
)
FACADE = ("awa_fast.client", "awa_fast.sync_client", "awa_fast.raw_client")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def _in(name: str, layer: tuple[str, ...]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in layer)


def _package_imports() -> list[tuple[str, int, str]]:
    """(module, line, imported name) for every awa_fast module, relative imports resolved."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found += [(module, node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                found.append((module, node.lineno, base))
                found += [(module, node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


def test_only_entry_points_import_entry_points():
    bad = [
        f"{m} line {line}: {name}"
        for m, line, name in _package_imports()
        if _in(name, ENTRY) and not _in(m, ENTRY)
    ]
    assert not bad, bad


def test_only_entry_points_and_the_package_import_the_facade():
    bad = [
        f"{m} line {line}: {name}"
        for m, line, name in _package_imports()
        if _in(name, FACADE) and not (_in(m, ENTRY) or _in(m, FACADE) or m == "awa_fast")
    ]
    assert not bad, bad


def test_admin_areas_are_reached_only_from_above():
    above = (*ENTRY, *FACADE, "awa_fast.admin")
    bad = [
        f"{m} line {line}: {name}"
        for m, line, name in _package_imports()
        if _in(name, ("awa_fast.admin",)) and not (_in(m, above) or m == "awa_fast")
    ]
    assert not bad, bad


def test_sql_modules_import_only_sql():
    bad = [
        f"{m} line {line}: {name}"
        for m, line, name in _package_imports()
        if _in(m, ("awa_fast.sql",))
        and name.startswith("awa_fast")
        and not _in(name, ("awa_fast.sql",))
    ]
    assert not bad, bad


def test_the_package_scan_sees_known_edges():
    edges = {(m, name) for m, _, name in _package_imports()}
    assert ("awa_fast.sync_client", "awa_fast.client") in edges
    assert ("awa_fast.sql.isolated", "awa_fast.sql.fragments") in edges
    assert ("awa_fast.worker.runtime", "awa_fast.worker.finalizer") in edges
