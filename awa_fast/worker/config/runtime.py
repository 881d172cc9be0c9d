"""``start()``'s keywords as one typed, frozen :class:`RuntimeConfig`, built and validated once
by :func:`runtime_config` (from ``AsyncClient.start()``'s arguments, which the launcher fills from
``--queues`` and the application's ``START_OPTIONS``); the runtime is built from it and reads
it, and never validates a setting itself (ADR 040)."""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any

from awa_fast import metrics, storage_options
from awa_fast.errors import ConfigError, ValidationError
from awa_fast.worker.config.checks import check_config
from awa_fast.worker.config.queues import QueueConfig, parse_queues
from awa_fast.worker.config.values import REQUIRED, doc, flag, int_setting, setting
from awa_fast.worker.consequences import ConsequenceConfig
from awa_fast.worker.maintenance import MaintenanceConfig, check_retention
from awa_fast.worker.services import Services

DEFAULT_HEARTBEAT_MS = 30_000
STAGED_COMPLETIONS = ("per_job", "batched")
# awa's retentions: any length below awa's own limit is kept (maintenance.check_retention,
# ADR 029), not capped at MAX_SETTING_S.
_AWA_RETENTIONS = {"completed_retention_hours", "failed_retention_hours"}
# start()'s keywords that set a MaintenanceConfig field of the same name, in check order.
MAINTENANCE_KEYWORDS = (
    "completed_retention_hours",
    "failed_retention_hours",
    "dlq_retention_days",
    "cleanup_batch_size",
    "leader_election_interval_ms",
    "promote_interval_ms",
    "heartbeat_rescue_interval_ms",
    "heartbeat_staleness_ms",
    "deadline_rescue_interval_ms",
    "callback_rescue_interval_ms",
    "cleanup_interval_ms",
    "reconcile_interval_ms",
)


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    """This process's Prometheus endpoint (ADR 010)."""

    port: int | None = doc(
        None, "TCP port", "serve the metrics here (0 = any free port); None = off"
    )
    host: str = doc(metrics.DEFAULT_HOST, "address", "the address the endpoint binds")
    refresh_ms: int = doc(
        metrics.DEFAULT_REFRESH_MS, "ms", "how often queue depth and owed consequences are re-read"
    )


