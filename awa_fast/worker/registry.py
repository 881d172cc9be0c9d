"""Registered handlers per kind, and how each turns stored JSON args into its typed args."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import msgspec

# Marker for "declared with no business effect on failure" (issue: failure consequences).
NO_FAILURE_CONSEQUENCE = object()
UNDECLARED = object()


def args_decoder(args_type: Any) -> Callable[[dict], Any]:
    """A function converting a job's JSON dict to an instance of ``args_type``.

    pydantic-style types use ``model_validate``; ``msgspec.Struct`` types ``msgspec.convert``;
    dataclasses ``args_type(**args)``; anything else (e.g. ``dict``) gets the dict itself.
    """
    validate = getattr(args_type, "model_validate", None)
    if validate is not None:
        return validate
    if isinstance(args_type, type) and issubclass(args_type, msgspec.Struct):
        return lambda raw: msgspec.convert(raw, args_type)
    if dataclasses.is_dataclass(args_type):
        return lambda raw: args_type(**raw)
    return lambda raw: raw


@dataclasses.dataclass
class Handler:
    """One registered kind: its handler and how to run it."""

    kind: str
    args_type: Any
    fn: Callable
    queue: str
    is_async: bool
    decode: Callable[[dict], Any]
    failure_consequence: Any = UNDECLARED
    verify_success: Callable | None = None


class Registry:
    """Handlers keyed by kind (a later registration for a kind replaces the earlier one)."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}

    def register(self, args_type: Any, fn: Callable, *, kind: str, queue: str = "default",
                 failure_consequence: Any = UNDECLARED, verify_success: Callable | None = None) -> Handler:
        """Register ``fn`` for ``kind``.

        Raises:
            TypeError: ``fn`` is not callable.
        """
        if not callable(fn):
            raise TypeError(f"handler for {kind!r} must be callable")
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None))
        handler = Handler(kind, args_type, fn, queue, is_async, args_decoder(args_type),
                          failure_consequence, verify_success)
        self.handlers[kind] = handler
        return handler

    def get(self, kind: str) -> Handler | None:
        return self.handlers.get(kind)

    def queues(self) -> list[str]:
        """The distinct queues of the registered handlers, in registration order."""
        return list(dict.fromkeys(h.queue for h in self.handlers.values()))
