"""Registered handlers per kind, and how each turns stored JSON args into its typed args."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, cast

import msgspec

from awa_fast.errors import ValidationError
from awa_fast.requests import check_name, optional_name
from awa_fast.typed_args import dataclass_decoder

# Marker for "declared with no business effect on failure" (issue: failure consequences).
NO_FAILURE_CONSEQUENCE = object()
UNDECLARED = object()


def args_decoder(args_type: Any) -> Callable[[dict], Any]:
    """A function converting a job's JSON dict to an instance of ``args_type``.

    pydantic-style types use ``model_validate``; ``msgspec.Struct`` types ``msgspec.convert``;
    dataclasses get their declared field types through msgspec (``awa_fast/typed_args.py``);
    anything else (e.g. ``dict``) gets the dict itself.
    """
    validate = getattr(args_type, "model_validate", None)
    if validate is not None:
        return validate
    if isinstance(args_type, type) and issubclass(args_type, msgspec.Struct):
        return lambda raw: msgspec.convert(raw, args_type)
    if dataclasses.is_dataclass(args_type):
        return dataclass_decoder(cast(type, args_type))  # an args type is a class
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
    explicit_queue: bool = False  # registered with queue=...: start() must start that queue


def check_consequence(kind: str, consequence: Any) -> None:
    """Raises TypeError unless ``consequence`` is a callable, NO_FAILURE_CONSEQUENCE or unset."""
    if consequence is UNDECLARED or consequence is NO_FAILURE_CONSEQUENCE or callable(consequence):
        return
    raise TypeError(
        f"failure_consequence of {kind!r} must be an async callable taking a "
        "JobFailure, or awa_fast.NO_FAILURE_CONSEQUENCE"
    )


class Registry:
    """Handlers keyed by kind (a later registration for a kind replaces the earlier one)."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        # Consequences declared for kinds whose handler lives elsewhere.
        self.consequences: dict[str, Any] = {}
        self.decoders: dict[str, Callable[[dict], Any]] = {}  # args types known from declarations
        self.verifiers: dict[str, Callable] = {}
        # kind -> its handler's queue, for kinds registered for a queue other than "default"
        self.off_default: dict[str, str] = {}

    def register(
        self,
        args_type: Any,
        fn: Callable,
        *,
        kind: str,
        queue: str | None = None,
        failure_consequence: Any = UNDECLARED,
        verify_success: Callable | None = None,
    ) -> Handler:
        """Register ``fn`` for ``kind`` (on ``queue``, ``None`` = ``"default"``).

        Raises:
            ValidationError: ``kind`` or ``queue`` breaks the name rule
                (``requests.check_name``), before anything is registered.
            TypeError: ``fn`` is not callable.
        """
        check_name(kind, "kind")
        optional_name(queue, "queue")
        if not callable(fn):
            raise TypeError(f"handler for {kind!r} must be callable")
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - the bound __call__ itself, not callable()
        )
        check_consequence(kind, failure_consequence)
        if failure_consequence is UNDECLARED and kind in self.consequences:
            failure_consequence = self.consequences[kind]
        handler = Handler(
            kind,
            args_type,
            fn,
            "default" if queue is None else queue,
            is_async,
            args_decoder(args_type),
            failure_consequence,
            verify_success,
            explicit_queue=queue is not None,
        )
        if verify_success is not None:
            self.verifiers[kind] = verify_success
        self.handlers[kind] = handler
        if handler.queue == "default":
            self.off_default.pop(kind, None)
        else:
            self.off_default[kind] = handler.queue
        return handler

    def declare_consequence(self, kind: str, consequence: Any, args_type: Any = None) -> None:
        """Declare ``kind``'s failure consequence without registering a handler here
        (``args_type``, when given, types the args the consequence sees).

        Raises:
            ValidationError: ``kind`` breaks the name rule (``requests.check_name``).
            TypeError: ``consequence`` is neither an async callable nor NO_FAILURE_CONSEQUENCE.
        """
        check_name(kind, "kind")
        if consequence is UNDECLARED:
            raise TypeError("declare a callable or NO_FAILURE_CONSEQUENCE")
        check_consequence(kind, consequence)
        self.consequences[kind] = consequence
        if args_type is not None:
            self.decoders[kind] = args_decoder(args_type)
        handler = self.handlers.get(kind)
        if handler is not None:
            handler.failure_consequence = consequence

    def undeclared_kinds(self) -> list[str]:
        """Registered kinds with neither a consequence nor an explicit no-effect declaration."""
        return sorted(
            k
            for k, h in self.handlers.items()
            if h.failure_consequence is UNDECLARED and k not in self.consequences
        )

    def consequence_kinds(self) -> set[str]:
        """Kinds with a failure consequence to apply (a callable; not ``NO_FAILURE_CONSEQUENCE``),
        whether their handler is registered here or only the consequence is declared."""
        found = {
            **{k: h.failure_consequence for k, h in self.handlers.items()},
            **self.consequences,
        }
        return {k for k, c in found.items() if c is not NO_FAILURE_CONSEQUENCE and callable(c)}

    def decoder(self, kind: str) -> Callable[[dict], Any] | None:
        """How to type ``kind``'s args: its handler's args type, else a declared one."""
        handler = self.handlers.get(kind)
        return handler.decode if handler is not None else self.decoders.get(kind)

    def get(self, kind: str) -> Handler | None:
        return self.handlers.get(kind)

    def queues(self) -> list[str]:
        """The distinct queues of the registered handlers, in registration order."""
        return list(dict.fromkeys(h.queue for h in self.handlers.values()))


TASK_OPTIONS = ("kind", "queue", "failure_consequence", "verify_success")
# Options of insert() that are per job, not per handler.
_INSERT_ONLY = ("priority", "max_attempts", "tags", "metadata", "run_at", "unique_opts")


def check_task_options(args_type: Any, options: dict) -> None:
    """What ``task()`` checks before registering (a raw AttributeError / TypeError otherwise).

    Raises:
        ValidationError: naming ``args_type`` or the unknown option.
    """
    if not isinstance(args_type, type):
        hint = (
            f"; to name the kind, use task(dict, kind={args_type!r})"
            if isinstance(args_type, str)
            else ""
        )
        raise ValidationError(
            f"task() args_type must be a class (dict, a dataclass, a msgspec.Struct or a "
            f"pydantic model), got {type(args_type).__name__} {args_type!r}{hint}",
            field="args_type",
            limit="a class",
        )
    for key in options:
        if key in ("failure_consequence", "verify_success"):
            continue
        where = f"; {key} is set per job: insert(..., {key}=...)" if key in _INSERT_ONLY else ""
        raise ValidationError(
            f"task() got an unknown option {key!r}{where}; task() accepts "
            f"{', '.join(TASK_OPTIONS)}",
            field=key,
            limit=f"one of {', '.join(TASK_OPTIONS)}",
        )
