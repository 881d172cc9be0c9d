"""`awa-fast worker`'s flags become one frozen LauncherConfig, validated before any child starts
(ADR 040). No database, no process."""

from __future__ import annotations

import dataclasses
import os

import pytest

from awa_fast.errors import ConfigError
from awa_fast.launcher_config import launcher_config


def test_the_flags_land_in_the_config_and_it_is_frozen():
    config = launcher_config(
        "app:client",
        None,
        queues="default:4",
        drain_timeout=2.5,
        status_interval=0,
        metrics_port=0,
        extra_env={"X": "1"},
    )
    assert config.processes == (os.cpu_count() or 1)
    assert (config.queues, config.drain_timeout_s, config.status_interval_s) == (
        "default:4",
        2.5,
        0.0,
    )
    assert (config.metrics_port, config.metrics_host) == (0, "127.0.0.1")
    assert dict(config.extra_env) == {"X": "1"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.processes = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.extra_env["Y"] = "2"  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"metrics_host": "0.0.0.0"}, "--metrics-host"),
        ({"metrics_port": 70_000}, "--metrics-port"),
        ({"drain_timeout": float("inf")}, "--drain-timeout"),
        ({"drain_timeout": 0}, "--drain-timeout"),
        ({"status_interval": -1}, "--status-interval"),
        ({"log_format": "yaml"}, "--log-format"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(kwargs, field):
    with pytest.raises(ConfigError) as exc:
        launcher_config("app:client", 1, **kwargs)
    assert exc.value.field == field


def test_a_bad_queue_entry_is_refused():
    with pytest.raises(ValueError, match="max_workers must be >= 1"):
        launcher_config("app:client", 1, queues="default:0")
