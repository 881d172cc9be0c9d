"""A verify_success verdict that cannot be recorded is retried with a back-off."""

from __future__ import annotations

import asyncio
import dataclasses

import psycopg
import pytest

from tests import support
from tests.support import scalar, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "maintenance": False}

pytestmark = pytest.mark.usefixtures("clean", "no_presence_rows")


@dataclasses.dataclass
class Job:
    mode: str = ""


async def test_a_verdict_that_cannot_be_recorded_is_backed_off(dsn, client):
    verdicts = []

    @client.task(Job, failure_consequence=lambda failure: None, verify_success=verdicts.append)
    async def handler(job):
        return None

    job = await client.insert(Job())
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # a real fault: recording any verdict fails
        await conn.execute(
            "CREATE FUNCTION awa_test_refuse_verdict() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
        )
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                "CREATE TRIGGER refuse BEFORE DELETE ON awa_fast.verify_due "
                "FOR EACH ROW EXECUTE FUNCTION awa_test_refuse_verdict()"
            )
        await client.start([("default", 1)], **FAST)
        await asyncio.wait_for(client.runtime.wait_attempts_ended(1), 15)
        await wait_state(client, job.id, "completed", timeout=5)
        for _ in range(3):  # the first back-off is 1 s
            await client.runtime.reconcile()
        assert len(verdicts) == 1
        assert await scalar(
            dsn, "SELECT tries FROM awa_fast.verify_due WHERE job_id = %s", (job.id,)
        )
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("DROP TRIGGER IF EXISTS refuse ON awa_fast.verify_due")
            await conn.execute("DROP FUNCTION IF EXISTS awa_test_refuse_verdict()")
