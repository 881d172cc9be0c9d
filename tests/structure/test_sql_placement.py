"""SQL lives in awa_fast/sql/: no other module of the package holds a SQL statement.

A static scan (no database): every string literal of every ``awa_fast`` module outside
``awa_fast/sql/`` (f-string parts included; docstrings, which describe statements, excluded)
must not contain a statement keyword, nor start with a session or transaction command. The
migrations (``awa_fast/schema/*.sql``) are SQL files, not Python, and are not scanned.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "awa_fast"
SQL_DIR = PACKAGE / "sql"
STATEMENT = re.compile(r"\b(SELECT|UPDATE|INSERT INTO|DELETE FROM|TRUNCATE|CREATE TABLE)\b")
# Session and transaction control, at the start of a literal (prose does not start so).
CONTROL = re.compile(
    r"^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE SAVEPOINT|LISTEN|UNLISTEN|SET|RESET|select)\b"
)

# (module, a substring of the literal): literals that name a keyword without being SQL.
ALLOWED: set[tuple[str, str]] = {
    ("worker/listener.py", "LISTEN connection lost"),  # a log message about the connection
}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _statements_in(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if STATEMENT.search(node.value) or CONTROL.match(node.value):
                found.append((node.lineno, node.value))
    return found


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if SQL_DIR not in p.parents)


def test_the_scan_sees_the_package():
    names = {p.relative_to(PACKAGE).as_posix() for p in _modules()}
    assert {
        "client.py",
        "cli/entry.py",
        "demo/run.py",
        "admin/jobs.py",
        "worker/finalizer.py",
    } <= names
    # and it does find statements where they belong
    assert _statements_in(SQL_DIR / "claim.py")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_sql_statement_outside_the_sql_package(path: Path):
    rel = path.relative_to(PACKAGE).as_posix()
    offending = [
        f"{rel}:{line}: {text.strip()[:80]!r}"
        for line, text in _statements_in(path)
        if not any(rel == mod and part in text for mod, part in ALLOWED)
    ]
    assert not offending, "SQL outside awa_fast/sql/ (name it in a sql module):\n" + "\n".join(
        offending
    )
