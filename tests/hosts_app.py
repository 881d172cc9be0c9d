"""The application ``awa-fast worker tests.hosts_app:client`` runs on every worker host of
tests/deploy/test_hosts.py (one launcher per network namespace).

Environment: ``AWA_FAST_HOSTS_NAME`` (the host's name, recorded with each run),
``AWA_FAST_HOSTS_DIRECT`` (a direct URL to the database: handlers record their runs and wait
there, never through a pooler's few server connections); the database URL comes from
``--database-url`` and the pooler mode from ``$AWA_FAST_POOLER``.

Kinds:

- ``hold`` (``async def``): its first attempt waits for ever (until cancelled); a later one
  records the run in ``public.host_runs`` (committed at once, apart from the attempt) and
  completes staging one ``Next`` (mode ``ok``) or raises ``TerminalError`` (mode ``fail``: the
  failure consequence ``release`` writes a row of ``public.released`` in the settlement
  transaction, so once per applied failure).
- ``hold_sync`` (``def``, a thread nothing can stop): as ``hold``, but its first attempt waits
  for the shared advisory lock ``HOLD_KEY`` (the test holds it exclusively), then records the
  run and ends the same way.
- ``next``: the follow-up; records its run.
- ``part``: a keyed job of a partitioned queue; records its run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

import psycopg

import awa_fast as awa

HOST = os.environ.get("AWA_FAST_HOSTS_NAME", "?")
DIRECT = os.environ.get("AWA_FAST_HOSTS_DIRECT", "")
HOLD_KEY = 31_031

client = awa.AsyncClient(max_connections=4)

# Passed by the launcher to client.start(): fast polling, heartbeats, rescue and election.
START_OPTIONS = dict(
    poll_interval_ms=50,
    heartbeat_interval_ms=100,
    heartbeat_staleness_ms=2000,
    heartbeat_rescue_interval_ms=100,
    deadline_rescue_interval_ms=200,
    callback_rescue_interval_ms=200,
    reconcile_interval_ms=100,
    promote_interval_ms=50,
    leader_election_interval_ms=100,
)

SETUP_SQL = """
CREATE TABLE IF NOT EXISTS public.host_runs (
    job_id bigint NOT NULL, kind text NOT NULL, queue text NOT NULL, attempt int NOT NULL,
    run_lease bigint NOT NULL, host text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS public.released (
    job_id bigint NOT NULL, host text NOT NULL, reason text NOT NULL);
"""


@dataclasses.dataclass
class Hold:
    n: int
    mode: str = "ok"


@dataclasses.dataclass
class HoldSync:
    n: int
    mode: str = "ok"


@dataclasses.dataclass
class Next:
    n: int


@dataclasses.dataclass
class Part:
    key: str
    n: int


RECORD = (
    "INSERT INTO public.host_runs (job_id, kind, queue, attempt, run_lease, host)"
    " VALUES (%s, %s, %s, %s, %s, %s)"
)


def _run(job) -> tuple:
    return (job.id, job.kind, job.queue, job.attempt, job.run_lease, HOST)


async def _record(job) -> None:
    async with await psycopg.AsyncConnection.connect(DIRECT, autocommit=True) as conn:
        await conn.execute(RECORD, _run(job))


async def release(failure: awa.JobFailure) -> None:
    await failure.conn.execute(
        "INSERT INTO public.released (job_id, host, reason) VALUES (%s, %s, %s)",
        (failure.job.id, HOST, failure.reason),
    )


def _end(job) -> None:
    if job.args.mode == "fail":
        raise awa.TerminalError(f"hold {job.args.n} declined on {HOST}")
    job.enqueue_on_completion(Next(job.args.n))


@client.task(Hold, kind="hold", failure_consequence=release)
async def hold(job):
    if job.attempt == 1:
        await asyncio.Event().wait()  # until cancelled
    await _record(job)
    _end(job)


@client.task(HoldSync, kind="hold_sync", failure_consequence=release)
def hold_sync(job):
    with psycopg.connect(DIRECT, autocommit=True) as conn:
        if job.attempt == 1:  # blocks while the test holds the lock exclusively
            conn.execute("SELECT pg_advisory_lock_shared(%s)", (HOLD_KEY,))
            conn.execute("SELECT pg_advisory_unlock_shared(%s)", (HOLD_KEY,))
        conn.execute(RECORD, _run(job))
    _end(job)


@client.task(Next, kind="next", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def next_job(job):
    await _record(job)


@client.task(Part, kind="part", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def part(job):
    await _record(job)
