"""What ``awa-fast worker`` configures: one frozen :class:`LauncherConfig`, built and validated
once by :func:`launcher_config` from the CLI's flags (or a program's arguments, the demo's) and
handed to the ``Supervisor`` (ADR 040). The children's own configuration is the application's
``start()`` keywords (``START_OPTIONS``) with the queues of ``--queues``: a ``RuntimeConfig``
each child builds (``worker/config/``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from types import MappingProxyType

from awa_fast import metrics
from awa_fast.config_fields import REQUIRED, doc
from awa_fast.errors import ConfigError
from awa_fast.worker.config.values import setting

DEFAULT_WORKERS_PER_QUEUE = 10  # a --queues entry without ":max_workers"
LOG_FORMATS = ("text", "json")


@dataclasses.dataclass(frozen=True)
class LauncherConfig:
    """The launcher's settings (``awa-fast worker``'s flags)."""

    app: str = doc(REQUIRED, "module:attr", "the application's AsyncClient, as uvicorn's spec")
    processes: int = doc(1, "count", "worker children (launcher_config: one per core)")
    queues: str | None = doc(
        None, "name:max_workers,...", "the queues every child works; None = the registered ones"
    )
    drain_timeout_s: float = doc(10.0, "s", "how long a draining child lets handlers finish")
    database_url: str | None = doc(None, "URL", "overrides the client's URL in the children")
    status_interval_s: float = doc(10.0, "s", "between periodic status lines; 0 = none")
    log_level: str = doc("info", "level", "the children's logging level")
    log_format: str = doc("text", "format", "'text' or 'json': children's logs, status lines")
    metrics_port: int | None = doc(
        None, "TCP port", "serve the children's metrics, aggregated (0 = any free); None = off"
    )
    metrics_host: str = doc(metrics.DEFAULT_HOST, "address", "the metrics endpoint's address")
    extra_env: Mapping[str, str] = doc(
        None, "environment", "added to the children's environment", factory=dict
    )
    debug: bool = doc(False, "bool", "print an application error's whole traceback (--traceback)")


def parse_queues_arg(text: str | None) -> list[tuple[str, int]] | None:
    """``"default:10,emails:4"`` -> ``[("default", 10), ("emails", 4)]`` (a bare name gets 10
    workers); ``None``/empty -> ``None`` (the client's registered queues).

    Raises:
        ValueError: a malformed entry or a max_workers that is not a positive integer.
    """
    if not text:
        return None
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, n = item.rpartition(":")
        if not sep:
            name, n = item, str(DEFAULT_WORKERS_PER_QUEUE)
        if not name:
            raise ValueError(f"invalid queue {item!r}: expected name:max_workers")
        try:
            workers = int(n)
        except ValueError:
            raise ValueError(f"invalid queue {item!r}: max_workers must be an integer") from None
        if workers < 1:
            raise ValueError(f"invalid queue {item!r}: max_workers must be >= 1")
        out.append((name, workers))
    return out or None


def launcher_config(
    app: str,
    processes: int | None = None,
    *,
    queues: str | None = None,
    drain_timeout: float = 10.0,
    database_url: str | None = None,
    status_interval: float = 10.0,
    log_level: str = "info",
    log_format: str = "text",
    metrics_port: int | None = None,
    metrics_host: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    debug: bool = False,
) -> LauncherConfig:
    """The launcher's configuration from its flags (seconds for ``drain_timeout`` and
    ``status_interval``; ``processes`` None or 0 = one per core).

    Raises:
        ValueError: a malformed ``queues`` entry (:func:`parse_queues_arg`).
        ConfigError: ``metrics_port`` / ``metrics_host`` is not a valid port / address, or
            ``metrics_host`` is given without ``metrics_port`` (fields ``--metrics-port`` /
            ``--metrics-host``); ``log_format`` not ``text`` or ``json``; ``drain_timeout``
            or ``status_interval`` not a finite number (> 0 / >= 0).
    """
    parse_queues_arg(queues)
    port = None if metrics_port is None else metrics.check_port(metrics_port, "--metrics-port")
    host = metrics.check_host(
        metrics.DEFAULT_HOST if metrics_host is None else metrics_host, "--metrics-host"
    )
    if metrics_host is not None and port is None:  # it would go unused
        raise ConfigError(
            f"--metrics-host {metrics_host} needs --metrics-port (it is that endpoint's address)",
            field="--metrics-host",
            limit="only with --metrics-port",
        )
    if log_format not in LOG_FORMATS:
        raise ConfigError(
            f"log_format must be 'text' or 'json', got {log_format!r}",
            field="--log-format",
            limit="text | json",
        )
    setting(drain_timeout, "--drain-timeout")  # seconds
    setting(status_interval, "--status-interval", zero=True)
    return LauncherConfig(
        app=app,
        processes=processes or os.cpu_count() or 1,
        queues=queues or None,
        drain_timeout_s=float(drain_timeout),
        database_url=database_url,
        status_interval_s=float(status_interval),
        log_level=log_level,
        log_format=log_format,
        metrics_port=port,
        metrics_host=host,
        extra_env=MappingProxyType(dict(extra_env or {})),
        debug=debug,
    )
