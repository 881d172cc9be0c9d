"""Every bulk statement and its row-by-row (or per-job) twin carry the same guard.

Static checks, no database:

* ``sql.ISOLATED``: each statement of a family contains the family's one guard fragment,
  character for character (tests/faults/test_one_row_never_wedges_a_statement.py checks that too);
* ``sql.BOUND_TWINS``: a batch statement binds its guard to arrays (``b.lease``), its per-job
  twin to parameters (``%s``): with bindings and table aliases normalized, every conjunct of
  the guard is in every statement of the pair;
* coverage: every statement named like a bulk statement or a row-by-row twin, and every
  ``sql.NAME`` handed to ``bulk.run_isolated`` in the package, belongs to a registered family
  (or is listed below with the reason it has no twin).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from awa_fast import sql

ROOT = Path(__file__).resolve().parents[2]

# Named like a batch or a twin, but not a bulk / row-by-row pair.
NOT_PAIRS = {
    "INSERT_ONE": "a single insert",
    "INSERT_MANY": "an insert batch is all or nothing (one statement, no per-row fallback)",
    "INSERT_MANY_KEYED": "as INSERT_MANY",
    "DLQ_PURGE_ONE": "purge_dlq_job(id): one entry by id, no filter to share",
}
PAIR_NAME = re.compile(r"(_ONE|_IDS|_CANDIDATES|_MANY|_BULK)$|_MANY_")


def _registered() -> dict[str, set[str]]:
    """statement name -> the families it belongs to."""
    by_text: dict[str, set[str]] = {}
    for family, (_guard, statements) in sql.ISOLATED.items():
        for text in statements:
            by_text.setdefault(text, set()).add(family)
    for family, (_guard, batch, single) in sql.BOUND_TWINS.items():
        for text in (*batch, *single):
            by_text.setdefault(text, set()).add(family)
    names = {}
    for name in dir(sql):
        value = getattr(sql, name)
        if name.isupper() and isinstance(value, str) and value in by_text:
            names[name] = by_text[value]
    return names


def _normalized(text: str) -> str:
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r"%\(\w+\)s|%s|\bb\.\w+", "?", text)  # a parameter or a batch array's column
    return re.sub(r"\b[a-z]\.(?=\w)", "", text)  # table aliases (j.id, d.run_lease)


def _conjuncts(guard: str) -> list[str]:
    return [c.strip() for c in _normalized(guard).split(" AND ")]


@pytest.mark.parametrize("family", sorted(sql.ISOLATED))
def test_isolated_family_statements_carry_its_guard(family):
    guard, statements = sql.ISOLATED[family]
    assert guard.strip()
    assert len(statements) >= 1
    for text in statements:
        assert guard in text, f"{family}: a statement lost its guard"


@pytest.mark.parametrize("family", sorted(sql.BOUND_TWINS))
def test_bound_twins_carry_the_same_guard(family):
    guard, batch, single = sql.BOUND_TWINS[family]
    assert batch and single
    for text in batch:
        assert guard in text, f"{family}: a batch statement lost its guard"
    for text in (*batch, *single):
        normalized = _normalized(text)
        missing = [c for c in _conjuncts(guard) if c not in normalized]
        assert not missing, f"{family}: {missing} missing from:\n{text}"


def test_the_normalized_comparison_tells_a_lost_conjunct():
    guard, _batch, single = sql.BOUND_TWINS["complete"]
    weakened = single[0].replace("AND state = 'running'", "")
    assert any(c not in _normalized(weakened) for c in _conjuncts(guard))


def test_every_statement_named_as_a_pair_is_registered():
    registered = _registered()
    named = {n for n in dir(sql) if n.isupper() and PAIR_NAME.search(n)}
    unregistered = sorted(named - set(registered) - set(NOT_PAIRS))
    assert not unregistered, f"bulk / row-by-row statements without a family: {unregistered}"
    assert not set(NOT_PAIRS) - named, "NOT_PAIRS names a statement that no longer exists"


def _run_isolated_calls() -> list[tuple[str, int, set[str]]]:
    calls = []
    for path in sorted((ROOT / "awa_fast").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "run_isolated"
            ):
                names = {
                    n.attr
                    for n in ast.walk(node)
                    if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name)
                    and n.value.id == "sql"
                }
                calls.append((path.relative_to(ROOT).as_posix(), node.lineno, names))
    return calls


def test_every_statement_run_isolated_runs_is_registered():
    calls = _run_isolated_calls()
    assert len(calls) >= 8, calls  # the scan finds the call sites
    registered = _registered()
    loose = [
        f"{where}:{line}: sql.{name}"
        for where, line, names in calls
        for name in sorted(names)
        if name not in registered
    ]
    assert not loose, "run_isolated statements without a family:\n" + "\n".join(loose)
