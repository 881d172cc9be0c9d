"""start()'s keywords become one typed, frozen RuntimeConfig, validated once (ADR 040): every
field says its unit and what it is, awa's storage options are typed fields, and what start()
was given is what the config holds. No database: the config is built from a client's
registrations alone."""

from __future__ import annotations

import dataclasses
import logging

import pytest

import awa_fast as awa
from awa_fast import storage_options
from awa_fast.connection_config import ConnectionConfig
from awa_fast.launcher_config import LauncherConfig
from awa_fast.worker.config import (
    MetricsConfig,
    QueueConfig,
    RuntimeConfig,
    StorageConfig,
    describe,
)
from awa_fast.worker.config.runtime import KEYWORDS, MAINTENANCE_KEYWORDS
from awa_fast.worker.maintenance import MaintenanceConfig


@dataclasses.dataclass
class Tick:
    n: int = 0


@pytest.fixture
def client(monkeypatch):
    # a client without a URL connects at its first use only: none here
    monkeypatch.delenv("AWA_FAST_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    client = awa.AsyncClient()
    client.task(Tick, queue="q")(lambda job: None)
    return client


@pytest.mark.parametrize(
    "cls",
    [
        RuntimeConfig,
        QueueConfig,
        MetricsConfig,
        StorageConfig,
        LauncherConfig,
        ConnectionConfig,
        MaintenanceConfig,
    ],
)
def test_every_field_states_its_unit_and_meaning(cls):
    rows = describe(cls)
    assert rows
    assert [name for name, unit, _, text in rows if not unit or not text] == []


def test_awa_storage_options_are_typed_fields():
    assert [f.name for f in dataclasses.fields(StorageConfig)] == list(storage_options.OPTIONS)


def test_every_start_keyword_lands_in_a_field(client):
    given = {
        "poll_interval_ms": 300,
        "heartbeat_interval_ms": 1000,
        "callback_poll_interval_ms": 150,
        "staged_completions": "batched",
        "finalizer_batch_size": 64,
        "sync_handler_threads": 3,
        "maintenance": False,
        "queue_subset": True,
        "cron_interval_ms": 2000,
        "dlq_enabled_by_default": True,
        "gc_freeze": False,
        "consequence_timeout_ms": 5000,
        "consequence_backoff_ms": 250,
        "descriptor_retention_days": 3,
        "global_max_workers": 4,
        "metrics_port": 0,
        "metrics_host": "127.0.0.1",
        "metrics_refresh_ms": 700,
        **{key: 7_000 for key in MAINTENANCE_KEYWORDS},
        "heartbeat_staleness_ms": 60_000,
        "cleanup_batch_size": 10,
        **{name: o.default or 5 for name, o in storage_options.OPTIONS.items()},
        "queue_storage_schema": "awa",
    }
    assert set(given) == set(KEYWORDS) | set(MAINTENANCE_KEYWORDS) | set(storage_options.OPTIONS)
    config = client._start_config([{"name": "q", "min_workers": 1, "weight": 2}], given)
    assert config.queues == (QueueConfig("q", min_workers=1, weight=2),)
    assert (config.poll_interval_ms, config.heartbeat_interval_ms) == (300, 1000)
    assert (config.staged_completions, config.finalizer_batch_size) == ("batched", 64)
    assert (config.sync_handler_threads, config.handler_threads, config.global_max_workers) == (
        3,
        3,
        4,
    )
    assert (config.maintenance, config.queue_subset, config.gc_freeze) == (False, True, False)
    assert (config.cron_interval_ms, config.dlq_enabled_by_default) == (2000, True)
    assert config.metrics == MetricsConfig(port=0, host="127.0.0.1", refresh_ms=700)
    assert (config.consequences.timeout_s, config.consequences.backoff_base_s) == (5.0, 0.25)
    assert config.maintenance_config.promote_interval_ms == 7_000
    assert config.maintenance_config.heartbeat_staleness_ms == 60_000
    assert config.maintenance_config.descriptor_retention_days == 3
    assert config.maintenance_config.terminal_count_rollup_interval_ms == 5  # honoured
    assert config.storage.queue_storage_queue_slot_count == 16
    assert config.storage.storage_transition_role == "auto"
    assert {o.name for o in config.storage.inapplicable()} == {
        name for name, o in storage_options.OPTIONS.items() if o.kind == "inapplicable"
    }


def test_defaults_are_awas(client, caplog):
    caplog.set_level(logging.INFO, "awa_fast.storage_options")
    config = client._start_config(None, {})
    assert config == RuntimeConfig(queues=(QueueConfig("q"),))
    assert config.maintenance_config == MaintenanceConfig()
    assert config.storage == StorageConfig() and not config.storage.inapplicable()
    assert not caplog.records  # nothing inapplicable given, nothing logged


def test_the_config_is_frozen(client):
    config = client._start_config([("q", 2)], {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.poll_interval_ms = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.queues[0].max_workers = 1  # type: ignore[misc]


def test_a_rejected_configuration_builds_nothing(client):
    # the same errors as start(): the field named, the limit given
    with pytest.raises(awa.ConfigError, match="finalizer_batch_size must be an int > 0") as exc:
        client._start_config([("q", 2)], {"finalizer_batch_size": 0})
    assert (exc.value.field, exc.value.limit) == ("finalizer_batch_size", "> 0")
    with pytest.raises(TypeError, match=r"poll_intervl_ms \(did you mean 'poll_interval_ms'"):
        client._start_config([("q", 2)], {"poll_intervl_ms": 5})
    with pytest.raises(TypeError, match="unexpected keyword"):
        client._start_config([("q", 2)], {"queues": [("q", 2)]})
