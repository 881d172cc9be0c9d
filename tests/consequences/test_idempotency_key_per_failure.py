"""Each failure of the same job gives its failure consequence a different idempotency key."""

from __future__ import annotations

import pytest

import awa_fast as awa
from tests import support
from tests.support import Job, until

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "consequence_backoff_ms": 50}

pytestmark = pytest.mark.usefixtures("clean")


async def test_idempotency_key_differs_per_failure_of_the_same_job(dsn, client):
    keys = []

    async def effect(failure):
        keys.append(failure.idempotency_key)

    @client.task(Job, failure_consequence=effect)
    async def work(job):
        raise awa.TerminalError("no")

    job = await client.insert(Job("x"), max_attempts=1)
    await client.start([{"name": "default", "max_workers": 1, "dlq": True}], **FAST)
    await until(lambda: len(keys) == 1, client, what="first failure")
    await until(lambda: client.get_dlq_job(job.id), client, what="dead-lettered")
    await client.retry_from_dlq(job.id)
    await until(lambda: len(keys) == 2, client, what="second failure")
    assert keys[0] != keys[1]
