"""awa 0.7's storage options that tune a mechanism awa-fast does not have (its rotating
queue-storage partitions, stripes, storage transition): accepted with awa's validation, one INFO
line each naming the option and why it has no effect, and listed by ``awa-fast check``
(docs/compat.md, awa_fast/storage_options.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import awa_fast as awa
from awa_fast import storage_options
from tests import support

pytestmark = pytest.mark.usefixtures("clean")

FAST = {**support.FAST, "maintenance": False}
ROOT = Path(__file__).resolve().parent.parent.parent

# One value of each, other than awa's default where awa's default is "not given".
INAPPLICABLE = {
    "queue_storage_queue_slot_count": 32,
    "queue_storage_lease_slot_count": 4,
    "queue_storage_claim_slot_count": 16,
    "queue_storage_queue_stripe_count": 2,
    "queue_storage_queue_rotate_interval_ms": 1000,
    "queue_storage_lease_rotate_interval_ms": 250,
    "queue_storage_claim_rotate_interval_ms": 5000,
    "storage_transition_role": "queue_storage_target",
}


@dataclasses.dataclass
class Tick:
    n: int


def no_effect_lines(caplog, option: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "awa_fast.storage_options"
        and r.levelno == logging.INFO
        and f"{option}=" in r.getMessage()
    ]


def test_the_table_names_every_storage_keyword_of_awa_start():
    # awa 0.7's start() storage keywords (awa-python/python/awa/client.py)
    honoured = {"terminal_count_rollup_interval_ms", "queue_storage_schema"}
    assert set(storage_options.OPTIONS) == {*INAPPLICABLE, *honoured}
    assert {o.name for o in storage_options.OPTIONS.values() if o.kind == "honoured"} == honoured


@pytest.mark.parametrize("option", sorted(INAPPLICABLE))
async def test_an_inapplicable_option_starts_with_one_info_line(client, caplog, option):
    caplog.set_level(logging.INFO, logger="awa_fast.storage_options")
    done: list[int] = []

    @client.task(Tick, queue="q")
    async def work(job):
        done.append(job.args.n)

    await client.start([("q", 1)], **{option: INAPPLICABLE[option]}, **FAST)
    try:
        job = await client.insert(Tick(1), queue="q")
        await support.wait_state(client, job.id, "completed")
    finally:
        await client.shutdown()
    (line,) = no_effect_lines(caplog, option)
    message = line.getMessage()
    assert "has no effect in awa-fast" in message
    assert message.split(": ", 1)[1].startswith(f"{option}={INAPPLICABLE[option]!r}")
    assert storage_options.OPTIONS[option].here in message  # says why
    assert done == [1]


async def test_options_not_given_or_none_log_nothing(client, caplog):
    caplog.set_level(logging.INFO, logger="awa_fast.storage_options")
    client.task(Tick, queue="q")(lambda job: None)
    await client.start([("q", 1)], queue_storage_schema=None, **FAST)
    await client.shutdown()
    assert not [r for r in caplog.records if r.name == "awa_fast.storage_options"]


@pytest.mark.parametrize(
    "option",
    sorted(name for name, o in storage_options.OPTIONS.items() if o.check == "positive_int"),
)
@pytest.mark.parametrize("bad", [0, -1])
async def test_a_count_or_interval_below_one_is_refused_as_awa_refuses_it(
    client, caplog, option, bad
):
    caplog.set_level(logging.INFO, logger="awa_fast.storage_options")
    client.task(Tick, queue="q")(lambda job: None)
    with pytest.raises(ValueError, match=f"{option} must be > 0") as e:
        await client.start([("q", 1)], **{option: bad})
    assert isinstance(e.value, awa.ConfigError) and e.value.field == option
    assert client.runtime is None
    assert not no_effect_lines(caplog, option)


async def test_an_unknown_transition_role_is_refused_naming_the_roles(client):
    client.task(Tick, queue="q")(lambda job: None)
    with pytest.raises(ValueError, match="storage_transition_role must be one of 'auto'"):
        await client.start([("q", 1)], storage_transition_role="both")
    assert client.runtime is None


async def test_awas_default_queue_storage_schema_is_the_clients_own(client, caplog):
    # honoured, not inapplicable: "awa" names the client's schema; another name moves the
    # client (tests/deploy/test_schemas.py)
    caplog.set_level(logging.INFO, logger="awa_fast.storage_options")
    client.task(Tick, queue="q")(lambda job: None)
    await client.start([("q", 1)], queue_storage_schema="awa", **FAST)
    try:
        assert client.runtime.services.schema.name == client.schema == "awa_fast"
    finally:
        await client.shutdown()
    assert not no_effect_lines(caplog, "queue_storage_schema")


async def test_enqueue_many_copy_stripes_log_once_per_client(client, caplog):
    caplog.set_level(logging.INFO, logger="awa_fast.storage_options")
    for n in range(3):
        written = await client.enqueue_many_copy(
            [{"n": n}], kind="tick", queue_storage_queue_stripe_count=4
        )
        assert written == 1
    (line,) = no_effect_lines(caplog, "queue_storage_queue_stripe_count")
    assert line.getMessage().startswith("enqueue_many_copy(): queue_storage_queue_stripe_count=4")
    assert len(await client.list_jobs(kind="tick")) == 3


@pytest.mark.parametrize("call", ["install_queue_storage", "prepare_queue_storage_schema"])
async def test_storage_slot_counts_are_logged_not_refused(client, caplog, call):
    caplog.set_level(logging.INFO, logger="awa_fast.storage")
    await getattr(client, call)(queue_slot_count=32, lease_slot_count=8)
    lines = [r.getMessage() for r in caplog.records if r.name == "awa_fast.storage"]
    assert len(lines) == 1 and lines[0].startswith(f"{call}: queue_slot_count=32 has no effect")
    caplog.clear()
    await getattr(client, call)(lease_slot_count=4)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "awa_fast.storage"]
    assert line.startswith(f"{call}: lease_slot_count=4 has no effect in awa-fast")
    with pytest.raises(ValueError, match="lease_slot_count must be > 0"):
        await getattr(client, call)(lease_slot_count=0)


def test_check_lists_the_options_without_effect(tmp_path):
    (tmp_path / "app07.py").write_text(
        "import dataclasses\nimport awa_fast as awa\n"
        "client = awa.AsyncClient('postgresql://127.0.0.1:1/none')\n"
        "@dataclasses.dataclass\nclass Ping:\n    n: int\n"
        "@client.task(Ping, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)\n"
        "async def ping(job):\n    pass\n"
        "START_OPTIONS = {'queue_storage_queue_rotate_interval_ms': 1000,\n"
        "                 'queue_storage_lease_slot_count': 8,\n"
        "                 'terminal_count_rollup_interval_ms': 30000}\n"
    )

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "awa_fast", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={
                **{
                    k: v
                    for k, v in os.environ.items()
                    if k not in ("AWA_FAST_DATABASE_URL", "DATABASE_URL")
                },
                "PYTHONPATH": str(ROOT),
            },
        )

    r = run("check", "app07:client")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "START_OPTIONS accepted with no effect in awa-fast" in r.stdout
    assert "  queue_storage_queue_rotate_interval_ms=1000: awa-fast has no rotating" in r.stdout
    assert "  queue_storage_lease_slot_count=8: " in r.stdout
    assert "terminal_count_rollup_interval_ms" not in r.stdout  # honoured
    r = run("--json", "check", "app07:client")
    listed = json.loads(r.stdout)["no_effect_options"]
    assert [o["option"] for o in listed] == [
        "queue_storage_lease_slot_count",
        "queue_storage_queue_rotate_interval_ms",
    ]
