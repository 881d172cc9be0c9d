"""Micro-benchmark of the compact completion's parameters: a batch's ids packed by
``awa_fast.pg_arrays.int8_array`` (``compiled`` row: one ``struct`` call) against psycopg's
dump of the same ``list`` (``reference`` row: what the completion sent before, text format),
and psycopg's binary list dump for comparison. Run with bench/micro's command (its docstring).
"""

from __future__ import annotations

import pytest
from psycopg.adapt import PyFormat, Transformer

from awa_fast.pg_arrays import int8_array

BATCH = 100  # the finalizer's default batch of compact completions
IDS = list(range(10**9, 10**9 + BATCH))
_DUMP = {
    "reference": Transformer().get_dumper(IDS, PyFormat.TEXT).dump,
    "psycopg_binary": Transformer().get_dumper(IDS, PyFormat.BINARY).dump,
    "compiled": int8_array,
}


@pytest.mark.parametrize("impl", list(_DUMP))
def test_completion_id_array(benchmark, impl):
    benchmark.group = f"bigint[] of {BATCH} ids"
    benchmark.extra_info["impl"] = impl
    assert benchmark(_DUMP[impl], IDS)
