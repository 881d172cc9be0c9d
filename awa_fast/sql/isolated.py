"""The registry of bulk statements and their row-by-row fallbacks (``bulk.run_isolated``), and
of the batched completions and their per-job twins: each pair carries the same guard
(tests/structure/test_sql_guards.py, tests/faults/test_one_row_never_wedges_a_statement.py).
"""

from awa_fast.sql.admin import (
    _DRAINABLE,
    _RETRYABLE_FAILED,
    DISCARD_FAILED,
    DISCARD_FAILED_ONE,
    DRAIN_ONE,
    DRAIN_QUEUE,
    DRAINABLE_IDS,
    FAILED_IDS,
    RETRY_FAILED,
    RETRY_FAILED_ONE,
    SETTLED_FAILED_IDS,
)
from awa_fast.sql.batch_ops import _BATCH_ELIGIBLE, BATCH_APPLY, BATCH_APPLY_ONE
from awa_fast.sql.claim import _CLAIMABLE, CLAIM, CLAIM_CANDIDATES, CLAIM_ONE
from awa_fast.sql.dlq import (
    _DLQ_FILTER,
    DEAD_LETTER,
    DEAD_LETTER_MANY,
    DLQ_MATCHING_IDS,
    DLQ_MOVE_BULK,
    DLQ_MOVE_ONE,
    DLQ_PURGE,
    DLQ_PURGE_MATCHING_ONE,
    DLQ_RETRY_BULK,
    DLQ_RETRY_ONE,
)
from awa_fast.sql.finalize import (
    CANCEL_DUPLICATE_ATTEMPT,
    COMPLETE_MANY,
    COMPLETE_MANY_WITH_FOLLOW_UPS,
    COMPLETE_WITH_FOLLOW_UPS,
    HEARTBEAT,
    TRANSITION,
)
from awa_fast.sql.finished import (
    _PAST_QUEUE_RETENTION,
    _STALE_MARK,
    PRUNE_QUEUE_RETENTION,
    PRUNE_QUEUE_RETENTION_IDS,
    PRUNE_QUEUE_RETENTION_ONE,
    SETTLE_STALE_MARK_ONE,
    SETTLE_STALE_MARKS,
    STALE_MARK_IDS,
)
from awa_fast.sql.fragments import _SETTLED_FAILED, S
from awa_fast.sql.maintenance import (
    _CALLBACK_EXPIRED,
    _DLQ_PRUNABLE,
    _DUE,
    _STALE,
    CANCEL_AS_DUPLICATE,
    CANCEL_RESCUED_DUPLICATE,
    DUE_IDS,
    PROMOTE,
    PROMOTE_ONE,
    PRUNE_DLQ,
    PRUNE_DLQ_IDS,
    PRUNE_DLQ_ONE,
    RESCUE,
    RESCUE_CALLBACK_CANDIDATES,
    RESCUE_CALLBACKS,
    RESCUE_CANDIDATES,
)

# Every bulk statement run through bulk.run_isolated, with the statements of its row-by-row
# fallback (candidates, one row, duplicate cancel): each carries the family's one guard
# fragment (checked by tests/faults/test_one_row_never_wedges_a_statement.py). Complete, heartbeat, rescue and the
# dead-letter move redo rows with the bulk statement itself (one-element arrays / %(only)s).
ISOLATED = {
    "claim": (_CLAIMABLE, (CLAIM, CLAIM_CANDIDATES, CLAIM_ONE)),
    "promote": (_DUE, (PROMOTE, DUE_IDS, PROMOTE_ONE, CANCEL_AS_DUPLICATE)),
    "rescue": (_STALE, (RESCUE, RESCUE_CANDIDATES, CANCEL_RESCUED_DUPLICATE)),
    "rescue_callbacks": (
        _CALLBACK_EXPIRED,
        (RESCUE_CALLBACKS, RESCUE_CALLBACK_CANDIDATES, CANCEL_RESCUED_DUPLICATE),
    ),
    "retry_failed": (_RETRYABLE_FAILED, (RETRY_FAILED, FAILED_IDS, RETRY_FAILED_ONE)),
    "drain_queue": (_DRAINABLE, (DRAIN_QUEUE, DRAINABLE_IDS, DRAIN_ONE)),
    "dlq_retry": (_DLQ_FILTER, (DLQ_RETRY_BULK, DLQ_MATCHING_IDS, DLQ_RETRY_ONE)),
    "dlq_purge": (_DLQ_FILTER, (DLQ_PURGE, DLQ_MATCHING_IDS, DLQ_PURGE_MATCHING_ONE)),
    "dlq_move": (_SETTLED_FAILED, (DLQ_MOVE_BULK, SETTLED_FAILED_IDS, DLQ_MOVE_ONE)),
    "discard_failed": (_SETTLED_FAILED, (DISCARD_FAILED, SETTLED_FAILED_IDS, DISCARD_FAILED_ONE)),
    "complete": ("j.run_lease = b.lease AND j.state = 'running'", (COMPLETE_MANY,)),
    "heartbeat": ("j.run_lease = b.lease", (HEARTBEAT,)),
    "dead_letter": (f"{S}.dead_letter_if_enabled(", (DEAD_LETTER_MANY, DEAD_LETTER)),
    "prune_dlq": (_DLQ_PRUNABLE, (PRUNE_DLQ, PRUNE_DLQ_IDS, PRUNE_DLQ_ONE)),
    "settle_stale_marks": (
        _STALE_MARK,
        (SETTLE_STALE_MARKS, STALE_MARK_IDS, SETTLE_STALE_MARK_ONE),
    ),
    "batch_apply": (_BATCH_ELIGIBLE, (BATCH_APPLY, BATCH_APPLY_ONE)),
    "prune_queue_retention": (
        _PAST_QUEUE_RETENTION,
        (PRUNE_QUEUE_RETENTION, PRUNE_QUEUE_RETENTION_IDS, PRUNE_QUEUE_RETENTION_ONE),
    ),
}

# Batched statements whose per-job twin binds the same guard to scalars instead of the batch's
# arrays (``b.id`` / ``b.lease`` against ``%s`` / ``%(id)s``): name -> (guard as the batch
# writes it, batch statements, per-job statements). The batch's row fails alone through
# run_isolated (COMPLETE_MANY with a one-element batch, then CANCEL_DUPLICATE_ATTEMPT on a
# collision); a failed batch of completions is redone job by job by the finalizer (TRANSITION,
# COMPLETE_WITH_FOLLOW_UPS). Compared with the bindings normalized (tests/structure/test_sql_guards.py).
BOUND_TWINS = {
    "complete": (
        "j.id = b.id AND j.run_lease = b.lease AND j.state = 'running'",
        (COMPLETE_MANY, COMPLETE_MANY_WITH_FOLLOW_UPS),
        (COMPLETE_WITH_FOLLOW_UPS, TRANSITION, CANCEL_DUPLICATE_ATTEMPT),
    ),
}
