"""The queues a process works: :class:`QueueConfig`, one per queue, built from awa's queue
forms by :func:`parse_queues` (tuples, dicts, ``None``), validated once at ``start()``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from awa_fast.errors import ConfigError, Unsupported, ValidationError, ValidationTypeError
from awa_fast.worker.config.values import MAX_SETTING_S, REQUIRED, doc, positive

DEFAULT_MAX_WORKERS = 10
DEFAULT_DEADLINE_MS = 300_000
DEFAULT_CLAIM_BATCH = 512

# Per-queue dict keys awa-fast honours; awa's others are rejected by name.
_QUEUE_KEYS = {
    "name",
    "max_workers",
    "deadline_duration_ms",
    "claim_batch_size",
    "claimers",
    "rate_limit",
    "priority_aging_interval_ms",
    "dlq",
    "min_workers",
    "weight",
    "retention",
}
# awa's RetentionPolicy::default: a per-queue retention dict without one of its keys takes
# this, not start()'s global value (awa-python parse_queue_retention_overrides).
AWA_QUEUE_RETENTION_DEFAULT_HOURS = {"completed_hours": 24.0, "failed_hours": 72.0}


@dataclasses.dataclass(frozen=True)
class QueueConfig:
    """One queue this process works (awa's ``QueueConfig``); built by :func:`parse_queues`,
    which validates every field. In weighted mode (``start(global_max_workers=N)``,
    ``worker/weighted.py``) ``min_workers`` and ``weight`` share the slots and ``cap`` is the
    queue's ``max_workers`` if given."""

    name: str = doc(REQUIRED, "name", "the queue's name (required)")
    max_workers: int = doc(DEFAULT_MAX_WORKERS, "count", "concurrent attempts at most")
    deadline_duration_ms: int = doc(
        DEFAULT_DEADLINE_MS, "ms", "an attempt's deadline; 0 = none (at most 100 years)"
    )
    claim_batch_size: int = doc(DEFAULT_CLAIM_BATCH, "count", "rows one claim takes at most")
    rate_limit: tuple[float, int] | None = doc(
        None, "(claims/s, claims)", "(max_rate, burst) of the claim token bucket; None = none"
    )
    priority_aging_interval_ms: int = doc(0, "ms", "how often waiting jobs age; 0 = no aging")
    claimers: int = doc(1, "count", "claim loops sharing the queue's slots (awa's claimers)")
    retention: tuple[float, float] | None = doc(
        None,
        "(hours, hours)",
        "awa's per-queue retention (completed; failed and cancelled); None = start()'s global",
    )
    dlq: bool | None = doc(
        None, "bool", "dead-letter the queue's exhausted jobs; None = leave the stored policy"
    )
    min_workers: int = doc(0, "count", "weighted mode: slots guaranteed to the queue")
    weight: int = doc(1, "count", "weighted mode: the queue's share of the overflow slots")
    cap: int | None = doc(None, "count", "weighted mode: max_workers when given; None = no cap")


def parse_queues(
    queues: Any, registered: list[str], global_max_workers: int | None = None
) -> list[QueueConfig]:
    """awa's queue forms: ``None`` (one queue per registered handler queue, 10 workers), a list of
    ``(name, max_workers)`` tuples, a list of dicts with ``name`` and ``max_workers`` plus
    optional ``deadline_duration_ms``, ``claim_batch_size``, ``claimers`` (an int >= 1: claim
    loops sharing the queue's slots, awa's meaning), ``rate_limit=(max_rate, burst)`` (claims
    per second, bucket size), ``priority_aging_interval_ms``, ``dlq`` (a bool) and
    ``retention`` (a dict with ``completed_hours`` and/or ``failed_hours``, numbers >= 0; a key
    left out takes awa's default, 24 and 72 hours); or ``PartitionedQueue`` configs.
    With ``global_max_workers`` (awa's weighted mode) the dicts give ``min_workers`` (>= 0,
    guaranteed slots) and ``weight`` (>= 1, share of the rest); a ``max_workers`` there caps
    the queue.

    Raises:
        ValidationError: an invalid value, naming the queue and key; weighted mode without
            dict queues, ``min_workers``/``weight`` without ``global_max_workers``, or
            minimums summing past it (awa's rules); ``claimers`` or ``claim_batch_size`` < 1; a
            ``retention`` that is not such a dict. ``Unsupported`` (a ValidationError) for
            unknown keys.
    """
    weighted = global_max_workers is not None
    if weighted:
        positive(global_max_workers, "global_max_workers")
        if queues is None:
            raise ValidationError(
                "weighted mode requires explicit queue configs "
                "(global_max_workers set but queues=None)",
                field="queues",
            )
    if queues is None:
        return [QueueConfig(q) for q in (registered or ["default"])]
    out = [_queue(item, weighted) for item in queues]
    if global_max_workers is not None:  # weighted
        total_min = sum(q.min_workers for q in out)
        if total_min > global_max_workers:
            raise ValidationError(
                f"sum of min_workers ({total_min}) exceeds global_max_workers "
                f"({global_max_workers})",
                field="global_max_workers",
                limit=f">= {total_min}",
            )
    return out


def _queue(item: Any, weighted: bool) -> QueueConfig:
    """One entry of ``start()``'s queue list (a tuple or a dict)."""
    if isinstance(item, tuple) and weighted:
        raise ValidationError(
            "tuple queue config is not supported with global_max_workers; "
            "use dict form with min_workers/weight",
            field="queues",
        )
    if isinstance(item, tuple):
        if len(item) != 2:
            raise ConfigError(
                f"a tuple queue config is (name, max_workers), got {item!r}",
                field="queues",
                limit="(name, max_workers)",
            )
        name, max_workers = item
        return QueueConfig(name, positive(max_workers, f"{name}: max_workers"))
    if not isinstance(item, dict) or "name" not in item:
        raise ValidationError(
            "each queue must be a (name, max_workers) tuple or a dict with 'name'",
            field="queues",
        )
    cfg = dict(item)
    name = cfg.pop("name")
    _check_dict_keys(name, cfg, weighted)
    claimers = cfg.pop("claimers", 1)
    retention = _queue_retention(name, cfg.pop("retention", None))
    share = _weighted_share(name, cfg) if weighted else {}
    return QueueConfig(
        name,
        positive(cfg.pop("max_workers", DEFAULT_MAX_WORKERS), f"{name}: max_workers"),
        deadline_duration_ms=_deadline_ms(
            name, cfg.pop("deadline_duration_ms", DEFAULT_DEADLINE_MS)
        ),
        claim_batch_size=int(cfg.pop("claim_batch_size", DEFAULT_CLAIM_BATCH)),
        rate_limit=parse_rate_limit(name, cfg.pop("rate_limit", None)),
        priority_aging_interval_ms=_aging_ms(name, cfg.pop("priority_aging_interval_ms", None)),
        claimers=claimers,
        retention=retention,
        dlq=cfg.pop("dlq", None),
        **share,
    )


def _check_dict_keys(name: Any, cfg: dict, weighted: bool) -> None:
    """The checks of a queue dict's keys that do not depend on one another's values, in awa's
    order (the values first, valid in no mode when wrong; then what needs weighted mode)."""
    if "max_workers" in cfg and "min_workers" in cfg:
        raise ValidationError(
            f"queue {name!r}: give max_workers or min_workers, not both", field="min_workers"
        )
    for key in cfg:
        if key not in _QUEUE_KEYS:
            raise Unsupported(key, f"queue {name!r}: unknown queue option")
    for key in ("claimers", "claim_batch_size"):
        if key in cfg:
            positive(cfg[key], f"queue {name!r}: {key}")
    if "dlq" in cfg and not isinstance(cfg["dlq"], bool):
        # a truthy string such as "no" would turn the DLQ on
        raise ConfigError(
            f"queue {name!r}: dlq must be a bool, got {cfg['dlq']!r}", field="dlq", limit="bool"
        )
    if "retention" in cfg:
        _queue_retention(name, cfg["retention"])
    # awa: "weight must be > 0" in either mode
    if "weight" in cfg and (
        isinstance(cfg["weight"], bool) or not isinstance(cfg["weight"], int) or cfg["weight"] < 1
    ):
        raise ValidationError(
            f"queue {name!r}: weight must be > 0 (an integer), got {cfg['weight']!r}",
            field="weight",
            limit=">= 1",
        )
    if "min_workers" in cfg:
        _count(cfg["min_workers"], f"queue {name!r}: min_workers", 0)
    if not weighted and ("min_workers" in cfg or "weight" in cfg):
        key = "min_workers" if "min_workers" in cfg else "weight"
        raise ValidationError(
            f"queue {name!r}: {key} needs weighted mode (start(global_max_workers=N))",
            field=key,
        )


def _weighted_share(name: Any, cfg: dict) -> dict[str, Any]:
    """A weighted-mode queue dict's ``min_workers``, ``weight`` and ``cap`` (its
    ``max_workers``, popped from ``cfg``)."""
    return {
        "min_workers": _count(cfg.pop("min_workers", 0), f"queue {name!r}: min_workers", 0),
        "weight": _count(cfg.pop("weight", 1), f"queue {name!r}: weight", 1),
        "cap": (
            positive(cfg.pop("max_workers"), f"{name}: max_workers")
            if "max_workers" in cfg
            else None
        ),
    }


def _queue_retention(queue: str, value: Any) -> tuple[float, float] | None:
    """A queue dict's ``retention`` (awa's per-queue override): ``None``, or a dict with
    ``completed_hours`` and/or ``failed_hours`` (finite numbers >= 0, hours). A key left out
    takes awa's default (``AWA_QUEUE_RETENTION_DEFAULT_HOURS``). awa's upper limit (2**64
    seconds) is checked with the global ones (``maintenance.check_retention``).

    Raises:
        ConfigError: not a dict, another key, or a value that is not a finite number >= 0,
            naming the queue and the key.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(
            f"queue {queue!r}: retention must be a dict with 'completed_hours' and/or "
            f"'failed_hours' keys, got {value!r}",
            field="retention",
            limit="dict",
        )
    unknown = sorted(set(value) - set(AWA_QUEUE_RETENTION_DEFAULT_HOURS))
    if unknown:
        raise ConfigError(
            f"queue {queue!r}: retention takes 'completed_hours' and 'failed_hours', got "
            f"{', '.join(map(repr, unknown))}",
            field="retention",
            limit="completed_hours, failed_hours",
        )
    hours = []
    for key, default in AWA_QUEUE_RETENTION_DEFAULT_HOURS.items():
        h = value.get(key, default)
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not math.isfinite(h) or h < 0:
            raise ConfigError(
                f"queue {queue!r}: retention {key} must be a non-negative finite number "
                f"(hours), got {h!r}",
                field=key,
                limit=">= 0",
            )
        hours.append(float(h))
    return hours[0], hours[1]


def _deadline_ms(queue: str, value: Any) -> int:
    """A queue's ``deadline_duration_ms``: an int from 0 (no deadline) to 100 years. A larger
    one made every claim of the queue fail ("interval out of range"): the queue stood still.

    Raises:
        ValidationError: naming the queue and the field.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < 0
        or value > MAX_SETTING_S * 1000
    ):
        raise ValidationError(
            f"queue {queue!r}: deadline_duration_ms must be an int from 0 (no "
            f"deadline) to {MAX_SETTING_S * 1000} (100 years), got {value!r}",
            field="deadline_duration_ms",
            limit=f">= 0 and <= {MAX_SETTING_S * 1000}",
        )
    return value


