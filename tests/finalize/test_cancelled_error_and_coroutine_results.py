"""A handler's own CancelledError counts the attempt; a returned coroutine is awaited."""

from __future__ import annotations

import asyncio

import pytest

from tests import support
from tests.support import Job, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "consequence_backoff_ms": 50}

pytestmark = pytest.mark.usefixtures("clean")


async def test_cancelled_error_from_handler_code_counts_the_attempt(dsn, client):
    @client.task(Job)
    async def work(job):
        inner = asyncio.ensure_future(asyncio.sleep(10))
        inner.cancel()
        await inner  # raises CancelledError inside the handler

    job = await client.insert(Job("x"), max_attempts=2)
    await client.start([("default", 1)], **FAST)
    row = await wait_state(client, job.id, "retryable")
    assert row["attempt"] == 1 and row["errors"][-1]["error"].startswith("CancelledError")


async def test_a_def_handler_returning_a_coroutine_is_awaited(dsn, client):
    done = []

    async def real(job):
        done.append(job.id)

    client.task(Job)(lambda job: real(job))  # a plain callable returning a coroutine
    job = await client.insert(Job("x"))
    await client.start([("default", 1)], **FAST)
    await wait_state(client, job.id, "completed")
    assert done == [job.id]
