"""start() rejects a setting no pass or claim could use, naming the field, and starts nothing."""

from __future__ import annotations

import dataclasses

import pytest

import awa_fast as awa
from awa_fast.errors import ConfigError
from tests import support
from tests.support import scalar

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "maintenance": False}

pytestmark = pytest.mark.usefixtures("clean", "no_presence_rows")


@dataclasses.dataclass
class Job:
    mode: str = ""


# Issue 9, class 5: maintenance and consequence settings start() accepted but no pass could use: NaN
# / inf retention or staleness (every prune / rescue pass failed with "interval out of range", or
# start() itself raised a raw psycopg error), wrong types (a raw TypeError), "no" taken as true for
# a bool keyword, and a raw ValueError without the field.


@pytest.mark.parametrize(
    "options, field",
    [
        ({"completed_retention_hours": float("nan")}, "completed_retention_hours"),
        ({"failed_retention_hours": float("inf")}, "failed_retention_hours"),
        ({"dlq_retention_days": -1}, "dlq_retention_days"),
        ({"heartbeat_staleness_ms": float("nan")}, "heartbeat_staleness_ms"),
        (
            {"heartbeat_interval_ms": 1_000, "heartbeat_staleness_ms": 10**16},
            "heartbeat_staleness_ms",
        ),
        ({"promote_interval_ms": "100"}, "promote_interval_ms"),
        ({"cleanup_batch_size": 0.5}, "cleanup_batch_size"),
        ({"consequence_timeout_ms": float("nan")}, "consequence_timeout_ms"),
        ({"consequence_backoff_ms": "5"}, "consequence_backoff_ms"),
        ({"dlq_enabled_by_default": "no"}, "dlq_enabled_by_default"),
        ({"maintenance": "no"}, "maintenance"),
        ({"queue_subset": 1}, "queue_subset"),
        ({"staged_completions": None}, "staged_completions"),
    ],
)
async def test_start_rejects_settings_no_pass_could_use(dsn, client, options, field):
    client.task(Job)(lambda job: None)
    with pytest.raises(ConfigError) as err:
        await client.start([("default", 1)], **{**FAST, **options})
    assert err.value.field == field, str(err.value)
    assert client.runtime is None
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.workers") == 0


@pytest.mark.parametrize("dlq", ["no", 0, None])
async def test_start_rejects_a_per_queue_dlq_that_is_not_a_bool(dsn, client, dlq):
    # {"dlq": "no"} was stored as bool("no"): the queue's DLQ turned on
    client.task(Job)(lambda job: None)
    with pytest.raises(ConfigError) as err:
        await client.start([{"name": "default", "max_workers": 1, "dlq": dlq}], **FAST)
    assert err.value.field == "dlq" and err.value.limit == "bool", str(err.value)
    assert "'default'" in str(err.value)
    assert client.runtime is None
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.queue_meta WHERE dlq") == 0


# Issue 9, class 1/5: a queue's deadline_duration_ms too large for PostgreSQL's interval made every
# claim of that queue fail ("interval out of range"): its jobs stayed available forever. A negative,
# fractional or string one was accepted too. start() rejects them naming the field.


@pytest.mark.parametrize(
    "key, value",
    [
        ("deadline_duration_ms", 10**16),
        ("deadline_duration_ms", -1),
        ("deadline_duration_ms", 1.5),
        ("deadline_duration_ms", "300"),
        ("deadline_duration_ms", float("nan")),
        ("priority_aging_interval_ms", 10**16),  # every aging pass overflowed
    ],
)
async def test_a_deadline_no_claim_could_compute_is_rejected_at_start(dsn, client, key, value):
    client.task(Job)(lambda job: None)
    with pytest.raises(awa.ValidationError) as err:
        await client.start([{"name": "default", "max_workers": 2, key: value}], **FAST)
    assert err.value.field == key and "'default'" in str(err.value)
    assert client.runtime is None
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.workers") == 0