def _count(value: Any, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        field = what.rsplit(": ", 1)[-1]
        raise ValidationError(
            f"{what} must be an integer >= {least}, got {value!r}", field=field, limit=f">= {least}"
        )
    return value


def parse_rate_limit(queue: str, value: Any) -> tuple[float, int] | None:
    """``(max_rate, burst)``: ``max_rate`` > 0 claims per second, ``burst`` >= 1 claims.

    Raises:
        ValidationTypeError: not a pair, or a member of the wrong type (a ``TypeError`` too, as
            in awa), naming the queue.
        ValidationError: a value out of range, naming the queue.
    """
    if value is None:
        return None
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError  # a 2-character string unpacks
        rate, burst = value
    except (TypeError, ValueError):
        raise ValidationTypeError(
            f"queue {queue!r}: rate_limit must be a (max_rate, burst) pair or None, got {value!r}",
            field="rate_limit",
        ) from None
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        raise ValidationTypeError(
            f"queue {queue!r}: rate_limit max_rate must be a number (claims per second), "
            f"got {rate!r}",
            field="rate_limit",
        )
    if isinstance(burst, bool) or not isinstance(burst, int):
        raise ValidationTypeError(
            f"queue {queue!r}: rate_limit burst must be an int >= 1, got {burst!r}",
            field="rate_limit",
        )
    if not rate > 0 or rate == float("inf"):
        raise ValidationError(
            f"queue {queue!r}: rate_limit max_rate must be a finite number "
            f"> 0 (claims per second), got {rate!r}",
            field="rate_limit",
            limit="> 0",
        )
    if burst < 1:
        raise ValidationError(
            f"queue {queue!r}: rate_limit burst must be an int >= 1, got {burst!r}",
            field="rate_limit",
            limit=">= 1",
        )
    return float(rate), burst


def _aging_ms(queue: str, value: Any) -> int:
    if value is None:
        return 0
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < 0
        or value > MAX_SETTING_S * 1000
    ):  # beyond it every aging pass overflows
        raise ValidationError(
            f"queue {queue!r}: priority_aging_interval_ms must be an int from "
            f"0 (0 disables aging) to {MAX_SETTING_S * 1000} (100 years), got "
            f"{value!r}",
            field="priority_aging_interval_ms",
            limit=f">= 0 and <= {MAX_SETTING_S * 1000}",
        )
    return value
