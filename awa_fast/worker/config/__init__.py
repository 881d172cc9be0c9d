"""The typed configuration of a worker runtime (ADR 040): :class:`RuntimeConfig` and its parts,
frozen, built and validated once by :func:`runtime_config` from ``start()``'s arguments (the
launcher fills them from ``--queues`` and ``START_OPTIONS``). ``values`` checks one setting,
``queues`` the queue forms, ``checks`` the configuration against what the client registered,
``runtime`` builds the whole."""

from awa_fast.worker.config.checks import HEARTBEAT_SAFETY, check_config
from awa_fast.worker.config.queues import QueueConfig, parse_queues, parse_rate_limit
from awa_fast.worker.config.runtime import (
    DEFAULT_HEARTBEAT_MS,
    MetricsConfig,
    RuntimeConfig,
    StorageConfig,
    consequence_config,
    did_you_mean,
    runtime_config,
)
from awa_fast.worker.config.values import MAX_SETTING_INT, MAX_SETTING_S, describe

__all__ = [
    "DEFAULT_HEARTBEAT_MS",
    "HEARTBEAT_SAFETY",
    "MAX_SETTING_INT",
    "MAX_SETTING_S",
    "MetricsConfig",
    "QueueConfig",
    "RuntimeConfig",
    "StorageConfig",
    "check_config",
    "consequence_config",
    "describe",
    "did_you_mean",
    "parse_queues",
    "parse_rate_limit",
    "runtime_config",
]
