"""awa_fast.worker.observe.Signal: the step counter components fire and tests wait on."""

from __future__ import annotations

import asyncio

import pytest

from awa_fast.worker.observe import Signal


async def test_after_returns_once_a_later_step_fired():
    s = Signal("step")
    waiter = asyncio.create_task(s.after(0))
    await asyncio.sleep(0)
    assert not waiter.done()
    s.fire("x")
    assert await asyncio.wait_for(waiter, 1) == 1
    assert (s.count, s.last) == (1, "x")
    assert await asyncio.wait_for(s.after(0), 1) == 1  # already past: returns at once


async def test_wait_until_evaluates_now_then_after_each_step():
    s, seen = Signal("step"), []

    def predicate():
        seen.append(s.count)
        return "done" if s.count >= 2 else None

    async def evaluated(n):
        while len(seen) < n:
            await asyncio.sleep(0)

    waiter = asyncio.create_task(s.wait_until(predicate, timeout=5))
    await evaluated(1)
    s.fire()
    await evaluated(2)
    s.fire()
    assert await waiter == "done"
    assert seen == [0, 1, 2]


async def test_wait_until_misses_no_step_fired_during_an_async_predicate():
    s = Signal("step")
    state = {"ready": False}

    async def predicate():
        ready = state["ready"]
        if not ready:  # the step lands while the predicate is evaluated
            state["ready"] = True
            s.fire()
        return ready

    assert await s.wait_until(predicate, timeout=1) is True


async def test_wait_until_times_out():
    with pytest.raises(TimeoutError):
        await Signal("never").wait_until(lambda: False, timeout=0.05)


def test_listeners_get_each_value_in_order():
    s, got = Signal("step"), []
    s.subscribe(got.append)
    s.fire(1)
    s.fire(2)
    assert got == [1, 2] and s.count == 2
