"""The maintenance configuration (intervals, batch sizes, retention) and the retention rules:
what awa accepts (:func:`check_retention`), what the finished slices keep by truncation and
what is deleted row by row (ADR 029)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from awa_fast import sql
from awa_fast.config_fields import doc
from awa_fast.errors import ConfigError

# awa turns a retention into a Rust Duration (Duration::from_secs_f64, awa-python client.rs):
# less than 2**64 seconds, its limit (check_retention).
AWA_MAX_RETENTION_S = float(2**64)
# A retention of 5,000 years or more keeps rows forever (retention_s gives None): now() minus a
# longer one leaves PostgreSQL's range (timestamps from 4713 BC; intervals about 292,000 years),
# and a finished row's finalized_at is its finishing statement's now() (an edit is refused,
# migration 022), so no row written since 2974 BC is that old.
KEEP_FOREVER_S = 5000 * 365.25 * 86400
# Hours of retention the slices expire by truncation alone, per class (completed; failed and
# cancelled): a slice is written again RING_SLOTS periods after it was first written and must
# expire before then, with a period to spare (the one written now). Beyond it, rows are deleted
# row by row (MaintenanceConfig.queue_retention_params; ADR 029).
RING_KEEPS_HOURS = (
    (sql.RING_SLOTS - 2) * sql.COMPLETED_SLICE_S / 3600,
    (sql.RING_SLOTS - 2) * sql.FAILED_SLICE_S / 3600,
)


@dataclasses.dataclass
class MaintenanceConfig:
    """The maintenance leader's settings (awa's defaults): intervals in milliseconds, retention
    in hours or days, each field's unit and meaning in its metadata
    (``config_fields.describe``). ``start()`` builds it once (``worker.config.runtime_config``);
    left mutable because tests tune one pass's setting on a running ``Maintenance``."""

    leader_election_interval_ms: int = doc(10_000, "ms", "how often a non-leader tries to lead")
    promote_interval_ms: int = doc(250, "ms", "how often due scheduled/retryable jobs are promoted")
    heartbeat_rescue_interval_ms: int = doc(30_000, "ms", "how often stale attempts are rescued")
    heartbeat_staleness_ms: int = doc(
        90_000, "ms", "a heartbeat this old marks its attempt dead (>= 2 heartbeat intervals)"
    )
    deadline_rescue_interval_ms: int = doc(30_000, "ms", "how often overdue attempts are rescued")
    callback_rescue_interval_ms: int = doc(
        30_000, "ms", "how often expired callback waits are rescued"
    )
    cleanup_interval_ms: int = doc(60_000, "ms", "how often finished rows and the DLQ are pruned")
    completed_retention_hours: float = doc(24.0, "hours", "completed jobs are kept this long")
    failed_retention_hours: float = doc(
        72.0, "hours", "failed and cancelled jobs are kept this long"
    )
    dlq_retention_days: float = doc(30.0, "days", "dead-lettered jobs are kept this long")
    descriptor_retention_days: float = doc(
        30.0, "days", "unrefreshed descriptors are kept this long; 0 = forever (awa)"
    )
    cleanup_batch_size: int = doc(1000, "rows", "rows one prune statement deletes at most")
    promote_batch_size: int = doc(4096, "rows", "rows one promote statement moves at most")
    reconcile_interval_ms: int = doc(1_000, "ms", "how often the reconciler ticks")
    verify_window_s: float = doc(3600.0, "s", "how far back verify_success hooks look")
    hot_vacuum_interval_ms: int = doc(500, "ms", "how often the hot table's dead rows are checked")
    hot_vacuum_dead_rows: int = doc(5_000, "rows", "dead rows that trigger a hot-table vacuum")
    hot_vacuum_truncate_bytes: int = doc(
        64 * 1024 * 1024, "bytes", "free tail that makes the vacuum truncate the hot table"
    )
    hot_vacuum_truncate_retry_ms: int = doc(
        60_000, "ms", "wait after a refused truncate before trying again"
    )
    terminal_count_rollup_interval_ms: int | None = doc(
        None, "ms", "awa's: the counter fold as its own loop; None = with each prune pass"
    )
    queue_retention: dict[str, tuple[float, float]] = doc(
        None,
        "hours",
        "awa's per-queue retention: queue -> (completed, failed/cancelled)",
        factory=dict,
    )

    def retention_horizons(self) -> tuple[float, float]:
        """Hours the finished slices keep, per class (completed; failed and cancelled): the
        longest retention of any queue, global or its own (``queue_retention``)."""
        completed = [self.completed_retention_hours]
        failed = [self.failed_retention_hours]
        for c, f in self.queue_retention.values():
            completed.append(c)
            failed.append(f)
        return max(completed), max(failed)

    def queue_retention_params(self) -> list[dict[str, Any]]:
        """The parameters of ``sql.PRUNE_QUEUE_RETENTION``, one dict per class that has rows
        to delete one by one; empty when the slices alone expire every queue's rows.

        A queue's retention is left to the slices (``None`` in ``ages``, or ``default_s`` for
        every queue without one) when it is the class's horizon and the ring keeps that long
        (``RING_KEEPS_HOURS``: 30 h completed, 90 h failed and cancelled). A shorter one is
        deleted row by row; so is every retention of a class whose horizon the ring does not
        keep (ADR 029: a slice is written again before its rows expire). A retention of
        ``KEEP_FOREVER_S`` or more is ``None`` too: nothing deletes its rows."""
        horizons = self.retention_horizons()
        queues = sorted(self.queue_retention)
        out = []
        for i, (states, default_h) in enumerate(
            (
                (["completed"], self.completed_retention_hours),
                (["failed", "cancelled"], self.failed_retention_hours),
            )
        ):
            first_slot = i * sql.RING_SLOTS  # the class's slices (sql.slice_table)
            horizon = horizons[i]
            by_slices = horizon <= RING_KEEPS_HOURS[i]

            def row_age_s(hours: float, horizon: float = horizon, by_slices: bool = by_slices):
                return None if by_slices and hours >= horizon else retention_s(hours)

            ages = [row_age_s(self.queue_retention[q][i]) for q in queues]
            default_s = row_age_s(default_h)
            finite = [a for a in [*ages, default_s] if a is not None]
            if not finite:
                continue
            out.append(
                {
                    "states": states,
                    "queues": queues,
                    "ages": ages,
                    "default_s": default_s,
                    "min_s": min(finite),
                    "first_slot": first_slot,
                    "last_slot": first_slot + sql.RING_SLOTS - 1,
                }
            )
        return out

    @property
    def leader_check_ms(self) -> float:
        """Milliseconds between a leader's statements on its lock connection: at most a third
        of the staleness, since another process displaces a holder idle longer than that
        (sql.DISPLACE_FROZEN_LEADER)."""
        return min(self.leader_election_interval_ms, self.heartbeat_staleness_ms / 3)


