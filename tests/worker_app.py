"""A worker application run as a subprocess by the crash tests (``python tests/worker_app.py``).

Reads the database from ``AWA_FAST_APP_DSN``; prints ``started <id>`` when a handler begins.
"""

import asyncio
import os

import awa_fast as awa

client = awa.AsyncClient(os.environ.get("AWA_FAST_APP_DSN", ""))


@client.task(dict, kind="hang", queue="kill_q")
async def hang(job):
    print("started", job.id, flush=True)
    await asyncio.Event().wait()


async def main() -> None:
    await client.start([("kill_q", 4)], heartbeat_interval_ms=100, maintenance=False)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
