"""How the client facades get their methods without writing each one out (ADR 041).

Two typed factories, each called once per method in a class body:

- :func:`expose` makes an ``AsyncClient`` method that calls the method of the same name on one
  of the client's components (an admin area of :mod:`awa_fast.admin`, the producer):
  ``get_job = expose(JobAdmin.get_job)``.
- :func:`blocking` makes the blocking twin of an async method, for ``Client`` and
  ``SyncTransaction``: ``get_job = blocking(AsyncClient.get_job)``.
- :func:`parameters_of` gives a blocking facade's ``__init__`` the async class's parameters.
- :func:`variant` makes one of a family of methods that differ in one value (awa's six
  ``on_<outcome>_enqueue``, ``queue_descriptor`` / ``job_kind_descriptor``).

Each returns a plain function whose static type carries the wrapped method's parameters and
result (``ParamSpec``), so mypy and IDEs check every call, and whose runtime signature,
name and docstring are the wrapped method's (``functools.wraps``). A missing twin is a
missing attribute, never a ``__getattr__`` fallback; ``tests/admin/test_client_surface.py`` checks
that each side has the other's methods.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
S = TypeVar("S")
V = TypeVar("V")

# wraps() without copying the wrapped function's __dict__ (a coroutine marker must not reach
# a blocking twin); __wrapped__ is still set, so inspect.signature shows the real parameters.
_WRAPS_UPDATED: tuple[str, ...] = ()


class Composite(Protocol):
    """What :func:`expose` needs of the facade: its component of a given class."""

    def _component(self, cls: type[T]) -> T: ...


class Blocking(Protocol):
    """What :func:`blocking` needs of a blocking facade: the async object it drives and a
    way to run one of its coroutines to completion from this thread."""

    @property
    def _target(self) -> Any: ...

    def _run(self, coro: Coroutine[Any, Any, R]) -> R: ...


def owner_class(fn: Callable[..., Any]) -> type:
    """The class whose body defines ``fn`` (from its module and qualified name).

    Raises:
        TypeError: ``fn`` is not a method defined directly in a module-level class.
    """
    owner_name, _, name = fn.__qualname__.rpartition(".")
    cls = getattr(sys.modules[fn.__module__], owner_name, None)
    if not isinstance(cls, type) or vars(cls).get(name) is not fn:
        raise TypeError(f"{fn.__qualname__} is not a method of a module-level class")
    return cls


def expose(
    fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Composite, P], Coroutine[Any, Any, R]]:
    """A facade method calling ``fn`` (an ``async def`` of a component class) on the
    facade's component of that class, with the same parameters, result and docstring.

    Raises:
        TypeError: at class definition, ``fn`` is not a method of a module-level class.
    """
    cls = owner_class(fn)

    @functools.wraps(fn, updated=_WRAPS_UPDATED)
    async def method(self: Composite, *args: P.args, **kwargs: P.kwargs) -> R:
        return await fn(self._component(cls), *args, **kwargs)

    return method


def blocking(
    fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Blocking, P], R]:
    """The blocking twin of the async method ``fn``: calls the method of the same name on the
    facade's ``_target`` (looked up at each call) and blocks until its coroutine returns;
    same parameters, result, errors and docstring."""
    name = fn.__name__

    @functools.wraps(fn, updated=_WRAPS_UPDATED)
    def method(self: Blocking, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._run(getattr(self._target, name)(*args, **kwargs))

    return method


def parameters_of(
    source: Callable[P, Any],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, P], None]]:
    """Decorator for an ``__init__(self, *args, **kwargs)`` that passes its arguments on to
    ``source`` (a class): its static type and runtime signature become ``source``'s
    constructor parameters, so the two never drift apart."""
    params = list(inspect.signature(source).parameters.values())

    def decorate(init: Callable[..., None]) -> Callable[Concatenate[Any, P], None]:
        self_param = next(iter(inspect.signature(init).parameters.values()))
        init.__signature__ = inspect.Signature([self_param, *params])  # type: ignore[attr-defined]
        return init

    return decorate


def variant(
    fn: Callable[Concatenate[S, V, P], R], value: V, *, name: str, doc: str
) -> Callable[Concatenate[S, P], R]:
    """The method ``name``: ``fn(self, value, ...)`` (a typed ``functools.partialmethod``); its
    other parameters, static type and runtime signature are ``fn``'s, its docstring ``doc``."""
    params = list(inspect.signature(fn).parameters.values())

    def method(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        return fn(self, value, *args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"{fn.__qualname__.rpartition('.')[0] or fn.__module__}.{name}"
    method.__doc__ = doc
    method.__signature__ = inspect.Signature([params[0], *params[2:]])  # type: ignore[attr-defined]
    return method


def variants(
    fn: Callable[Concatenate[S, V, P], R], name: str
) -> Callable[[V, str], Callable[Concatenate[S, P], R]]:
    """A maker of :func:`variant` methods of ``fn``, named ``name.format(value)``:
    ``on_enqueue = variants(register, "on_{}_enqueue")``, then in the class body
    ``on_completed_enqueue = on_enqueue("completed", doc)``."""

    def make(value: V, doc: str) -> Callable[Concatenate[S, P], R]:
        return variant(fn, value, name=name.format(value), doc=doc)

    return make
