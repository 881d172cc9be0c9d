"""A worker run as a subprocess by the SIGSTOP tests (``python -m tests.stop_app``).

``AWA_FAST_APP_DSN``: the database. It runs maintenance (so it becomes the leader when it
starts first) with a 100 ms election tick and 1 s staleness. Handler ``zombie``: prints
``started <id> <run_lease>``, sleeps ``args["hold"]`` seconds, stages a follow-up ``child``
naming its run lease, returns. Prints ``ready <leader>`` once started, ``ended`` after each
attempt's end.
"""

import asyncio
import os

import awa_fast as awa

client = awa.AsyncClient(os.environ.get("AWA_FAST_APP_DSN", ""))
STALE_MS = 1000


@client.task(dict, kind="zombie", queue="stop_q", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def zombie(job):
    print("started", job.id, job.run_lease, flush=True)
    await asyncio.sleep(job.args["hold"])
    job.enqueue_on_completion({"from_lease": job.run_lease}, kind="child", queue="child_q")


async def main() -> None:
    await client.start(
        [("stop_q", 4)],
        heartbeat_interval_ms=100,
        heartbeat_staleness_ms=STALE_MS,
        leader_election_interval_ms=100,
        heartbeat_rescue_interval_ms=100,
    )
    rt = client.runtime
    for _ in range(100):
        if rt.maintenance.is_leader:
            break
        await asyncio.sleep(0.05)
    print("ready", rt.maintenance.is_leader, flush=True)
    ended = 0
    while True:
        await rt.wait_attempts_ended(ended + 1)
        ended += 1
        print("ended", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
