"""awa-pg calls awa-fast does not implement yet. Each raises :class:`~awa_fast.errors.Unsupported`
(a ``ValidationError``) naming itself, so an application learns it at once instead of getting
an ``AttributeError`` later or, worse, nothing. ``docs/architecture.md`` says why each is left.
"""

from __future__ import annotations

from typing import Any

from awa_fast.errors import Unsupported

_BATCH = "batch operations (set priority / move queue)"


def _unsupported(name: str, why: str):
    def call(self, *args: Any, **kwargs: Any) -> None:
        raise Unsupported(name, why)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"awa-pg's ``{name}``: raises ``Unsupported`` ({why})."
    return call


class UnsupportedMixin:
    """Methods of awa-pg's clients that raise ``Unsupported`` (shared by both clients: they
    raise before doing anything, so the async and sync forms are the same call)."""

    preview_batch_operation = _unsupported("preview_batch_operation", _BATCH)
    submit_batch_operation = _unsupported("submit_batch_operation", _BATCH)
    preview_set_priority = _unsupported("preview_set_priority", _BATCH)
    set_priority = _unsupported("set_priority", _BATCH)
    preview_move_queue = _unsupported("preview_move_queue", _BATCH)
    move_queue = _unsupported("move_queue", _BATCH)
    list_batch_operations = _unsupported("list_batch_operations", _BATCH)
    get_batch_operation = _unsupported("get_batch_operation", _BATCH)
    cancel_batch_operation = _unsupported("cancel_batch_operation", _BATCH)
    purge_batch_operations = _unsupported("purge_batch_operations", _BATCH)
