"""Signals a component fires after each step it completes (a claim ran, an attempt ended, a
maintenance pass finished), so tests and embedders wait for the next step instead of polling
the database.

A :class:`Signal` is a counter plus waiters. :meth:`Signal.fire` is synchronous and costs an
increment when nobody waits; it runs on the event loop of the component that fires it, after
the step's transaction committed (what the step wrote is visible to the waiter).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Signal:
    """A count of one component's steps that coroutines can wait on.

    Attributes:
        name: what the step is (for messages), e.g. ``"claim"``.
        count: steps fired so far (starts at 0).
        last: the value given to the latest :meth:`fire` (``None`` before the first).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0
        self.last: Any = None
        self._event: asyncio.Event | None = None
        self._listeners: list[Callable[[Any], None]] = []

    def fire(self, value: Any = None) -> None:
        """One step completed (``value`` describes it, e.g. rows claimed): wake every waiter,
        then call the listeners with ``value``."""
        self.count += 1
        self.last = value
        event, self._event = self._event, None
        if event is not None:
            event.set()
        for listener in self._listeners:
            listener(value)

    def subscribe(self, listener: Callable[[Any], None]) -> None:
        """Call ``listener(value)`` (synchronous, must not raise) after each :meth:`fire`."""
        self._listeners.append(listener)

    async def after(self, count: int) -> int:
        """Wait until more than ``count`` steps have fired; returns :attr:`count`."""
        while self.count <= count:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()
        return self.count

    async def wait_until(
        self,
        predicate: Callable[[], T | Awaitable[T]],
        timeout: float | None = None,
    ) -> T:
        """Return the first truthy value of ``predicate()`` (a plain or async callable),
        evaluated now and again after each step. No step is missed between an evaluation and
        the wait that follows it.

        Raises:
            TimeoutError: ``timeout`` seconds (None = no limit) passed first.
        """

        async def loop() -> T:
            while True:
                seen = self.count
                value = predicate()
                if inspect.isawaitable(value):
                    value = await value
                if value:
                    return value
                await self.after(seen)

        return await asyncio.wait_for(loop(), timeout)
