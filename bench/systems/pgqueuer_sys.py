"""pgqueuer adapter.

Configuration from pgqueuer's docs (docs/development/benchmark.md): the asyncpg driver ("roughly
double the throughput of psycopg"), default durability (``durable``: all tables logged), batched
dequeue (``QueueManager.run(batch_size=...)``; the docs' benchmark uses 10, we use a larger batch
for the drain, see BATCH_SIZE). A completed job is deleted from the ``pgqueuer`` table (and
logged in ``pgqueuer_log``); finalized = seeded - rows left in ``pgqueuer``. pgqueuer has no COPY
path: its bulk path is ``Queries.enqueue`` with lists (one statement). It has no snooze: the
failure mix uses ``RetryRequested(0)`` for both "retry once" and "snooze once"; terminal =
an exception with the default ``on_failure="delete"``.

Pipeline (the nearest thing to awa-fast's staged follow-ups, not atomic): the stage-A handler
enqueues its stage-B job itself through a pool of 10 asyncpg connections (awa-fast's per-process
pool size), with ``dedupe_key`` (pgqueuer dedupes only while a job is queued or picked, so a B
value whose first job already finished is enqueued again: more work, never less). The pipeline
is done when the queue table is empty: every A ran, so every B was enqueued.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta

from bench.soak import pickup
from bench.systems import NotSupported, dist_version

BATCH_SIZE = int(os.environ.get("BENCH_PGQUEUER_BATCH", "100"))


class SoakProducer:
    """One asyncpg connection per lane (an asyncpg connection runs one query at a time)."""

    method = "Queries.enqueue lists (one call per tick)"

    def __init__(self, conns, queries):
        self.conns = conns
        self.free: asyncio.Queue = asyncio.Queue()
        for q in queries:
            self.free.put_nowait(q)

    async def insert(self, n: int, t: float) -> None:
        q = await self.free.get()
        try:
            await q.enqueue(["soak"] * n, [repr(t).encode()] * n, [0] * n)
        finally:
            self.free.put_nowait(q)

    async def close(self) -> None:
        for c in self.conns:
            await c.close()


class Adapter:
    name = "pgqueuer"
    dist = "pgqueuer"

    def __init__(self):
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401

        self.version = dist_version(self.dist)
        self.driver_version = dist_version("asyncpg")

    async def _queries(self, dsn: str):
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(dsn)
        return conn, Queries(AsyncpgDriver(conn))

    async def setup(self, dsn: str) -> dict:
        conn, q = await self._queries(dsn)
        try:
            await q.install()
        finally:
            await conn.close()
        return {"engine": f"asyncpg {self.driver_version}, durability=durable"}

    async def enqueue(self, dsn: str, mode: str, n: int, batch: int) -> dict:
        conn, q = await self._queries(dsn)
        try:
            if mode == "single":
                t = time.perf_counter()
                for i in range(n):
                    await q.enqueue("noop", str(i).encode())
                return {"elapsed": time.perf_counter() - t, "method": "Queries.enqueue"}
            if mode in ("many", "copy"):
                step = batch if mode == "many" else n
                t = time.perf_counter()
                for k in range(0, n, step):
                    m = min(step, n - k)
                    await q.enqueue(
                        ["noop"] * m, [str(i).encode() for i in range(k, k + m)], [0] * m
                    )
                label = (
                    f"Queries.enqueue lists (batches of {step})"
                    if mode == "many"
                    else "Queries.enqueue lists, one call (no COPY path)"
                )
                return {"elapsed": time.perf_counter() - t, "method": label}
            if mode == "unique":
                t = time.perf_counter()
                for k in range(0, n, batch):
                    m = min(batch, n - k)
                    await q.enqueue(
                        ["noop"] * m,
                        [str(i).encode() for i in range(k, k + m)],
                        [0] * m,
                        dedupe_key=[f"u{i}" for i in range(k, k + m)],
                    )
                return {
                    "elapsed": time.perf_counter() - t,
                    "method": f"Queries.enqueue lists + dedupe_key (batches of {batch})",
                }
            raise NotSupported(mode)
        finally:
            await conn.close()

    async def seed(self, dsn: str, workload: str, n: int) -> int:
        if workload == "noop":
            eps = ["noop"] * n
        elif workload == "failmix":
            eps = [("fm_retry", "fm_terminal", "fm_snooze")[i % 3] for i in range(n)]
        elif workload == "pipeline":
            eps = ["stage_a"] * n
        else:
            raise NotSupported(workload)
        conn, q = await self._queries(dsn)
        try:
            for k in range(0, n, 5000):
                part = eps[k : k + 5000]
                await q.enqueue(
                    part, [str(i).encode() for i in range(k, k + len(part))], [0] * len(part)
                )
        finally:
            await conn.close()
        self._seeded = n
        # the pipeline stages one B per pair of A's (values n // 2): 1.5 n jobs finish
        return n + n // 2 if workload == "pipeline" else n

    pipeline_method = "A's handler enqueues B itself (dedupe_key; not atomic with A's completion)"

    def supports(self, workload: str) -> bool:
        return workload in ("noop", "failmix", "soak", "pipeline")

    # -- soak (bench/soak.py) -----------------------------------------------------------------

    soak_relations = ("public", "pgqueuer%")

    def soak_backlog_sql(self) -> str:
        return "SELECT count(*) FROM pgqueuer"  # finished jobs leave the queue table

    async def open_soak_producer(self, dsn: str, lanes: int) -> SoakProducer:
        conns, queries = [], []
        for _ in range(lanes):
            conn, q = await self._queries(dsn)
            conns.append(conn)
            queries.append(q)
        return SoakProducer(conns, queries)

    def count_query(self, workload: str) -> str:
        # Finalized = seeded - rows still in the queue table (callers pass the seeded count).
        if workload == "pipeline":  # reaches 1.5 n exactly when the table is empty
            return "SELECT %(seeded)s + %(seeded)s / 2 - (SELECT count(*) FROM pgqueuer)"
        return "SELECT %(seeded)s - (SELECT count(*) FROM pgqueuer)"

    async def run_worker(self, dsn, workload, max_workers, go, stop, ready, options=None) -> dict:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.errors import RetryRequested
        from pgqueuer.qm import QueueManager
        from pgqueuer.queries import Queries

        if options:
            raise NotSupported(f"start options {sorted(options)} (awa-fast only)")
        from pgqueuer.db import AsyncpgPoolDriver
        from pgqueuer.errors import DuplicateJobError

        conn = await asyncpg.connect(dsn)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=10)
        staging = Queries(AsyncpgPoolDriver(pool))

        @qm.entrypoint("stage_a")
        async def stage_a(job):
            v = int(job.payload) // 2
            try:
                await staging.enqueue("stage_b", str(v).encode(), 0, dedupe_key=f"b{v}")
            except DuplicateJobError:
                pass

        @qm.entrypoint("stage_b")
        async def stage_b(job):
            return None

        @qm.entrypoint("soak")
        async def soak(job):
            pickup(float(job.payload))

        @qm.entrypoint("noop")
        async def noop(job):
            return None

        @qm.entrypoint("fm_retry")
        async def fm_retry(job):
            if job.attempts == 0:
                raise RetryRequested(timedelta(0))

        @qm.entrypoint("fm_terminal")
        async def fm_terminal(job):
            raise RuntimeError("terminal")

        @qm.entrypoint("fm_snooze")
        async def fm_snooze(job):
            if job.attempts == 0:
                raise RetryRequested(timedelta(0))

        ready()
        await go.wait()
        task = asyncio.create_task(
            qm.run(
                batch_size=BATCH_SIZE,
                dequeue_timeout=timedelta(seconds=5),
                max_concurrent_tasks=max(max_workers, 2 * BATCH_SIZE),
            )
        )
        await stop.wait()
        qm.shutdown.set()
        try:
            await asyncio.wait_for(task, 10)
        except Exception:
            task.cancel()
        await conn.close()
        await pool.close()
        return {}

    async def pickup_latency(self, dsn: str, iterations: int, poll_ms: int) -> list[float]:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.qm import QueueManager
        from pgqueuer.queries import Queries

        wconn = await asyncpg.connect(dsn)
        qm = QueueManager(Queries(AsyncpgDriver(wconn)))
        started: dict[int, float] = {}
        events: dict[int, asyncio.Event] = {}

        @qm.entrypoint("ping")
        async def ping(job):
            i = int(job.payload)
            started[i] = time.perf_counter()
            events[i].set()

        task = asyncio.create_task(
            qm.run(batch_size=10, dequeue_timeout=timedelta(milliseconds=poll_ms))
        )
        conn, q = await self._queries(dsn)
        await asyncio.sleep(0.5)
        out = []
        try:
            for i in range(iterations):
                events[i] = asyncio.Event()
                t0 = time.perf_counter()
                await q.enqueue("ping", str(i).encode())
                await asyncio.wait_for(events[i].wait(), 30)
                out.append((started[i] - t0) * 1000)
                await asyncio.sleep(0.01)
        finally:
            qm.shutdown.set()
            try:
                await asyncio.wait_for(task, 10)
            except Exception:
                task.cancel()
            await conn.close()
            await wconn.close()
        return out