def retention_s(hours: float) -> float | None:
    """``hours`` of retention in seconds, or ``None`` from ``KEEP_FOREVER_S`` on (kept forever:
    the statements compare with ``now() - NULL``, which no row passes)."""
    seconds = hours * 3600
    return None if seconds >= KEEP_FOREVER_S else seconds


def check_retention(config: MaintenanceConfig) -> None:
    """Reject a retention awa itself does not accept (ADR 029). awa takes any finite number of
    hours (days for ``descriptor_retention_days``) >= 0 and turns it into a Rust ``Duration``
    (``Duration::from_secs_f64``, awa-python's client.rs), which holds less than 2**64 seconds
    (about 5.1e15 hours); above that awa panics. Every retention below it is kept: up to what
    the slice ring keeps (``RING_KEEPS_HOURS``) by whole-slice truncation, beyond it row by
    row, and from ``KEEP_FOREVER_S`` (5,000 years) on forever.

    Raises:
        ConfigError: ``completed_retention_hours``, ``failed_retention_hours``,
            ``descriptor_retention_days`` or a queue's ``retention`` ``completed_hours`` /
            ``failed_hours`` that is not a finite number >= 0, or is 2**64 seconds or longer,
            naming the field (and the queue) and the limit.
    """
    given = [
        ("completed_retention_hours", 3600, config.completed_retention_hours),
        ("failed_retention_hours", 3600, config.failed_retention_hours),
        ("descriptor_retention_days", 86400, config.descriptor_retention_days),
    ]
    for queue, (completed_h, failed_h) in sorted(config.queue_retention.items()):
        given.append((f"queue {queue!r}: retention completed_hours", 3600, completed_h))
        given.append((f"queue {queue!r}: retention failed_hours", 3600, failed_h))
    for field, unit_s, value in given:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise ConfigError(
                f"{field} must be a non-negative finite number, got {value!r}",
                field=field,
                limit=">= 0",
            )
        if value * unit_s >= AWA_MAX_RETENTION_S:
            limit = AWA_MAX_RETENTION_S / unit_s
            raise ConfigError(
                f"{field}={value!r} is longer than awa accepts (less than {limit:.4g} "
                f"{'hours' if unit_s == 3600 else 'days'}: 2**64 seconds, the longest Rust "
                "Duration awa converts a retention to)",
                field=field,
                limit=f"< {limit:.4g}",
            )
