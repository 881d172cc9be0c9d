"""The compiled awa_fast._ext modules behave exactly like tests/reference_ext.py.

Property tests compare return values and raised errors (type, field/reason,
limit, message) on generated inputs; plain unit tests pin every limit at ±1
and the golden derive_kind cases, against both implementations.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

import orjson
import pytest
from blake3 import blake3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from awa_fast._ext import batch, sizing, unique, validate
from awa_fast.errors import StagingError, ValidationError


def _load_reference():
    name = "awa_fast_tests_reference_ext"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).parents[1] / "reference_ext.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ref = _load_reference()

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


# ----------------------------------------------------------------------------- helpers


def outcome(fn, *args):
    """What a call did: ("ok", value) or ("err", type, details...)."""
    try:
        value = fn(*args)
    except (ValidationError, StagingError) as e:
        return (
            "err",
            type(e),
            getattr(e, "field", None),
            getattr(e, "reason", None),
            e.limit,
            str(e),
        )
    except Exception as e:
        return ("err", type(e))
    if isinstance(value, datetime):
        return ("ok", datetime, value, value.isoformat(), value.tzinfo)
    return ("ok", type(value), value)


def same(compiled_fn, reference_fn, *args):
    got = outcome(compiled_fn, *args)
    want = outcome(reference_fn, *args)
    assert got == want, f"args={args!r}"
    return got


# ----------------------------------------------------------------------------- strategies

# Text biased towards the interesting characters: NUL, backslash, escape text.
chars = st.one_of(
    st.characters(),
    st.sampled_from(["\x00", "\\", "u", "0", '"', "A", "a", "1", "é", "\u2028", "\U0001f600"]),
)
texts = st.text(alphabet=chars, max_size=12)  # may hold lone surrogates
# orjson refuses lone surrogates, so JSON content is drawn from valid UTF-8.
utf8_chars = st.one_of(
    st.characters(codec="utf-8"),
    st.sampled_from(["\x00", "\\", "u", "0", '"', "A", "a", "1", "é", "\u2028", "\U0001f600"]),
)
json_texts = st.text(alphabet=utf8_chars, max_size=12)
long_texts = st.integers(min_value=195, max_value=205).flatmap(
    lambda n: st.text(alphabet=chars, min_size=n, max_size=n)
)
names = st.one_of(texts, long_texts, st.just(""), st.integers(), st.none(), st.binary(max_size=3))

odd_values = st.one_of(
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.integers(min_value=-(2**70), max_value=2**70),
)


def ints_around(lo, hi):
    return st.one_of(
        st.integers(min_value=lo - 3, max_value=hi + 3),
        st.sampled_from([lo - 1, lo, lo + 1, hi - 1, hi, hi + 1]),
        odd_values,
    )


tag_lists = st.one_of(
    st.none(),
    st.lists(texts, max_size=22),
    st.lists(texts, max_size=22).map(tuple),
    st.lists(st.one_of(texts, st.integers()), max_size=4),
    st.integers(),
    texts,
    st.sets(st.text(max_size=2), max_size=3),
)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=INT64_MIN, max_value=INT64_MAX),
    st.floats(allow_nan=False, allow_infinity=False),
    json_texts,
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(json_texts, children, max_size=4)
    ),
    max_leaves=20,
)


def dumps(value) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def has_nul(value) -> bool:
    """Independent oracle: does a JSON-able value hold U+0000 in any string or key?"""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(has_nul(v) for v in value)
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    return False


# Arbitrary byte soup made of escape fragments, to stress backslash parity.
byte_soup = st.lists(
    st.sampled_from(
        [b"\\", b"\\\\", b"u", b"u0000", b"\\u0000", b"0", b"00", b"a", b'"', b"\x00", b"\xc3\xa9"]
    ),
    max_size=12,
).map(b"".join)

fixed_tz = st.builds(
    timezone,
    st.timedeltas(
        min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)
    ),
)
datetimes = st.datetimes(timezones=st.one_of(st.none(), fixed_tz, st.just(UTC)))
edge_datetimes = st.one_of(
    st.datetimes(max_value=datetime(1, 1, 2), timezones=st.one_of(st.none(), fixed_tz)),
    st.datetimes(min_value=datetime(9999, 12, 30), timezones=st.one_of(st.none(), fixed_tz)),
)


@st.composite
def run_at_values(draw):
    dt = draw(st.one_of(datetimes, edge_datetimes))
    choice = draw(st.integers(0, 6))
    if choice == 0:
        return dt
    if choice == 1:
        return dt.isoformat()
    if choice == 2:
        s = dt.isoformat()
        return s.replace("+00:00", draw(st.sampled_from(["Z", "z", "+00:00"])))
    if choice == 3:
        return dt.date()
    if choice == 4:
        return draw(
            st.one_of(
                texts, st.sampled_from(["", "Z", "2024-13-01T00:00:00Z", "2024-01-01T00:00:00Zz"])
            )
        )
    if choice == 5:
        return draw(odd_values)
    return dt.isoformat(
        sep=" ", timespec=draw(st.sampled_from(["auto", "seconds", "milliseconds", "minutes"]))
    )


option_values = st.one_of(
    st.booleans(),
    st.none(),
    st.integers(min_value=-3, max_value=260),
    st.sampled_from([INT64_MIN - 1, INT64_MIN, INT64_MAX, INT64_MAX + 1, 255, 256, -1, 0]),
    st.floats(allow_nan=False),
    st.text(max_size=3),
)
unique_opts = st.one_of(
    st.none(),
    st.dictionaries(
        st.one_of(
            st.sampled_from(["by_queue", "by_args", "by_period", "states"]),
            st.sampled_from(["nope", "State"]),
            st.integers(),
        ),
        option_values,
        max_size=5,
    ),
    st.dictionaries(
        st.sampled_from(["by_queue", "by_args", "by_period", "states"]), option_values, max_size=4
    ),
    st.lists(st.integers(), max_size=2),
    st.text(max_size=3),
)

periods = st.one_of(
    st.none(),
    st.integers(min_value=INT64_MIN, max_value=INT64_MAX),
    st.sampled_from([INT64_MIN, INT64_MAX, INT64_MIN - 1, INT64_MAX + 1, 0, -1]),
    st.booleans(),
    st.floats(allow_nan=False),
)


# ----------------------------------------------------------------------------- compiled build


def test_compiled_modules_active():
    for module in (validate, unique, sizing, batch):
        path = module.__file__
        assert path is not None
        assert not path.endswith((".py", ".pyx", ".pyc")), path
        assert any(path.endswith(sfx) for sfx in importlib.machinery.EXTENSION_SUFFIXES), path
        if sys.platform != "win32":
            assert path.endswith(".so"), path


# ----------------------------------------------------------------------------- property tests


@SETTINGS
@given(names, names, ints_around(1, 4), ints_around(1, 1000), tag_lists)
def test_validate_insert_matches_reference(kind, queue, priority, max_attempts, tags):
    result = same(
        validate.validate_insert, ref.validate_insert, kind, queue, priority, max_attempts, tags
    )
    if result[0] == "ok":
        out = validate.validate_insert(kind, queue, priority, max_attempts, tags)
        assert out is not tags
        assert out == ([] if tags is None else list(tags))


@SETTINGS
@given(json_values, st.sampled_from(["args", "metadata"]))
def test_check_json_nul_on_orjson(value, field):
    data = dumps(value)
    result = same(validate.check_json_nul, ref.check_json_nul, data, field)
    if has_nul(value):
        assert result == (
            "err",
            ValidationError,
            field,
            None,
            "no NUL bytes",
            f"{field} must not contain NUL characters (\\u0000)",
        )
    else:
        assert result == ("ok", type(None), None)


@SETTINGS
@given(byte_soup)
def test_check_json_nul_on_byte_soup(data):
    same(validate.check_json_nul, ref.check_json_nul, data, "args")


@SETTINGS
@given(run_at_values())
def test_normalize_run_at_matches_reference(value):
    result = same(validate.normalize_run_at, ref.normalize_run_at, value)
    if result[0] == "ok" and value is not None:
        out = result[2]
        assert out.tzinfo is UTC
        assert 1 <= out.year <= 9999


@SETTINGS
@given(
    st.one_of(
        st.text(alphabet=st.sampled_from("AaBbZz09_IOVQ"), max_size=16),
        st.text(max_size=10),
        st.text(alphabet=st.sampled_from("AÉéİıǅΣσ1٣_"), max_size=8),
    )
)
def test_derive_kind_matches_reference(name):
    same(validate.derive_kind, ref.derive_kind, name)


@SETTINGS
@given(unique_opts)
def test_parse_unique_opts_matches_reference(opts):
    same(unique.parse_unique_opts, ref.parse_unique_opts, opts)


@SETTINGS
@given(texts, texts, json_values, st.booleans(), st.booleans(), periods)
def test_unique_key_matches_reference(kind, queue, args, by_queue, by_args, by_period):
    result = same(
        unique.unique_key, ref.unique_key, kind, queue, dumps(args), by_queue, by_args, by_period
    )
    if result[0] == "ok":
        assert len(result[2]) == 16


@SETTINGS
@given(
    st.one_of(texts, st.integers()),
    texts,
    st.one_of(st.binary(max_size=40), texts),
    st.binary(max_size=40),
    st.one_of(
        st.lists(texts, max_size=5),
        st.lists(texts, max_size=5).map(tuple),
        st.lists(st.integers(), min_size=1, max_size=2),
    ),
    st.one_of(st.none(), st.binary(max_size=10), texts),
)
def test_request_size_matches_reference(kind, queue, args_json, metadata_json, tags, ordering_key):
    same(
        sizing.request_size,
        ref.request_size,
        kind,
        queue,
        args_json,
        metadata_json,
        tags,
        ordering_key,
    )


@SETTINGS
@given(
    st.one_of(st.integers(min_value=0, max_value=20), st.just(16)),
    st.one_of(st.integers(min_value=0, max_value=70000), st.just(65536)),
    st.lists(
        st.one_of(
            st.integers(min_value=0, max_value=20000),
            st.sampled_from([0, 1, 65535, 65536, 65537, -1, INT64_MAX, INT64_MAX + 1, True]),
            st.floats(allow_nan=False),
        ),
        max_size=25,
    ),
)
def test_staging_budget_matches_reference(max_count, max_bytes, sizes):
    compiled = sizing.StagingBudget(max_count, max_bytes)
    reference = ref.StagingBudget(max_count, max_bytes)
    for size in sizes:
        before = (compiled.count, compiled.bytes_used)
        got = outcome(compiled.charge, size)
        assert got == outcome(reference.charge, size), f"size={size!r}"
        state = (compiled.count, compiled.bytes_used, compiled.max_count, compiled.max_bytes)
        assert state == (
            reference.count,
            reference.bytes_used,
            reference.max_count,
            reference.max_bytes,
        )
        if got[0] == "err":
            assert (compiled.count, compiled.bytes_used) == before


# ----------------------------------------------------------------------------- unit tests: limits ±1

IMPLS = pytest.mark.parametrize("impl", [validate, ref], ids=["compiled", "reference"])
UIMPLS = pytest.mark.parametrize("impl", [unique, ref], ids=["compiled", "reference"])
SIMPLS = pytest.mark.parametrize("impl", [sizing, ref], ids=["compiled", "reference"])


def raises_validation(fn, *args, field, limit):
    with pytest.raises(ValidationError) as info:
        fn(*args)
    assert info.value.field == field
    assert info.value.limit == limit
    return info.value


@IMPLS
@pytest.mark.parametrize("field", ["kind", "queue"])
def test_name_length_limits(impl, field):
    def call(value):
        args = {"kind": "k", "queue": "q"}
        args[field] = value
        return impl.validate_insert(args["kind"], args["queue"], 2, 25, None)

    assert call("x") == []
    assert call("x" * 200) == []
    assert call("é" * 200) == []  # characters, not bytes
    e = raises_validation(call, "", field=field, limit="1..200 characters")
    assert field in str(e) and "got 0" in str(e)
    e = raises_validation(call, "x" * 201, field=field, limit="1..200 characters")
    assert str(e) == f"{field} must be 1 to 200 characters, got 201"
    raises_validation(call, "a\x00b", field=field, limit="no NUL bytes")
    raises_validation(call, b"kind", field=field, limit="1..200 characters")


@IMPLS
def test_priority_limits(impl):
    for ok in (1, 4):
        assert impl.validate_insert("k", "q", ok, 1, None) == []
    for bad in (0, 5, 7):
        e = raises_validation(
            impl.validate_insert, "k", "q", bad, 1, None, field="priority", limit="1..4"
        )
        assert str(e) == f"priority must be between 1 and 4, got {bad}"
    for bad in ("2", True, 2.0, None):
        raises_validation(
            impl.validate_insert, "k", "q", bad, 1, None, field="priority", limit="1..4"
        )


@IMPLS
def test_max_attempts_limits(impl):
    for ok in (1, 1000):
        assert impl.validate_insert("k", "q", 2, ok, ()) == []
    for bad in (0, 1001, False, "25", 25.0):
        raises_validation(
            impl.validate_insert, "k", "q", 2, bad, None, field="max_attempts", limit="1..1000"
        )


@IMPLS
def test_tags_limits(impl):
    tags = tuple(f"t{i}" for i in range(20))
    out = impl.validate_insert("k", "q", 2, 25, tags)
    assert out == list(tags) and isinstance(out, list)
    e = raises_validation(
        impl.validate_insert, "k", "q", 2, 25, list(tags) + ["x"], field="tags", limit="<= 20"
    )
    assert str(e) == "tags: at most 20 tags, got 21"
    raises_validation(
        impl.validate_insert, "k", "q", 2, 25, ["ok", "a\x00"], field="tags", limit="no NUL bytes"
    )
    raises_validation(impl.validate_insert, "k", "q", 2, 25, ["ok", 3], field="tags", limit="<= 20")
    raises_validation(impl.validate_insert, "k", "q", 2, 25, "abc", field="tags", limit="<= 20")


@IMPLS
def test_check_json_nul_cases(impl):
    impl.check_json_nul(dumps({"a": "b"}), "args")
    impl.check_json_nul(dumps({"a": "\\u0000"}), "args")  # literal backslash + text
    impl.check_json_nul(b'"\\\\u0000"', "args")
    for data in (
        dumps({"a": "\x00"}),
        dumps({"\x00": 1}),
        dumps([[{"k": ["x\x00y"]}]]),
        dumps({"a": "\\\x00"}),  # backslash then NUL -> \\\u0000
        b'"\\\\\\u0000"',
        b'"\\u0000"',
    ):
        raises_validation(
            impl.check_json_nul, data, "metadata", field="metadata", limit="no NUL bytes"
        )


def test_orjson_escapes_nul_in_keys_and_values():
    assert dumps({"a\x00": "\x00"}) == b'{"a\\u0000":"\\u0000"}'


@IMPLS
def test_normalize_run_at_cases(impl):
    utc = UTC
    assert impl.normalize_run_at(None) is None
    naive = datetime(2024, 5, 1, 12, 0)
    assert impl.normalize_run_at(naive) == datetime(2024, 5, 1, 12, 0, tzinfo=utc)
    aware = datetime(2024, 5, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    out = impl.normalize_run_at(aware)
    assert out.tzinfo is utc and out.hour == 10
    assert impl.normalize_run_at("2024-05-01T12:00:00Z") == datetime(2024, 5, 1, 12, tzinfo=utc)
    assert impl.normalize_run_at("2024-05-01T12:00:00+02:00").hour == 10
    # year range at ±1 minute
    assert impl.normalize_run_at("0001-01-01T00:00:00Z").year == 1
    assert impl.normalize_run_at("9999-12-31T23:59:59Z").year == 9999
    assert impl.normalize_run_at("0001-01-01T01:00:00+01:00").year == 1
    raises_validation(
        impl.normalize_run_at, "0001-01-01T00:59:00+01:00", field="run_at", limit="years 1..9999"
    )
    raises_validation(
        impl.normalize_run_at, "9999-12-31T23:59:00-00:01", field="run_at", limit="years 1..9999"
    )
    raises_validation(
        impl.normalize_run_at,
        datetime(9999, 12, 31, 23, 30, tzinfo=timezone(timedelta(hours=-1))),
        field="run_at",
        limit="years 1..9999",
    )
    raises_validation(
        impl.normalize_run_at, "not a date", field="run_at", limit="RFC 3339 timestamp"
    )
    raises_validation(impl.normalize_run_at, "", field="run_at", limit="RFC 3339 timestamp")
    for bad in (date(2024, 1, 1), 1700000000, 1.5, b"2024-01-01"):
        with pytest.raises(ValidationError) as info:
            impl.normalize_run_at(bad)
        assert info.value.field == "run_at"


GOLDEN_KINDS = [
    ("SendEmail", "send_email"),
    ("SMTPEmail", "smtp_email"),
    ("OAuthRefresh", "o_auth_refresh"),
    ("PDFRenderJob", "pdf_render_job"),
    ("ProcessV2Import", "process_v2_import"),
    ("ReconcileQ3Revenue", "reconcile_q3_revenue"),
    ("HTMLToPDF", "html_to_pdf"),
    ("IOError", "io_error"),
]


@IMPLS
@pytest.mark.parametrize(("name", "kind"), GOLDEN_KINDS)
def test_derive_kind_golden(impl, name, kind):
    assert impl.derive_kind(name) == kind


@UIMPLS
def test_parse_unique_opts_limits(impl):
    assert impl.parse_unique_opts(None) is None
    assert impl.parse_unique_opts({}) == (False, True, None, 31)
    assert impl.DEFAULT_STATES == 31
    assert impl.STATE_BITS == {
        "scheduled": 0,
        "available": 1,
        "running": 2,
        "completed": 3,
        "retryable": 4,
        "failed": 5,
        "cancelled": 6,
        "waiting_external": 7,
    }
    assert impl.parse_unique_opts({"states": 0})[3] == 0
    assert impl.parse_unique_opts({"states": 255})[3] == 255
    for bad in (-1, 256, True, 3.0):
        raises_validation(
            impl.parse_unique_opts, {"states": bad}, field="unique_opts.states", limit="0..255"
        )
    assert impl.parse_unique_opts({"by_period": INT64_MIN})[2] == INT64_MIN
    assert impl.parse_unique_opts({"by_period": INT64_MAX})[2] == INT64_MAX
    for bad in (INT64_MIN - 1, INT64_MAX + 1, True, 60.0, "60"):
        raises_validation(
            impl.parse_unique_opts,
            {"by_period": bad},
            field="unique_opts.by_period",
            limit="None or signed 64-bit int",
        )
    for key in ("by_queue", "by_args"):
        raises_validation(
            impl.parse_unique_opts, {key: 1}, field=f"unique_opts.{key}", limit="bool"
        )
    e = raises_validation(
        impl.parse_unique_opts,
        {"by_queue": True, "bogus": 1},
        field="unique_opts",
        limit="dict with keys by_queue, by_args, by_period, states",
    )
    assert "bogus" in str(e)
    raises_validation(
        impl.parse_unique_opts,
        [("by_queue", True)],
        field="unique_opts",
        limit="dict with keys by_queue, by_args, by_period, states",
    )
    assert impl.parse_unique_opts(
        {"by_queue": True, "by_args": False, "by_period": 3600, "states": 7}
    ) == (
        True,
        False,
        3600,
        7,
    )


@UIMPLS
def test_unique_key_layout(impl):
    args = dumps({"b": 1, "a": "é"})
    h = lambda data: blake3(data).digest()[:16]
    assert impl.unique_key("kïnd", "q", args, False, False, None) == h("kïnd".encode())
    assert impl.unique_key("k", "qé", args, True, False, None) == h(b"k\x00q\xc3\xa9")
    assert impl.unique_key("k", "q", args, False, True, None) == h(b"k\x00" + args)
    assert impl.unique_key("k", "q", args, True, True, -2) == h(
        b"k\x00q\x00" + args + b"\x00" + b"\xfe" + b"\xff" * 7
    )
    assert impl.unique_key("k", "q", args, False, False, INT64_MAX) == h(
        b"k\x00\xff\xff\xff\xff\xff\xff\xff\x7f"
    )
    assert impl.unique_key("k", "q", args, False, False, INT64_MIN) == h(
        b"k\x00" + b"\x00" * 7 + b"\x80"
    )
    with pytest.raises(OverflowError):
        impl.unique_key("k", "q", args, False, False, INT64_MAX + 1)
    with pytest.raises(OverflowError):
        impl.unique_key("k", "q", args, False, False, INT64_MIN - 1)
    with pytest.raises(TypeError):
        impl.unique_key("k", "q", "{}", False, True, None)


@SIMPLS
def test_request_size_counts_bytes(impl):
    assert impl.request_size("é", "q", b"{}", b"{}", ["日本", "x"], None) == 2 + 1 + 2 + 2 + 6 + 1
    assert impl.request_size("k", "q", b"", b"", [], b"abc") == 5
    with pytest.raises(TypeError):
        impl.request_size("k", "q", "{}", b"", [], None)


@SIMPLS
def test_staging_budget_count_limit(impl):
    budget = impl.StagingBudget()
    assert (budget.max_count, budget.max_bytes, budget.count, budget.bytes_used) == (
        16,
        65536,
        0,
        0,
    )
    for _ in range(16):
        budget.charge(1)
    with pytest.raises(StagingError) as info:
        budget.charge(1)
    assert info.value.reason == "too_many" and info.value.limit == 16
    assert str(info.value) == "ADR-046: at most 16 staged follow-ups per attempt"
    assert (budget.count, budget.bytes_used) == (16, 16)
    with pytest.raises(AttributeError):
        budget.count = 0


@SIMPLS
def test_staging_budget_byte_limit(impl):
    budget = impl.StagingBudget()
    budget.charge(65535)
    budget.charge(1)  # exactly 65536: allowed
    assert budget.bytes_used == 65536
    budget.charge(0)
    with pytest.raises(StagingError) as info:
        budget.charge(1)
    assert info.value.reason == "too_large" and info.value.limit == 65536
    assert str(info.value) == (
        "ADR-046: at most 65536 bytes of staged follow-ups per attempt, this request would make 65537"
    )
    assert (budget.count, budget.bytes_used) == (3, 65536)

    fresh = impl.StagingBudget(max_count=2, max_bytes=10)
    with pytest.raises(StagingError) as info:
        fresh.charge(11)
    assert info.value.reason == "too_large" and info.value.limit == 10
    assert (fresh.count, fresh.bytes_used) == (0, 0)
    fresh.charge(10)
    with pytest.raises(ValueError):
        fresh.charge(-1)
    with pytest.raises(TypeError):
        fresh.charge(1.0)


# ----------------------------------------------------------------------------- batch (bulk COPY)


@SETTINGS
@given(st.lists(json_values, max_size=6))
def test_encode_many_matches_reference(values):
    same(batch.encode_many, ref.encode_many, values, "args")


@SETTINGS
@given(texts, texts, st.lists(json_values, max_size=5), st.booleans(), st.booleans(), periods)
def test_keys_many_matches_reference(kind, queue, values, by_queue, by_args, by_period):
    jsons = [dumps(v) for v in values]
    same(batch.keys_many, ref.keys_many, kind, queue, jsons, by_queue, by_args, by_period)


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=2**62),
            st.binary(max_size=40),
            st.binary(min_size=16, max_size=16),
        ),
        max_size=6,
    ),
    st.booleans(),
    st.binary(max_size=10),
    st.binary(max_size=10),
    st.binary(max_size=10),
)
def test_copy_block_matches_reference(rows, with_keys, head, mid, tail):
    ids = [r[0] for r in rows]
    jsons = [r[1] for r in rows]
    keys = [r[2] for r in rows] if with_keys else None
    same(batch.copy_block, ref.copy_block, ids, jsons, keys, head, mid, tail)
