"""The application the metrics test runs under the launcher (``awa-fast worker
tests.metrics_app:client --metrics-port 0``). Database: ``$AWA_FAST_LAUNCHER_DSN``.

``Step(mode, tag)`` on queue ``metrics_q``: ``ok`` completes; ``stage`` stages ``Child(tag)``
(unique by args, so two triggers with one tag insert one child and skip the other) and
completes; ``stage_fail`` stages a child and fails terminally (the child is discarded);
``retry`` asks for a retry on its first attempt and completes on the second; ``cancel``
cancels itself; ``wait`` stages a child, then waits for a callback that expires after 0.3 s
(the child is discarded, the callback rescue fails the job); ``hang`` never returns from its
first attempt and completes the second. ``Charge`` always fails terminally; its failure consequence is applied.
``Child`` has no handler: children stay ``available`` (queue depth).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

import awa_fast as awa

client = awa.AsyncClient(os.environ.get("AWA_FAST_LAUNCHER_DSN", ""), max_connections=4)
START_OPTIONS = dict(
    poll_interval_ms=50,
    heartbeat_interval_ms=100,
    promote_interval_ms=50,
    leader_election_interval_ms=200,
    callback_rescue_interval_ms=100,
    heartbeat_staleness_ms=1000,
    heartbeat_rescue_interval_ms=200,
    metrics_refresh_ms=100,
)


@dataclasses.dataclass
class Step:
    mode: str
    tag: str = ""


@dataclasses.dataclass
class Charge:
    amount: int


@dataclasses.dataclass
class Child:
    tag: str


@client.task(Step, queue="metrics_q")
async def step(job):
    mode = job.args.mode
    if mode in ("stage", "stage_fail", "wait"):
        job.enqueue_on_completion(Child(job.args.tag), queue="metrics_children", unique_opts={})
    if mode == "stage_fail":
        raise awa.TerminalError("declined after staging")
    if mode == "retry" and job.attempt == 1:
        return awa.RetryAfter(0.05)
    if mode == "hang" and job.attempt == 1:
        await asyncio.Event().wait()
    if mode == "wait":
        return awa.WaitForCallback(await job.register_callback(timeout_seconds=0.3))
    if mode == "cancel":
        return awa.Cancel("not needed")
    return None


async def refund(failure: awa.JobFailure) -> None:
    """The failure consequence of Charge (nothing external to undo in this test)."""


@client.task(Charge, queue="metrics_q", failure_consequence=refund)
async def charge(job):
    raise awa.TerminalError("card declined")
