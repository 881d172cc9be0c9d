"""A caught error in a client transaction keeps its other writes; an aborting one fails commit."""

from __future__ import annotations

import psycopg
import pytest

import awa_fast as awa
from tests.support import Job, scalar

pytestmark = pytest.mark.usefixtures("clean")


async def test_a_caught_unique_conflict_in_a_transaction_keeps_its_other_writes(dsn, client):
    async with await client.transaction() as tx:
        await tx.execute("CREATE TABLE IF NOT EXISTS orders (id int)")
        await tx.execute("INSERT INTO orders VALUES (1)")
        await tx.insert(Job("audit"), unique_opts={})
        with pytest.raises(awa.UniqueConflict):
            await tx.insert(Job("audit"), unique_opts={})
    assert await scalar(dsn, "SELECT count(*) FROM orders") == 1
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all") == 1


async def test_a_commit_after_an_aborting_error_raises_instead_of_rolling_back_silently(client):
    with pytest.raises(awa.AwaError, match="rolled back"):
        async with await client.transaction() as tx:
            with pytest.raises(awa.DatabaseError) as info:  # typed, the driver's chained
                await tx.execute("SELECT 1/0")
            assert isinstance(info.value.__cause__, psycopg.errors.DivisionByZero)
