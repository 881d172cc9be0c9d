"""awa-fast: a Postgres-backed job queue for Python, API-compatible with awa-pg.

``import awa_fast as awa`` in place of ``import awa``.
"""

from awa_fast import callback_contract
from awa_fast._native import native_extensions
from awa_fast.admin import DlqEntry, HealthCheck, QueueHealth, RetryFailedResult
from awa_fast.admin.queues import QueueStat
from awa_fast.batch_ops import (
    BatchOperation,
    BatchOperationFilter,
    BatchOperationKind,
    BatchOperationPreview,
    BatchOperationState,
)
from awa_fast.callback_token import CallbackToken
from awa_fast.callbacks import ResolveResult
from awa_fast.client import AsyncClient
from awa_fast.errors import (
    AttemptStillRunning,
    AwaError,
    CallbackNotFound,
    ConfigError,
    DatabaseError,
    DatabaseUnavailable,
    DeadlockError,
    JobNotFound,
    LiveRuntimesRequireExclusiveWindow,
    QueueMismatchWarning,
    ReadOnlyDatabase,
    RuntimeVersionFloorNotMet,
    SchemaNotMigrated,
    SerializationError,
    StagingError,
    StorageNotFinalized,
    TerminalError,
    UniqueConflict,
    UnknownJobKind,
    Unsupported,
    ValidationError,
    ValidationTypeError,
)
from awa_fast.job import Job, JobState
from awa_fast.partitioned import PartitionedQueue
from awa_fast.raw_client import RawClient
from awa_fast.requests import EnqueueRequest, InsertOpts, UniqueOpts, derive_kind
from awa_fast.results import Cancel, RetryAfter, Snooze, WaitForCallback
from awa_fast.schema import current_migration_version, migrate, migrations, migrations_range
from awa_fast.sync_client import Client
from awa_fast.telemetry import init_telemetry, shutdown_telemetry
from awa_fast.transaction import Transaction
from awa_fast.worker.consequences import JobFailure
from awa_fast.worker.registry import NO_FAILURE_CONSEQUENCE

__all__ = [
    "AsyncClient",
    "AttemptStillRunning",
    "AwaError",
    "DlqEntry",
    "HealthCheck",
    "QueueHealth",
    "CallbackNotFound",
    "CallbackToken",
    "Cancel",
    "JobFailure",
    "Client",
    "ConfigError",
    "DatabaseError",
    "DatabaseUnavailable",
    "DeadlockError",
    "EnqueueRequest",
    "InsertOpts",
    "Job",
    "JobNotFound",
    "JobState",
    "NO_FAILURE_CONSEQUENCE",
    "QueueStat",
    "RawClient",
    "ReadOnlyDatabase",
    "RetryAfter",
    "SchemaNotMigrated",
    "SerializationError",
    "Snooze",
    "StagingError",
    "TerminalError",
    "Transaction",
    "UniqueConflict",
    "UniqueOpts",
    "UnknownJobKind",
    "ValidationError",
    "ValidationTypeError",
    "WaitForCallback",
    "current_migration_version",
    "derive_kind",
    "init_telemetry",
    "migrate",
    "migrations",
    "migrations_range",
    "native_extensions",
    "shutdown_telemetry",
    "Unsupported",
    "LiveRuntimesRequireExclusiveWindow",
    "RuntimeVersionFloorNotMet",
    "StorageNotFinalized",
    "PartitionedQueue",
    "ResolveResult",
    "BatchOperation",
    "BatchOperationFilter",
    "BatchOperationKind",
    "BatchOperationPreview",
    "BatchOperationState",
    "RetryFailedResult",
    "callback_contract",
    "QueueMismatchWarning",
]
