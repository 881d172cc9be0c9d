"""A delay or callback timeout past PostgreSQL's interval range is a ValidationError."""

from __future__ import annotations

import dataclasses

import pytest

import awa_fast as awa
from tests import support
from tests.support import wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "maintenance": False}

pytestmark = pytest.mark.usefixtures("clean", "no_presence_rows")


@dataclasses.dataclass
class Job:
    mode: str = ""


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, 1e12])
def test_retry_after_and_snooze_reject_unbounded_delays(value):
    with pytest.raises(ValueError):
        awa.RetryAfter(value)
    with pytest.raises(ValueError):
        awa.Snooze(value)


# Issue 9, class 2/5: a callback timeout too large for PostgreSQL's interval (1e300 s) reached the
# database and came back to the handler as a raw psycopg DatetimeFieldOverflow; it is a
# ValidationError naming timeout_seconds and its limit, at register_callback and at
# heartbeat_callback, and changes nothing.


async def test_callback_timeout_past_the_interval_range_is_a_validation_error(dsn, client):
    errors = []

    @client.task(Job, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def handler(job):
        try:
            await job.register_callback(timeout_seconds=1e300)
        except awa.ValidationError as exc:
            errors.append((exc.field, exc.limit))
        token = await job.register_callback(timeout_seconds=60)
        try:
            await client.heartbeat_callback(token.id, timeout_seconds=1e12)
        except awa.ValidationError as exc:
            errors.append((exc.field, exc.limit))
        return awa.WaitForCallback(token)

    job = await client.insert(Job())
    await client.start([("default", 1)], **FAST)
    row = await wait_state(client, job.id, "waiting_external", "retryable", "failed", timeout=10)
    assert row["state"] == "waiting_external", row["errors"]
    assert [f for f, _limit in errors] == ["timeout_seconds", "timeout_seconds"]
    assert all("315360000" in limit for _f, limit in errors)