@dataclasses.dataclass(frozen=True)
class StorageConfig:
    """awa 0.7's storage options (``awa_fast/storage_options.py``, docs/compat.md); ``None`` =
    not given. Honoured: ``terminal_count_rollup_interval_ms`` and ``queue_storage_schema``.
    The others tune awa's rotating partitions, which awa-fast does not have: accepted with
    awa's validation, logged once at INFO and listed by ``awa-fast check``."""

    terminal_count_rollup_interval_ms: int | None = doc(
        None, "ms", "honoured: the counter fold's own interval; None = with each prune pass"
    )
    queue_storage_schema: str | None = doc(
        None, "schema name", "honoured: the schema the client and runtime use (ADR 027)"
    )
    queue_storage_queue_slot_count: int | None = doc(None, "count", "no effect (awa default 16)")
    queue_storage_lease_slot_count: int | None = doc(None, "count", "no effect (awa default 8)")
    queue_storage_claim_slot_count: int | None = doc(None, "count", "no effect (awa default 8)")
    queue_storage_queue_stripe_count: int | None = doc(None, "count", "no effect (awa default 1)")
    queue_storage_queue_rotate_interval_ms: int | None = doc(
        None, "ms", "no effect (awa default 1000)"
    )
    queue_storage_lease_rotate_interval_ms: int | None = doc(
        None, "ms", "no effect (awa default 250)"
    )
    queue_storage_claim_rotate_interval_ms: int | None = doc(
        None, "ms", "no effect (awa default: the queue rotate interval)"
    )
    storage_transition_role: str | None = doc(
        None, "role", "no effect: 'auto', 'canonical_drain' or 'queue_storage_target'"
    )

    def inapplicable(self) -> list[storage_options.StorageOption]:
        """The options given that have no effect here, in table order."""
        return storage_options.inapplicable_given(dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """Everything ``start()`` configures, validated (:func:`runtime_config` builds it; the
    ``Runtime`` of ``worker/runtime.py`` runs it). A field's metadata gives its unit and what
    it is (``worker.config.describe(RuntimeConfig)``); the maintenance intervals and retentions
    are ``maintenance_config``'s fields (``worker/maintenance.py``: ms and hours, awa's
    defaults), awa's storage options ``storage``'s."""

    queues: tuple[QueueConfig, ...] = doc(REQUIRED, "queues", "the queues this process works")
    queues_given: bool = doc(
        False, "bool", "start() was given queues (not None: a handler's queue= must be among them)"
    )
    queue_subset: bool = doc(
        False, "bool", "this process works some of the application's queues (launcher --queues)"
    )
    global_max_workers: int | None = doc(
        None, "count", "awa's weighted mode: slots shared by the queues; None = per-queue"
    )
    poll_interval_ms: int = doc(200, "ms", "how often an idle queue is polled for due jobs")
    heartbeat_interval_ms: int = doc(
        DEFAULT_HEARTBEAT_MS, "ms", "how often running attempts beat (<= staleness / 2)"
    )
    callback_poll_interval_ms: int = doc(
        200, "ms", "how often a parked wait_for_callback polls its callback"
    )
    staged_completions: str = doc(
        "per_job", "mode", "'per_job' (ADR-046) or 'batched' finalize of staged follow-ups"
    )
    finalizer_batch_size: int = doc(512, "count", "outcomes one finalize batch holds at most")
    sync_handler_threads: int | None = doc(
        None, "count", "threads running def handlers; None = one per worker slot"
    )
    maintenance: bool = doc(True, "bool", "take part in the maintenance leader election")
    maintenance_config: MaintenanceConfig = doc(
        None,
        "ms / hours / days",
        "the leader's intervals and retentions",
        factory=MaintenanceConfig,
    )
    cron_interval_ms: int = doc(1000, "ms", "how often the leader evaluates periodic schedules")
    dlq_enabled_by_default: bool | None = doc(
        None, "bool", "the DLQ policy written for queues that say none; None = leave it"
    )
    gc_freeze: bool = doc(True, "bool", "gc.freeze() at the end of start (ADR 017)")
    metrics: MetricsConfig = doc(
        None, "MetricsConfig", "the Prometheus endpoint", factory=MetricsConfig
    )
    storage: StorageConfig = doc(
        None, "StorageConfig", "awa 0.7's storage options", factory=StorageConfig
    )
    consequences: ConsequenceConfig = doc(
        None,
        "s (ConsequenceConfig)",
        "the settler's effect timeout and first backoff",
        factory=ConsequenceConfig,
    )

    @property
    def slots(self) -> int:
        """Worker slots of this process: ``global_max_workers``, else the queues' summed."""
        if self.global_max_workers is not None:
            return self.global_max_workers
        return sum(q.max_workers for q in self.queues)

    @property
    def handler_threads(self) -> int:
        """Threads for ``def`` handlers: ``sync_handler_threads``, else one per slot."""
        return self.sync_handler_threads or max(1, self.slots)


# start()'s keywords other than the maintenance ones and awa's storage options (the "did you
# mean" hints are drawn from all three).
KEYWORDS = (
    "poll_interval_ms",
    "global_max_workers",
    "heartbeat_interval_ms",
    "descriptor_retention_days",
    "callback_poll_interval_ms",
    "staged_completions",
    "finalizer_batch_size",
    "sync_handler_threads",
    "maintenance",
    "queue_subset",
    "cron_interval_ms",
    "dlq_enabled_by_default",
    "metrics_port",
    "metrics_host",
    "metrics_refresh_ms",
    "gc_freeze",
    "consequence_timeout_ms",
    "consequence_backoff_ms",
)


def did_you_mean(unknown: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the first of ``unknown`` close to a ``start()`` keyword."""
    known = ["queues", *KEYWORDS, *MAINTENANCE_KEYWORDS, *storage_options.OPTIONS]
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        if close:
            return f" (did you mean {close[0]!r}?)"
    return ""


def consequence_config(
    timeout_ms: Any = None, backoff_ms: Any = None, base: ConsequenceConfig | None = None
) -> ConsequenceConfig:
    """``start()``'s ``consequence_timeout_ms`` / ``consequence_backoff_ms`` (milliseconds) as a
    :class:`ConsequenceConfig`; one not given (``None``) keeps ``base``'s value (default: the
    defaults). ``AsyncClient.start()`` hands the result to its settler; the runtime never
    changes it.

    Raises:
        ConfigError: naming the field (a finite number > 0, at most 100 years).
    """
    config = ConsequenceConfig() if base is None else base
    if timeout_ms is not None:
        timeout_s = setting(timeout_ms, "consequence_timeout_ms") / 1000
        config = dataclasses.replace(config, timeout_s=timeout_s)
    if backoff_ms is not None:
        backoff_s = setting(backoff_ms, "consequence_backoff_ms") / 1000
        config = dataclasses.replace(config, backoff_base_s=backoff_s)
    return config


def runtime_config(
    services: Services,
    queues: Any = None,
    options: dict[str, Any] | None = None,
    *,
    consequences: ConsequenceConfig | None = None,
) -> RuntimeConfig:
    """Validate ``start(queues, **options)`` once and return it typed. ``services`` gives what
    the cross-checks read (registered handlers and their queues, descriptors, schedules,
    specs); ``consequences`` is the client's current settler configuration, which
    ``consequence_timeout_ms`` / ``consequence_backoff_ms`` adjust.

    Raises:
        TypeError: an unknown keyword (naming the close one: "did you mean").
        ConfigError, ValidationError: a value out of range or of the wrong type, naming the
            field (and the queue) and the limit; a configuration that cannot work
            (:func:`~awa_fast.worker.config.checks.check_config`).
    Warns:
        QueueMismatchWarning: as :func:`~awa_fast.worker.config.checks.check_config`.
    """
    opts = dict(options or {})
    settled = consequence_config(
        opts.pop("consequence_timeout_ms", None),
        opts.pop("consequence_backoff_ms", None),
        consequences,
    )
    if opts.get("queue_storage_schema") is not None:
        storage_options.check_value("queue_storage_schema", opts["queue_storage_schema"])
    queue_subset = flag(opts.pop("queue_subset", False), "queue_subset")
    gc_freeze = flag(opts.pop("gc_freeze", True), "gc_freeze")
    storage = _storage(opts)
    global_max_workers = opts.pop("global_max_workers", None)
    parsed = tuple(parse_queues(queues, services.registry.queues(), global_max_workers))
    poll_interval_ms = int(
        setting(opts.pop("poll_interval_ms", 200), "poll_interval_ms", integer=True)
    )
    heartbeat_ms = int_setting(
        opts.pop("heartbeat_interval_ms", None), "heartbeat_interval_ms", DEFAULT_HEARTBEAT_MS
    )
    mconf = _maintenance_config(opts, storage, parsed)
    maintenance = opts.get("maintenance", True)  # checked with the runner's settings
    _cross_checks(services, parsed, queues, queue_subset, heartbeat_ms, mconf, maintenance)
    runner = _runner_settings(opts)
    assert not opts, opts  # every keyword taken by one of the steps above
    return RuntimeConfig(
        queues=parsed,
        queues_given=queues is not None,
        queue_subset=queue_subset,
        global_max_workers=global_max_workers,
        poll_interval_ms=poll_interval_ms,
        heartbeat_interval_ms=heartbeat_ms,
        maintenance_config=mconf,
        gc_freeze=gc_freeze,
        storage=storage,
        consequences=settled,
        **runner,
    )


def _storage(opts: dict[str, Any]) -> StorageConfig:
    """awa's storage options among ``opts`` (popped), after refusing every keyword that is
    neither ``start()``'s nor one of them; the inapplicable ones given are logged once."""
    known = {*KEYWORDS, *MAINTENANCE_KEYWORDS}
    unknown = set(opts) - known - set(storage_options.OPTIONS)
    if unknown:
        raise TypeError(
            f"start() got unexpected keyword(s): {', '.join(sorted(unknown))}"
            + did_you_mean(sorted(unknown))
        )
    given = {k: opts.pop(k) for k in list(opts) if k in storage_options.OPTIONS}
    storage_options.accept(given)  # validated as awa does; the inapplicable ones logged
    return StorageConfig(**given)


def _maintenance_config(
    opts: dict[str, Any], storage: StorageConfig, queues: tuple[QueueConfig, ...]
) -> MaintenanceConfig:
    """The maintenance keywords among ``opts`` (popped) over awa's defaults, with the queues'
    own retentions; checked against awa's retention limit."""
    given = {key: opts.pop(key, None) for key in MAINTENANCE_KEYWORDS}
    given["terminal_count_rollup_interval_ms"] = storage.terminal_count_rollup_interval_ms
    values: dict[str, Any] = {}
    for key, value in given.items():
        if value is not None:
            values[key] = setting(
                value,
                key,
                integer=key == "cleanup_batch_size",
                zero=key in _AWA_RETENTIONS,  # awa: >= 0 (0 prunes at once)
                awa_retention=key in _AWA_RETENTIONS,
            )
    descriptor_days = opts.pop("descriptor_retention_days", None)
    if descriptor_days is not None:  # awa: 0 keeps descriptors forever
        values["descriptor_retention_days"] = setting(
            descriptor_days, "descriptor_retention_days", zero=True, awa_retention=True
        )
    values["queue_retention"] = {q.name: q.retention for q in queues if q.retention is not None}
    mconf = MaintenanceConfig(**values)
    check_retention(mconf)
    return mconf


def _cross_checks(
    services: Services,
    queues: tuple[QueueConfig, ...],
    given: Any,
    queue_subset: bool,
    heartbeat_ms: int,
    mconf: MaintenanceConfig,
    maintenance: Any,
) -> None:
    """The checks of the queues against what the client registered: descriptors of queues not
    started (awa's ``QueueDescriptorWithoutQueue``), then :func:`check_config`."""
    names = {q.name for q in queues}
    for queue in services.queue_descriptors:
        if queue not in names:
            raise ValidationError(
                f"queue descriptor declared for unknown queue {queue!r} "
                "(not among the queues start() runs)",
                field="queue",
            )
    # queue_subset: this process deliberately works some of the application's queues
    # (the launcher's --queues); handlers of the others are left to other processes.
    check_config(
        services.registry,
        list(queues),
        given is not None and not queue_subset,
        heartbeat_ms,
        mconf.heartbeat_staleness_ms,
        # a subset too: plain inserts of those kinds still go to 'default'
        warn_unserved_default=given is not None,
        maintenance=maintenance,
        periodic=bool(services.periodic_jobs),
        specs=bool(services.specs.kinds_any()),
        stacklevel=7,  # the application's start(): its wrapper, start, _start_config, here
    )


def _runner_settings(opts: dict[str, Any]) -> dict[str, Any]:
    """The rest of ``opts``: the runner's and the metrics endpoint's settings, in check order."""
    dlq = flag(opts.pop("dlq_enabled_by_default", None), "dlq_enabled_by_default", optional=True)
    staged = opts.pop("staged_completions", "per_job")
    if staged not in STAGED_COMPLETIONS:
        raise ConfigError(
            "staged_completions must be 'per_job' (ADR-046, the default) or "
            f"'batched', got {staged!r}",
            field="staged_completions",
            limit="'per_job' or 'batched'",
        )
    callback_poll = int(
        setting(
            opts.pop("callback_poll_interval_ms", 200), "callback_poll_interval_ms", integer=True
        )
    )
    maintenance = flag(opts.pop("maintenance", True), "maintenance")
    cron_ms = int_setting(opts.pop("cron_interval_ms", None), "cron_interval_ms", 1000)
    batch = int(
        setting(opts.pop("finalizer_batch_size", 512), "finalizer_batch_size", integer=True)
    )
    threads = opts.pop("sync_handler_threads", None)
    if threads is not None:
        threads = int_setting(threads, "sync_handler_threads", 1)
    return {
        "dlq_enabled_by_default": dlq,
        "staged_completions": staged,
        "callback_poll_interval_ms": callback_poll,
        "maintenance": maintenance,
        "cron_interval_ms": cron_ms,
        "finalizer_batch_size": batch,
        "sync_handler_threads": threads,
        "metrics": _metrics(opts),
    }


def _metrics(opts: dict[str, Any]) -> MetricsConfig:
    """``metrics_port`` / ``metrics_host`` / ``metrics_refresh_ms`` among ``opts``.

    Raises:
        ConfigError: a bad value; ``metrics_port`` in a launcher's child (the launcher serves
            its children's metrics); ``metrics_host`` / ``metrics_refresh_ms`` without
            ``metrics_port`` (a launcher's child may set ``metrics_refresh_ms``: it refreshes
            the launcher's endpoint).
    """
    port = opts.pop("metrics_port", None)
    host = opts.pop("metrics_host", None)
    refresh_ms = opts.pop("metrics_refresh_ms", None)
    if port is not None:
        if os.environ.get(metrics.LAUNCHER_ENV):
            raise ConfigError(
                f"metrics_port={port!r}: this process's metrics are aggregated by the "
                "launcher (awa-fast worker --metrics-port) through "
                f"{metrics.MULTIPROC_ENV}; give the port there",
                field="metrics_port",
            )
        port = metrics.check_port(port)
    config = MetricsConfig(
        port=port,
        host=metrics.check_host(metrics.DEFAULT_HOST if host is None else host),
        refresh_ms=int_setting(refresh_ms, "metrics_refresh_ms", metrics.DEFAULT_REFRESH_MS),
    )
    if port is None:
        # A launcher's child has no port of its own, but its refresh feeds the launcher's endpoint.
        unused = [("metrics_host", host)]
        if not os.environ.get(metrics.LAUNCHER_ENV):
            unused.append(("metrics_refresh_ms", refresh_ms))
        for field, value in unused:
            if value is not None:
                raise ConfigError(
                    f"{field}={value!r} configures the metrics endpoint, but no metrics_port is "
                    "set (start(metrics_port=...) or awa-fast worker --metrics-port): set one, "
                    f"or drop {field}",
                    field=field,
                    limit="only with metrics_port",
                )
    return config
