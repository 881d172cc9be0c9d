"""awa's queue and job-kind descriptors on a real PostgreSQL: declared before start(), checked
against awa's limits and rules (unknown queue, after start), stored at start, refreshed by the
presence beat (``updated_at`` moves only when the declaration changes), pruned by the leader
after ``descriptor_retention_days`` (0 keeps them)."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest

import awa_fast as awa
from awa_fast.worker.maintenance import Maintenance, MaintenanceConfig
from tests import support
from tests.support import scalar

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "maintenance": False}

pytestmark = pytest.mark.usefixtures("clean")


@dataclasses.dataclass
class SendEmail:
    to: str = ""


async def _rows(dsn, table: str, key: str) -> dict:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute(f"SELECT * FROM awa_fast.{table} ORDER BY {key}")
        return {r[key]: r for r in await cur.fetchall()}


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"display_name": "x" * 201}, "display_name"),
        ({"description": "x" * 2001}, "description"),
        ({"owner": 5}, "owner"),
        ({"docs_url": "h" * 2049}, "docs_url"),
        ({"tags": ["t"] * 21}, "tags"),
        ({"tags": "solo"}, "tags"),
        ({"extra": ["not", "a", "dict"]}, "extra"),
    ],
)
async def test_limits_are_validation_errors(client, kwargs, field):
    for declare in (client.queue_descriptor, client.job_kind_descriptor):
        with pytest.raises(awa.ValidationError) as info:
            declare("email", **kwargs)
        assert info.value.field == field
    assert client.queue_descriptors == {} and client.kind_descriptors == {}


async def test_declared_stored_refreshed_and_rules(dsn, client):
    @client.task(SendEmail, queue="email")
    async def send(job):
        return None

    client.queue_descriptor(
        "email",
        display_name="Outbound email",
        owner="growth@example.com",
        docs_url="https://runbook/email",
        tags=["user-facing"],
        extra={"tier": 1},
    )
    client.job_kind_descriptor("send_email", description="Renders and hands off to SES.")
    client.queue_descriptor("nowhere", display_name="not run here")
    with pytest.raises(awa.ValidationError, match="unknown queue 'nowhere'") as info:
        await client.start([("email", 2)], **FAST)  # awa: a descriptor for a queue not run
    assert info.value.field == "queue" and client.runtime is None
    del client.queue_descriptors["nowhere"]

    await client.start([("email", 2)], **FAST)
    with pytest.raises(RuntimeError, match="before start"):
        client.queue_descriptor("email", display_name="changed")
    queues = await _rows(dsn, "queue_descriptors", "queue")
    kinds = await _rows(dsn, "job_kind_descriptors", "kind")
    email = queues["email"]
    assert (
        email["display_name"],
        email["owner"],
        email["docs_url"],
        email["tags"],
        email["extra"],
    ) == (
        "Outbound email",
        "growth@example.com",
        "https://runbook/email",
        ["user-facing"],
        {"tier": 1},
    )
    assert kinds["send_email"]["description"] == "Renders and hands off to SES."
    assert kinds["send_email"]["display_name"] is None and kinds["send_email"]["tags"] == []

    # the presence beat refreshes last_seen_at; an unchanged declaration keeps updated_at
    await scalar(
        dsn,
        "UPDATE awa_fast.queue_descriptors SET last_seen_at = now() - "
        "interval '2 days', updated_at = now() - interval '2 days' RETURNING 1",
    )
    await client.runtime.check_unhandled()
    email = (await _rows(dsn, "queue_descriptors", "queue"))["email"]
    assert email["last_seen_at"] > email["updated_at"]
    await client.shutdown()

    # a changed declaration (next deployment) moves updated_at and the hash
    before = email
    again = awa.AsyncClient(dsn)
    try:

        @again.task(SendEmail, queue="email")
        async def send2(job):
            return None

        again.queue_descriptor("email", display_name="Email (v2)")
        await again.start([("email", 1)], **FAST)
        email = (await _rows(dsn, "queue_descriptors", "queue"))["email"]
        assert email["display_name"] == "Email (v2)" and email["owner"] is None
        assert email["descriptor_hash"] != before["descriptor_hash"]
        assert email["updated_at"] > before["updated_at"]
    finally:
        await again.close()


async def test_leader_prunes_unrefreshed_descriptors(dsn, client):
    @client.task(SendEmail, queue="email")
    async def send(job):
        return None

    client.queue_descriptor("email", display_name="Outbound email")
    client.job_kind_descriptor("send_email", display_name="Send")
    with pytest.raises(awa.ValidationError) as info:
        await client.start([("email", 1)], descriptor_retention_days=-1, **FAST)
    assert info.value.field == "descriptor_retention_days"
    await client.start([("email", 1)], descriptor_retention_days=3, **FAST)
    assert client.runtime.maintenance_config.descriptor_retention_days == 3
    await client.shutdown()
    await scalar(
        dsn,
        "UPDATE awa_fast.job_kind_descriptors SET last_seen_at = now() - "
        "interval '4 days' RETURNING 1",
    )
    # one pass of the leader's cleanup, with that retention
    await Maintenance(dsn, client.pool, MaintenanceConfig(descriptor_retention_days=3)).prune()
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.job_kind_descriptors") == 0
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.queue_descriptors") == 1
    await scalar(
        dsn,
        "UPDATE awa_fast.queue_descriptors SET last_seen_at = now() - "
        "interval '400 days' RETURNING 1",
    )
    # awa: 0 keeps them forever
    await Maintenance(dsn, client.pool, MaintenanceConfig(descriptor_retention_days=0)).prune()
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.queue_descriptors") == 1
