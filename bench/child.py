"""A worker process of the drain scenarios: ``python -m bench.child '<json config>'``.

Protocol (line-based): the child prints ``READY`` once its handlers are registered and its
connections are open, waits for ``GO`` on stdin, starts the system's worker runtime, waits for
``STOP`` (or stdin EOF), shuts down and prints ``STATS <json>`` (awa-fast: the finalizer's
counters and the outcome counts). Runs on uvloop when it is installed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys


async def _main(cfg: dict) -> None:
    from bench.systems import load

    adapter = load(cfg["system"])
    loop = asyncio.get_running_loop()
    go, stop = asyncio.Event(), asyncio.Event()

    def ready() -> None:
        print("READY", flush=True)

    async def control() -> None:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line or line.strip() == "STOP":
                go.set()
                stop.set()
                return
            if line.strip() == "GO":
                go.set()

    ctl = asyncio.create_task(control())
    stats = await adapter.run_worker(
        cfg["dsn"], cfg["workload"], cfg["max_workers"], go, stop, ready
    )
    ctl.cancel()
    print("STATS " + json.dumps(stats or {}), flush=True)


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    cfg = json.loads(sys.argv[1])
    try:
        import uvloop

        uvloop.run(_main(cfg))
    except ImportError:
        asyncio.run(_main(cfg))


if __name__ == "__main__":
    main()
