"""The bounds of a runtime's shutdown (docs/architecture.md, "Shutdown") and the cancel that
keeps to them: a handler that ignores cancellation or a database that does not answer must not
keep shutdown from ending. ``supervisor.kill_after_s`` derives the launcher's kill deadline
from :func:`shutdown_bound_s`."""

from __future__ import annotations

import asyncio
import logging
import time

from awa_fast.worker.presence import PRESENCE_GONE_S

log = logging.getLogger("awa_fast.runtime")

CLAIM_HANDOVER_S = 5.0  # shutdown: longest wait for a claim in flight to return its rows
# Shutdown's bound, after its drain timeout, on the attempts still ending (cancelled handlers
# giving back, returned ones finalizing) and on the finalizer's last flush.
SHUTDOWN_GRACE_S = 10.0


def shutdown_bound_s(timeout_s: float) -> float:
    """The longest a shutdown with drain timeout ``timeout_s`` (seconds) can take, in seconds,
    from the bounds of its phases (``Runtime._drain``, ``_release``): the dispatchers' claims
    in flight (``max(timeout_s, CLAIM_HANDOVER_S)``, then a cancel), the handlers
    (``timeout_s``), the attempts left after it (``SHUTDOWN_GRACE_S`` + 1 s), the runtime's own
    tasks (a cancel), the finalizer's last flush (``SHUTDOWN_GRACE_S``) and the presence row
    (``PRESENCE_GONE_S``). A cancel (:func:`cancel_and_wait`) gives up ``SHUTDOWN_GRACE_S``
    after its first round and waits 1 s per round."""
    cancel = SHUTDOWN_GRACE_S + 1.0
    return (
        max(timeout_s, CLAIM_HANDOVER_S)
        + cancel
        + timeout_s
        + SHUTDOWN_GRACE_S
        + 1.0
        + cancel
        + SHUTDOWN_GRACE_S
        + PRESENCE_GONE_S
    )


async def cancel_and_wait(tasks: list, grace_s: float = 0.0) -> None:
    """Let ``tasks`` end by themselves for ``grace_s`` seconds, then cancel them until they
    are done: on Python 3.11 a cancel racing ``asyncio.wait_for`` (psycopg_pool's getconn) can
    be swallowed, so one cancel is not enough. At most ``SHUTDOWN_GRACE_S`` after the first
    cancel: a task in a statement the database does not answer (psycopg's cancel request waits
    for the server too) is left, cancelled, and logged by name."""
    live = [t for t in tasks if not t.done()]
    if live and grace_s > 0:
        _, pending = await asyncio.wait(live, timeout=grace_s)
        live = list(pending)
    give_up = time.monotonic() + SHUTDOWN_GRACE_S
    while live:
        if time.monotonic() >= give_up:
            log.error(
                "%d task(s) did not end within %g s of their cancel (the database did not "
                "answer?); left behind: %s",
                len(live),
                SHUTDOWN_GRACE_S,
                ", ".join(sorted(t.get_name() for t in live)),
            )
            return
        for t in live:
            t.cancel()
        _, pending = await asyncio.wait(live, timeout=1.0)
        live = list(pending)
    await asyncio.gather(*tasks, return_exceptions=True)


async def wait_bounded(still: set, pending: dict) -> None:
    """Wait up to ``SHUTDOWN_GRACE_S`` for the attempt tasks ``still`` running after the drain
    (``pending``: attempt key -> task; the cancelled ones giving their attempts back, the
    returned ones finalizing). A task still running then (a handler that ignores its
    cancellation, a finalize the database does not answer) is cancelled (again) and left: its
    attempt stays ``running`` and heartbeat rescue takes it over once this process stops
    beating it. Logged with the job ids."""
    _, stuck = await asyncio.wait(still, timeout=SHUTDOWN_GRACE_S)
    if not stuck:
        return
    ids = sorted(job_id for (job_id, _), task in pending.items() if task in stuck)
    log.error(
        "%d attempt(s) did not end within %g s of the drain (a handler that ignores its "
        "cancellation, or a finalize the database did not answer): left running for "
        "heartbeat rescue: job ids %s",
        len(ids),
        SHUTDOWN_GRACE_S,
        first(ids),
        extra={"stuck": len(ids), "stuck_job_ids": ids},
    )
    for task in stuck:
        task.cancel()
    await asyncio.wait(stuck, timeout=1.0)


async def finalizer_closed(finalizer) -> None:
    """The finalizer's last flush, within ``SHUTDOWN_GRACE_S`` (logged if it did not end)."""
    try:
        await asyncio.wait_for(finalizer.close(), SHUTDOWN_GRACE_S)
    except TimeoutError:
        log.error(
            "the finalizer's last flush did not end within %g s (the database did "
            "not answer): the attempts it held stay running and are rescued",
            SHUTDOWN_GRACE_S,
        )


def first(ids: list[int], n: int = 20) -> str:
    """``ids`` for a log line: all of them, or the first ``n`` and how many more."""
    head = ", ".join(map(str, ids[:n]))
    return head if len(ids) <= n else f"{head} and {len(ids) - n} more"
