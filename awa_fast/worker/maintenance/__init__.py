"""Leader-only maintenance: promote due jobs, rescue dead or overdue attempts, prune by
retention, vacuum the hot table, as passes of one scheduler while this process leads.

The modules, one concern each (docs/architecture.md, ADR 036):

- ``config``: :class:`MaintenanceConfig` and the retention rules (:func:`check_retention`).
- ``leader``: the election's lease, lock and epoch, and ``fenced``, the transaction every
  leader write runs in (:class:`Deposed` when another process took over).
- ``scheduler``: :class:`PassScheduler`, which runs each pass at its interval and records its
  :class:`LoopHealth`; one pass can be run directly (``Maintenance.run_pass``).
- ``passes``: what the passes share (:class:`PassContext`, statement helpers).
- ``promote``, ``rescue``, ``prune``, ``vacuum``: the passes.
- ``service``: :class:`Maintenance`, the election loop that starts and stops the passes.
"""

from awa_fast.worker.maintenance.config import (
    KEEP_FOREVER_S,
    RING_KEEPS_HOURS,
    MaintenanceConfig,
    check_retention,
    retention_s,
)
from awa_fast.worker.maintenance.leader import Deposed, Fenced, Leadership
from awa_fast.worker.maintenance.passes import PassContext
from awa_fast.worker.maintenance.scheduler import (
    DEAD_AFTER_FAILURES,
    MAX_BACKOFF_S,
    LoopHealth,
    Pass,
    PassIncomplete,
    PassScheduler,
)
from awa_fast.worker.maintenance.service import STUCK_LOOPS, Maintenance

__all__ = [
    "DEAD_AFTER_FAILURES",
    "KEEP_FOREVER_S",
    "MAX_BACKOFF_S",
    "RING_KEEPS_HOURS",
    "STUCK_LOOPS",
    "Deposed",
    "Fenced",
    "Leadership",
    "LoopHealth",
    "Maintenance",
    "MaintenanceConfig",
    "Pass",
    "PassContext",
    "PassIncomplete",
    "PassScheduler",
    "check_retention",
    "retention_s",
]
