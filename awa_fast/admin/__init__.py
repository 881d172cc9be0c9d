"""Admin of :class:`~awa_fast.client.AsyncClient`, one module per area. Each operation is
defined once, here, with its public docstring; the client exposes it under the same name
(``get_job = expose(JobAdmin.get_job)``, :mod:`awa_fast.twins`, ADR 041) and the blocking
``Client`` derives its twin from that.

========================  ==============================================================
``admin/jobs.py``         :class:`JobAdmin`: get / list / retry / cancel / discard / dump jobs
``admin/queues.py``       :class:`QueueAdmin`: counts, pause / resume, drain
``admin/health.py``       :class:`HealthAdmin`: ``health_check``
``admin/dlq.py``          :class:`DlqAdmin`: the dead-letter queue (ADR-020)
``admin/cron.py``         :class:`CronAdmin`: stored periodic schedules
``admin/consequences.py`` :class:`ConsequenceAdmin`: corrections, consequences owed
``admin/callbacks.py``    :class:`CallbackAdmin`: operations by callback id (ADR-021)
``admin/storage.py``      :class:`StorageAdmin`: awa-pg's storage calls
``admin/batches.py``      :class:`BatchAdmin`: batch operations (awa's ADR-030)
========================  ==============================================================

Each area takes its dependencies explicitly in its constructor (a
:class:`~awa_fast.connections.Connections`, and for some the heartbeat staleness, the settler,
the runtime getter) and never the client.
"""

from awa_fast.admin.batches import BatchAdmin
from awa_fast.admin.callbacks import CallbackAdmin
from awa_fast.admin.consequences import ConsequenceAdmin
from awa_fast.admin.cron import CronAdmin
from awa_fast.admin.dlq import DlqAdmin, DlqEntry
from awa_fast.admin.health import HealthAdmin, HealthCheck, QueueHealth
from awa_fast.admin.jobs import JobAdmin, RetryFailedResult
from awa_fast.admin.queues import QueueAdmin, QueueStat
from awa_fast.admin.storage import StorageAdmin

__all__ = [
    "BatchAdmin",
    "CallbackAdmin",
    "ConsequenceAdmin",
    "CronAdmin",
    "DlqAdmin",
    "DlqEntry",
    "HealthAdmin",
    "HealthCheck",
    "JobAdmin",
    "QueueAdmin",
    "QueueHealth",
    "QueueStat",
    "RetryFailedResult",
    "StorageAdmin",
]
