"""A worker process of the drain scenarios: ``python -m bench.child '<json config>'``.

Protocol (line-based): the child prints ``READY`` once its handlers are registered and its
connections are open, waits for ``GO`` on stdin, starts the system's worker runtime, waits for
``STOP`` (or stdin EOF), shuts down and prints ``STATS <json>`` (awa-fast: the finalizer's
counters and the outcome counts). Runs on uvloop when it is installed.

Workload ``soak`` (bench/soak.py): every 100 ms the child also prints
``SOAK {"sec": <epoch second>, "hist": {<bucket>: <count>}}`` per second with new pickups, the
pickup-latency histogram of the jobs its handlers started in that second since the last line
(the harness adds them up), and flushes the rest before ``STATS``. Config key
``options`` (optional) holds system-specific start options (awa-fast's ``start()`` keywords).
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
    emitter = asyncio.create_task(_emit_pickups()) if cfg["workload"] == "soak" else None
    extra = {"options": cfg["options"]} if cfg.get("options") else {}
    stats = await adapter.run_worker(
        cfg["dsn"], cfg["workload"], cfg["max_workers"], go, stop, ready, **extra
    )
    ctl.cancel()
    if emitter is not None:
        emitter.cancel()
        _print_pickups(None)
    print("STATS " + json.dumps(stats or {}), flush=True)


def _print_pickups(before: int | None) -> None:
    from bench.soak import RECORDER

    for sec, hist in RECORDER.take(before):
        print("SOAK " + json.dumps({"sec": sec, "hist": hist}), flush=True)


async def _emit_pickups() -> None:
    # Every 100 ms, the current second's partial histogram too (the harness merges them), so a
    # worker-side backlog lags the producer's count by at most about 0.1 s of work.
    while True:
        await asyncio.sleep(0.1)
        _print_pickups(None)


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
