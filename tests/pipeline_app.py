"""A stage-A/stage-B pipeline worker run as a subprocess by the fault-injection test.

``AWA_FAST_APP_DSN``: the database. Every A stages one B for a value many As share.
"""

import asyncio
import dataclasses
import os
import random

import awa_fast as awa

client = awa.AsyncClient(os.environ.get("AWA_FAST_APP_DSN", ""), max_connections=6)


@dataclasses.dataclass
class PipeA:
    n: int


@dataclasses.dataclass
class PipeB:
    value: int


@client.task(PipeA, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def pipe_a(job):
    await asyncio.sleep(0.03 + random.random() * 0.03)
    job.enqueue_on_completion(PipeB(job.args.n % 37), unique_opts={})


@client.task(PipeB, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def pipe_b(job):
    return None


START_OPTIONS = dict(
    poll_interval_ms=100,
    heartbeat_interval_ms=100,
    heartbeat_staleness_ms=1000,
    heartbeat_rescue_interval_ms=200,
    deadline_rescue_interval_ms=200,
    callback_rescue_interval_ms=200,
    promote_interval_ms=100,
    leader_election_interval_ms=200,
    staged_completions=os.environ.get("STAGED_COMPLETIONS", "per_job"),
)


async def main() -> None:
    await client.start([("default", 16)], **START_OPTIONS)
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
