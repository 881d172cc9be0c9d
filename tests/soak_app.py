"""The worker application of the fault-injection soak (tests/faults/test_fault_soak.py), run as a
subprocess that the test SIGKILLs, cuts off and restarts the server under.

``AWA_FAST_APP_DSN``: the database. Kinds:

- ``SoakA(n)`` stages ``SoakB(n % 29)`` (unique by args): ADR-046's staged follow-ups.
- ``SoakPay(n, mode)`` has a failure consequence that releases reservation ``n`` on an external
  connection (repeat-safe: the ``released`` flag guards the stock update; every run is logged),
  and a ``verify_success`` hook that reports jobs with ``n % 5 == 0`` as not done, so the
  reconciler corrects them. Modes: ``fail`` (terminal error), ``ok``, ``flaky`` (fails its first
  attempt), ``slow`` (runs 0.3 s: a SIGKILL on its only attempt exhausts it by rescue).
"""

import asyncio
import dataclasses
import os

import psycopg

import awa_fast as awa

DSN = os.environ.get("AWA_FAST_APP_DSN", "")
client = awa.AsyncClient(DSN, max_connections=6)


@dataclasses.dataclass
class SoakA:
    n: int


@dataclasses.dataclass
class SoakB:
    value: int


@dataclasses.dataclass
class SoakPay:
    n: int
    mode: str


async def release(failure: awa.JobFailure) -> None:
    """Repeat-safe effect on another system (its own autocommit connection)."""
    async with await psycopg.AsyncConnection.connect(
        DSN, autocommit=True, connect_timeout=5
    ) as ext:
        await ext.execute(
            "INSERT INTO public.effect_log (n, reason) VALUES (%s, %s)",
            (failure.args.n, failure.reason),
        )
        async with ext.transaction():
            cur = await ext.execute(
                "UPDATE public.reservations SET released = true "
                "WHERE n = %s AND NOT released RETURNING qty",
                (failure.args.n,),
            )
            row = await cur.fetchone()
            if row:
                await ext.execute("UPDATE public.stock SET available = available + %s", (row[0],))


@client.task(SoakA, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def soak_a(job):
    await asyncio.sleep(0.02)
    job.enqueue_on_completion(SoakB(job.args.n % 29), unique_opts={})


@client.task(SoakB, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def soak_b(job):
    return None


@client.task(SoakPay, failure_consequence=release, verify_success=lambda job: job.args.n % 5 != 0)
async def soak_pay(job):
    mode = job.args.mode
    if mode == "fail":
        raise awa.TerminalError("payment declined")
    if mode == "flaky" and job.attempt == 1:
        raise RuntimeError("gateway timeout")
    if mode == "slow":
        await asyncio.sleep(0.3)


START_OPTIONS = dict(
    poll_interval_ms=100,
    heartbeat_interval_ms=100,
    heartbeat_staleness_ms=1000,
    heartbeat_rescue_interval_ms=200,
    deadline_rescue_interval_ms=200,
    promote_interval_ms=100,
    leader_election_interval_ms=200,
    reconcile_interval_ms=100,
    consequence_backoff_ms=100,
)


async def main() -> None:
    await client.start([("default", 8)], **START_OPTIONS)
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
