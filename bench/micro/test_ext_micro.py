"""Micro-benchmarks of the compiled hot path (awa_fast._ext) against the pure-Python reference
(tests/reference_ext.py), with pytest-benchmark.

Not part of the test suite (outside ``testpaths``); run with::

    python -m pytest bench/micro --benchmark-only --benchmark-group-by=group

Every operation is one benchmark group with two rows, ``compiled`` and ``reference``; the
bracketed factors in pytest-benchmark's table are the ratio to the faster row, i.e. the
speed-up. tests/bench/test_bench_micro.py runs this file once with ``--benchmark-disable`` so it
cannot rot. The batch operations work on ``ROWS`` rows per call, like one ``insert_many_copy``
of ``ROWS`` jobs.
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from awa_fast._ext import batch, sizing, unique, validate

ROWS = 1000
ROOT = Path(__file__).resolve().parents[2]


def _load_reference():
    name = "awa_fast_tests_reference_ext"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "reference_ext.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ref = _load_reference()


class Compiled:
    """The compiled functions under the reference's names."""

    validate_insert = staticmethod(validate.validate_insert)
    check_json_nul = staticmethod(validate.check_json_nul)
    normalize_run_at = staticmethod(validate.normalize_run_at)
    derive_kind = staticmethod(validate.derive_kind)
    parse_unique_opts = staticmethod(unique.parse_unique_opts)
    unique_key = staticmethod(unique.unique_key)
    request_size = staticmethod(sizing.request_size)
    StagingBudget = sizing.StagingBudget
    encode_many = staticmethod(batch.encode_many)
    keys_many = staticmethod(batch.keys_many)
    copy_block = staticmethod(batch.copy_block)


IMPLS = {"compiled": Compiled, "reference": ref}

# A typical job's args: a few keys, a nested list, non-ASCII text.
ARGS = {
    "user_id": 123456789,
    "email": "someone@example.com",
    "template": "welcome",
    "locale": "fr-FR",
    "items": [1, 2, 3, 4, 5],
    "note": "déjà vu",
}
ARGS_JSON = orjson.dumps(ARGS, option=orjson.OPT_SORT_KEYS)
META_JSON = b'{"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}'
TAGS = ["signup", "email"]
ROWS_ARGS = [dict(ARGS, user_id=i) for i in range(ROWS)]
ROWS_JSON = [orjson.dumps(a, option=orjson.OPT_SORT_KEYS) for a in ROWS_ARGS]
ROWS_KEYS = [unique.unique_key("send_email", "mail", j, False, True, None) for j in ROWS_JSON]
ROWS_IDS = list(range(10**9, 10**9 + ROWS))
# The fixed COPY columns around args and the key, as awa_fast/enqueue.py builds them.
HEAD = b"send_email\tmail"
MID = b"2\t0\t25\t2026-12-01 08:00:00+00:00\t{}\t{signup,email}"
TAIL = b"31\t\\N\t2026-12-01 08:00:00+00:00"

impl_param = pytest.mark.parametrize("impl", list(IMPLS), ids=list(IMPLS))


def _run(benchmark, impl, group, fn, *args):
    benchmark.group = group
    benchmark.extra_info["impl"] = impl
    return benchmark(fn, *args)


# -- validation -----------------------------------------------------------------------------------


@impl_param
def test_validate_insert(benchmark, impl):
    m = IMPLS[impl]
    out = _run(
        benchmark, impl, "validate_insert", m.validate_insert, "send_email", "mail", 2, 25, TAGS
    )
    assert out == TAGS


@impl_param
def test_check_json_nul(benchmark, impl):
    m = IMPLS[impl]
    _run(benchmark, impl, "check_json_nul (args JSON)", m.check_json_nul, ARGS_JSON, "args")


@impl_param
def test_normalize_run_at(benchmark, impl):
    m = IMPLS[impl]
    when = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    assert _run(benchmark, impl, "normalize_run_at", m.normalize_run_at, when) == when


@impl_param
def test_derive_kind(benchmark, impl):
    m = IMPLS[impl]
    out = _run(benchmark, impl, "derive_kind", m.derive_kind, "SendHTTPWelcomeEmail")
    assert out == "send_http_welcome_email"


# -- unique key -----------------------------------------------------------------------------------


@impl_param
def test_parse_unique_opts(benchmark, impl):
    m = IMPLS[impl]
    opts = {"by_queue": True, "by_period": 3600, "states": 15}
    assert _run(benchmark, impl, "parse_unique_opts", m.parse_unique_opts, opts)[0] is True


@impl_param
def test_unique_key(benchmark, impl):
    m = IMPLS[impl]
    key = _run(
        benchmark, impl, "unique_key", m.unique_key, "send_email", "mail", ARGS_JSON, True, True, 7
    )
    assert len(key) == 16


# -- size accounting ------------------------------------------------------------------------------


@impl_param
def test_request_size(benchmark, impl):
    m = IMPLS[impl]
    size = _run(
        benchmark,
        impl,
        "request_size",
        m.request_size,
        "send_email",
        "mail",
        ARGS_JSON,
        META_JSON,
        TAGS,
        None,
    )
    assert size > len(ARGS_JSON)


@impl_param
def test_staging_budget_16_charges(benchmark, impl):
    m = IMPLS[impl]

    def sixteen():
        budget = m.StagingBudget()
        for _ in range(16):
            budget.charge(200)
        return budget.count

    assert _run(benchmark, impl, "StagingBudget: new + 16 charges", sixteen) == 16


# -- COPY block (bulk insert) ---------------------------------------------------------------------


@impl_param
def test_encode_many(benchmark, impl):
    m = IMPLS[impl]
    out = _run(benchmark, impl, f"encode_many ({ROWS} rows)", m.encode_many, ROWS_ARGS, "args")
    assert out == ROWS_JSON


@impl_param
def test_keys_many(benchmark, impl):
    m = IMPLS[impl]
    out = _run(
        benchmark,
        impl,
        f"keys_many ({ROWS} rows)",
        m.keys_many,
        "send_email",
        "mail",
        ROWS_JSON,
        False,
        True,
        None,
    )
    assert out == ROWS_KEYS


@impl_param
def test_copy_block(benchmark, impl):
    m = IMPLS[impl]
    out = _run(
        benchmark,
        impl,
        f"copy_block ({ROWS} rows)",
        m.copy_block,
        ROWS_IDS,
        ROWS_JSON,
        ROWS_KEYS,
        HEAD,
        MID,
        TAIL,
    )
    assert out.count(b"\n") == ROWS
