"""The structure tests parse awa_fast's source (no database)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_collection_while_parsing() -> Iterator[None]:
    # CPython 3.11's AST constructor fails with "AST constructor recursion depth mismatch" when
    # a collection runs a finalizer in the middle of it (seen in CI right after "Task was
    # destroyed but it is pending!", a task an earlier test on the same xdist worker left):
    # collect first, then keep the collector off while a test parses.
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
