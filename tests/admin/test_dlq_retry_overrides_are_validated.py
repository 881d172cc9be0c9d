"""retry_from_dlq validates its priority and queue overrides as an insert does."""

from __future__ import annotations

import pytest

import awa_fast as awa

pytestmark = pytest.mark.usefixtures("clean")


@pytest.mark.parametrize(
    "override", [{"priority": 40000}, {"priority": True}, {"queue": "a\x00b"}, {"queue": 5}]
)
async def test_dlq_retry_overrides_are_validated(client, override):
    with pytest.raises(awa.ValidationError):
        await client.retry_from_dlq(1, **override)
