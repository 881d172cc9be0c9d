"""The checks of a runtime configuration against what the client registered: handlers,
their queues and kinds, the heartbeat against the staleness that rescues (``start()`` refuses a
configuration that cannot work before anything runs)."""

from __future__ import annotations

import warnings

from awa_fast.errors import ConfigError, QueueMismatchWarning, ValidationError
from awa_fast.requests import check_name
from awa_fast.worker.config.queues import QueueConfig
from awa_fast.worker.registry import Registry

HEARTBEAT_SAFETY = 2  # heartbeat_staleness_ms must be >= this many heartbeat intervals


def check_config(
    registry: Registry,
    queues: list[QueueConfig],
    explicit_queues: bool,
    heartbeat_interval_ms: int,
    heartbeat_staleness_ms: int,
    *,
    warn_unserved_default: bool | None = None,
    maintenance: bool = True,
    periodic: bool = False,
    specs: bool = False,
    stacklevel: int = 6,
) -> None:
    """Reject at ``start()`` a configuration that cannot work.

    Raises:
        ConfigError: no handlers (unless periodic schedules, or a maintenance process with
            declared consequences or specs); a queue or handler kind that ``insert`` would reject; a
            handler whose queue is not started; ``heartbeat_interval_ms`` not at most
            ``heartbeat_staleness_ms / 2`` (a live attempt would be rescued and run again).

    Warns (``QueueMismatchWarning``) when ``warn_unserved_default`` (default:
    ``explicit_queues``; ``start()`` passes whether queues were given, a ``queue_subset`` too)
    and handlers registered without ``queue=`` are started without ``default``, or every
    handler names its queue and a started queue is named by none; ``stacklevel`` points the
    warning at the application's ``start()`` call.
    """
    if not (registry.handlers or periodic or (maintenance and (registry.consequences or specs))):
        # Without handlers a process is useful only to register periodic schedules or as a
        # maintenance process that knows the consequences or specs of kinds handled elsewhere.
        raise ConfigError(
            "no handlers registered: register at least one worker before starting the "
            "runtime, with @client.task before start() (a maintenance-only process declares "
            "failure consequences with client.failure_consequence)",
            field="handlers",
            limit=">= 1 handler",
        )
    started = _check_queue_names(queues)
    _check_handlers(registry, started, explicit_queues)
    if warn_unserved_default is None:
        warn_unserved_default = explicit_queues
    if warn_unserved_default:
        _warn_unserved(registry, started, stacklevel + 1)
    if heartbeat_interval_ms * HEARTBEAT_SAFETY > heartbeat_staleness_ms:
        raise ConfigError(
            f"heartbeat_interval_ms={heartbeat_interval_ms} is too close to "
            f"heartbeat_staleness_ms={heartbeat_staleness_ms}: a live attempt would be rescued and "
            f"run again",
            field="heartbeat_interval_ms",
            limit=f"<= heartbeat_staleness_ms / {HEARTBEAT_SAFETY}",
        )


def _check_queue_names(queues: list[QueueConfig]) -> set[str]:
    """The started queue names, each one ``insert`` accepts, each given once.

    Raises:
        ConfigError: naming the queue (field ``queues``).
    """
    for i, q in enumerate(queues):
        try:
            check_name(q.name, "queue")
        except ValidationError as exc:
            raise ConfigError(
                f"queues[{i}]: queue name {q.name!r} would be rejected by insert: {exc}",
                field="queues",
                limit=getattr(exc, "limit", None),
            ) from exc
    started = {q.name for q in queues}
    if len(started) < len(queues):
        dup = sorted({q.name for q in queues if [x.name for x in queues].count(q.name) > 1})
        raise ConfigError(
            f"queue(s) {', '.join(map(repr, dup))} configured more than once",
            field="queues",
            limit="each queue once",
        )
    return started


def _check_handlers(registry: Registry, started: set[str], explicit_queues: bool) -> None:
    """Raises ConfigError: a handler kind or queue ``insert`` would reject; with
    ``explicit_queues``, a handler registered with ``queue=`` for a queue not started."""
    for kind, handler in registry.handlers.items():
        try:
            check_name(kind, "kind")
            check_name(handler.queue, "queue")
        except ValidationError as exc:
            raise ConfigError(
                f"handler kind {kind!r} (queue {handler.queue!r}) would be rejected "
                f"by insert: {exc}",
                field="kind",
                limit=getattr(exc, "limit", None),
            ) from exc
        if explicit_queues and handler.explicit_queue and handler.queue not in started:
            raise ConfigError(
                f"the handler of {kind!r} is registered for queue {handler.queue!r}, "
                f"which this process does not start (queues: "
                f"{', '.join(sorted(started))})",
                field="queues",
                limit=f"includes {handler.queue!r}",
            )


def _warn_unserved(registry: Registry, started: set[str], stacklevel: int) -> None:
    """``QueueMismatchWarning``: handlers registered without ``queue=`` and ``default`` not
    started, or every handler names its queue and a started queue is named by none."""
    implicit = sorted(k for k, h in registry.handlers.items() if not h.explicit_queue)
    if implicit and "default" not in started:
        # Not an error: such a handler may serve jobs inserted with queue= into the started
        # queues. But their plain inserts go to 'default', which nothing here serves.
        warnings.warn(
            f"start() serves {', '.join(sorted(started))} but not 'default', where inserts of "
            f"{', '.join(map(repr, implicit[:5]))}{' ...' if len(implicit) > 5 else ''} "
            "without queue= go (their handlers were registered without queue=): those jobs "
            "wait for a worker of 'default'. A misspelt queue name?",
            QueueMismatchWarning,
            stacklevel=stacklevel,
        )
    if registry.handlers and not implicit:
        # Every handler names its queue: a started queue none of them names runs nothing.
        idle = sorted(started - {h.queue for h in registry.handlers.values()})
        if idle:
            warnings.warn(
                f"start() serves {', '.join(map(repr, idle))}, for which no handler is "
                "registered (every handler names its queue: "
                + ", ".join(
                    f"{k!r} -> {h.queue!r}" for k, h in sorted(registry.handlers.items())[:5]
                )
                + "): no job there can run. A misspelt queue name?",
                QueueMismatchWarning,
                stacklevel=stacklevel,
            )
