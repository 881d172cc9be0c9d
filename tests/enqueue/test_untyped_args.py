"""Issue 28, class 4: untyped (dict) args and metadata reach the handler exactly as inserted,
or are refused at insert naming the field path (ADR 030). orjson wrote a ``datetime``,
``date``, ``time``, ``UUID``, ``tuple``, ``Enum`` or dataclass inside dict args as a string,
list, value or dict: the handler saw another type than was inserted."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import enum
import uuid

import pytest

from awa_fast import SerializationError, ValidationError
from tests.support import FAST, scalar

pytestmark = pytest.mark.usefixtures("clean")


class Colour(enum.Enum):
    RED = 1


class Tone(enum.StrEnum):
    LOW = "low"


@dataclasses.dataclass
class Point:
    x: int = 1


CHANGED = {  # orjson wrote them; the handler got another type
    "datetime": dt.datetime(2026, 1, 2, 3, 4, 5),
    "date": dt.date(2026, 1, 2),
    "time": dt.time(3, 4),
    "uuid": uuid.UUID(int=7),
    "tuple": (1, 2),
    "enum": Colour.RED,
    "dataclass": Point(),
}
UNWRITABLE = {  # refused before, without the path
    "decimal": decimal.Decimal("1.10"),
    "set": {1, 2},
    "bytes": b"\x01",
    "int_beyond_64_bits": 2**64,
}


@pytest.mark.parametrize("value", list(CHANGED.values()), ids=list(CHANGED))
async def test_a_value_that_would_reach_the_handler_changed_is_refused_naming_its_path(
    dsn, client, value
):
    with pytest.raises(ValidationError) as info:
        await client.insert({"order": {"items": [1, {"when": value}]}}, kind="untyped")
    assert info.value.field == "args.order.items[1].when"
    assert type(value).__name__ in str(info.value)
    with pytest.raises(ValidationError) as many:
        await client.insert_many([{"n": 1}, {"n": value}], kind="untyped")
    assert many.value.field == "args[1].n"
    with pytest.raises(ValidationError) as meta:
        await client.insert({"n": 1}, kind="untyped", metadata={"source": [value]})
    assert meta.value.field == "metadata.source[0]"
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs") == 0


@pytest.mark.parametrize("value", list(UNWRITABLE.values()), ids=list(UNWRITABLE))
async def test_a_value_json_cannot_hold_is_refused_naming_its_path(dsn, client, value):
    with pytest.raises(SerializationError) as info:
        await client.insert({"a": 1, "b": {"c": value}}, kind="untyped")
    assert info.value.field == "args.b.c"
    with pytest.raises(SerializationError) as many:
        await client.insert_many([{"n": 1}, {"n": 2, "m": value}], kind="untyped")
    assert many.value.field == "args[1].m"
    with pytest.raises(SerializationError) as key:
        await client.insert({"by_id": {1: "x"}}, kind="untyped")
    assert key.value.field == "args.by_id key 1"
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs") == 0


async def test_json_values_reach_the_handler_exactly_as_inserted(client):
    sent = {
        "none": None,
        "flag": True,
        "count": 2**63 - 1,
        "unsigned": 2**64 - 1,
        "ratio": 0.1,
        "minus_zero": -0.0,
        "text": "é\u2028",
        "tone": Tone.LOW,  # a str enum comes back as its str: equal
        "nested": {"list": [1, 2.5, "x", None, [False]]},
    }
    got: list = []
    done = asyncio.Event()

    @client.task(dict, kind="exact")
    async def exact(job):
        got.append(job.args)
        done.set()

    await client.insert(sent, kind="exact")
    await client.start([("default", 1)], **FAST)
    await asyncio.wait_for(done.wait(), 15)
    assert got == [sent]

    def types(value):
        if isinstance(value, dict):
            return {k: types(v) for k, v in value.items()}
        if isinstance(value, list):
            return [types(v) for v in value]
        return str if isinstance(value, str) else type(value)

    assert types(got[0]) == types(sent)
