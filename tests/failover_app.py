"""The worker application of the failover tests (tests/deploy/test_failover.py), run by
``awa-fast worker tests.failover_app:client`` on a multi-host URL while the test kills the
primary and promotes its standby.

``$AWA_FAST_FAILOVER_URL``: the database (``host=a,b port=x,y target_session_attrs=read-write``).
``$AWA_FAST_FAILOVER_RUNS``: a directory where every handler run appends a line
``<kind> <n> <job id> <attempt>`` to ``runs.<pid>`` (the local file system survives the
failover; the database's record of a run may not). Kinds:

- ``FoParent(n)`` stages ``FoChild(n)`` (ADR-046's staged follow-up; no unique key, so a
  follow-up inserted twice for one parent would show as two rows).
- ``FoChild(n)`` does nothing.
- ``FoSlow(n)`` runs 3 s: twice the heartbeat staleness, so it completes on its first attempt
  only if the process's heartbeat reached the server the rescuer reads.
- ``FoPay(n)`` fails terminally; its failure consequence records ``n`` in
  ``public.failover_effects`` on a connection of its own (repeat-safe: one row per ``n``; every
  application also appends ``effect <n>`` to the run log).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

import psycopg

import awa_fast as awa

URL = os.environ.get("AWA_FAST_FAILOVER_URL", "")
RUNS = os.environ.get("AWA_FAST_FAILOVER_RUNS", "")
# Each process's connections name it: the test finds every process's listener and leader on
# the promoted server.
APP_NAME = f"failover_{os.getpid()}"
client = awa.AsyncClient(f"{URL} application_name={APP_NAME}" if URL else "", max_connections=4)

# Passed by the launcher to client.start(): fast heartbeats, rescue and election, so a failover
# settles within seconds.
START_OPTIONS = dict(
    poll_interval_ms=100,
    heartbeat_interval_ms=100,
    heartbeat_staleness_ms=1500,
    heartbeat_rescue_interval_ms=200,
    deadline_rescue_interval_ms=200,
    callback_rescue_interval_ms=200,
    promote_interval_ms=100,
    leader_election_interval_ms=200,
    reconcile_interval_ms=100,
    consequence_backoff_ms=100,
)


def record(line: str) -> None:
    """Append one line to this process's run log (one write: whole lines, never interleaved)."""
    fd = os.open(os.path.join(RUNS, f"runs.{os.getpid()}"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@dataclasses.dataclass
class FoParent:
    n: int


@dataclasses.dataclass
class FoChild:
    n: int


@dataclasses.dataclass
class FoSlow:
    n: int


@dataclasses.dataclass
class FoPay:
    n: int


@client.task(FoParent, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def fo_parent(job):
    record(f"parent {job.args.n} {job.id} {job.attempt}")
    await asyncio.sleep(0.01)
    job.enqueue_on_completion(FoChild(job.args.n))


@client.task(FoChild, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def fo_child(job):
    record(f"child {job.args.n} {job.id} {job.attempt}")


@client.task(FoSlow, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def fo_slow(job):
    record(f"slow {job.args.n} {job.id} {job.attempt}")
    await asyncio.sleep(3.0)


async def release(failure: awa.JobFailure) -> None:
    """The repeat-safe effect on "another system" (a table reached by its own connection)."""
    async with await psycopg.AsyncConnection.connect(
        URL, autocommit=True, connect_timeout=5
    ) as ext:
        await ext.execute(
            "INSERT INTO public.failover_effects (n) VALUES (%s) ON CONFLICT DO NOTHING",
            (failure.args.n,),
        )
    record(f"effect {failure.args.n} 0 0")


@client.task(FoPay, failure_consequence=release)
async def fo_pay(job):
    record(f"pay {job.args.n} {job.id} {job.attempt}")
    raise awa.TerminalError("declined")
