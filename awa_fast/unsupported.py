"""awa-pg calls awa-fast does not implement yet. Each raises :class:`~awa_fast.errors.Unsupported`
(a ``ValidationError``) naming itself, so an application learns it at once instead of getting
an ``AttributeError`` later or, worse, nothing. ``docs/architecture.md`` says why each is left.
"""

from __future__ import annotations

from typing import Any

from awa_fast.errors import Unsupported

_DESCRIPTORS = "queue and job-kind descriptors are not stored by awa-fast"
_BATCH = "batch operations (set priority / move queue)"


class UnsupportedMixin:
    """Methods of awa-pg's clients that raise ``Unsupported`` (shared by both clients: they
    raise before doing anything, so the async and sync forms are the same call)."""

    def queue_descriptor(self, queue: str, **fields: Any) -> None:
        raise Unsupported("queue_descriptor", _DESCRIPTORS)

    def job_kind_descriptor(self, kind: str, **fields: Any) -> None:
        raise Unsupported("job_kind_descriptor", _DESCRIPTORS)

    def preview_batch_operation(self, *args: Any, **kwargs: Any) -> None:
        raise Unsupported("preview_batch_operation", _BATCH)

    def submit_batch_operation(self, *args: Any, **kwargs: Any) -> None:
        raise Unsupported("submit_batch_operation", _BATCH)

    def preview_set_priority(self, *args: Any, **kwargs: Any) -> None:
        raise Unsupported("preview_set_priority", _BATCH)

    def set_priority(self, *args: Any, **kwargs: Any) -> None:
        raise Unsupported("set_priority", _BATCH)

    def preview_move_queue(self, *args: Any, **kwargs: Any) -> None:
        raise Unsupported("preview_move_queue", _BATCH)

    def move_queue(self, *args: Any, **kwargs: Any) -> None:
        raise Unsupported("move_queue", _BATCH)

    def list_batch_operations(self, *args: Any, **kwargs: Any) -> None:
        raise Unsupported("list_batch_operations", _BATCH)

    def get_batch_operation(self, *args: Any, **kwargs: Any) -> None:
        raise Unsupported("get_batch_operation", _BATCH)

    def cancel_batch_operation(self, *args: Any, **kwargs: Any) -> None:
        raise Unsupported("cancel_batch_operation", _BATCH)

    def purge_batch_operations(self, *args: Any, **kwargs: Any) -> None:
        raise Unsupported("purge_batch_operations", _BATCH)


def init_telemetry(endpoint: str, service_name: str, export_interval_ms: int = 5000) -> bool:
    """awa-pg's OTLP metrics/traces exporter. Raises ``Unsupported``: awa-fast exports no
    OpenTelemetry data yet."""
    raise Unsupported("init_telemetry", "awa-fast exports no OpenTelemetry metrics or traces")


def shutdown_telemetry() -> None:
    """Nothing to shut down: :func:`init_telemetry` never starts an exporter."""
