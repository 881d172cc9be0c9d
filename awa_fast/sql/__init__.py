"""Named SQL statements: every query awa-fast runs lives in this package, one module per concern.

Conventions: every transition after a claim is guarded by ``id``, ``state = 'running'`` and
``run_lease``; statements that lock many rows lock them in id order or with SKIP LOCKED, and
statements that take many unique keys take them in key order, so two of them cannot deadlock
each other. Bulk statements and their row-by-row twins share one guard fragment (``ISOLATED``).

Modules: ``fragments`` (column lists and predicates shared by several modules), ``enqueue``
(inserts, follow-ups), ``claim``, ``finalize`` (outcomes of an attempt, heartbeats),
``maintenance`` (promote, rescue, DLQ prune, aging), ``finished`` (the finished-job
slices: expiry, counters, the hot table's vacuum), ``leader`` (the maintenance leader's lock and
fencing), ``runtime`` (worker presence, wake-ups, schema checks), ``admin`` (job and queue
admin), ``dlq``, ``cron``, ``consequences`` (failure settlement, verification), ``callbacks``
(external waits), ``descriptors``, ``batch_ops``, ``migrate`` (the migration runner's bookkeeping), ``isolated`` (the bulk / row-by-row
registry) ``dashboard`` and ``demo`` (each imported on its own). Every public name of those modules
except ``dashboard``'s and ``demo``'s is re-exported here, so callers write ``sql.NAME``.
"""

from awa_fast.sql.admin import *  # noqa: F403
from awa_fast.sql.batch_ops import *  # noqa: F403
from awa_fast.sql.callbacks import *  # noqa: F403
from awa_fast.sql.claim import *  # noqa: F403
from awa_fast.sql.consequences import *  # noqa: F403
from awa_fast.sql.cron import *  # noqa: F403
from awa_fast.sql.descriptors import *  # noqa: F403
from awa_fast.sql.dlq import *  # noqa: F403
from awa_fast.sql.enqueue import *  # noqa: F403
from awa_fast.sql.finalize import *  # noqa: F403
from awa_fast.sql.finished import *  # noqa: F403
from awa_fast.sql.fragments import *  # noqa: F403
from awa_fast.sql.isolated import *  # noqa: F403
from awa_fast.sql.leader import *  # noqa: F403
from awa_fast.sql.maintenance import *  # noqa: F403
from awa_fast.sql.migrate import *  # noqa: F403
from awa_fast.sql.runtime import *  # noqa: F403
