"""A lone surrogate in a name, tag or ordering key is a ValidationError naming the field."""

from __future__ import annotations

import pytest

import awa_fast as awa

pytestmark = pytest.mark.usefixtures("clean")


@pytest.mark.parametrize("field", ["kind", "queue", "tags", "ordering_key"])
async def test_lone_surrogates_are_validation_errors(client, field):
    opts = {"kind": "k", "queue": "q"}
    bad = "a\ud800"
    opts[field] = [bad] if field == "tags" else bad
    with pytest.raises(awa.ValidationError) as info:
        await client.insert({"x": 1}, **opts)
    assert info.value.field == field
