"""Producer-side validation: every insert rule is checked before anything touches the database.

Each limit is tested at its boundary (the boundary value inserts) and one beyond it (raises
``awa_fast.ValidationError`` naming the field, and nothing is written). Runs against a real
PostgreSQL (fixture ``dsn``); each test starts from empty tables.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime, timedelta, timezone

import msgspec
import psycopg
import pytest

import awa_fast
from awa_fast import EnqueueRequest, ValidationError

UTC = UTC
PLUS5 = timezone(timedelta(hours=5))
MINUS5 = timezone(timedelta(hours=-5))


# -- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture(autouse=True)
def clean(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '5s'")
        conn.execute("TRUNCATE awa_fast.jobs, awa_fast.queue_meta")


@pytest.fixture(scope="module")
async def client(dsn):
    async with awa_fast.AsyncClient(dsn, max_connections=4) as c:
        yield c


@pytest.fixture(scope="module")
def sync_client(dsn):
    with awa_fast.Client(dsn, max_connections=2) as c:
        yield c


def count(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM awa_fast.jobs_all").fetchone()[0]


def row(dsn: str, job_id: int) -> dict:
    with psycopg.connect(dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute("SELECT * FROM awa_fast.jobs_all WHERE id = %s", (job_id,)).fetchone()


def assert_field(exc: ValidationError, field: str) -> None:
    assert exc.field is not None
    assert exc.field == field or exc.field.startswith(field), (exc.field, field, str(exc))


# -- limits: boundary inserts, one beyond raises ----------------------------------------------

# (keyword, good boundary values, bad values one beyond, field, text the message must mention)
LIMITS = [
    ("priority", [1, 4], [0, 5], "priority", ["1", "4"]),
    ("max_attempts", [1, 1000], [0, 1001], "max_attempts", ["1", "1000"]),
    ("kind", ["k", "k" * 200], ["", "k" * 201], "kind", ["200"]),
    ("queue", ["q", "q" * 200], ["", "q" * 201], "queue", ["200"]),
    ("tags", [[], [f"t{i}" for i in range(20)]], [[f"t{i}" for i in range(21)]], "tags", ["20"]),
]


@pytest.mark.parametrize("kw, goods, bads, field, mentions", LIMITS, ids=[x[0] for x in LIMITS])
async def test_limit_boundaries(client, dsn, kw, goods, bads, field, mentions):
    base = {"kind": "limit_job"}
    for bad in bads:
        with pytest.raises(ValidationError) as ei:
            await client.insert({"x": 1}, **{**base, kw: bad})
        assert_field(ei.value, field)
        for text in mentions:
            assert text in str(ei.value), str(ei.value)
        assert count(dsn) == 0
    for i, good in enumerate(goods, 1):
        job = await client.insert({"x": 1}, **{**base, kw: good})
        assert getattr(job, kw) == good
        assert row(dsn, job.id)[kw] == good
        assert count(dsn) == i


async def test_kind_length_counts_characters_not_bytes(client, dsn):
    # 200 four-byte characters are 200 characters (800 UTF-8 bytes): allowed.
    job = await client.insert({}, kind="\U0001f600" * 200, queue="\u00e9" * 200)
    assert row(dsn, job.id)["kind"] == "\U0001f600" * 200
    with pytest.raises(ValidationError) as ei:
        await client.insert({}, kind="\U0001f600" * 201)
    assert_field(ei.value, "kind")
    assert count(dsn) == 1


@pytest.mark.parametrize(
    "kw, value, field",
    [
        ("priority", True, "priority"),
        ("priority", 2.0, "priority"),
        ("priority", "2", "priority"),
        ("max_attempts", None, "max_attempts"),
        ("max_attempts", 10**30, "max_attempts"),
        ("kind", 5, "kind"),
        ("queue", None, "queue"),
        ("tags", "a,b", "tags"),
        ("tags", ["ok", 3], "tags"),
        ("metadata", ["not", "a", "dict"], "metadata"),
        ("ordering_key", 12, "ordering_key"),
    ],
)
async def test_wrong_types_rejected(client, dsn, kw, value, field):
    with pytest.raises(ValidationError) as ei:
        await client.insert({"x": 1}, **{"kind": "typed", kw: value})
    assert_field(ei.value, field)
    assert count(dsn) == 0


# -- NUL bytes at any depth -------------------------------------------------------------------

NUL_CASES = [
    ("kind", {"kind": "a\x00b"}, "kind"),
    ("queue", {"queue": "q\x00"}, "queue"),
    ("tag", {"tags": ["fine", "bad\x00tag"]}, "tags"),
    ("args_value", {"args": {"a": "x\x00y"}}, "args"),
    ("args_deep_value", {"args": {"a": {"b": [1, {"c": ["\x00"]}]}}}, "args"),
    ("args_key", {"args": {"k\x00": 1}}, "args"),
    ("args_deep_key", {"args": {"a": [{"b": {"\x00": True}}]}}, "args"),
    ("metadata_value", {"metadata": {"m": "\x00"}}, "metadata"),
    ("metadata_deep_key", {"metadata": {"m": {"n": [{"\x00k": 1}]}}}, "metadata"),
]


@pytest.mark.parametrize("case, opts, field", NUL_CASES, ids=[c[0] for c in NUL_CASES])
async def test_nul_rejected(client, dsn, case, opts, field):
    exc = await rejected_insert(client, dsn, opts, "nul_job")
    assert_field(exc, field)
    assert "NUL" in str(exc)


async def rejected_insert(client, dsn, opts: dict, kind: str) -> ValidationError:
    """Insert ``opts`` (``args`` and insert keywords); it must raise ``ValidationError`` and
    write nothing. Returns the error."""
    opts = dict(opts)
    args = opts.pop("args", {"ok": 1})
    opts.setdefault("kind", kind)
    with pytest.raises(ValidationError) as ei:
        await client.insert(args, **opts)
    assert count(dsn) == 0
    return ei.value


async def test_escaped_backslash_u0000_text_is_not_nul(client, dsn):
    # The six characters \u0000 (backslash, not NUL) are legal text.
    job = await client.insert({"a": "\\u0000", "\\u0000": "\\\\u0000"}, kind="not_nul")
    assert row(dsn, job.id)["args"] == {"a": "\\u0000", "\\u0000": "\\\\u0000"}


@dataclasses.dataclass
class NulArgs:
    nested: dict


async def test_nul_in_dataclass_args_rejected(client, dsn):
    with pytest.raises(ValidationError) as ei:
        await client.insert(NulArgs(nested={"x": ["\x00"]}))
    assert_field(ei.value, "args")
    assert count(dsn) == 0


# -- NaN and infinities ------------------------------------------------------------------------
# orjson writes them as null: the handler got None and the unique key matched a real None


@dataclasses.dataclass
class Measure:
    value: float


NON_FINITE_CASES = [
    ("dataclass_nan", {"args": Measure(float("nan"))}, "args.value"),
    ("dict_inf", {"args": {"a": [1, {"b": float("inf")}]}}, "args.a[1].b"),
    ("metadata_minus_inf", {"metadata": {"m": -float("inf")}}, "metadata.m"),
    ("args_with_null_and_nan", {"args": {"x": None, "y": float("nan")}}, "args.y"),
]


@pytest.mark.parametrize(
    "case, opts, field", NON_FINITE_CASES, ids=[c[0] for c in NON_FINITE_CASES]
)
async def test_nan_and_infinity_rejected(client, dsn, case, opts, field):
    exc = await rejected_insert(client, dsn, opts, "measure")
    assert exc.field == field
    assert "NaN or infinity" in str(exc)
    # a real null is not one
    await client.insert({"x": None, "y": 1.5}, kind="measure")


# -- serializability --------------------------------------------------------------------------

UNSERIALIZABLE = [
    ("set", {"s": {1, 2}}),
    ("object", {"o": object()}),
    ("int_2_64", {"n": 2**64}),
    ("negative_int_beyond_i64", {"n": -(2**63) - 1}),
    ("non_str_key", {1: "x"}),
    ("deep_non_str_key", {"a": [{"b": {(1, 2): 3}}]}),
    ("bytes", {"b": b"raw"}),
]


@pytest.mark.parametrize("case, args", UNSERIALIZABLE, ids=[c[0] for c in UNSERIALIZABLE])
async def test_unserializable_args_rejected(client, dsn, case, args):
    with pytest.raises(ValidationError) as ei:
        await client.insert(args, kind="bad_args")
    assert_field(ei.value, "args")
    assert count(dsn) == 0


@pytest.mark.parametrize("case, meta", UNSERIALIZABLE, ids=[c[0] for c in UNSERIALIZABLE])
async def test_unserializable_metadata_rejected(client, dsn, case, meta):
    with pytest.raises(ValidationError) as ei:
        await client.insert({"ok": 1}, kind="bad_meta", metadata=meta)
    assert_field(ei.value, "metadata")
    assert count(dsn) == 0


async def test_largest_u64_int_is_serializable(client, dsn):
    job = await client.insert({"n": 2**64 - 1, "m": -(2**63)}, kind="big_ints")
    assert row(dsn, job.id)["args"] == {"n": 2**64 - 1, "m": -(2**63)}


@dataclasses.dataclass
class DataclassWithObject:
    payload: object


class StructWithObject(msgspec.Struct):
    payload: object


@pytest.mark.parametrize("args_type", [DataclassWithObject, StructWithObject])
async def test_unserializable_typed_args_raise_validation_error(client, dsn, args_type):
    try:
        with pytest.raises(ValidationError) as ei:
            await client.insert(args_type(payload=object()))
        assert_field(ei.value, "args")
    finally:
        assert count(dsn) == 0


@pytest.mark.parametrize(
    "args",
    [None, [1, 2], "text", 42, (("a", 1),), NulArgs],
    ids=["none", "list", "str", "int", "tuple", "dataclass_type"],
)
async def test_args_of_unsupported_type_rejected(client, dsn, args):
    with pytest.raises(ValidationError) as ei:
        await client.insert(args, kind="whatever")
    assert_field(ei.value, "args")
    assert count(dsn) == 0


async def test_dict_args_need_kind(client, dsn):
    with pytest.raises(ValidationError) as ei:
        await client.insert({"a": 1})
    assert_field(ei.value, "kind")
    assert count(dsn) == 0


# -- run_at -----------------------------------------------------------------------------------

RUN_AT_OK = [
    ("year1_utc", datetime(1, 1, 1, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC)),
    ("year1_naive", datetime(1, 1, 1), datetime(1, 1, 1, tzinfo=UTC)),
    (
        "year9999_utc",
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ),
    ("year1_plus_offset_west", datetime(1, 1, 1, tzinfo=MINUS5), datetime(1, 1, 1, 5, tzinfo=UTC)),
    ("naive_is_utc", datetime(2040, 6, 1, 12, 0), datetime(2040, 6, 1, 12, 0, tzinfo=UTC)),
    (
        "aware_converted",
        datetime(2040, 6, 1, 17, 0, tzinfo=PLUS5),
        datetime(2040, 6, 1, 12, 0, tzinfo=UTC),
    ),
    ("str_z", "2040-06-01T12:00:00Z", datetime(2040, 6, 1, 12, 0, tzinfo=UTC)),
    ("str_offset", "2040-06-01T07:00:00-05:00", datetime(2040, 6, 1, 12, 0, tzinfo=UTC)),
    ("str_naive", "2040-06-01T12:00:00.250000", datetime(2040, 6, 1, 12, 0, 0, 250000, tzinfo=UTC)),
]


@pytest.mark.parametrize("case, value, stored", RUN_AT_OK, ids=[c[0] for c in RUN_AT_OK])
async def test_run_at_accepted_and_normalized(client, dsn, case, value, stored):
    job = await client.insert({"x": 1}, kind="when", run_at=value)
    assert row(dsn, job.id)["run_at"] == stored
    assert count(dsn) == 1


RUN_AT_BAD = [
    ("year0_after_utc_conversion", datetime(1, 1, 1, tzinfo=PLUS5), "9999"),
    ("year10000_after_utc_conversion", datetime(9999, 12, 31, 23, tzinfo=MINUS5), "9999"),
    ("str_year1_to_year0", "0001-01-01T00:00:00+05:00", "9999"),
    ("str_year0", "0000-12-31T00:00:00Z", "RFC 3339"),
    ("str_year10000", "10000-01-01T00:00:00Z", "RFC 3339"),
    ("not_a_date", "not a date", "RFC 3339"),
    ("empty_str", "", "RFC 3339"),
    ("int", 1700000000, "datetime"),
    ("date", date(2040, 1, 1), "datetime"),
]


@pytest.mark.parametrize("case, value, mention", RUN_AT_BAD, ids=[c[0] for c in RUN_AT_BAD])
async def test_run_at_rejected(client, dsn, case, value, mention):
    with pytest.raises(ValidationError) as ei:
        await client.insert({"x": 1}, kind="when", run_at=value)
    assert_field(ei.value, "run_at")
    assert mention in str(ei.value) or mention in (ei.value.limit or ""), str(ei.value)
    assert count(dsn) == 0


# -- unique_opts ------------------------------------------------------------------------------

UNIQUE_BAD = [
    ("unknown_key", {"by_kind": True}, "unique_opts"),
    ("not_a_dict", "by_args", "unique_opts"),
    ("by_queue_str", {"by_queue": "yes"}, "unique_opts.by_queue"),
    ("by_args_int", {"by_args": 1}, "unique_opts.by_args"),
    ("states_256", {"states": 256}, "unique_opts.states"),
    ("states_negative", {"states": -1}, "unique_opts.states"),
    ("states_bool", {"states": True}, "unique_opts.states"),
    ("states_str", {"states": "31"}, "unique_opts.states"),
    ("by_period_str", {"by_period": "x"}, "unique_opts.by_period"),
    ("by_period_float", {"by_period": 1.5}, "unique_opts.by_period"),
    ("by_period_bool", {"by_period": True}, "unique_opts.by_period"),
    ("by_period_beyond_i64", {"by_period": 2**63}, "unique_opts.by_period"),
]


@pytest.mark.parametrize("case, opts, field", UNIQUE_BAD, ids=[c[0] for c in UNIQUE_BAD])
async def test_bad_unique_opts_rejected(client, dsn, case, opts, field):
    with pytest.raises(ValidationError) as ei:
        await client.insert({"x": 1}, kind="uniq", unique_opts=opts)
    assert ei.value.field == field, (ei.value.field, str(ei.value))
    assert count(dsn) == 0


@pytest.mark.parametrize(
    "opts",
    [
        {"states": 0},
        {"states": 255},
        {"by_period": -(2**63)},
        {"by_period": 2**63 - 1},
        {"by_queue": True, "by_args": False},
    ],
    ids=["states0", "states255", "period_min", "period_max", "bools"],
)
async def test_unique_opts_boundaries_accepted(client, dsn, opts):
    job = await client.insert({"x": 1}, kind="uniq", unique_opts=opts)
    assert job.unique_states == opts.get("states", 31)
    assert len(job.unique_key) == 16
    assert count(dsn) == 1


# -- batches: one bad row writes nothing ------------------------------------------------------

BATCH_BAD = [
    ("nul_arg", {"bad": "x\x00"}, "args"),
    ("set_arg", {"bad": {1, 2}}, "args"),
    ("big_int", {"bad": 2**64}, "args"),
    ("not_a_dict", ["bad"], "args"),
    ("request_priority", EnqueueRequest({"bad": 1}, kind="batch_job", priority=5), "priority"),
    ("request_run_at", EnqueueRequest({"bad": 1}, kind="batch_job", run_at="never"), "run_at"),
    ("request_tags", EnqueueRequest({"bad": 1}, kind="batch_job", tags=["t"] * 21), "tags"),
    (
        "request_unique",
        EnqueueRequest({"bad": 1}, kind="batch_job", unique_opts={"states": 300}),
        "unique_opts.states",
    ),
]


@pytest.mark.parametrize("method", ["insert_many", "insert_many_copy"])
@pytest.mark.parametrize("case, bad, field", BATCH_BAD, ids=[c[0] for c in BATCH_BAD])
async def test_batch_with_one_bad_row_writes_nothing(client, dsn, method, case, bad, field):
    good = [{"n": i} for i in range(50)]
    batch = good[:25] + [bad] + good[25:]
    with pytest.raises(ValidationError) as ei:
        await getattr(client, method)(batch, kind="batch_job")
    assert_field(ei.value, field)
    assert count(dsn) == 0
    # The same batch without the bad row is fine.
    assert len(await getattr(client, method)(good, kind="batch_job")) == 50
    assert count(dsn) == 50


async def test_batch_shared_option_invalid_writes_nothing(client, dsn):
    with pytest.raises(ValidationError) as ei:
        await client.insert_many([{"n": 1}, {"n": 2}], kind="batch_job", max_attempts=1001)
    assert_field(ei.value, "max_attempts")
    assert count(dsn) == 0


async def test_transaction_validation_error_leaves_nothing(client, dsn):
    with pytest.raises(ValidationError) as ei:
        async with await client.transaction() as tx:
            await tx.insert({"ok": 1}, kind="tx_job")
            await tx.insert({"ok": 2}, kind="tx_job", priority=0)
    assert_field(ei.value, "priority")
    assert count(dsn) == 0


# -- sync client and bridge share the rules ---------------------------------------------------


def test_sync_client_validation(sync_client, dsn):
    with pytest.raises(ValidationError) as ei:
        sync_client.insert({"x": 1}, kind="sync_job", queue="q" * 201)
    assert_field(ei.value, "queue")
    with pytest.raises(ValidationError) as ei:
        sync_client.insert_many([{"x": 1}, {"x": "\x00"}], kind="sync_job")
    assert_field(ei.value, "args")
    with pytest.raises(ValidationError) as ei:
        with sync_client.transaction() as tx:
            tx.insert({"x": 1}, kind="sync_job")
            tx.insert({"x": 2}, kind="sync_job", tags=["\x00"])
    assert_field(ei.value, "tags")
    assert count(dsn) == 0


def test_bridge_sync_validation(dsn):
    from awa_fast.bridge import insert_job_sync

    with psycopg.connect(dsn) as conn:
        with pytest.raises(ValidationError) as ei:
            insert_job_sync(conn, {"x": 1}, kind="bridge_job", max_attempts=0)
        assert_field(ei.value, "max_attempts")
        conn.commit()
    assert count(dsn) == 0


async def test_bridge_async_validation(dsn):
    from awa_fast.bridge import insert_job

    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        with pytest.raises(ValidationError) as ei:
            await insert_job(conn, {"x": {"y": "\x00"}}, kind="bridge_job")
        assert_field(ei.value, "args")
        await conn.commit()
    assert count(dsn) == 0


def test_max_connections_validated(dsn):
    for bad in (0, -1, "10"):
        with pytest.raises(ValidationError) as ei:
            awa_fast.AsyncClient(dsn, max_connections=bad)
        assert_field(ei.value, "max_connections")


def test_validation_error_is_awa_error_and_value_error():
    assert issubclass(ValidationError, awa_fast.AwaError)
    assert issubclass(ValidationError, ValueError)
    assert issubclass(awa_fast.SerializationError, ValidationError)


# -- handler results: RetryAfter and Snooze take a delay in seconds ---------------------------


@pytest.mark.parametrize("cls", [awa_fast.RetryAfter, awa_fast.Snooze])
@pytest.mark.parametrize(
    "bad", [-1, float("nan"), float("inf"), 10**400, 315_360_001, "5", True, None]
)
def test_retry_after_and_snooze_reject_what_is_not_a_delay(cls, bad):
    # 10**400 raised OverflowError and "5" was accepted (float() of it)
    with pytest.raises(ValueError, match="seconds must be"):
        cls(bad)


# -- task() options ---------------------------------------------------------------------------


async def test_task_rejects_an_unknown_option_naming_it_and_what_task_accepts(client):
    # max_attempts reached Registry.register(): a raw "unexpected keyword argument" TypeError
    with pytest.raises(ValidationError) as err:
        client.task(
            dict, kind="o", failure_consequence=awa_fast.NO_FAILURE_CONSEQUENCE, max_attempts=1
        )
    assert err.value.field == "max_attempts" and "failure_consequence" in err.value.limit
    assert "insert(..., max_attempts=...)" in str(err.value)
    with pytest.raises(ValidationError) as err:
        client.task(dict, kind="o", retries=3)
    assert err.value.field == "retries" and "task() accepts kind, queue" in str(err.value)
    assert "o" not in client.registry.handlers


@pytest.mark.parametrize("args_type", ["slow", None, {"a": 1}])
async def test_task_rejects_an_args_type_that_is_not_a_class(client, args_type):
    # task("slow") raised AttributeError inside kind_for_type
    with pytest.raises(ValidationError) as err:
        client.task(args_type)
    assert err.value.field == "args_type" and err.value.limit == "a class", str(err.value)
    if args_type == "slow":
        assert "kind='slow'" in str(err.value)
    assert not any(h.args_type == args_type for h in client.registry.handlers.values())
