"""Issue 28, class 4: one rule for every name (``requests.check_name``: a str of 1-200
characters without NUL), applied wherever a kind, queue or schedule name enters: a name
``insert()`` refuses is refused at ``task()``, registration, periodic schedules, follow-up
specs, admin calls and the CLI, as a ``ValidationError`` naming the field, with nothing
registered or written."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from awa_fast import ValidationError

pytestmark = pytest.mark.usefixtures("clean")

BAD = {"empty": "", "too_long": "x" * 201, "nul": "a\x00b", "not_str": 5}


@dataclasses.dataclass
class Ping:
    n: int = 0


async def no_effect(failure):
    pass


def _refused(field: str, call, *args, **kwargs):
    with pytest.raises(ValidationError) as info:
        call(*args, **kwargs)
    assert info.value.field == field, info.value
    return info.value


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
async def test_insert_and_task_refuse_the_same_names(client, bad):
    with pytest.raises(ValidationError) as inserted:
        await client.insert({"n": 1}, kind=bad)
    assert inserted.value.field == "kind"
    _refused("kind", client.task, dict, kind=bad)
    _refused("queue", client.task, Ping, queue=bad)
    with pytest.raises(ValidationError) as at_insert:
        await client.insert(Ping(), queue=bad)
    assert at_insert.value.field == "queue"
    assert not client.registry.handlers  # nothing registered


async def test_an_empty_kind_is_refused_not_derived(client):
    # task(dict, kind="") registered the derived kind "dict"
    _refused("kind", client.task, dict, kind="")
    assert "dict" not in client.registry.handlers


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
async def test_registrations_refuse_a_bad_name(client, bad):
    _refused("kind", client.failure_consequence, bad, no_effect)
    _refused("kind", client.on_completed_enqueue, Ping, lambda a, j: None, kind=bad)
    _refused("name", client.periodic, bad, "* * * * *", Ping, Ping())
    _refused("queue", client.periodic, "every_minute", "* * * * *", Ping, Ping(), queue=bad)
    _refused("queue", client.queue_descriptor, bad)
    assert not client.registry.consequences and not client.periodic_jobs


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
async def test_admin_calls_refuse_a_bad_name(client, bad):
    calls = [
        ("queue", lambda: client.pause_queue(bad)),
        ("queue", lambda: client.drain_queue(bad)),
        ("kind", lambda: client.retry_failed(kind=bad)),
        ("queue", lambda: client.retry_failed(queue=bad)),
        ("kind", lambda: client.discard_failed(bad)),
        ("kind", lambda: client.list_dlq(kind=bad)),
        ("queue", lambda: client.dlq_depth(queue=bad)),
        ("queue", lambda: client.bulk_retry_from_dlq(queue=bad)),
        ("kind", lambda: client.purge_dlq(kind=bad)),
        ("kind", lambda: client.cancel_by_unique_key(bad)),
    ]
    for field, call in calls:
        with pytest.raises(ValidationError) as info:
            await call()
        assert info.value.field == field, (field, info.value)


def test_the_cli_refuses_a_bad_kind_name(dsn):
    out = subprocess.run(
        [sys.executable, "-m", "awa_fast", "--database-url", dsn, "job", "discard", "--kind", ""],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in ("AWA_FAST_DATABASE_URL",)},
        timeout=60,
    )
    assert out.returncode != 0
    assert "kind must be 1 to 200 characters, got 0" in out.stderr, out.stderr


def test_the_compiled_rule_and_its_reference_agree():
    from awa_fast import _native
    from tests import reference_ext

    for value in [*BAD.values(), "ok", "é" * 200]:
        results = []
        for impl in (_native, reference_ext):
            try:
                results.append(("ok", impl.check_name(value, "queues[2]")))
            except ValidationError as exc:
                results.append((str(exc), exc.field, exc.limit))
        assert results[0] == results[1], value
