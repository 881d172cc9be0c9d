"""Re-raises a cancellation that ``asyncio.wait_for`` swallowed.

On Python 3.11, ``asyncio.wait_for`` returns the inner result when the inner awaitable finishes
in the same loop iteration as a cancel of the outer task: the ``CancelledError`` is lost, and
``psycopg_pool``'s ``getconn`` uses ``wait_for``. A background loop that carries on after that
never ends, and ``asyncio.run()`` -- which cancels every task once at exit -- waits for it
forever. ``Task.cancelling()`` still counts the cancel, so each loop calls
:func:`raise_if_cancelling` after such an await.
"""

from __future__ import annotations

import asyncio


def raise_if_cancelling() -> None:
    """Raise ``asyncio.CancelledError`` if the current task has a cancel pending."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
