"""The soak scenario's paced producer: ``python -m bench.soak_producer '<json config>'``.

Config: ``system``, ``dsn``, ``rate`` (jobs/s), ``duration`` (s), ``tick_ms`` (batch interval),
``lanes`` (inserts in flight at most). Protocol (line-based): prints ``READY`` once connected,
waits for ``GO <t0>`` (epoch seconds) and from t0 on issues, at every tick, one insert of the jobs
that fell due since the last one (``rate * (now - t0)`` in total, up to ``rate * duration``).
Each job's args carry the epoch time taken just before its insert call (the worker measures
pickup latency from it). An insert waits for a free lane; a tick served after its time is late.
Prints ``P {"n": committed, "due": ..., "late_ms": ...}`` at most every 50 ms while running,
``DONE {stats}`` at the end, then exits. ``STOP`` on stdin (or EOF) ends it early.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
import threading
import time


async def _main(cfg: dict) -> None:
    from bench.systems import load

    adapter = load(cfg["system"])
    rate, duration = float(cfg["rate"]), float(cfg["duration"])
    tick = float(cfg["tick_ms"]) / 1000
    lanes = int(cfg["lanes"])
    producer = await adapter.open_soak_producer(cfg["dsn"], lanes)
    loop = asyncio.get_running_loop()
    print("READY", flush=True)
    line = sys.stdin.readline()
    if not line.startswith("GO "):
        await producer.close()
        return
    t0 = float(line.split()[1])
    stopped = asyncio.Event()

    def control() -> None:  # a daemon thread: a blocked stdin read must not delay the exit
        sys.stdin.readline()  # STOP or EOF
        loop.call_soon_threadsafe(stopped.set)

    threading.Thread(target=control, daemon=True).start()
    total = round(rate * duration)
    max_batch = max(1, math.ceil(rate * tick)) * 20  # catching up, but in bounded statements
    free = asyncio.Semaphore(lanes)
    pending: set[asyncio.Task] = set()
    st = {"committed": 0, "late_ms": 0.0, "late_max_ms": 0.0, "batches": 0, "failed": None}

    async def insert(n: int) -> None:
        try:
            await producer.insert(n, time.time())
            st["committed"] += n
        except Exception as exc:
            st["failed"] = repr(exc)
            stopped.set()
        finally:
            free.release()

    async def report() -> None:
        last = -1
        while True:
            await asyncio.sleep(0.05)
            if st["committed"] != last or st["late_ms"]:
                last = st["committed"]
                due = min(total, int(rate * max(0.0, time.time() - t0)))
                msg = {"n": last, "due": due, "late_ms": round(st["late_ms"], 2)}
                st["late_ms"] = 0.0
                print("P " + json.dumps(msg), flush=True)

    reporter = asyncio.create_task(report())
    await asyncio.sleep(max(0.0, t0 - time.time()))
    issued, k = 0, 1
    while issued < total and not stopped.is_set():
        tick_at = t0 + k * tick
        delay = tick_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await free.acquire()
        now = time.time()
        due = min(total, int(rate * (now - t0)))
        n = min(due - issued, max_batch)
        if n <= 0:
            free.release()
            k += 1
            continue
        late = (now - tick_at) * 1000
        st["late_ms"] = max(st["late_ms"], late)
        st["late_max_ms"] = max(st["late_max_ms"], late)
        issued += n
        st["batches"] += 1
        task = asyncio.create_task(insert(n))
        pending.add(task)
        task.add_done_callback(pending.discard)
        k = max(k + 1, int((time.time() - t0) / tick) + 1)
    behind_at_end = time.time() - (t0 + duration)
    if pending:
        await asyncio.gather(*pending)
    reporter.cancel()
    await producer.close()
    due = min(total, int(rate * max(0.0, time.time() - t0)))
    print("P " + json.dumps({"n": st["committed"], "due": due, "late_ms": 0.0}), flush=True)
    done = {
        "produced": st["committed"],
        "offered": total,
        "batches": st["batches"],
        "late_max_ms": round(st["late_max_ms"], 2),
        "behind_at_end_s": round(behind_at_end, 3),
        "stopped_early": issued < total,
        "failed": st["failed"],
        "method": producer.method,
        "tick_ms": cfg["tick_ms"],
        "lanes": lanes,
    }
    print("DONE " + json.dumps(done), flush=True)


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
